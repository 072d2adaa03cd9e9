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


def test_a_figure_only_the_newer_file_holds_is_listed_not_compared(capsys) -> None:
    """The 2.14.1 file records the AMSGrad bundle and the layer-normalised RNN, which the tool of the
    2.11 files did not run: compared with such a file they are named as not compared, and the figures
    both hold still decide; a changed one of them still fails."""
    newer = kept("intel-xeon-torch2.14.1.json")
    assert {"bundle amsgrad member 0", "solo layer-norm rnn, keras_amsgrad"} <= set(newer)
    assert newer["bundle amsgrad: member 0 equals its solo run"] is True
    older = {k: v for k, v in newer.items() if "amsgrad" not in k}
    assert compare(older, newer) == 0
    out = capsys.readouterr().out
    assert "solo layer-norm rnn, keras_amsgrad" in out and "figures in one file only" in out
    moved = copy.deepcopy(newer)
    moved["solo layer-norm rnn, keras_amsgrad"]["final_val_loss"] = (0.5).hex()
    assert compare(newer, moved) == 1 and "DIFFERENT" in capsys.readouterr().out
    # a file's own check that failed is a failure even where the other file lacks it
    broken = copy.deepcopy(newer) | {"bundle amsgrad: member 0 equals its solo run": False}
    assert compare(older, broken) == 1
    # headers and provenances are not figures: only the runs' figures are listed as one-sided
    capsys.readouterr()
    compare(older, newer)
    said = capsys.readouterr().out
    assert "bundle provenance (amsgrad)" not in said and "5 figures in one file only" in said
