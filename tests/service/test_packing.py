"""Packing a grid's pending trials into Ray units (fused bundles): fast, no Ray."""

from __future__ import annotations

from typing import Any

import pytest

import trainers
from service.core.spec import StudySpec
from service.core.trial import TrialSpec, Unit
from service.study.packing import (
    MAX_BUNDLE,
    bundle,
    bundle_size,
    even_parts,
    member_bytes,
    pack,
    pack_study,
    unit_share,
)
from service.study.search import grid_trials
from trainers.fused import fusable_key


def rows_of(spec: dict[str, Any]) -> list[TrialSpec]:
    return grid_trials(StudySpec.model_validate(spec).search_space(), {})


ORHAN_SMALL = {
    "preset": "orhan2020-copy500",
    "models": ["chain", "orthogonal"],
    "dims": {"lr": [1e-3, 3e-4], "scale": [1.0]},
    "seeds": [1, 2],
    "base": {"seq_len": 50, "steps": 20},
}


def keys(units: list[Unit]) -> list[str]:
    return [r.config_hash for u in units for r in u.members]


def test_every_trial_lands_in_exactly_one_unit_and_bundles_share_shapes() -> None:
    rows = rows_of({**ORHAN_SMALL, "seeds": [1, 2, 3]})  # 12 trials
    units = pack(rows, fused=True, slots=2)
    assert sorted(keys(units)) == sorted(r.config_hash for r in rows)
    for unit in units:
        assert unit.fused and len({fusable_key(r.resolved) for r in unit.members}) == 1
    assert len(units) == 2 and sorted(len(u.members) for u in units) == [6, 6]  # one bundle per slot


def test_bundles_keep_an_initialiser_together() -> None:
    units = pack(rows_of(ORHAN_SMALL), fused=True, slots=2)  # 4 chain + 4 orthogonal
    assert [len(u.members) for u in units] == [4, 4]
    assert all(len({r.model for r in u.members}) == 1 for u in units)  # orthogonal's W has its own layout


def test_fusing_off_or_size_one_gives_one_trial_per_unit() -> None:
    rows = rows_of(ORHAN_SMALL)
    for units in (pack(rows, fused=False, slots=2), pack(rows, fused=True, slots=2, size=1)):
        assert [len(u.members) for u in units] == [1] * len(rows) and keys(units) == [
            r.config_hash for r in rows
        ]
        assert not any(u.fused for u in units)


def test_a_fixed_bundle_size_caps_the_bundles() -> None:
    units = pack(rows_of({**ORHAN_SMALL, "seeds": [1, 2, 3]}), fused=True, slots=1, size=5)
    assert sorted(len(u.members) for u in units) == [3, 3, 3, 3]  # 6 chain at most 5 → 3 + 3, not 5 + 1


def test_cells_the_fused_trainer_lacks_run_alone() -> None:
    spec = {
        "space": {"dims": {"lr": [1e-3, 1e-4]}},
        "seeds": [1, 2],
        "base": {"task": "addition", "cell": "lstm", "seq_len": 20},
    }
    rows = rows_of(spec)
    assert [len(u.members) for u in pack(rows, fused=True, slots=1)] == [1, 1, 1, 1]
    assert not bundle(rows[:2], fused=True).fused  # a sampled point's seeds: alone too


def test_a_sampled_points_seeds_fuse_when_they_share_shapes() -> None:
    seeds = [t for t in rows_of(ORHAN_SMALL) if t.model == "chain" and t.params["lr"] == 1e-3]
    assert len(seeds) == 2 and bundle(seeds, fused=True).fused and not bundle(seeds, fused=False).fused


def test_bundle_size_follows_slots_memory_and_the_cap() -> None:
    assert bundle_size(8, slots=2, per_member=1, memory=10**9) == 4
    assert bundle_size(2112, slots=2, per_member=1, memory=10**9) == 32  # the cap
    assert bundle_size(2112, slots=2, per_member=100, memory=750) == 7  # memory
    assert bundle_size(10, slots=2, per_member=100, memory=10) == 1  # one member always fits
    assert bundle_size(3, slots=8, per_member=1, memory=10**9) == 1


