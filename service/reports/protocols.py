"""Where studies set side by side trained one group under different protocols: Orhan's copy at T = 50
beside SRNN's copy at T = 20 are both `model=rnn`, and a comparison by model set their rates against
each other, their difference with its interval, without a word. A comparison's notes name the settings
(`protocol_notes`), so that a reader groups by them too, or compares studies of one protocol."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping, Sequence
from typing import Any

from service.core.values import repr_value
from service.store.models import Trial
from trainers.config import EXECUTION_FIELDS

#: config fields that are no part of a protocol: where and how fast a trial ran (`EXECUTION_FIELDS`; a
#: cell's kernel, `backend`; a task's data folder, `root`), its seed (what a rate is a sample over) and its
#: numerics mode (a comparison's numerics notes say that one)
NOT_PROTOCOL = frozenset({*EXECUTION_FIELDS, "seed", "numerics", "cell.backend", "task.root"})
#: settings, and groups, one note names at most (then how many more)
SHOWN = 4


def settings_of(config: Mapping[str, Any] | None) -> dict[str, str]:
    """A trial config's settings as comparisons name them (`lr`, `task.seq_len`, `cell.init`) → each value
    as a table writes it, the fields of no protocol left out."""
    out: dict[str, str] = {}
    for key, value in (config or {}).items():
        if key in ("task_params", "cell_params"):
            scope = key.removesuffix("_params")
            out |= {f"{scope}.{k}": repr_value(v) for k, v in (value or {}).items()}
        else:
            out[key] = repr_value(value)
    return {k: v for k, v in out.items() if k not in NOT_PROTOCOL}


def held(trials: Sequence[Trial]) -> dict[str, str]:
    """The settings a study's trials of one group all hold at one value: its protocol there. What a study
    varies (its points' values: its grid's lr and scale, even where it ran one value of them) is what its
    rate is over, not its protocol."""
    values: dict[str, set[str]] = defaultdict(set)
    counts: dict[str, int] = defaultdict(int)
    varied: set[str] = set()
    for t in trials:
        varied |= {f"{scope}{k}" for k in (t.params or {}) for scope in ("", "task.", "cell.")}
        for key, value in settings_of(t.config).items():
            values[key].add(value)
            counts[key] += 1
    return {
        k: next(iter(v))
        for k, v in values.items()
        if len(v) == 1 and counts[k] == len(trials) and k not in varied
    }


def protocol_notes(
    groups: Mapping[tuple[str | None, ...], Mapping[str, Sequence[Trial]]], by: Sequence[str]
) -> list[str]:
    """For each set of settings that studies hold at different values within a group (`groups`: each
    group of `by` → study → its trials there), one note: the groups where they differ so, each study's
    values, and the way to set them apart."""
    Found = tuple[tuple[str, tuple[tuple[str, str], ...]], ...]  # each setting → each study's value
    apart: dict[Found, list[str]] = {}  # → the groups where the studies differ so
    for key, studies in groups.items():
        protocols = {sid: held(trials) for sid, trials in studies.items() if trials}
        if len(protocols) < 2:
            continue
        common = set.intersection(*(set(p) for p in protocols.values()))
        differ = sorted(k for k in common if len({p[k] for p in protocols.values()}) > 1)
        if not differ:
            continue
        label = ", ".join(f"{field}={'–' if v is None else v}" for field, v in zip(by, key, strict=True))
        found = tuple((k, tuple((sid, p[k]) for sid, p in protocols.items())) for k in differ)
        apart.setdefault(found, []).append(label)
    notes = []
    for found, labels in apart.items():
        settings = "; ".join(
            f"{k} ({', '.join(f'{sid}: {v}' for sid, v in values)})" for k, values in found[:SHOWN]
        ) + (f"; and {len(found) - SHOWN} more" if len(found) > SHOWN else "")
        where = "; ".join(labels[:SHOWN]) + (
            f"; and {len(labels) - SHOWN} more" if len(labels) > SHOWN else ""
        )
        notes.append(
            f"{where}: the studies trained it under different settings, {settings}: its rows set one protocol's "
            f"runs beside another's, and the difference is theirs too; group by them as well (by="
            f"{','.join([*by, *(k for k, _ in found[:2])])}) to set them apart, or compare studies of one protocol"
        )
    return notes
