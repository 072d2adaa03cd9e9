"""The trainer runtime: what the solo loop (`trainers.loop.train`) and the fused one
(`trainers.fused.train_fused`) both do around their steps, written once.

- the process: its device (`resolve_device`) and what it sets before its first step
  (`configure_process`: numerics mode, threads, denormals, malloc, TF32, the GPU's memory share);
- a trial's data: its training batches, a pure function of (task, batch size, seed) (`training_batches`),
  and a validation pass's running sums (`ValidationSums`);
- a trial's result: what it records of its task and device before training, its trained network and
  its analyses after, and a failure's reason (`record_task`, `record_device`, `keep_network`, `fail`).

It knows nothing of a cell, a bundle, Ray or MLflow.
"""

from __future__ import annotations

import ctypes
import functools
import itertools
import logging
import math
import os
import traceback
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import cast

import torch

from trainers import plugins
from trainers.config import TrainConfig
from trainers.model import SequenceModel
from trainers.numerics import provenance
from trainers.numerics import use as use_numerics
from trainers.result import TrialResult
from trainers.seeding import generator
from trainers.tasks import Task
from trainers.tasks.base import Tensors

log = logging.getLogger(__name__)


# ----- the process --------------------------------------------------------------------------------


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    device = torch.device(name)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise RuntimeError(f"device {name!r} was requested but CUDA is not available; use device=cpu or auto")
    return device


def configure_process(device: torch.device, threads: int, numerics: str) -> None:
    """What a training process sets before its first step (`train`, `train_fused`, the benchmarks):
    its numerics mode (`trainers.numerics.use`: which CPU kernels compute the numbers; NumericsError
    when the process already computes with another), torch's thread count and, on the CPU, denormals
    flushed to zero on every thread that computes (`flush_denormals`; denormals in decaying states are
    many times slower) and freed memory kept for reuse
    (`keep_freed_memory`); on a GPU, float32 computed as IEEE float32 (TF32 off, in cuBLAS and cuDNN)
    and at most $MEMSWEEP_GPU_MEMORY_FRACTION of the card's memory allocated (`gpu_memory_fraction`).
    Only the numerics mode and the TF32 setting move a number.

    TF32: torch leaves it on for cuDNN by default, and cuDNN's RNN (a solo Elman cell with relu or
    tanh on a GPU, `trainers.kernels.elman_rnn`) then rounds its products to 10 mantissa bits, and a
    solo run drifts from its bundle member (cuBLAS, float32; measured: docs/gpu.md). The papers'
    float32 is IEEE float32."""
    use_numerics(numerics)
    torch.set_num_threads(threads)
    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
        fraction = gpu_memory_fraction()
        if fraction is not None:
            # by index: torch refuses a device without one ("cuda", what device "auto" gives), and None
            # is the current device, which is the one a bare "cuda" computes on
            torch.cuda.set_per_process_memory_fraction(fraction, device.index)
    if device.type == "cpu":
        flush_denormals(True)
        keep_freed_memory()


#: the share of a GPU's memory a training process may allocate (torch's allocator refuses beyond it, as
#: when the card is full: a bundle then trains again in halves, `trainers.fused`); unset: all of it
GPU_MEMORY_FRACTION = "MEMSWEEP_GPU_MEMORY_FRACTION"


def gpu_memory_fraction() -> float | None:
    """$MEMSWEEP_GPU_MEMORY_FRACTION as a fraction in (0, 1], or None when unset."""
    raw = os.environ.get(GPU_MEMORY_FRACTION, "").strip()
    if not raw:
        return None
    try:
        value = float(raw)
    except ValueError:
        value = math.nan
    if not 0 < value <= 1:
        raise ValueError(
            f"{GPU_MEMORY_FRACTION}={raw!r} is not a fraction of a GPU's memory: give a number in (0, 1], "
            "e.g. 0.5, or unset it to let a trainer use the whole card"
        )
    return value


def flush_denormals(on: bool) -> None:
    """Denormals flushed to zero (or not) on this thread and on every thread of the OpenMP pool that
    ATen, MKL and oneDNN compute on with `threads` > 1.

    `torch.set_flush_denormal` sets the calling thread's CPU flags only, and a pool thread takes its
    flags from the thread that made it: a pool made before a trial set them (a task's data built with
    torch's default thread count, an earlier trial in a reused Ray worker) kept computing denormals, so
    with 2 threads half of a large elementwise op's elements were flushed and half were not, as the
    process's history had it (tests/trainers/test_numerics.py). So the flags are also set in a parallel
    region of the current thread count, run by the OpenMP runtime torch itself links (its
    `GOMP_parallel`, which Intel's and LLVM's runtimes also export): the same threads as every later
    region's. Then a denormal product on every thread must come out 0, or a RuntimeError says so (a
    trial's hash holds `THREADED_VERSION`: it must not train otherwise). One thread: no pool to reach."""
    torch.set_flush_denormal(on)
    threads = torch.get_num_threads()
    if threads == 1:
        return
    parallel = _openmp_parallel()
    if parallel is not None:
        parallel(_REGION(lambda _: torch.set_flush_denormal(on)), None, threads, 0)
    if on and not _flushed_on(threads):
        raise RuntimeError(
            f"denormals are not flushed on every one of the {threads} threads "
            f"({'the OpenMP runtime torch links was not found' if parallel is None else 'its pool kept them'}):"
            " train with threads=1"
        )


