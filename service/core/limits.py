"""The ranges of the whole-number queries the REST routes take and `memsweep` checks before it asks
(`service.api.routes.studies`, `service.cli.parser`): one place, so a command never refuses what the
server would take, nor sends what it would refuse."""

from __future__ import annotations

from typing import NamedTuple


class Bounds(NamedTuple):
    """A whole-number query's range, both ends included, and its value when it is not given."""

    low: int
    high: int
    default: int


#: `GET /studies?limit=`, `memsweep studies --limit`: the studies on a page
STUDIES_LIMIT = Bounds(1, 500, 50)
#: `GET /studies?offset=`, `memsweep studies --offset`: the newest studies skipped
STUDIES_OFFSET = Bounds(0, 1_000_000, 0)
#: `GET /studies/{id}/best?k=`, `memsweep best --k`: the configurations ranked
BEST_K = Bounds(1, 1000, 5)
