"""Comparing studies: success counts side by side, by model or by any trial field, with the
difference of two rates and its 95 % interval.

    comparison = compare_studies(ledger, ["3f9c…", "a71d…"], by=["cell", "seq_len"])

- Groups: `by` names fields — `model`, a varied value (`lr`, `scale`, `seed`, …) or any field of the
  resolved trial config (`cell`, `hidden`, `task`; a task's or a cell's own fields by their names,
  `seq_len`, `init`, or as `task.seq_len`, `cell.init`). `?by=cell,seq_len` is the cells × sequence
  lengths matrix the NRU and SRNN papers tabulate, one row per (group, study).
- Each study is judged under its own criterion (`trainers.Criterion`, through `summary.success_cell`),
  unless the request names one: then every study is judged under that one.
- Each rate has its 95 % Wilson interval. Each study after the first (the *reference*) gets the
  difference of its rate and the reference's in the same group, with Newcombe's hybrid score interval
  (`summary.newcombe_interval`; Stat. Med. 17:873, 1998, method 10).
- A run is its config (hash) trained to the same end (`run_of`). A run both studies hold (one reused
  the other's, or both ran the same config as far: the trainers are deterministic) counts in each
  study's own rate, and the row reports how many there are as `shared`; a config asha stopped in one
  study and trained further in another is two runs. The pooled rows (`study_id` null: one per group,
  and one over everything) count every distinct config of all the studies once, as its furthest run, judged under the reference study's criterion (or the
  one the request names). Newcombe's interval assumes independent samples; a shared run's outcomes in the
  two studies are positively correlated (the same loss, judged once or under two criteria), which
  only lowers the variance of the difference, so with shared runs the interval is conservative (wider
  than it need be). For a difference between disjoint samples, compare studies that share none.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Literal

from pydantic import BaseModel, Field

from service.core.criterion_query import OWN, SuccessQuery
from service.core.errors import StudyError, UnknownFieldError
from service.core.states import StudyState
from service.core.values import repr_value, value_sort_key
from service.reports.protocols import protocol_notes
from service.reports.summary import CriterionPublic, fisher_exact_p, newcombe_interval, success_cell
from service.store.ledger import Ledger
from service.store.models import Study, Trial
from service.tracking.links import MlflowLinks
from trainers import TRAINER_VERSION, Criterion

if TYPE_CHECKING:
    from service.tracking.tracker import Tracker

#: what a trial config holds beside its own fields (its task's and cell's fields are looked up in them)
NESTED = {"task": "task_params", "cell": "cell_params"}


class UnknownStudiesError(LookupError):
    """Study ids the ledger does not hold; the message names them."""


# ----- what a comparison answers (the REST API serves these types as they are) ---------------------

Scope = Literal["group", "total"]


class ComparedStudy(BaseModel):
    study_id: str
    name: str
    state: StudyState
    criterion: CriterionPublic = Field(description="what counted as a success in this study's rows")
    trials: int
    numerics: list[str] = Field(
        description="the numerics modes its trials computed with (trainers/numerics.py; 'unrecorded' "
        "for trials of a memsweep before TRAINER_VERSION 7)"
    )
    machines: list[str] = Field(
        description="where its trials' numbers came from: CPU model and ATen capability (provenance)"
    )


class ComparisonRow(BaseModel):
    """One study's cell in one group, and its difference from the reference study's."""

    scope: Scope = Field(description="a group of `by`, or all the trials")
    group: dict[str, str | None] = Field(
        description="field → value of this group (null: the trial lacks it; all null in total rows)"
    )
    study_id: str | None = Field(
        description="the study; null: pooled, every distinct run (config hash) of all the studies once, "
        "judged under the reference's criterion"
    )
    trials: int
    finished: int
    failed: int
    pruned: int = Field(
        default=0, description="stopped early by the scheduler (asha): runs that did not succeed"
    )
    errors: int = Field(description="trials whose worker, node or process died: no run, not counted")
    raised: int = Field(default=0, description="failed runs an exception ended (counted as not succeeded)")
    succeeded: int
    rate: float | None = Field(description="succeeded / finished; null when none finished (no estimate)")
    ci95: tuple[float, float] = Field(description="95 % Wilson score interval of the rate")
    difference: float | None = Field(description="rate − the reference study's rate in this group")
    difference_ci95: tuple[float, float] | None = Field(
        description="95 % Newcombe hybrid score interval of the difference (independent samples: "
        "conservative when runs are shared)"
    )
    difference_p: float | None = Field(
        default=None,
        description="two-sided p of Fisher's exact test of the two rates (independent samples); with few "
        "runs read it beside the interval, which is approximate there",
    )
    shared: int | None = Field(
        description="runs (a config trained to the same end) this study and the reference both hold here; "
        "in pooled rows, the runs it counts that more than one study holds"
    )


class Comparison(BaseModel):
    """Success counts of studies side by side, grouped by `by`, with differences from the first study."""

    by: list[str]
    at_step: int | None
    reference: str = Field(description="the study every difference is taken from (the first one named)")
    trainer_version: str
    studies: list[ComparedStudy]
    rows: list[ComparisonRow]
    notes: list[str] = Field(
        default_factory=list,
        description="what to know before reading the rows: the studies' numerics differ, or native "
        "numerics ran on different machines (their per-seed numbers are then not run-for-run comparable); a "
        "plugin's code differs between them; a group's studies trained it under different settings",
    )
    mlflow: MlflowLinks | None = Field(
        default=None, description="the comparison's MLflow run, with ?log=true"
    )


def field_value(t: Trial, name: str) -> Any:
    """A trial's value of a field: its model, a varied value, or a field of its resolved config
    (a task's or cell's field by its name, or as `task.x` / `cell.x`); None when it has none."""
    if name == "model":
        return t.model
    if name in t.params:
        return t.params[name]
    config = t.config or {}
    scope, _, field = name.rpartition(".")
    if scope:
        return (config.get(NESTED.get(scope, scope)) or {}).get(field)
    if name in config and name not in NESTED.values():
        return config[name]
    for nested in NESTED.values():
        if name in (config.get(nested) or {}):
            return config[nested][name]
    return None


def field_names(trials: Sequence[Trial]) -> list[str]:
    """Every field the trials can be grouped by."""
    names = {"model"}
    for t in trials:
        names.update(t.params)
        config = t.config or {}
        names.update(k for k in config if k not in NESTED.values())
        for nested in NESTED.values():
            names.update(config.get(nested) or {})
    return sorted(names)


def compare_studies(
    ledger: Ledger,
    study_ids: Sequence[str],
    by: Sequence[str] = ("model",),
    query: SuccessQuery = OWN,
) -> Comparison:
    """Success counts of the studies side by side, grouped by `by` (see the module docstring); every
    study under its own criterion unless the query names one, at the end of each run or at a budget of
    `query.at_step` steps."""
    ids = list(dict.fromkeys(i.strip() for i in study_ids if i.strip()))
    if len(ids) < 2:
        raise StudyError(
            f"studies: give at least two distinct study ids to compare (got {', '.join(ids) or 'none'}); "
            "e.g. `memsweep compare 3f9c2a1b7d4e a71d09c3b2e5` or ?studies=3f9c2a1b7d4e,a71d09c3b2e5 "
            "(`memsweep studies` or GET /studies lists them). The models of one study against one of "
            "them: `memsweep success ID --reference MODEL`, or GET /studies/{id}/success?reference=MODEL"
        )
    studies: list[Study] = []
    missing = []
    for i in ids:
        study = ledger.get_study(i)
        if study is None:
            missing.append(i)
        else:
            studies.append(study)
    if missing:
        raise UnknownStudiesError(
            f"no studies {', '.join(repr(m) for m in missing)} in the ledger; `memsweep studies` (or GET /studies) lists the studies"
        )
    fields = [f.strip() for f in by if f.strip()] or ["model"]
    trials = {s.id: ledger.trials(s.id) for s in studies}
    everything = [t for ts in trials.values() for t in ts]
    known = field_names(everything)
    unknown = [f for f in fields if f not in known and f.rpartition(".")[0] not in NESTED]
    if unknown:
        raise UnknownFieldError(unknown, known)
    criteria = {}
    for s in studies:
        try:
            criteria[s.id] = s.validated_spec().criterion_for(query)
        except StudyError as exc:
            raise StudyError(f"study {s.id}: {exc}") from None
    groups: dict[tuple[str | None, ...], dict[str, list[Trial]]] = defaultdict(lambda: defaultdict(list))
    for s in studies:
        for t in trials[s.id]:
            key = tuple(None if (v := field_value(t, f)) is None else repr_value(v) for f in fields)
            groups[key][s.id].append(t)
    reference = studies[0].id
    rows: list[ComparisonRow] = []
    for key in sorted(groups, key=lambda k: tuple(value_sort_key(v or "") for v in k)):
        group = dict(zip(fields, key, strict=True))
        rows += _rows("group", group, groups[key], studies, criteria, reference, query.at_step)
        rows.append(_pooled("group", group, groups[key], criteria[reference], query.at_step))
    rows += _rows("total", dict.fromkeys(fields), trials, studies, criteria, reference, query.at_step)
    rows.append(_pooled("total", dict.fromkeys(fields), trials, criteria[reference], query.at_step))
    where = {s.id: numerics_of(trials[s.id]) for s in studies}
    return Comparison(
        by=fields,
        at_step=query.at_step,
        reference=reference,
        trainer_version=TRAINER_VERSION,
        studies=[
            ComparedStudy(
                study_id=s.id,
                name=s.name,
                state=StudyState(s.state),
                criterion=CriterionPublic.of(criteria[s.id]),
                trials=len(trials[s.id]),
                numerics=where[s.id][0],
                machines=where[s.id][1],
            )
            for s in studies
        ],
        rows=rows,
        notes=numerics_notes([(s.id, *where[s.id]) for s in studies])
        + plugin_notes(trials)
        + protocol_notes(groups, fields),
    )


def plugin_notes(trials: Mapping[str, Sequence[Trial]]) -> list[str]:
    """A plugin whose trials in these studies ran different versions of its code (their provenance's
    `plugin.cell` / `plugin.task`): their rows set one code's runs beside another's under one name."""
    ran = plugin_versions({sid: [t.provenance for t in rows] for sid, rows in trials.items()})
    # the cell's (task's) name the studies use, beside its distribution's: "the cell leaky (plugin memsweep-leaky)"
    names: dict[str, set[str]] = defaultdict(set)
    for rows in trials.values():
        for t in rows:
            for field, identity in (t.provenance or {}).items():
                kind = field.removeprefix("plugin.")
                if field.startswith("plugin.") and (name := (getattr(t, "config", None) or {}).get(kind)):
                    names[f"{kind} {identity.split('==')[0]}"].add(str(name))

    def called(plugin: str) -> str:
        kind, _, dist = plugin.partition(" ")
        return (
            f"{kind} {', '.join(sorted(names[plugin]))} (plugin {dist})"
            if names[plugin]
            else f"{plugin} plugin"
        )

    return [
        f"the {called(plugin)} ran different code in these studies ("
        + "; ".join(f"{identity}: {', '.join(sorted(sids))}" for identity, sids in sorted(versions.items()))
        + "): its rows set one version's runs beside another's, and the pooled rows count both"
        for plugin, versions in sorted(ran.items())
        if len(versions) > 1
    ]


def plugin_versions(
    provenances: Mapping[str, Iterable[Mapping[str, str] | None]],
) -> dict[str, dict[str, set[str]]]:
    """Each plugin that trials' provenances name (`plugin.cell` / `plugin.task`), as "cell
    memsweep-cornn", → each identity (distribution, version and code digest) it ran under → the keys
    (studies) whose trials ran that one; more than one identity: its code differed between them."""
    seen: dict[str, dict[str, set[str]]] = defaultdict(lambda: defaultdict(set))
    for key, provenance in provenances.items():
        for p in provenance:
            for field, identity in (p or {}).items():
                if field.startswith("plugin."):
                    seen[f"{field.removeprefix('plugin.')} {identity.split('==')[0]}"][identity].add(key)
    return seen


def numerics_of(trials: Sequence[Trial]) -> tuple[list[str], list[str]]:
    """(the numerics modes a study's trials computed with, the machines its finished trials' numbers
    came from: CPU model and ATen capability, from their provenance)."""
    modes = sorted({str((t.config or {}).get("numerics", "unrecorded")) for t in trials})
    machines = sorted(
        {f"{p['cpu']} ({p.get('capability', '?')})" for t in trials if (p := t.provenance) and "cpu" in p}
    )
    return modes, machines


def numerics_notes(studies: Sequence[tuple[str, list[str], list[str]]]) -> list[str]:
    """What a reader of a comparison must know of its studies' numerics (trainers/numerics.py)."""
    notes = []
    modes = {sid: m for sid, m, _ in studies}
    if len({tuple(m) for m in modes.values()}) > 1 or any(len(m) > 1 for m in modes.values()):
        notes.append(
            "the studies computed with different numerics modes ("
            + "; ".join(f"{sid}: {', '.join(m)}" for sid, m in modes.items())
            + "): the same config gives other numbers in another mode, so runs compare as samples, not run for run"
        )
    native = {sid: machines for sid, m, machines in studies if "native" in m and machines}
    if len({machine for v in native.values() for machine in v}) > 1:
        notes.append(
            "native numerics ran on different machines ("
            + "; ".join(f"{sid}: {', '.join(v)}" for sid, v in native.items())
            + "): their numbers depend on the CPU; the portable mode gives the same numbers on any x86-64 CPU with AVX2"
        )
    return notes