#: `void GOMP_parallel(void (*fn)(void *), void *data, unsigned num_threads, unsigned flags)`
_REGION = ctypes.CFUNCTYPE(None, ctypes.c_void_p)


class _DlInfo(ctypes.Structure):
    _fields_ = [
        ("dli_fname", ctypes.c_char_p),
        ("dli_fbase", ctypes.c_void_p),
        ("dli_sname", ctypes.c_char_p),
        ("dli_saddr", ctypes.c_void_p),
    ]


@functools.cache
def _openmp_parallel() -> Callable[..., None] | None:
    """`GOMP_parallel` of the OpenMP runtime torch's CPU library links — the library that gives it
    `omp_get_max_threads`, by `dladdr` (another one a plugin loaded, scikit-learn's libgomp, has a pool
    of its own) — or None where that cannot be found."""
    lib = Path(torch.__file__).parent / "lib"
    candidates = sorted(lib.glob("libtorch_cpu.*"))
    try:
        torch_cpu = ctypes.CDLL(str(candidates[0]))
        address = ctypes.cast(torch_cpu.omp_get_max_threads, ctypes.c_void_p)
        info = _DlInfo()
        if not ctypes.CDLL(None).dladdr(address, ctypes.byref(info)) or not info.dli_fname:
            return None
        parallel = ctypes.CDLL(info.dli_fname.decode()).GOMP_parallel
    except (IndexError, OSError, AttributeError):
        return None
    parallel.argtypes = [_REGION, ctypes.c_void_p, ctypes.c_uint, ctypes.c_uint]
    parallel.restype = None
    return cast(Callable[..., None], parallel)


def _flushed_on(threads: int) -> bool:
    """Whether a denormal product comes out 0 on every thread: the smallest denormal (by its bits: a
    conversion under the flags would flush it first) doubled, over enough elements that each thread of
    `threads` takes a share (ATen's grain is 32,768)."""
    smallest = torch.ones(threads * 65536, dtype=torch.int32).view(torch.float32)
    return bool(((smallest * 2) == 0).all())


#: glibc's mallopt parameters (malloc.h) and the values `keep_freed_memory` sets
_M_TRIM_THRESHOLD, _M_MMAP_MAX = -1, -4
TRIM_THRESHOLD_BYTES = 512 * 2**20


