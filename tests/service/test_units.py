"""Fast unit tests of the engine's pieces: spec, ledger, summary statistics (no Ray, no MLflow)."""

import math
import re
import subprocess
import sys
from types import SimpleNamespace
from typing import Any

import pytest
from pydantic import ValidationError

from service.core.errors import StudyError
from service.core.spec import STORED, StudySpec
from service.core.trial import Evaluated, Finished, objective
from service.reports.summary import (
    best_configs,
    henrici_table,
    loss_by_scale,
    profile_table,
    success_table,
    wilson_interval,
)
from service.store.ledger import Ledger
from service.study.search import check_space, grid_trials, materialize, study_space
from trainers import HALF_BASELINE, Criterion


def test_wilson_interval_known_values():
    lo, hi = wilson_interval(46, 462)  # Orhan's chain on copy-500
    assert (round(lo, 4), round(hi, 4)) == (0.0755, 0.1303)  # by hand: centre 0.10287 ± 0.02739
    assert wilson_interval(0, 594)[0] == 0.0 and 0.006 < wilson_interval(0, 594)[1] < 0.007
    lo, hi = wilson_interval(5, 5)
    assert hi == 1.0 and 0.5 < lo < 0.6


def test_a_preset_with_a_space_keeps_the_space_models_that_models_names():
    """`preset` and `space` together add the space's models beside the preset's; `models: [chain, x]`
    naming one of them was refused, "'x' is no model of preset"."""
    spec = StudySpec.model_validate(
        {"preset": "orhan2020-copy500", "models": ["chain", "x"], "dims": {"lr": [1e-3], "scale": [1.0]},
         "space": {"models": {"x": {"fixed": {"init": "orthogonal"}, "dims": {"lr": [3e-4]}}}}}
    )  # fmt: skip
    assert [m.name for m in spec.search_space().models] == ["chain", "x"]
    with pytest.raises(ValueError, match="'y' is no model of preset 'orhan2020-copy500'"):
        spec.model_copy(update={"models": ["chain", "y"]}).search_space()


def test_spec_needs_a_space_and_max_trials_for_samplers():
    with pytest.raises(ValidationError, match="preset"):
        StudySpec()
    with pytest.raises(ValidationError, match="max_trials"):
        StudySpec(preset="orhan2020-copy500", sampler="tpe")
    with pytest.raises(ValidationError, match="sampler"):
        StudySpec(preset="orhan2020-copy500", sampler="bayes")


def test_preset_with_overrides():
    spec = StudySpec(
        preset="orhan2020-copy500", models=["chain"], dims={"lr": [1e-4]}, seeds=[1, 2], base={"steps": 10}
    )
    space = spec.search_space()
    assert space.size() == 7 * 2  # 7 α values × 1 lr × 2 seeds
    assert space.base["steps"] == 10 and space.base["seq_len"] == 500


def test_bad_fields_are_named_before_anything_runs():
    spec = StudySpec(space={"dims": {"lr": [1e-3]}}, base={"task": "addition", "seq_lenn": 20})
    with pytest.raises(StudyError, match=r"unknown config field 'seq_lenn'; did you mean 'seq_len'\?"):
        check_space(spec.search_space())
    spec = StudySpec(space={"dims": {"init": ["chain", "spiral"]}})
    rows_spec = spec.search_space()
    with pytest.raises(ValueError, match="spiral"):
        grid_trials(rows_spec, {})


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ({"preset": "sgornn2022-addition", "base": {"rotatons": 3}},
         r"base.rotatons is a setting of none of this study's cells \(fastrnn, lstm, sgornn, vprnn\).*rotations"),
        ({"preset": "orhan2020-copy500", "models": ["chain", "lstm"], "base": {"fb_froward": 0.5}},
         r"base.fb_froward is a setting of none of this study's cells \(lstm, rnn\).*fb_forward"),
    ],
)  # fmt: skip
def test_a_misspelt_cell_setting_of_a_study_of_several_cells_is_refused(spec, message):
    """With several cells, a base setting goes to the models whose cell takes it; one that no cell takes
    was dropped without a word (with one cell it was refused as an unknown field)."""
    with pytest.raises(StudyError, match=message):
        study_space(StudySpec.model_validate(spec), 50_000)


def test_a_cell_setting_of_a_study_of_several_cells_goes_to_the_cells_that_take_it():
    spec = {"preset": "orhan2020-copy500", "models": ["chain", "lstm"], "base": {"fb_forward": 0.5}}
    models = {m.name: m for m in study_space(StudySpec.model_validate(spec), 50_000).models}
    assert models["chain"].fixed["fb_forward"] == 0.5 and "fb_forward" not in models["lstm"].fixed


@pytest.mark.parametrize(
    "spec",
    [
        {"preset": "orhan2020-copy500", "base": {"seed": 3}},  # was overwritten by the preset's seeds
        {"space": {"dims": {"seed": [1, 2]}}},  # was two trials of one hash, both seed 1
        {"space": {"models": {"a": {"fixed": {"seed": 2}}}}},
    ],
)
def test_seed_as_a_setting_is_refused_pointing_to_seeds(spec):
    with pytest.raises(ValidationError, match=r"seed is not a setting .*write `seeds: \[1, 2, 3\]`"):
        StudySpec.model_validate(spec)


@pytest.mark.parametrize(
    ("seeds", "said"),
    [
        ("1,2", "'1,2' is text, not a list; write seeds: [1, 2]"),  # YAML's `seeds: "1,2"`
        ("[1, 2]", "'[1, 2]' is text, not a list; write seeds: [1, 2]"),  # a list in quotes
        ("1 2 3", "'1 2 3' is text, not a list; write seeds: [1, 2, 3]"),
        ("a,b", "'a,b' is text, not a list; write seeds: [1, 2, 3]"),  # no seeds in it: the form
        (3, "3 is one number, not a list; write seeds: [3]"),
        ({"a": 1}, "{'a': 1} is a mapping, not a list; write seeds: [1, 2, 3]"),
    ],
)
def test_seeds_not_a_list_are_refused_naming_the_field_the_form_and_the_fix(seeds, said):
    """`seeds: "1,2"` answered `seeds: Input should be a valid list`: not what was given, the form, or
    the fix. As the CLI and REST say it (`invalid_fields`), and the same for an extension's seeds."""
    from service.application.records import StudyExtend
    from service.core.errors import invalid_fields

    with pytest.raises(ValidationError) as refused:
        StudySpec.model_validate({"preset": "orhan2020-copy500", "seeds": seeds})
    (line,) = invalid_fields(refused.value.errors(), StudySpec)[1]
    assert line.startswith(f"seeds: {said} (") and "seeds are a list of whole numbers" in line, line
    assert "on the command line: --seeds " in line and "in JSON: " in line, line
    with pytest.raises(ValidationError, match=re.escape(said)):
        StudyExtend.model_validate({"seeds": seeds})


def test_a_continuous_range_over_a_whole_number_field_is_refused_before_a_draw():
    """Only the range's ends were tried (8.0 and 64.0 pass as whole numbers); the sampler's first draw
    then failed the study in its driver."""
    spec = StudySpec.model_validate(
        {"space": {"dims": {"hidden": {"uniform": [8, 64]}}}, "sampler": "random", "max_trials": 3}
    )
    with pytest.raises(
        StudyError, match=r"hidden = .* is not an integer \(for whole numbers, write hidden as \{int"
    ):
        study_space(spec, 50_000)
    spec = StudySpec.model_validate(
        {"space": {"dims": {"hidden": {"int": [8, 64], "log": True}}}, "sampler": "random", "max_trials": 3}
    )
    assert study_space(spec, 50_000) is not None


@pytest.mark.parametrize("seed", [-1, 2**31])
def test_a_sampler_seed_out_of_range_is_refused_at_the_door(seed):
    with pytest.raises(ValidationError, match="sampler_seed"):
        StudySpec.model_validate({"preset": "orhan2020-copy500", "sampler_seed": seed})