def log_comparison(comparison: Comparison, tracker: Tracker) -> tuple[str, str]:
    """A comparison as its own MLflow run (its table as CSV and JSON, its figure): (experiment id,
    run id). The REST `GET /compare?log=true` and `memsweep compare --mlflow` both log through here."""
    from service.reports.plots import comparison_rates
    from service.reports.tables import comparison_csv

    data = comparison.model_dump(mode="json", exclude={"mlflow"})  # the run's own links are not in it
    return tracker.log_comparison(data, comparison_csv(data), comparison_rates(data))


def _rows(
    scope: Scope,
    group: dict[str, str | None],
    members: Mapping[str, Sequence[Trial]],
    studies: Sequence[Study],
    criteria: Mapping[str, Criterion],
    reference: str,
    at_step: int | None,
) -> list[ComparisonRow]:
    """One row per study: its cell in this group, and its difference from the reference study's."""
    cells = {s.id: success_cell(members.get(s.id, []), criteria[s.id], at_step) for s in studies}
    ref, ref_runs = cells[reference], {run_of(t) for t in members.get(reference, [])}
    rows = []
    for s in studies:
        cell = cells[s.id]
        row = ComparisonRow(scope=scope, group=group, study_id=s.id, **cell.model_dump(), difference=None,
                            difference_ci95=None, shared=None)  # fmt: skip
        if s.id != reference and cell.rate is not None and ref.rate is not None:
            row.difference = cell.rate - ref.rate
            row.difference_ci95 = newcombe_interval(
                cell.succeeded, cell.finished, ref.succeeded, ref.finished
            )
            row.difference_p = fisher_exact_p(cell.succeeded, cell.finished, ref.succeeded, ref.finished)
            row.shared = len(ref_runs & {run_of(t) for t in members.get(s.id, [])})
        rows.append(row)
    return rows