@functools.cache
def keep_freed_memory() -> bool:
    """Have glibc's malloc serve every block from its heap (no block of its own mapped with mmap) and
    keep up to 512 MB of freed heap instead of handing it back to the kernel; True when set (False
    off glibc).

    A training step allocates and frees the same large tensors every step (autograd's gradients, a
    loss's softmax, oneDNN's LSTM workspace). By default glibc maps a block above its threshold
    (128 KB at first, raised as mapped blocks are freed, never above 32 MB) fresh each time and
    unmaps it when freed, and the kernel zero-fills every 4 KB page on first touch, a cost per step
    that a large tensor pays again every step (measured: docs/speed.md). The cost: a process keeps
    the heap its largest step needed. Set once per process.
    """
    try:
        libc = ctypes.CDLL("libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):  # not glibc (macOS, musl): its allocator's defaults stay
        return False
    return bool(mallopt(_M_MMAP_MAX, 0)) and bool(mallopt(_M_TRIM_THRESHOLD, TRIM_THRESHOLD_BYTES))


# ----- a trial's data -----------------------------------------------------------------------------


def training_batches(task: Task, batch_size: int, seed: int) -> Iterator[Tensors]:
    """The trial's training batches, a pure function of (task, batch size, seed)."""
    if task.data_regime == "fresh":
        gen = generator(seed, "batches")
        while True:
            yield task.sample(batch_size, gen)
    split = task.train_split()
    orders = task.epoch_orders()  # the task's own order (NRU's iterator), else a shuffle from the seed
    if orders is None:
        gen = generator(seed, "shuffle")
        orders = (torch.randperm(len(split), generator=gen) for _ in itertools.count())
    for order in orders:  # one pass per epoch, last partial batch kept (Keras)
        for start in range(0, len(order), batch_size):
            yield split.take(order[start : start + batch_size])


@dataclass
class ValidationSums:
    """A validation pass's running sums, batch by batch (the solo loop and fused bundles both use it)."""

    loss: float = 0.0
    metric: float = 0.0
    n: int = 0

    def add(self, task: Task, out: torch.Tensor, y: torch.Tensor, b: int) -> None:
        self.loss += float(task.loss(out, y)) * b
        self.metric += task.metric_sum(out, y)
        self.n += b

    def means(self, task: Task) -> tuple[float, float | None]:
        """(mean validation loss, mean metric or None for a task without one)."""
        return self.loss / self.n, (self.metric / self.n if task.metric_name else None)


# ----- a trial's result ---------------------------------------------------------------------------


def record_task(result: TrialResult, task: Task) -> None:
    """What a result records of its task before training: the metric's name and the baselines."""
    result.metric_name = task.metric_name
    result.baseline_loss = task.baseline_loss
    result.reference_baselines = dict(task.reference_baselines)


def record_device(result: TrialResult, device: torch.device, config: TrainConfig) -> None:
    """What a result records of where it trained: the device, and where its numbers came from (with
    the plugins its cell and task come from, `plugin.cell` / `plugin.task`: `trainers.plugins`)."""
    result.device = str(device)
    result.provenance = provenance(device)
    record_plugins(result, config)


def record_plugins(result: TrialResult, config: TrainConfig) -> None:
    """The plugins the trial's cell and task come from, in its provenance (`plugin.cell`, `plugin.task`:
    their identities, `trainers.plugins`): a comparison of two studies names a plugin's code change by them."""
    used = plugins.identities(config.cell, config.task)
    if used:
        result.provenance = {**(result.provenance or {}), **{f"plugin.{kind}": i for kind, i in used.items()}}


def keep_network(result: TrialResult, model: SequenceModel, nonlinearity: str | None) -> None:
    """The trained W and V in the result, with their analyses: the Henrici index d(W) and the weight
    profile (Orhan & Pitkow §3.2, Figs. 5-6: "a unit pulse of input" at t = 0, through the trained
    input weights, then 100 steps without input, units ordered by peak time)."""
    from trainers.analysis import henrici_index, network_profile

    w, v = model.cell.recurrent_matrix(), model.cell.input_matrix()
    result.recurrent_matrix = w.detach().cpu().clone() if w is not None else None
    result.input_matrix = v.detach().cpu().clone() if v is not None else None
    w, v = result.recurrent_matrix, result.input_matrix
    if w is None:
        return
    result.henrici_index = henrici_index(w)
    pulse = v.sum(dim=1) if v is not None else torch.ones(w.shape[0])
    result.profile = network_profile(w, pulse, nonlinearity=nonlinearity or "linear").mean


#: CUDA's "sticky" errors, as their messages say them: after one, the process's CUDA context is broken
#: and every later call in it fails (CUDA's runtime API documents these as needing a new process)
STICKY_CUDA_ERRORS = (
    "illegal memory access",
    "unspecified launch failure",
    "device-side assert",
    "misaligned address",
    "illegal instruction",
    "hardware stack error",
    "uncorrectable ecc",
    "launch timed out",
    "device has fallen off the bus",
    "no cuda-capable device",
)


def device_fault(exc: BaseException) -> bool:
    """Whether `exc` is a device fault, no result of the trial: a sticky CUDA error
    (`STICKY_CUDA_ERRORS`, raised as `torch.AcceleratorError`) leaves its process's CUDA context broken,
    so every later member or trial in that process would fail the same way. The loops raise it
    instead of failing the trial; the service then runs the trial again in a new process (Ray does not
    reuse a worker whose trial raised; `service.study.book`: an infrastructure fault, tried up to three
    times). A CUDA error that leaves the context working (a capture refused, an invalid argument) stays
    the trial's failure, as does running out of memory (a bundle trains again in halves)."""
    text = str(exc).lower()
    return isinstance(exc, torch.AcceleratorError) and any(marker in text for marker in STICKY_CUDA_ERRORS)


def fail(result: TrialResult, exc: BaseException) -> None:
    """A trial ended by an exception: `failed`, with a reason that is one line a person can read (the
    exception's type and first line of its message) and the whole traceback kept beside it (and logged)."""
    message = str(exc).strip().splitlines()
    result.status = "failed"
    result.reason = f"{type(exc).__name__}: {message[0][:500] if message else ''}".rstrip(": ")
    result.traceback = "".join(traceback.format_exception(exc))
    log.warning("trial failed: %s", result.reason, exc_info=exc)
