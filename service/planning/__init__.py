"""Before a run: what a study will cost, from calibrations on the nodes that will run it."""
