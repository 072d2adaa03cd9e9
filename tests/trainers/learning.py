"""Learning tests with a margin: a config learns when at least `need` of its seeds end below half the
task's random baseline (Orhan & Pitkow's criterion), not when one seed happens to cross the line.

A trajectory's last bits move with the numerics mode and the CPU (trainers/numerics.py), and one seed
near the line passes or fails on them. So each learning test trains several seeds, stops each early
well below the line (`early_stop_loss`), and gives a budget well beyond what the slowest measured seed
needed; its docstring states the margin it was given and where it was measured. CI runs these tests
under each numerics mode (the `numerics` marker).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import trainers
from trainers import HALF_BASELINE


def assert_learns(config: Mapping[str, Any], seeds: Sequence[int] = (1, 2, 3), need: int = 2) -> None:
    """Train `config` seed after seed until `need` of them finished below half the baseline (then the
    rest need not run); fail, with every seed's course, once too few seeds are left to reach `need`."""
    report: dict[int, tuple[Any, ...]] = {}
    below = 0
    for i, seed in enumerate(seeds):
        r = trainers.train({**config, "seed": seed})
        report[seed] = (r.status, r.steps, [round(e.val_loss, 4) for e in r.history], r.reason)
        print(f"seed {seed}: {report[seed]}")  # the margin's evidence, with pytest -s
        below += r.status == "done" and HALF_BASELINE.judge_result(r)
        if below >= need:
            return
        assert below + len(seeds) - i - 1 >= need, (
            f"{below} of {len(seeds)} seeds below half the baseline: {report}"
        )
