"""The CPUs an embedded Ray offers, counted without Ray's private helpers: this process's affinity, at
most its cgroup's quota (read from a fake cgroup directory here), MEMSWEEP_RAY_NUM_CPUS first."""

from __future__ import annotations

import inspect
import os
from pathlib import Path

import pytest

from service.core.settings import Settings


def own_cgroups() -> list[str]:
    return Path("/proc/self/cgroup").read_text().splitlines()


def test_a_cgroup_v2_quota_caps_the_cpus(tmp_path: Path):
    from service.study.nodes import cgroup_cpus, usable_cpus

    if not any(line.startswith("0::") for line in own_cgroups()):
        pytest.skip("this process has no cgroup v2 hierarchy")
    (tmp_path / "cpu.max").write_text("max 100000\n")
    assert cgroup_cpus(tmp_path) is None
    assert usable_cpus(tmp_path) == len(os.sched_getaffinity(0))
    (tmp_path / "cpu.max").write_text("150000 100000\n")  # `docker run --cpus 1.5`
    assert cgroup_cpus(tmp_path) == 1.5
    assert usable_cpus(tmp_path) == 1  # whole CPUs, as Ray counts a quota
    (tmp_path / "cpu.max").write_text("50000 100000\n")
    assert usable_cpus(tmp_path) == 1  # at least one


def test_a_cgroup_v1_quota_caps_the_cpus(tmp_path: Path):
    from service.study.nodes import cgroup_cpus, usable_cpus

    if not any("cpu" in line.split(":")[1].split(",") for line in own_cgroups()):
        pytest.skip("this process has no cgroup v1 cpu hierarchy")
    (tmp_path / "cpu").mkdir()
    (tmp_path / "cpu" / "cpu.cfs_period_us").write_text("100000\n")
    (tmp_path / "cpu" / "cpu.cfs_quota_us").write_text("-1\n")
    assert cgroup_cpus(tmp_path) is None
    (tmp_path / "cpu" / "cpu.cfs_quota_us").write_text("100000\n")
    assert cgroup_cpus(tmp_path) == 1.0 and usable_cpus(tmp_path) == 1
    assert cgroup_cpus(tmp_path / "elsewhere") is None  # no cgroup filesystem: no quota


def test_memsweep_ray_num_cpus_wins_and_the_count_is_rays_on_this_machine():
    from ray._private.utils import get_num_cpus  # the reference only

    from service.study.nodes import cgroup_cpus, embedded_cpus, embedded_resources, usable_cpus

    assert (
        embedded_cpus(Settings(ray_num_cpus=7)) == 7
        and embedded_resources(Settings(ray_num_cpus=7))[0] == 7.0
    )
    # Ray's count reads neither the affinity nor a quota below the cgroup root: only here do they agree
    if len(os.sched_getaffinity(0)) == os.cpu_count() and cgroup_cpus() is None:
        assert usable_cpus() == get_num_cpus()
    assert embedded_cpus(Settings(ray_num_cpus=None)) == usable_cpus()


def test_the_ray_adapter_uses_no_private_part_of_ray():
    from service.study import nodes, ray_tune

    for module in (nodes, ray_tune):
        source = inspect.getsource(module)
        assert "from ray._private" not in source and "._rungs" not in source, module.__name__
