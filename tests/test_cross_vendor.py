"""tools/cross_vendor.py's comparison of two machines' figures (docs/reproducibility.md): every portable
figure must be the same, the native ones may part, and figures of another torch or another
TRAINER_VERSION are not comparable at all."""

from __future__ import annotations

import copy
import json
from pathlib import Path

from tools.cross_vendor import compare

KEPT = Path(__file__).resolve().parents[1] / "benchmarks" / "results" / "cross-vendor"


def kept(name: str) -> dict:
    return json.loads((KEPT / name).read_text())


def test_the_kept_machines_agree_and_a_changed_figure_or_version_is_refused(capsys) -> None:
    amd, xeon = kept("amd-epyc-torch2.11.json"), kept("intel-xeon-torch2.11.json")
    assert compare(amd, xeon) == 0  # the two vendors, the same torch: every portable figure the same
    assert "differ (native: allowed)" in capsys.readouterr().out
    moved = copy.deepcopy(xeon)
    moved["check trial, portable"]["final_val_loss"] = (0.5).hex()
    assert compare(amd, moved) == 1 and "DIFFERENT" in capsys.readouterr().out
    native = copy.deepcopy(xeon)
    native["check trial, native"]["final_val_loss"] = (0.5).hex()
    assert compare(xeon, native) == 0
    # a file that records its trainer version is compared only with one of the same version; the files
    # kept before the tool recorded it show '-' and are compared as they are
    newer = kept("intel-xeon-torch2.14.1.json")
    assert newer["trainer_version"] and "trainer_version" not in amd
    older = copy.deepcopy(newer) | {"trainer_version": "9"}
    assert compare(older, newer) == 1 and "the trainer versions differ" in capsys.readouterr().out
    assert compare(newer, newer) == 0