def grid(seeds=(1, 2)):
    spec = StudySpec(
        space={"dims": {"lr": [1e-3, 1e-4]}},
        base={"task": "addition", "seq_len": 10, "steps": 2},
        seeds=list(seeds),
    )
    return grid_trials(spec.search_space(), {})


def test_grid_trials_have_distinct_hashes_and_seeds_in_params():
    rows = grid()
    assert len(rows) == 4 and len({r.config_hash for r in rows}) == 4
    assert sorted(r.params["seed"] for r in rows) == [1, 1, 2, 2]
    assert all(r.config_hash == r.resolved.config_hash() for r in rows)


def test_a_keyed_study_and_its_trials_are_made_once_even_when_the_creation_is_sent_again(tmp_path):
    """`Ledger.create_study` is retried when its commit's answer is lost (`service.store.patience`):
    the retry finds the study its key is bound to, and makes no second one."""
    ledger = Ledger(f"sqlite:///{tmp_path / 'l.db'}")
    assert ledger.claim_key("k", "digest")[0]
    first = ledger.create_study("a", {}, grid(), key="k")
    again = ledger.create_study("a", {}, grid(), key="k")
    assert again.id == first.id and [s.id for s in ledger.list_studies()] == [first.id]
    assert len(ledger.trials(first.id)) == 4


def test_ledger_adds_only_new_hashes_and_reuses_finished_results(tmp_path):
    ledger = Ledger(f"sqlite:///{tmp_path / 'l.db'}")
    a = ledger.create_study("a", {})
    assert ledger.add_trials(a.id, grid()) == 4
    assert ledger.add_trials(a.id, grid(seeds=(1, 2, 3))) == 2  # extending adds only the new points
    first = ledger.trials(a.id)[0]
    from trainers import TrialResult

    row = ledger.finish_trial(first.id, TrialResult(final_val_loss=0.01, baseline_loss=1 / 6))
    assert row.succeeded(HALF_BASELINE) and row.result().final_val_loss == 0.01
    b = ledger.create_study("b", {})
    ledger.add_trials(b.id, grid())
    reused = [t for t in ledger.trials(b.id) if t.reused_from is not None]
    assert len(reused) == 1 and reused[0].config_hash == first.config_hash and reused[0].status == "done"
    assert ledger.counts(b.id)["done"] == 1 and ledger.counts(b.id)["pending"] == 3


class T:
    def __init__(self, model, params, loss, status="done", thr=0.1, henrici=None, profile=None):
        self.model, self.params, self.final_val_loss, self.status = model, params, loss, status
        self.baseline_loss, self.reference_baselines, self.steps = 2 * thr, {}, 20
        self.history, self.config_hash = [], str(id(self))
        self.henrici_index, self.profile = henrici, profile


def test_success_table_counts_by_model_and_value():
    trials = [T("chain", {"lr": 1e-3, "seed": 1}, 0.05), T("chain", {"lr": 1e-3, "seed": 2}, 0.2),
              T("chain", {"lr": 1e-4, "seed": 1}, None, "failed"), T("orth", {"lr": 1e-3, "seed": 1}, 0.5)]  # fmt: skip
    table = success_table(trials)
    assert table.by_model["chain"].succeeded == 1 and table.by_model["chain"].trials == 3
    assert table.by_model["chain"].failed == 1 and table.total.succeeded == 1
    assert table.by_value["chain"]["lr"]["0.001"].succeeded == 1
    assert table.by_value["chain"]["lr"]["0.0001"].trials == 1


def test_runs_that_raised_are_counted_apart_in_every_cell_and_named_in_the_notes():
    """A failed run with a traceback raised an exception (a bug in a cell, not the protocol's failure): the
    rate still counts it, as a run that did not succeed, but each cell says how many, and the table's
    notes name the models, so a crashing cell's 0 % no longer reads as a cell that could not learn."""
    crashed = [T("mine", {"lr": lr, "seed": 1}, None, "failed") for lr in (1e-3, 1e-4)]
    for t in crashed:
        t.traceback = "Traceback (most recent call last): …\nRuntimeError: shape mismatch"
    diverged = T("chain", {"lr": 1e-2, "seed": 1}, None, "failed")  # a loss not finite: no traceback
    table = success_table([*crashed, diverged, T("chain", {"lr": 1e-3, "seed": 1}, 0.05)])
    assert (table.by_model["mine"].raised, table.by_model["mine"].failed) == (2, 2)
    assert (table.by_model["chain"].raised, table.by_model["chain"].failed) == (0, 1)
    assert table.total.raised == 2 and table.by_value["mine"]["lr"]["0.001"].raised == 1
    assert table.by_model["mine"].rate == 0.0  # still counted, as the docs say
    (note,) = table.notes
    assert "raised an exception" in note and "mine 2 of 2" in note and "chain" not in note
    assert success_table([diverged]).notes == []


def test_a_rate_is_over_the_runs_that_finished_not_the_trials_still_to_run():
    """A study under way, or cancelled: 2 runs done, both successes, 6 not run yet. The rate is 2/2
    with 2/2's interval; it was 2/8 with an interval as if 6 runs had failed, and a model none of whose
    runs had ended showed 0.000 [0, 0.24] instead of no estimate."""
    from service.reports.summary import wilson_interval

    done = [T("chain", {"seed": s}, 0.05) for s in (1, 2)]
    waiting = [T("chain", {"seed": s}, None, status) for s, status in
               [(3, "pending"), (4, "running"), (5, "cancelled"), (6, "pending"), (7, "pending"), (8, "pending")]]  # fmt: skip
    never = [T("antisym", {"seed": s}, None, "cancelled") for s in (1, 2)]
    table = success_table(done + waiting + never, reference="antisym")
    chain = table.by_model["chain"]
    assert (chain.trials, chain.finished, chain.succeeded, chain.rate) == (8, 2, 2, 1.0)
    assert chain.ci95 == wilson_interval(2, 2)
    unrun = table.by_model["antisym"]
    # no estimate: a rate of 0.0 read as "every run failed" (the client, the CLI, MLflow's metric)
    assert (unrun.trials, unrun.finished, unrun.rate, unrun.ci95) == (2, 0, None, (0.0, 1.0))
    assert table.differences["antisym"].difference is None
    assert (
        table.differences is not None and table.differences["chain"].difference is None
    )  # none to set against
    slow = T("chain", {"seed": 9}, None, "running")
    slow.history = [{"step": 10, "val_loss": 0.05}]  # at a budget it reached, a running trial has a result
    assert success_table([slow], at_step=10).total.finished == 1
    assert success_table([slow], at_step=5).total.finished == 0
    # nor at a budget it has not reached yet (it counted there as a run, with its latest loss)
    assert success_table([slow], at_step=100_000).total.finished == 0
    # a cancelled trial at a budget it reached is judged against its task's baseline; one stored without
    # it (cancelled before its baselines were recorded) cannot be judged: no run there, not a failure
    stopped = T("chain", {"seed": 10}, None, "cancelled")
    stopped.history = [{"step": 10, "val_loss": 0.05}]
    cell = success_table([stopped], at_step=10).total
    assert (cell.finished, cell.succeeded) == (1, 1)
    stopped.baseline_loss = None
    assert success_table([stopped], at_step=10).total.finished == 0
    # a threshold needs no baseline: a running trial (which carries none) that reached it is judged there
    slow.baseline_loss = None
    at_threshold = success_table([slow, stopped], Criterion(fraction=None, threshold=0.1), at_step=10).total
    assert (at_threshold.finished, at_threshold.succeeded) == (2, 2)


def test_best_configs_pool_seeds():
    trials = [T("chain", {"lr": 1e-3, "seed": 1}, 0.05), T("chain", {"lr": 1e-3, "seed": 2}, 0.15),
              T("chain", {"lr": 1e-4, "seed": 1}, 0.08)]  # fmt: skip
    best = best_configs(trials, k=2)
    assert best[0].params == {"lr": 1e-4} and best[1].mean_final_val_loss == pytest.approx(0.1)
    assert best[1].sem == pytest.approx(0.05 / math.sqrt(2) * math.sqrt(2))


