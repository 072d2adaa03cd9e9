"""Trials made under other code than the code loaded now: their stored hash is not what their config
gives today (another TRAINER_VERSION, THREADED_VERSION, or a plugin's code edited or upgraded since).
What an extension, a resume or a plan says about them, and why (`service.study.engine`,
`service.planning.plan`)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import trainers
from service.reports.compare import plugin_versions
from service.store.models import Trial
from trainers import plugins


def other_code(remade: Sequence[Trial], of: int) -> tuple[list[str], str]:
    """Why trials (`remade`, of `of`) were made under other code than the code loaded now, and the fix:
    a plugin's identity then (their provenance, as `memsweep compare` reads it) and now, else the trainer
    version (or, with no provenance to tell, a plugin's code)."""
    ran = plugin_versions({"then": [r.provenance for r in remade], "now": [plugins_now(r) for r in remade]})
    edited = {plugin: ids for plugin, ids in ran.items() if len(ids) > 1}
    if edited:
        return [
            f"{part_of(len(remade), of)}the {plugin} plugin changed (its version or its code) since they "
            "were made (then "
            + ", ".join(sorted(i for i, keys in ids.items() if "then" in keys))
            + "; now "
            + ", ".join(sorted(i for i, keys in ids.items() if "now" in keys))
            + ")"
            for plugin, ids in sorted(edited.items())
        ], (
            "put the plugin they ran back (that version, its files as they were: the digest is of them; a "
            "`memsweep serve` that runs the study then restarts), or create a new study for the new code "
            "(memsweep compare then sets the two side by side, naming each one's code)"
        )
    used = sorted({i for r in remade for i in plugins_now(r).values()})
    return [
        f"{part_of(len(remade), of)}they were made under another trainer version (TRAINER_VERSION "
        f"{trainers.TRAINER_VERSION} now, or THREADED_VERSION for several threads)"
        + (f", or other code of the plugins they use (now {', '.join(used)})" if used else "")
    ], (
        "create a new study from the same spec to train them under this version (finished trials "
        "this ledger holds are reused)"
    )


def drawn_under_other_code(rows: Sequence[Trial], doing: str) -> str | None:
    """Why a sampled study may not draw more points (`doing`: an extension, a resume): the points it drew
    were made under other code (a plugin's edited since, another trainer version), and new draws under
    today's would mix the two in its sampler's history and its tables (before, only `memsweep compare`
    noticed). None when every drawn point's config hashes today as it did."""
    remade = [r for r in rows if hash_today(r.config) != r.config_hash]
    if not remade:
        return None
    causes, fix = other_code(remade, len(rows))
    return (
        f"{doing} would draw new points beside {len(rows)} drawn under other code: {'; '.join(causes)}; "
        f"its sampler's history and its tables would mix the two. {fix[:1].upper()}{fix[1:]}"
    )


def hash_today(config: Mapping[str, Any]) -> str | None:
    """A stored config's hash under the code loaded now; None when it no longer resolves (a setting
    renamed since, in a trainer version or a plugin): made under other code, as a hash that moved."""
    try:
        return trainers.resolve(config).config_hash()
    except (trainers.ConfigError, trainers.UnknownNameError):
        return None


def part_of(part: int, total: int) -> str:
    """ "3 of them: " where a cause holds for some of the trials, nothing where it holds for all."""
    return "" if part == total else f"{part} of them: "


def plugins_now(row: Trial) -> dict[str, str]:
    """The plugins a trial's cell and task come from as this process loaded them, as a provenance."""
    ids = plugins.identities(row.config["cell"], row.config["task"])
    return {f"plugin.{kind}": identity for kind, identity in ids.items()}