def run_of(t: Trial) -> tuple[str, str, int | None]:
    """What makes two studies' trials one run: the config (its hash) trained as far, to the same end (a
    run asha stopped at step 100 and one of the same config trained to its budget are two runs; two
    runs of one config to the same end compute the same numbers)."""
    return t.config_hash, t.status, t.steps


def _further(t: Trial, than: Trial) -> bool:
    """Whether run `t` of a config went further than `than`: finished `done` over stopped or failed,
    then more steps."""
    return (t.status == "done", t.steps or 0) > (than.status == "done", than.steps or 0)


def _pooled(
    scope: Scope,
    group: dict[str, str | None],
    members: Mapping[str, Sequence[Trial]],
    criterion: Criterion,
    at_step: int | None,
) -> ComparisonRow:
    """Every distinct config of the studies in this group once, as its furthest run (one study's run
    that asha stopped, another's of the same config trained to its end: the end, not the stopped one);
    `shared`: the runs more than one study holds (`run_of`)."""
    runs: dict[str, Trial] = {}
    holders: dict[tuple[str, str, int | None], int] = defaultdict(int)
    for ts in members.values():
        for t in ts:
            kept = runs.get(t.config_hash)
            if kept is None or _further(t, kept):
                runs[t.config_hash] = t
            holders[run_of(t)] += 1
    cell = success_cell(list(runs.values()), criterion, at_step)
    shared = sum(holders[run_of(t)] > 1 for t in runs.values())  # of the runs it counts
    return ComparisonRow(scope=scope, group=group, study_id=None, **cell.model_dump(), difference=None,
                         difference_ci95=None, shared=shared)  # fmt: skip