@pytest.mark.parametrize("task,n,expect_mb", [("copy", 100, (10, 16)), ("psmnist", 25, (4, 7))])
def test_member_bytes_counts_the_batch_over_the_sequence(
    task: str, n: int, expect_mb: tuple[int, int]
) -> None:
    r = trainers.resolve(trainers.apply_overrides(trainers.TrainConfig(task=task, cell="rnn"), {"hidden": n}))
    mb = member_bytes(r) / 2**20  # B=16: copy T=500 (d=10, C=9), psMNIST T=784 (d=1, C=10)
    assert expect_mb[0] < mb < expect_mb[1]


def test_on_a_gpu_bundles_are_sized_by_its_memory_not_a_fixed_cap() -> None:
    """A unit's share of the device it trains on, as a node measures it: on a GPU the bundle grows
    with the memory (a bundle replaces kernel launches there); on the CPU it stops at MAX_BUNDLE."""
    share = unit_share(24 * 2**30, units_at_once=2)  # a 24 GiB GPU, units asking 0.5 GPU each
    assert share == 6 * 2**30  # half of it planned for, split between the two units on it
    per_member = 100 * 2**20
    assert bundle_size(2112, slots=2, per_member=per_member, memory=share, cap=None) == 61  # 6 GiB / 100 MiB
    assert (
        bundle_size(2112, slots=2, per_member=per_member, memory=unit_share(80 * 2**30, 2), cap=None) == 204
    )
    assert bundle_size(2112, slots=2, per_member=per_member, memory=share) == MAX_BUNDLE  # the CPU's cap
    rows = rows_of({**ORHAN_SMALL, "models": ["chain"], "dims": {"lr": [1e-3, 3e-4], "scale": [1.0, 1.01, 1.02]},
                    "seeds": [1, 2, 3, 4, 5, 6, 7, 8]})  # fmt: skip
    assert len(rows) == 48
    on_gpu = pack(rows, fused=True, slots=1, device="cuda", gpus_per_unit=1.0, memory=2**40)
    on_cpu = pack(rows, fused=True, slots=1, device="cpu", memory=2**40)
    assert [len(u.members) for u in on_gpu] == [48] and sorted(len(u.members) for u in on_cpu) == [24, 24]
    tight = pack(
        rows, fused=True, slots=1, device="cuda", gpus_per_unit=1.0, memory=5 * member_bytes(rows[0].resolved)
    )
    assert max(len(u.members) for u in tight) == 5


def test_a_2112_point_preset_fills_one_gpu_in_its_four_models_bundles() -> None:
    """Orhan & Pitkow's whole copy-500 grid (4 models, 2,112 points) for a study with `gpus: 1`,
    packed against an H100's measured memory (79 GiB free): one bundle per model, 462 + 462 + 594 +
    594, the bundles `benchmarks/gpu_check/` timed there (docs/gpu.md). On a 16 GiB GPU shared by
    two units (`gpus: 0.5`) each model splits into equal parts within the unit's 4 GiB, no straggler.
    Every trial lands in exactly one unit either way."""
    rows = rows_of({"preset": "orhan2020-copy500"})
    assert len(rows) == 2112
    spec = StudySpec.model_validate({"preset": "orhan2020-copy500", "resources": {"cpus": 1, "gpus": 1}})
    h100 = pack_study(spec, rows, measured=("cuda", unit_share(79 * 2**30, units_at_once=1)))
    assert sorted(len(u.members) for u in h100) == [462, 462, 594, 594] and all(u.fused for u in h100)
    assert {str(u.members[0].resolved.config.cell_params.get("init")) for u in h100} == {
        "chain", "fbchain", "identity", "orthogonal"
    }  # fmt: skip
    half = StudySpec.model_validate({"preset": "orhan2020-copy500", "resources": {"cpus": 1, "gpus": 0.5}})
    share = unit_share(16 * 2**30, units_at_once=2)
    small = pack_study(half, rows, measured=("cuda", share))
    k = share // member_bytes(rows[0].resolved)
    assert max(len(u.members) for u in small) <= k
    assert sorted(len(u.members) for u in small) == [231, 231, 231, 231, 297, 297, 297, 297]
    for units in (h100, small):
        assert sorted(keys(units)) == sorted(r.config_hash for r in rows)


def test_even_parts_are_as_few_and_as_equal_as_the_size_allows() -> None:
    items = list(range(594))
    assert [len(p) for p in even_parts(items, 315)] == [297, 297]
    assert [len(p) for p in even_parts(items, 594)] == [594]
    assert [len(p) for p in even_parts(list(range(7)), 3)] == [3, 2, 2]
    assert [x for p in even_parts(items, 100) for x in p] == items  # in order, each once
    assert even_parts([], 5) == []
