"""Numbers to hold side by side from two x86-64 CPUs running the same torch: the portable mode's promise
across vendors, checked for real (issue 33; docs/reproducibility.md).

    python tools/cross_vendor.py --out amd.json          # on each machine, the same torch version
    python tools/cross_vendor.py --compare amd.json xeon.json

Each run is a fresh process on the CPU with one thread:

- the README's check trial (`python -m trainers train --task copy --seq-len 50 --init chain --scale 1.0
  --lr 3e-4 --steps 2000 --eval-every 500 --seed 1`), in the portable mode and in the native one;
- a fused bundle of four rnn members (copy T = 50; seeds 1 and 2, lr 1e-3 and 3e-4; 500 steps), with
  RMSprop and with Adam, and with AMSGrad on nn.RNN's draws and second bias (SRNN's RNN), in the
  portable mode;
- the layer-normalised RNN (NRU's RNN-orth: ATen's LayerNorm) alone with Keras' AMSGrad, 300 steps.

It records each run's final validation loss (as `float.hex`), a digest of its evaluations and trained
W, and where the numbers came from (`provenance`, the CPU's flags). `--compare` prints them side by
side: every portable figure must be equal (exit 0), the native ones may part; a figure only one file
holds (an older tool's file lacks the newer figures) is listed and not compared. It needs the trainers
only (torch and numpy), so it runs on a lent GPU machine's host CPU as it is (its trials train with
`--device cpu`, whatever GPU the machine has).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
CHECK_TRIAL = ["--task", "copy", "--seq-len", "50", "--init", "chain", "--scale", "1.0", "--lr", "3e-4",
               "--steps", "2000", "--eval-every", "500", "--seed", "1"]  # fmt: skip


#: the bundles by optimizer, with the settings each adds: RMSprop and Adam on the defaults; AMSGrad on
#: nn.RNN's draws and second bias, SRNN's RNN (its readout nn.Linear's)
BUNDLES: dict[str, dict[str, Any]] = {
    "rmsprop": {},
    "adam": {},
    "amsgrad": {
        "cell_params": {"init": "plain", "bias_hh": True, "nonlinearity": "tanh"},
        "readout_init": "plain",
    },
}
#: trials that train alone, by label: the layer-normalised RNN (NRU's RNN-orth; ATen's LayerNorm) with
#: Keras' AMSGrad, as the NRU presets run it
SOLOS: dict[str, dict[str, Any]] = {
    "solo layer-norm rnn, keras_amsgrad": {
        "task": "copy", "cell": "rnn", "task_params": {"seq_len": 50}, "steps": 300, "eval_every": 150, "seed": 1,
        "lr": 1e-3, "optimizer": "keras_amsgrad", "readout_init": "xavier_normal", "device": "cpu", "threads": 1,
        "numerics": "portable",
        "cell_params": {"layer_norm": True, "nonlinearity": "tanh", "input_init": "xavier_normal"},
    },
}  # fmt: skip


def bundle(optimizer: str) -> list[dict[str, Any]]:
    return [
        {"task": "copy", "cell": "rnn", "task_params": {"seq_len": 50}, "steps": 500, "eval_every": 250,
         "seed": seed, "lr": lr, "optimizer": optimizer, "device": "cpu", "threads": 1, "numerics": "portable",
         **BUNDLES[optimizer]}
        for seed in (1, 2) for lr in (1e-3, 3e-4)
    ]  # fmt: skip


def digest(history: list[dict[str, Any]], w: Any) -> str:
    h = hashlib.sha256(json.dumps([(e["step"], e["train_loss"], e["val_loss"]) for e in history]).encode())
    if w is not None:
        h.update(w.numpy().tobytes())
    return h.hexdigest()[:16]


def child_bundle(optimizer: str) -> dict[str, Any]:
    """In a fresh portable process: the bundle's members, then member 0 alone (it must equal its member);
    with the AMSGrad bundle, the `SOLOS` too."""
    sys.path.insert(0, str(ROOT))
    from trainers import numerics

    numerics.use("portable")
    from trainers.fused import train_fused
    from trainers.loop import train

    solos: dict[str, Any] = {}
    for name, config in SOLOS.items() if optimizer == "amsgrad" else ():
        r = train(config)
        solos[name] = {
            "final_val_loss": r.final_val_loss.hex() if r.final_val_loss is not None else None,
            "digest": digest([e.to_dict() for e in r.history], r.recurrent_matrix),
        }
    configs = bundle(optimizer)
    members = train_fused(configs)
    solo = train(configs[0])
    out = {
        f"bundle {optimizer} member {k}": {
            "final_val_loss": r.final_val_loss.hex() if r.final_val_loss is not None else None,
            "digest": digest([e.to_dict() for e in r.history], r.recurrent_matrix),
        }
        for k, r in enumerate(members)
    }
    out[f"bundle {optimizer}: member 0 equals its solo run"] = (
        digest([e.to_dict() for e in solo.history], solo.recurrent_matrix)
        == out[f"bundle {optimizer} member 0"]["digest"]
    )
    out["provenance"] = members[0].provenance
    return out | solos


def check_trial(mode: str) -> dict[str, Any]:
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("MKL_CBWR", "ATEN_CPU_CAPABILITY", "ONEDNN_MAX_CPU_ISA")
    }
    env |= {"MEMSWEEP_NUMERICS": mode, "PYTHONPATH": str(ROOT)}
    cmd = [sys.executable, "-m", "trainers", "train", *CHECK_TRIAL, "--device", "cpu", "--threads", "1", "--json",
           "--history"]  # fmt: skip
    done = subprocess.run(cmd, env=env, cwd=ROOT, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise SystemExit(f"the check trial ({mode}) failed:\n{done.stderr[-3000:]}")
    result = json.loads(done.stdout)
    return {
        "final_val_loss": float(result["final_val_loss"]).hex(),
        "final_val_loss (decimal)": result["final_val_loss"],
        "digest": digest(result["history"], None),
        "provenance": result.get("provenance"),
    }


def cpu_flags() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags"):
                keep = ("avx2", "fma", "avx512f", "amx_tile", "avx512_fp16")
                return " ".join(f for f in line.split(":", 1)[1].split() if f in keep)
    except OSError:
        pass
    return "?"


def collect() -> dict[str, Any]:
    import torch

    sys.path.insert(0, str(ROOT))
    from trainers import TRAINER_VERSION

    out: dict[str, Any] = {
        "trainer_version": TRAINER_VERSION,
        "torch": torch.__version__,
        "python": sys.version.split()[0],
        "cpu flags": cpu_flags(),
    }
    for mode in ("portable", "native"):
        out[f"check trial, {mode}"] = check_trial(mode)
        print(f"check trial, {mode}: {out[f'check trial, {mode}']['final_val_loss (decimal)']}", flush=True)
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("MKL_CBWR", "ATEN_CPU_CAPABILITY", "ONEDNN_MAX_CPU_ISA")
    }
    env |= {"MEMSWEEP_NUMERICS": "portable", "PYTHONPATH": str(ROOT)}
    for optimizer in BUNDLES:
        cmd = [sys.executable, __file__, "--child-bundle", optimizer]
        done = subprocess.run(cmd, env=env, cwd=ROOT, capture_output=True, text=True, check=False)
        if done.returncode != 0:
            raise SystemExit(f"the {optimizer} bundle failed:\n{done.stderr[-3000:]}")
        got = json.loads(done.stdout.strip().splitlines()[-1])
        out[f"bundle provenance ({optimizer})"] = got.pop("provenance")
        out |= got
        print(f"bundle {optimizer}: done", flush=True)
    return out


def is_figure(value: Any) -> bool:
    """A run's figure (its final loss and digest) or a file's own check (a bool), not a header
    (versions, CPU flags) or a provenance."""
    return isinstance(value, bool) or (isinstance(value, dict) and "final_val_loss" in value)


def compare(a: dict[str, Any], b: dict[str, Any]) -> int:
    """Side by side; 1 when a portable figure differs (or the torch or trainer versions do). A file
    written before the tool recorded the trainer version shows `-` for it and is compared as it is."""
    bad = 0
    w = max(map(len, (*a, *b))) + 2  # the label column: the longest key and a gap
    print(f"{'':<{w}}{'A':<26}{'B':<26}")
    for key in ("trainer_version", "torch", "cpu flags"):
        print(f"{key:<{w}}{a.get(key, '-')!s:<25} {b.get(key, '-')!s:<26}")
    if a.get("torch") != b.get("torch"):
        print("the torch versions differ: the comparison needs the same torch on both machines")
        bad = 1
    if (
        None not in (a.get("trainer_version"), b.get("trainer_version"))
        and a["trainer_version"] != b["trainer_version"]
    ):
        print("the trainer versions differ: a TRAINER_VERSION moves numbers (CHANGELOG.md)")
        bad = 1
    one_side = []
    for key in sorted(k for k in set(a) | set(b) if is_figure(a.get(k)) or is_figure(b.get(k))):
        x, y = a.get(key), b.get(key)
        if isinstance(x, bool) or isinstance(y, bool):  # a file's own check (member 0 equals its solo run)
            print(f"{key:<{w}}{'-' if x is None else x!s:<26}{'-' if y is None else y!s:<26}")
            bad |= not all(v for v in (x, y) if v is not None)
            continue
        if x is None or y is None:  # a figure the other file's tool did not yet record
            one_side.append(key)
            print(f"{key:<{w}}{'-' if x is None else 'recorded':<26}{'-' if y is None else 'recorded':<26}"
                  f"in one file only: not compared")  # fmt: skip
            continue
        same = x == y or (x["final_val_loss"] == y["final_val_loss"] and x.get("digest") == y.get("digest"))
        portable = "native" not in key
        mark = "same" if same else ("DIFFERENT" if portable else "differ (native: allowed)")
        print(
            f"{key:<{w}}{float.fromhex(x['final_val_loss'])!r:<26}{float.fromhex(y['final_val_loss'])!r:<26}{mark}"
        )
        bad |= portable and not same
    if one_side:
        print(f"{len(one_side)} figures in one file only (recorded by a newer tool): not compared; run the "
              f"tool of this version on both machines to compare them")  # fmt: skip
    return bad


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, help="write this machine's figures here (JSON)")
    ap.add_argument("--compare", nargs=2, type=Path, metavar=("A", "B"))
    ap.add_argument("--child-bundle", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child_bundle:
        print(json.dumps(child_bundle(args.child_bundle)))
        return
    if args.compare:
        a, b = (json.loads(p.read_text()) for p in args.compare)
        raise SystemExit(compare(a, b))
    if not args.out:
        ap.error("give --out FILE (this machine's figures) or --compare A B")
    figures = collect()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(figures, indent=1, sort_keys=True))
    print(f"→ {args.out}")


if __name__ == "__main__":
    main()
