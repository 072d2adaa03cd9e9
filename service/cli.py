"""`memsweep`: the command line. Until the study engine lands it fronts the trainers' CLI."""

from __future__ import annotations

import sys
from collections.abc import Sequence

from trainers.cli import main as trainers_main


def main(argv: Sequence[str] | None = None) -> int:
    """`memsweep train|describe|list …` — the same commands and flags as `python -m trainers`."""
    return trainers_main(argv if argv is not None else sys.argv[1:])


if __name__ == "__main__":
    sys.exit(main())