def test_a_point_some_seed_of_which_was_pruned_ranks_after_the_complete_ones():
    """ASHA pruned seed 1 of a point at 0.398 and let seed 2 end at 0.0999: ranked on that one seed,
    the point came first (s.e.m. 0, "seeds 1, 2"); it comes after the points whose every seed ended."""
    trials = [T("chain", {"lr": 6e-3, "seed": 1}, 0.398, "pruned"), T("chain", {"lr": 6e-3, "seed": 2}, 0.0999),
              T("chain", {"lr": 1e-3, "seed": 1}, 0.10), T("chain", {"lr": 1e-3, "seed": 2}, 0.11)]  # fmt: skip
    best = best_configs(trials)
    assert [b.params["lr"] for b in best] == [1e-3, 6e-3]
    assert (
        best[1].seeds == [2] and best[1].trials == 2 and best[1].mean_final_val_loss == pytest.approx(0.0999)
    )


def test_henrici_profiles_and_loss_by_scale_use_the_right_trials():
    trials = [T("orth", {"scale": 1.0, "seed": 1}, 0.05, henrici=2.0, profile=[0.0, 1.0, 0.0]),
              T("orth", {"scale": 1.0, "seed": 2}, 0.07, henrici=3.0, profile=[0.0, 3.0, 0.0]),
              T("orth", {"scale": 0.5, "seed": 1}, 0.5, henrici=9.0, profile=[9.0, 9.0, 9.0])]  # fmt: skip
    h = henrici_table(trials)["orth"]  # successful trials only (loss < 0.1)
    assert h["mean"] == 2.5 and h["n"] == 2 and h["sem"] == pytest.approx(0.5)
    p = profile_table(trials)["orth"]
    assert p["offsets"] == [-1, 0, 1] and p["mean"] == [0.0, 2.0, 0.0] and p["n"] == 2
    rows = loss_by_scale(trials)["orth"]
    assert [r["scale"] for r in rows] == [0.5, 1.0] and rows[1]["mean"] == pytest.approx(0.06)
    assert [r["scale"] for r in loss_by_scale(trials, below=0.2)["orth"]] == [1.0]


def test_success_plot_accepts_all_and_none_successful():
    from service.reports.plots import success_bars

    trials = [T("chain", {"seed": s}, 0.01) for s in range(4)] + [
        T("orth", {"seed": s}, 0.5) for s in range(4)
    ]
    png = success_bars(success_table(trials).model_dump(mode="json"), "all or nothing")
    assert png[:8] == b"\x89PNG\r\n\x1a\n"


def test_success_counts_are_written_over_their_error_bars():
    """ "8/9" sat on its error bar and "0/9" on the axis: each count is written at its bar's upper error,
    inside the axes."""
    from service.reports.plots import success_figure

    trials = [T("chain", {"seed": s}, 0.01 if s < 8 else 0.5) for s in range(9)]
    trials += [T("orth", {"seed": s}, 0.5) for s in range(9)]
    table = success_table(trials).model_dump(mode="json")
    ax = success_figure(table, "labels").axes[0]
    labels = {t.get_text(): t.xy[1] for t in ax.texts}
    for model, label in (("chain", "8/9"), ("orth", "0/9")):
        upper = 9 * table["by_model"][model]["ci95"][1]
        assert labels[label] == pytest.approx(upper) and labels[label] < ax.get_ylim()[1]
    assert labels["0/9"] > 0


