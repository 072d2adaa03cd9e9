"""The vocabulary every room shares: a study's spec, a trial's spec and events, the states, the settings."""