def test_figures_drawn_in_threads_at_once_use_no_pyplot():
    """Studies and requests draw figures in threads at once: pyplot's current figure and its figure
    manager are global, and importing the plots switched the whole process's backend to Agg. Each
    figure is its own Figure now; a fresh process that draws one has not loaded pyplot."""
    code = (
        "import sys; from concurrent.futures import ThreadPoolExecutor; "
        "from service.reports.plots import success_bars; "
        "table = {'by_model': {m: {'succeeded': 1, 'finished': 2, 'ci95': [0.1, 0.9]} for m in 'ab'}}; "
        "pngs = list(ThreadPoolExecutor(4).map(lambda i: success_bars(table, str(i)), range(8))); "
        "print(all(p[:4] == b'\\x89PNG' for p in pngs), 'matplotlib.pyplot' in sys.modules)"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["True", "False"]


def test_a_failed_seeds_non_finite_evaluation_does_not_break_the_best_curve_or_its_figures():
    """A seed that failed at a NaN or infinite loss keeps that evaluation in its history; the best
    configuration's mean curve over seeds (statistics.stdev raises on those) has no s.e.m. there,
    and the study's figures are still drawn."""
    from service.reports.plots import study_figures
    from service.reports.summary import mean_curve, success_vs_budget

    ok = T("chain", {"lr": 1e-3, "seed": 1}, 0.05)
    ok.history = [{"step": 10, "val_loss": 0.3}, {"step": 20, "val_loss": 0.05}]
    for bad in (math.nan, math.inf):
        failed = T("chain", {"lr": 1e-3, "seed": 2}, None, "failed")
        failed.history = [{"step": 10, "val_loss": 0.2}, {"step": 20, "val_loss": bad}]
        curve = mean_curve([ok, failed])
        assert curve[0] == {"step": 10, "mean": 0.25, "sem": pytest.approx(0.05), "n": 2}
        assert curve[1]["n"] == 2 and math.isnan(curve[1]["sem"])
        trials = [ok, failed]
        summary = {  # plain data, as `reports.study_summary.summarise` makes it
            "name": "s",
            "success": success_table(trials).model_dump(mode="json"),
            "success_vs_budget": success_vs_budget(trials).model_dump(mode="json"),
            "best_per_model": {
                "chain": [b.model_dump(mode="json") for b in best_configs(trials, model="chain")]
            },
        }
        figures = study_figures(trials, summary, HALF_BASELINE)
        assert all(png[:8] == b"\x89PNG\r\n\x1a\n" for png in figures.values()) and figures


def test_log_batch_requests_respect_mlflow_limits_and_lose_nothing() -> None:
    from service.tracking.batches import MAX_BATCH_ENTITIES, MAX_BATCH_PARAMS, batches

    for n_params, n_metrics, n_tags in [(0, 0, 0), (3, 5, 1), (250, 40, 0), (60, 2500, 2), (100, 900, 0)]:
        params, metrics, tags = list(range(n_params)), list(range(n_metrics)), list(range(n_tags))
        out = batches(params, metrics, tags)
        assert [x for b in out for x in b.params] == params
        assert [x for b in out for x in b.metrics] == metrics
        assert [x for b in out for x in b.tags] == tags
        for b in out:
            assert len(b.params) <= MAX_BATCH_PARAMS
            assert len(b.params) + len(b.metrics) + len(b.tags) <= MAX_BATCH_ENTITIES
        floor = max(
            1, -(-n_params // MAX_BATCH_PARAMS), -(-(n_params + n_metrics + n_tags) // MAX_BATCH_ENTITIES)
        )
        assert len(out) == floor  # as few requests as the limits allow


def test_lstm_table3_initialisers_are_selectable_in_the_preset_and_in_a_spec():
    rows = [r.config for r in grid_trials(StudySpec(preset="orhan2020-lstm-ptbchar").search_space(), {})]
    assert {r["cell_params"]["init"] for r in rows} == {"plain", "orthogonal", "chain", "mixed"}
    assert {r["cell"] for r in rows} == {"lstm"} and len(rows) == 24
    spec = StudySpec.model_validate(
        {"space": {"models": {"mixed": {"fixed": {"cell": "lstm", "init": "mixed"}, "dims": {"lr": [1e-3]}}}},
         "base": {"task": "copy", "seq_len": 30}}
    )  # fmt: skip
    (row,) = grid_trials(spec.search_space(), {})
    assert row.config["cell"] == "lstm" and row.config["cell_params"]["init"] == "mixed"
    with pytest.raises(StudyError, match="init"):
        check_space(StudySpec(space={"dims": {"init": ["chained"]}}, base={"cell": "lstm"}).search_space())


def test_a_trials_weight_profile_comes_from_a_unit_pulse_of_input():
    """Orhan §3.2: "a unit pulse of input" at t=0 — through the trained input weights V."""
    import torch

    import trainers
    from trainers.analysis import henrici_index, network_profile

    resolved = materialize({"task": "addition", "seq_len": 10, "n_train": 32, "n_val": 16, "hidden": 6,
                            "steps": 4, "init": "orthogonal"})  # fmt: skip
    result = trainers.train(resolved)
    w, v = result.recurrent_matrix, result.input_matrix
    assert w.shape == (6, 6) and v.shape == (6, 2)
    expected = network_profile(w, v.sum(dim=1), nonlinearity="relu").mean
    assert result.profile == pytest.approx(expected)
    assert result.profile != pytest.approx(network_profile(w, torch.ones(6), nonlinearity="relu").mean)
    assert result.henrici_index == henrici_index(w)


def test_grid_and_sampled_points_layer_settings_the_same_way():
    """base < the model's fixed fields < the point's values < execution settings < the seed."""
    from search_spaces import Model, SearchSpace, Values
    from service.study.search import point_trials

    model = Model("m", {"init": "chain", "lr": 0.5}, {"lr": Values((1e-3,))})
    space = SearchSpace(
        "s", (model,), seeds=(3,), base={"task": "addition", "init": "identity", "threads": 4}
    )
    (grid,) = grid_trials(space, {"threads": 1})
    (point,) = point_trials(space, model, {"lr": 1e-3}, {"threads": 1})
    assert grid == point and grid.params == {"lr": 1e-3, "seed": 3}
    c = grid.config
    assert (c["cell_params"]["init"], c["lr"], c["threads"], c["seed"]) == ("chain", 1e-3, 1, 3)


def spec_parser() -> Any:
    """The parser of `memsweep run TARGET [spec flags]`, as far as the spec goes."""
    import argparse

    from service.cli.console import add_spec_flags

    parser = argparse.ArgumentParser()
    parser.add_argument("target")
    add_spec_flags(parser)
    return parser


def test_set_success_fraction_on_the_command_line_sets_the_studys_criterion():
    """`memsweep run … --set success_fraction=0.25` (it used to be silently overwritten by 0.5)."""
    from service.cli.console import build_spec

    parser = spec_parser()
    spec = build_spec(
        parser.parse_args(["orhan2020-copy500", "--set", "success_fraction=0.25", "--models", "chain"])
    )
    assert spec.success_fraction == 0.25 and spec.criterion().fraction == 0.25
    assert "success_fraction" not in spec.base and "success_fraction" not in spec.search_space().base
    spec = build_spec(parser.parse_args(["orhan2020-copy500", "--set", "success_threshold=0.02"]))
    assert spec.criterion().threshold == 0.02 and spec.criterion().name == "loss < 0.02"
    default = build_spec(parser.parse_args(["orhan2020-copy500", "--models", "chain"]))
    assert default.criterion() == HALF_BASELINE


def test_the_success_threshold_flag_sets_the_criterion_over_a_spec_files(tmp_path):
    """`memsweep run` took `--success-fraction` but no `--success-threshold` (`python -m trainers` has
    both): a flag now replaces a spec file's criterion whichever form it has, and both flags are refused."""
    from service.cli.console import build_spec

    parser = spec_parser()
    spec_file = tmp_path / "s.yaml"
    spec_file.write_text("preset: orhan2020-copy500\nmodels: [chain]\nsuccess_fraction: 0.25\n")
    spec = build_spec(parser.parse_args([str(spec_file), "--success-threshold", "0.02"]))
    assert spec.criterion() == Criterion(fraction=None, threshold=0.02)
    spec_file.write_text("preset: orhan2020-copy500\nmodels: [chain]\nsuccess_threshold: 0.02\n")
    spec = build_spec(parser.parse_args([str(spec_file), "--success-fraction", "0.25"]))
    assert spec.criterion() == Criterion(fraction=0.25)
    both = ["orhan2020-copy500", "--success-fraction", "0.25", "--success-threshold", "0.02"]
    with pytest.raises(
        ValidationError, match=r"give success_fraction \(of the baseline\) or success_threshold"
    ):
        build_spec(parser.parse_args(both))


def test_the_other_criteria_a_study_reports_are_the_same_in_mlflow_and_on_the_terminal():
    """The summary (MLflow's parent run, the plots) and the CLI's tables under `memsweep run`, `success`
    and `submit --wait` each computed the other criteria: for a copy study judged by a threshold the
    summary reported none and the terminal a `0.5 × arjovsky baseline` table. One rule now
    (`StudySpec.other_criteria`): its own fraction of each reference baseline, none beside a threshold,
    then its extra criteria, each once."""
    from service.cli.commands import other_criteria
    from service.core.spec import judged_under
    from service.reports.study_summary import criteria

    def both(spec: dict[str, Any]) -> tuple[list[Criterion], list[Criterion]]:
        study = StudySpec.model_validate(spec)
        trial = SimpleNamespace(reference_baselines={"arjovsky": 0.1})  # as the copy task's trials report
        summary = criteria(study, [trial])[1]  # type: ignore[list-item]
        own = study.criterion()
        return summary, [
            judged_under(own, **query) for query in other_criteria(study.model_dump(mode="json"))
        ]

    threshold = {"preset": "orhan2020-copy500", "models": ["chain"], "success_threshold": 0.02}
    assert both(threshold) == ([], [])
    fraction = {**threshold, "success_threshold": None, "success_fraction": 0.25}
    extra = {"extra_criteria": [{"threshold": 0.05}, {"fraction": 0.25, "baseline": "arjovsky"}]}
    summary, terminal = both({**fraction, **extra})
    assert (
        summary
        == terminal
        == [
            Criterion(fraction=None, threshold=0.05),
            Criterion(fraction=0.25, baseline="arjovsky"),
        ]
    )


def test_cpus_or_gpus_on_the_command_line_leave_the_spec_files_other_resource(tmp_path):
    """`--cpus 2` over a spec file's `resources: {cpus: 1, gpus: 0.5}` reset its GPUs to 0."""
    from service.cli.console import build_spec

    parser = spec_parser()
    spec_file = tmp_path / "s.yaml"
    spec_file.write_text("preset: orhan2020-copy500\nmodels: [chain]\nresources: {cpus: 1, gpus: 0.5}\n")
    spec = build_spec(parser.parse_args([str(spec_file), "--cpus", "2"]))
    assert (spec.resources.cpus, spec.resources.gpus) == (2, 0.5)
    spec = build_spec(parser.parse_args([str(spec_file), "--gpus", "0.25"]))
    assert (spec.resources.cpus, spec.resources.gpus) == (1, 0.25)
    spec = build_spec(parser.parse_args(["orhan2020-copy500", "--gpus", "1"]))
    assert (spec.resources.cpus, spec.resources.gpus) == (1, 1)


@pytest.mark.parametrize(
    ("flags", "said"),
    [
        (
            ["--success-fraction", "0.9"],
            "--success-fraction: a resumed study keeps its spec's success_fraction",
        ),
        (
            ["--concurrency", "4"],
            "--concurrency: a resumed study keeps its spec's concurrency",
        ),
        (
            ["--cpus", "2", "--gpus", "1"],
            "--cpus, --gpus: a resumed study keeps its spec's resources.cpus, resources.gpus",
        ),
        (["--scheduler", "asha"], "--scheduler: a resumed study keeps its spec's scheduler"),
        (["--name", "other"], "--name: a resumed study keeps its spec's name"),
    ],
)
def test_run_study_refuses_the_flags_a_resumed_study_cannot_take(tmp_path, monkeypatch, request, flags, said):
    """They were dropped without a word: `run --study ID --success-fraction 0.9` judged at 0.5."""
    from service.cli.commands import main
    from service.core.settings import Settings, get_settings
    from service.study.engine import Engine

    monkeypatch.setenv("MEMSWEEP_HOME", str(tmp_path))
    get_settings.cache_clear()  # the CLI's settings read again, from this home (and again after the test)
    request.addfinalizer(get_settings.cache_clear)
    engine = Engine(Settings(home=tmp_path, mlflow_tracking_uri=f"sqlite:///{tmp_path / 'mlflow.db'}"))
    study = engine.create_study(
        StudySpec.model_validate(
            {"space": {"dims": {"lr": [1e-3]}}, "base": {"task": "addition", "seq_len": 20}}
        )
    )
    with pytest.raises(SystemExit) as refused:
        main(["run", "--study", study.id, *flags])
    message = str(refused.value)
    assert refused.value.code == 2 and message.startswith(f"error: {said}")
    assert "create a new study with them" in message
    if "--success-fraction" in flags:
        assert f"memsweep success {study.id} --fraction F" in message
    assert engine.ledger.counts(study.id)["total"] == 1  # nothing added, nothing ran
    assert engine.ledger.study(study.id).state == "pending"


@pytest.mark.parametrize(
    ("url", "said"),
    [
        (
            "postgresql://u@127.0.0.1:1/db",
            "error: the ledger's database did not take the request (connection",
        ),
        (
            "sqlite:////nonexistent/dir/x.db",
            "error: the ledger's SQLite file /nonexistent/dir/x.db cannot be opened",
        ),
    ],
)
def test_a_ledger_the_cli_cannot_reach_is_one_line_naming_the_setting(
    tmp_path, monkeypatch, request, capsys, url, said
):
    """`memsweep studies` printed 136 lines of SQLAlchemy's traceback (the REST answer was one line)."""
    from service.cli.commands import main
    from service.core.settings import get_settings

    monkeypatch.setenv("MEMSWEEP_HOME", str(tmp_path))
    monkeypatch.setenv("MEMSWEEP_DATABASE_URL", url)
    monkeypatch.delenv("MEMSWEEP_API_URL", raising=False)
    get_settings.cache_clear()
    request.addfinalizer(get_settings.cache_clear)
    assert main(["studies"]) in (1, 2)
    err = capsys.readouterr().err
    assert err.startswith(said) and "MEMSWEEP_DATABASE_URL" in err and "Traceback" not in err, err


def test_an_extension_takes_the_flags_a_plain_resume_refuses(tmp_path, monkeypatch, request):
    """`run --study ID --dim … --concurrency 4` extends the study, its stored spec with the flag."""
    from service.cli.commands import _create_or_extend, build_parser
    from service.core.settings import Settings, get_settings
    from service.study.engine import Engine

    monkeypatch.setenv("MEMSWEEP_HOME", str(tmp_path))
    get_settings.cache_clear()
    request.addfinalizer(get_settings.cache_clear)
    engine = Engine(Settings(home=tmp_path, mlflow_tracking_uri=f"sqlite:///{tmp_path / 'mlflow.db'}"))
    study = engine.create_study(
        StudySpec.model_validate(
            {"space": {"dims": {"lr": [1e-3]}}, "base": {"task": "addition", "seq_len": 20}}
        )
    )
    args = build_parser().parse_args(
        ["run", "--study", study.id, "--dim", "lr=1e-3,1e-4", "--concurrency", "4"]
    )
    _create_or_extend(args, engine, None)
    assert engine.ledger.counts(study.id)["total"] == 2
    assert engine.ledger.study(study.id).validated_spec().concurrency == 4


def test_a_threshold_with_a_fraction_or_a_baseline_is_refused_not_half_used(tmp_path):
    """`?fraction=0.3&threshold=0.1` answered 200 judged under the threshold alone."""
    from fastapi.testclient import TestClient

    from service.api import create_app
    from tests.service.test_api_units import finish_all, grid, settings

    with TestClient(create_app(settings(tmp_path))) as c:
        study = c.post("/studies", json=grid()).json()["id"]
        other = c.post("/studies", json=grid(name="other", seeds=[3])).json()["id"]
        finish_all(c, study)
        finish_all(c, other)
        for query, given in (({"fraction": 0.3}, "fraction=0.3"), ({"baseline": "task"}, "baseline=task")):
            r = c.get(f"/studies/{study}/success", params={"threshold": 0.1, **query})
            assert r.status_code == 422 and r.json()["message"].startswith(f"threshold=0.1 with {given}: "), (
                r.text
            )
            r = c.get("/compare", params={"studies": f"{study},{other}", "threshold": 0.1, **query})
            assert r.status_code == 422 and "not both" in r.json()["message"], r.text
        assert c.get(f"/studies/{study}/success", params={"threshold": 0.1}).status_code == 200


def test_success_against_budget_takes_each_runs_last_evaluation_by_then():
    from service.reports.summary import state_at, success_table, success_vs_budget

    def run(model, losses, status="done", steps=None):
        t = T(model, {"seed": len(losses)}, losses[-1][1] if status == "done" else None, status)
        t.history = [{"step": s, "val_loss": v} for s, v in losses]
        t.steps = steps or losses[-1][0]
        return t

    fast = run("chain", [(100, 0.05), (200, 0.01)])  # threshold 0.1 (baseline 0.2)
    slow = run("chain", [(100, 0.5), (200, 0.08)])
    stopped = run("chain", [(100, 0.002)])  # stopped early at 100: a success at every later budget
    broke = run("orth", [(100, 0.05)], status="failed", steps=150)  # below at 100, failed at 150
    trials = [fast, slow, stopped, broke]
    assert state_at(broke, 100) == ("done", 0.05) and state_at(broke, 150)[0] == "failed"
    assert state_at(slow, 50) == ("pending", None)
    # raised in the step after a finite evaluation at its last step (`steps`): at that budget it had
    # ended with that evaluation (it was counted failed, as a run that went NaN by then is)
    raised = run("orth", [(100, 0.05)], status="failed", steps=100)
    raised.traceback = "Traceback (most recent call last): …"
    went_nan = run("orth", [(100, 0.05), (200, float("nan"))], status="failed", steps=200)
    assert state_at(raised, 100) == ("done", 0.05) and state_at(raised, 101)[0] == "failed"
    raised.budget_steps = 100  # raised after its last evaluation, at its budget: failed there, as at its end
    assert state_at(raised, 100)[0] == "failed"
    assert state_at(went_nan, 200)[0] == "failed" and state_at(went_nan, 199) == ("done", 0.05)
    assert success_table(trials, at_step=100).by_model == {
        "chain": success_table([fast, slow, stopped], at_step=100).by_model["chain"],
        "orth": success_table([broke], at_step=100).by_model["orth"],
    }
    assert success_table(trials, at_step=100).total.succeeded == 3  # fast, stopped, broke (then)
    assert success_table(trials).total.succeeded == 3  # at the end: fast, slow, stopped
    curve = success_vs_budget(trials)
    assert curve.steps == [100, 200]
    assert [r.succeeded for r in curve.by_model["chain"]] == [2, 3]
    assert [r.succeeded for r in curve.by_model["orth"]] == [1, 0]
    assert all(0 <= r.ci95[0] <= r.rate <= r.ci95[1] <= 1 for rows in curve.by_model.values() for r in rows)


def test_the_budget_curve_ends_at_the_budget_with_the_tables_count():
    """Every run of a study ended before its 2,000-step budget (early stops, asha's prunings at 1,600):
    the curve ended at 1,600, where a run pruned there counts by its loss (4 successes), while the
    study's table, at each run's end, said 2 (a pruned run is no success)."""
    from service.reports.summary import success_table, success_vs_budget

    def run(status, loss):
        t = T("chain", {"seed": 1}, loss if status == "done" else None, status)
        t.history = [{"step": 800, "val_loss": 0.5}, {"step": 1600, "val_loss": loss}]
        t.steps, t.budget_steps = 1600, 2000
        return t

    trials = [run("done", 0.01), run("done", 0.02), run("pruned", 0.01), run("pruned", 0.05)]
    curve = success_vs_budget(trials)
    assert curve.steps == [800, 1600, 2000]
    assert [c.succeeded for c in curve.by_model["chain"]] == [0, 4, 2]
    assert curve.by_model["chain"][-1].succeeded == success_table(trials).total.succeeded


def test_a_study_computes_with_one_numerics_mode():
    """The spec's `numerics` reaches every trial's config (and so its hash); a dimension over it, or
    models that ask different modes, are refused before anything runs (a Ray worker runs one mode)."""
    space = {"dims": {"lr": [1e-3]}}
    native = grid_trials(StudySpec(space=space, numerics="native", base={"steps": 2}).search_space(), {})
    portable = grid_trials(StudySpec(space=space, numerics="portable", base={"steps": 2}).search_space(), {})
    assert {t.resolved.config.numerics for t in native} == {"native"}
    assert {t.config_hash for t in native}.isdisjoint(t.config_hash for t in portable)
    with pytest.raises(ValidationError, match=r"numerics is one mode per study.*\(space.dims\)"):
        StudySpec(space={"dims": {"numerics": ["portable", "native"]}})
    mixed = {"models": {"a": {"fixed": {"numerics": "native"}}, "b": {"fixed": {"lr": 1e-3}}}}
    with pytest.raises(ValidationError, match=r"space.models.a.fixed"):
        StudySpec(space=mixed)
    with pytest.raises(ValidationError, match="numerics"):
        StudySpec(space=space, numerics="fast")
    with pytest.raises(ValidationError, match="numerics is given twice"):
        StudySpec(space=space, numerics="native", base={"numerics": "portable"})
    assert StudySpec(space=space, base={"numerics": "native"}).numerics == "native"


def test_a_study_keeps_the_numerics_mode_it_was_made_with(monkeypatch):
    """A spec that names no mode takes $MEMSWEEP_NUMERICS (else portable) when it is made, and keeps it
    in its stored form: a server restarted under another default extends it in its own mode."""
    monkeypatch.setenv("MEMSWEEP_NUMERICS", "native")
    stored = StudySpec(space={"dims": {"lr": [1e-3]}}).model_dump(mode="json")
    assert stored["numerics"] == "native"
    monkeypatch.setenv("MEMSWEEP_NUMERICS", "portable")
    trials = grid_trials(StudySpec.model_validate(stored).search_space(), {})
    assert {t.resolved.config.numerics for t in trials} == {"native"}


def test_srnn_backend_persistent_without_a_gpu_is_refused_at_the_door():
    """Issue 37: SRNN's `backend: persistent` (a GPU kernel) is refused with no GPU asked, as the Elman
    family's is (`check_execution` reads any model's `backend`), and reaches every SRNN trial with one."""
    for spec in (
        StudySpec(preset="srnn2020-copy", models=["srnn"], base={"backend": "persistent"}),
        StudySpec(preset="srnn2020-copy", models=["srnn"], base={"cell.backend": "persistent"}),
    ):
        with pytest.raises(StudyError, match=r"backend = 'persistent' is a GPU kernel.*resources"):
            study_space(spec, 10_000)
    asked = StudySpec(
        preset="srnn2020-copy", models=["srnn"], base={"backend": "persistent"}, resources={"gpus": 1}
    )
    trials = grid_trials(study_space(asked, 10_000), {})
    assert len(trials) == 6 and {t.config["cell_params"]["backend"] for t in trials} == {"persistent"}


def test_a_presets_backend_native_reaches_srnn_as_its_scan():
    """`backend: native` set in a preset study's base reaches every model whose cell has a `backend`:
    the Elman and GRU cells run torch's kernel, SRNN (no torch kernel) its scan; a cell with no
    `backend` (the uRNN, Arjovsky's) is left as it is; none is refused."""
    trials = grid_trials(
        study_space(StudySpec(preset="srnn2020-copy", base={"backend": "native"}), 10_000), {}
    )
    backends = {(t.model, t.config["cell_params"].get("backend")) for t in trials}
    assert {("srnn", "native"), ("rnn", "native"), ("gru", "native"), ("urnn", None)} <= backends


def test_a_bundle_reports_each_members_result_as_it_leaves():
    """A member that stops early is reported (its `Finished` event) as it leaves its bundle, not when the
    whole bundle ends: a worker lost later loses none of it. The unit's last report carries its objective,
    the mean over its members."""
    from service.study.packing import bundle
    from service.study.worker import train_unit

    spec = StudySpec(
        space={"dims": {"early_stop_loss": [10.0, None], "lr": [1e-3]}},
        base={"task": "addition", "seq_len": 10, "n_train": 64, "n_val": 32, "hidden": 8, "steps": 40,
              "eval_every": 10},
    )  # fmt: skip
    trials = grid_trials(spec.search_space(), {})
    stops, runs = (t.config_hash for t in trials)
    reports: list[dict] = []
    train_unit(bundle(trials, fused=True), reports.append, "here")
    finished = [
        (i, e.config_hash) for i, r in enumerate(reports) for e in r["events"] if isinstance(e, Finished)
    ]
    assert sorted(h for _, h in finished) == sorted([stops, runs])  # each once
    (left,) = [i for i, h in finished if h == stops]
    later = [e.evaluation.step for r in reports[left + 1 :] for e in r["events"] if isinstance(e, Evaluated)]
    assert later == [20, 30, 40]  # the other member trained on after it was reported
    results = {e.config_hash: e.result for r in reports for e in r["events"] if isinstance(e, Finished)}
    assert results[stops].early_stopped and results[stops].node == "here"
    assert reports[-1]["objective"] == pytest.approx(
        math.fsum(objective(r.final_val_loss, r.baseline_loss, r.status) for r in results.values()) / 2
    )


def test_a_grids_queue_hands_out_its_units_in_order_and_takes_a_faulted_one_back_at_once():
    """`UnitQueue`, a grid round as Ray Tune's searcher: units in order; a unit sent back goes first,
    before the units still queued (at the back, it waited for all of them: on a long grid, nearly the
    round); None (ask again) while a live unit may still send members back; FINISHED once the queue is
    empty and nothing is live, or once the study is cancelled."""
    import threading

    from ray.tune.search import Searcher

    from service.core.trial import Unit
    from service.study.ray_tune import UnitQueue

    spec = StudySpec.model_validate({"base": {"task": "addition", "seq_len": 10, "steps": 20},
                                     "space": {"dims": {"lr": [1e-3, 1e-4, 1e-5]}}})  # fmt: skip
    a, b, c = (Unit((t,)) for t in grid_trials(study_space(spec, 50_000), {}))
    cancel = threading.Event()
    queue = UnitQueue([a, b, c], cancel)
    assert queue.suggest("1") == {"unit": a} and queue.suggest("2") == {"unit": b}
    queue.on_trial_complete("1", error=True)  # Tune tells the searcher, then the callbacks: `again`
    queue.again(a)
    assert queue.suggest("3") == {"unit": a} and queue.suggest("4") == {"unit": c}
    assert queue.suggest("5") is None  # 2, 3 and 4 are live
    for trial in ("2", "3"):
        queue.on_trial_complete(trial, {"objective": 0.1})
    assert queue.suggest("5") is None  # 4 is live still: it may send members back
    queue.on_trial_complete("4", {"objective": 0.2})
    assert queue.suggest("5") == Searcher.FINISHED
    cancelled = UnitQueue([a, b], cancel)
    cancel.set()
    assert cancelled.suggest("1") == Searcher.FINISHED


def test_a_worker_trains_no_trial_whose_hash_its_code_does_not_give():
    """A worker whose code (a plugin edited after the server planned, another memsweep on a node)
    hashes a trial otherwise than it was planned refuses the whole unit before training: its result
    would be stored under another code's hash. The unit fails as a fault (no report), naming the node."""
    import dataclasses

    from service.study.packing import bundle
    from service.study.worker import OtherCodeError, train_unit

    spec = StudySpec(space={"dims": {"lr": [1e-3, 1e-4]}},
                     base={"task": "addition", "seq_len": 10, "n_train": 32, "n_val": 16, "hidden": 8, "steps": 4})  # fmt: skip
    good, other = grid_trials(spec.search_space(), {})
    planned_elsewhere = dataclasses.replace(other, config_hash="0" * 16)
    reports: list[dict] = []
    with pytest.raises(OtherCodeError, match=r"other code on node n1 than the study was planned with"):
        train_unit(bundle([good, planned_elsewhere], fused=True), reports.append, "n1")
    assert reports == []  # nothing trained, nothing reported
    train_unit(bundle([good], fused=True), reports.append, "n1")
    assert [e.result.status for e in reports[-1]["events"] if isinstance(e, Finished)] == ["done"]


def test_a_worker_that_cannot_compute_in_the_studys_numerics_fails_the_unit_as_a_fault():
    """A pooled worker process that computed under another numerics mode first failed every member
    `failed` with the reason: counted as failed runs of their points, and never run again. The unit
    now fails as a lost worker's does (no report), and its members run again in a new process."""
    from service.study.packing import bundle
    from service.study.worker import train_unit
    from trainers import numerics

    numerics.use(numerics.current() or numerics.default_mode())  # this process computes in one mode
    other = "native" if numerics.current() == "portable" else "portable"
    spec = StudySpec(space={"dims": {"lr": [1e-3, 1e-4]}},
                     base={"task": "addition", "seq_len": 10, "n_train": 32, "n_val": 16, "hidden": 8,
                           "steps": 4, "numerics": other})  # fmt: skip
    reports: list[dict] = []
    with pytest.raises(numerics.ProcessNumericsError, match="must train in a new process"):
        train_unit(bundle(grid_trials(spec.search_space(), {}), fused=True), reports.append, "n1")
    assert reports == []


def test_a_worker_on_a_machine_that_cannot_compute_in_the_studys_numerics_fails_each_member_once(monkeypatch):
    """A machine that cannot run the mode (no AVX2, not x86-64) is no fault a new process mends: its
    members fail with the reason, once, instead of being retried as a lost worker's."""
    from service.study import worker
    from service.study.packing import bundle
    from service.study.worker import train_unit
    from trainers import numerics, runtime

    def refuses(name: str) -> None:
        raise numerics.NumericsError(
            "numerics 'portable' is defined for x86-64 CPUs with AVX2; this machine is z"
        )

    monkeypatch.setattr(worker, "use_numerics", refuses)
    monkeypatch.setattr(runtime, "use_numerics", refuses)  # what `trainers.train` meets in its turn
    spec = StudySpec(space={"dims": {"lr": [1e-3]}},
                     base={"task": "addition", "seq_len": 10, "n_train": 32, "n_val": 16, "hidden": 8, "steps": 4})  # fmt: skip
    reports: list[dict] = []
    train_unit(bundle(grid_trials(spec.search_space(), {}), fused=False), reports.append, "n1")
    (result,) = [e.result for r in reports for e in r["events"] if isinstance(e, Finished)]
    assert result.status == "failed" and "defined for x86-64 CPUs with AVX2" in (result.reason or "")


@pytest.mark.parametrize(
    ("spec", "said"),
    [
        ({"space": {"dims": {"lr": [1e-3, 0.001]}}, "base": {"task": "addition"}}, r"space\.dims\.lr\[0\]"),
        ({"space": {"models": {"a": {"dims": {"hidden": [8, 8.0]}}}}}, r"space\.models\.a\.dims\.hidden\[0\]"),
        ({"preset": "orhan2020-copy500", "dims": {"lr": [1e-3, 0.001]}}, r"dims\.lr\[0\] = 0\.001 and"),
    ],
)  # fmt: skip
def test_a_dimensions_value_given_twice_is_refused_where_it_is_written(spec, said):
    with pytest.raises(ValidationError, match=said + ".* are the same value"):
        StudySpec.model_validate(spec)
    # a spec stored before the rule is read as it was: its space holds each point once, as its ledger did
    stored = StudySpec.model_validate(spec, context=STORED)
    points = grid_trials(study_space(stored, 50_000), {})
    assert len({t.config_hash for t in points}) == len(points)


def test_a_range_on_a_grid_is_refused_naming_the_dimension_and_every_sampler():
    spec = StudySpec.model_validate({"space": {"dims": {"lr": {"loguniform": [1e-4, 1e-2]}, "hidden": [8]}}})
    with pytest.raises(StudyError, match=r"and lr is a range: give a list of values, or a sampler .*cmaes"):
        study_space(spec, 50_000)


def test_a_success_table_titles_its_criterion_once(capsys: pytest.CaptureFixture[str], monkeypatch) -> None:
    """A threshold's name reads "loss < 0.17": the title said "final validation loss < loss < 0.17"."""
    from service.cli.console import print_success

    monkeypatch.setenv("COLUMNS", "200")
    trials = [T("chain", {"seed": 1}, 0.01)]
    for criterion, said in (
        (Criterion(fraction=None, threshold=0.17), "loss < 0.17"),
        (HALF_BASELINE, "loss < 0.5 × baseline"),
    ):
        table = success_table(trials, criterion).model_dump(mode="json")
        print_success({"name": "s", "success": table, "success_other_criteria": []})
        title = capsys.readouterr().out
        assert f"final validation {said} (s)" in title and "loss < loss" not in title


def test_a_misspelt_base_setting_of_several_cells_suggests_every_valid_name():
    """`base: {stpes: 400}` listed only the cells' settings, with no suggestion (a `dims` typo had one)."""
    with pytest.raises(StudyError, match=r"base\.stpes .*did you mean 'steps'\? the trials' .*seq_len"):
        study_space(
            StudySpec.model_validate({"preset": "sgornn2022-addition", "base": {"stpes": 400}}), 50_000
        )


@pytest.mark.parametrize(
    ("spec", "said"),
    [
        ({"preset": "orhan2020-copy500", "base": {"task": "addition"}},
         r"^base\.task = 'addition': preset 'orhan2020-copy500' fixes task 'copy' for its models, with layout = "
         r"'total' \(copy's settings, none of addition's\); the task is the preset's: leave task out of base, and "
         r"for task 'addition' run one of its presets, orhan2020-addition750, .*\(`memsweep presets` lists them\), "
         r"or an explicit `space`$"),
        ({"preset": "orhan2020-copy500", "base": {"cell": "lstm"}},
         r"^base\.cell = 'lstm': preset 'orhan2020-copy500' fixes cell 'rnn' for its models, with nonlinearity = "
         r"'elu' \(rnn's settings, none of lstm's\); the cell is the preset's: leave cell out of base, and to train "
         r"lstm beside its models on its protocol, add lstm as a model: models: \[chain, fbchain, identity, "
         r"orthogonal, lstm\] \(on the command line: --models chain,fbchain,identity,orthogonal,lstm\)$"),
        ({"preset": "orhan2020-addition750", "models": ["chain", "orthogonal"], "base": {"cell": "lstm"}},
         r"add lstm as a model: models: \[chain, orthogonal, lstm\] \(on the command line: "
         r"--models chain,orthogonal,lstm\)$"),
    ],
)  # fmt: skip
def test_a_task_or_cell_over_a_presets_own_is_refused_as_the_presets(spec, said):
    """`--set task=addition` on a copy preset said "unknown config field 'layout'", and `--set cell=lstm` on
    an Orhan preset "unknown config field 'nonlinearity'": fields the user never set, the preset had."""
    with pytest.raises(StudyError, match=said):
        study_space(StudySpec.model_validate(spec), 50_000)
    # with none of the preset's models, its cell's settings go with them (`cell_settings_per_model`): the
    # cell alone, also named in base, overrides no cell of the preset's models
    alone = {**spec, "models": ["lstm"], "base": {"cell": "lstm", "seq_len": 30}, "dims": {"lr": [1e-3]}}
    assert study_space(StudySpec.model_validate(alone), 50_000).model("lstm").fixed == {"cell": "lstm"}


@pytest.mark.parametrize(
    ("spec", "said"),
    [
        # not a setting at all: said so, with the nearest name
        ({"preset": "orhan2020-copy500", "dims": {"foo": [1, 2]}},
         r"^cannot override \['foo'\]: not a dimension of the models chain, fbchain, identity, orthogonal of "
         r"space 'orhan2020-copy500' \(dimensions: \['lr', 'scale'\]\); foo is no setting of these trials, nor of "
         r"their task or cells$"),
        ({"preset": "orhan2020-copy500", "dims": {"lrr": [1e-3]}}, r"lrr is no setting .*: did you mean 'lr'\?$"),
        # written in another case (`--dim Lr=…`): the same name, its case aside (it had no suggestion)
        ({"preset": "orhan2020-copy500", "dims": {"Lr": [1e-3]}}, r"Lr is no setting .*: did you mean 'lr'\?$"),
        # a setting of an added cell's arm, misspelt: the nearest of the trials' settings (its cell's among them)
        ({"preset": "orhan2020-copy500", "models": ["chain", "lstm"], "dims": {"forget_bais": [0.0, 1.0]}},
         r"forget_bais is no setting of these trials, nor of their task or cells: did you mean 'forget_bias'\?$"),
        # a field of the default cell (rnn's) where every model fixes a cell of its own: no setting of theirs
        ({"preset": "sgornn2022-addition", "dims": {"fb_forward": [True, False]}},
         r"fb_forward is no setting of these trials, nor of their task or cells$"),
        # a cell named by a value that is no text: refused naming it, where the trials resolve (a TypeError)
        ({"preset": "orhan2020-copy500", "base": {"cell": ["lstm"]}},
         r"unknown cell \"\['lstm'\]\"; did you mean 'lstm'\?"),
        ({"space": {"models": {"a": {"fixed": {"cell": ["lstm"]}, "dims": {"lr": [1e-3]}}}},
          "dims": {"lr": [1e-3, 1e-2]}}, r"unknown cell \"\['lstm'\]\""),
        # a setting no model varies that one of the chosen models fixes: a model of one's own sweeps it
        ({"preset": "srnn2020-addition", "dims": {"hidden": [64, 128]}},
         r"dims.hidden: model 'urnn' fixes hidden = 256, so it cannot span hidden; choose models that leave it "
         r"to the study \(`models`\), or sweep it in a model of your own beside these \(space: \{models: \{NAME: "
         r"\{fixed: \{\.\.\.\}, dims: \{hidden: \[value1, value2\]\}\}\}\}\)$"),
    ],
)  # fmt: skip
def test_a_dimension_no_model_varies_is_told_apart_from_a_typo(spec, said):
    """`dims: {foo: [1, 2]}` said "if foo is a setting of these trials, give it one value … in base", of
    space 'orhan2020-copy500''s models: a name that is no setting was offered as one."""
    with pytest.raises(StudyError, match=said):
        study_space(StudySpec.model_validate(spec), 50_000)


def test_a_setting_no_model_varies_is_swept_over_every_chosen_model():
    """`dims: {lr: [...]}` over a preset whose models leave lr to its base (SRNN's: RMSprop at 1e-3) was
    refused, and the way round was to write every model again with its settings copied by hand. Every
    chosen model now spans it, each at every value, the rest of each model as the preset fixes it."""
    spec = {
        "preset": "srnn2020-addition",
        "models": ["urnn", "srnn"],
        "dims": {"lr": [1e-3, 3e-4], "seq_len": [100]},
    }
    trials = grid_trials(study_space(StudySpec.model_validate(spec), 50_000), {})
    assert sorted((t.model, t.config["lr"]) for t in trials) == [
        ("srnn", 3e-4), ("srnn", 1e-3), ("urnn", 3e-4), ("urnn", 1e-3)
    ]  # fmt: skip
    urnn = [t for t in trials if t.model == "urnn"]
    assert {t.config["hidden"] for t in urnn} == {256} and all(t.params["lr"] in (1e-3, 3e-4) for t in urnn)


@pytest.mark.parametrize(
    ("spec", "said"),
    [
        ({"preset": "orhan2020-copy500", "dims": {"lr": [""]}},  # `--dim lr=`
         r"^dims\.lr has no values: give one or more, e.g\. lr: \[0\.0008, 0\.0005\] \(on the command line: "
         r"--dim lr=0\.0008,0\.0005\), or leave dims\.lr out$"),
        ({"preset": "orhan2020-copy500", "dims": {"lr": []}}, r"^dims\.lr has no values: give one or more"),
        ({"preset": "orhan2020-copy500", "dims": {"lr": {"values": [" "]}}}, r"^dims\.lr has no values"),
        ({"preset": "orhan2020-copy500", "dims": {"lr": [1e-3, ""]}},  # `--dim lr=1e-3,`
         r"^dims\.lr\[1\] = '' is no value \(a comma too many\?\): give values only, e\.g\. lr: \[0\.001\] "
         r"\(on the command line: --dim lr=0\.001\), or leave dims\.lr out$"),
        ({"space": {"models": {"a": {"dims": {"hidden": [""]}}}}},
         r"^space\.models\.a\.dims\.hidden has no values: give one or more, e\.g\. hidden: \[value1, value2\], "
         r"or leave space\.models\.a\.dims\.hidden out$"),
    ],
)  # fmt: skip
def test_a_dimension_with_no_values_is_refused_naming_it(spec, said):
    """`--dim lr=` reached the trials as `lr = ''`: "model 'chain' at lr='', …: trial config.lr = '' is not
    a number"."""
    with pytest.raises(ValidationError) as err:
        StudySpec.model_validate(spec)
    (error,) = err.value.errors()
    assert re.search(said, str(error["ctx"]["error"])), error


@pytest.mark.parametrize(
    ("value", "said"),
    [
        (
            "adamw",
            "base.optimizer = 'adamw' is not allowed; choose one of: rmsprop, adam, keras_adam, amsgrad",
        ),
        ("amsGrad", "(did you mean 'amsgrad'? names are lowercase)"),
    ],
)
def test_a_value_a_field_cannot_take_is_refused_before_a_preset_model_is_blamed(
    value: str, said: str
) -> None:
    """`--set optimizer=adamw` on nru2019-copy100, whose nru fixes its optimiser: the refusal said "model
    'nru' fixes optimizer …, choose models that share it", never that 'adamw' is no optimiser."""
    from search_spaces import SpaceError

    with pytest.raises(SpaceError) as refused:
        StudySpec(preset="nru2019-copy100", base={"optimizer": value}).search_space()
    assert said in str(refused.value) and "fixes" not in str(refused.value)
    with pytest.raises(SpaceError, match="model 'nru' fixes optimizer"):  # a real optimiser: that refusal
        StudySpec(preset="nru2019-copy100", base={"optimizer": "rmsprop"}).search_space()


def test_fishers_exact_p_beside_each_difference():
    """Newcombe's interval is approximate with few runs: 2/2 against 0/2 gives one clear of 0, where Fisher's
    exact test gives p = 1/3. Each difference now carries that p (R's fisher.test: the lady tasting tea,
    3/4 against 1/4, p = 0.4857; 3/10 against 8/10, p = 0.06978)."""
    from service.reports.summary import fisher_exact_p

    assert fisher_exact_p(2, 2, 0, 2) == pytest.approx(1 / 3)
    assert fisher_exact_p(3, 4, 1, 4) == pytest.approx(0.4857143, abs=1e-7)
    assert fisher_exact_p(3, 10, 8, 10) == pytest.approx(0.06978, abs=1e-5)
    assert fisher_exact_p(5, 5, 5, 5) == 1.0
    mine = [T("mine", {"seed": s}, 0.5) for s in (1, 2)]  # thr 0.1: both fail
    nru = [T("nru", {"seed": s}, 0.05) for s in (1, 2)]  # both succeed
    table = success_table([*mine, *nru], reference="nru")
    d = table.differences["mine"]
    assert d.difference == -1.0 and d.ci95[1] < 0 and d.p == pytest.approx(1 / 3)
    assert table.differences["nru"].p is None  # the reference itself
