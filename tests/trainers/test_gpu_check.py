"""The GPU check (benchmarks/gpu_check/) and the CUDA-graph helper (trainers/fused/graphs.py), on the CPU.

The script's CPU smoke run must pass its correctness section and produce the table a GPU session will
read; the helper's eager step must be `train_fused`'s step bit for bit, and its graphed step's
bookkeeping (warm-ups, the capture, replays, Adam's per-step factors) must take the same steps: here
with a stand-in for the CUDA graph that replays the captured function. No test depends on the last
bits of this CPU's arithmetic beyond what the fused tests already require (a member is its solo run).
"""

from __future__ import annotations

import contextlib
import json
import math
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode

from trainers import fused
from trainers.cells import list_cells
from trainers.fused import FUSED_CELLS, Bundle, graphs, train_fused
from trainers.fused import steps as fused_steps
from trainers.fused.graphs import GraphedStep, GraphUnsupported

REPO = Path(__file__).resolve().parents[2]
SHAPES = ("copy500", "addition750", "psmnist")


@pytest.fixture(scope="module")
def quick_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict, str, str]:
    out = tmp_path_factory.mktemp("gpu-check")
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "benchmarks.gpu_check",
            "--device",
            "cpu",
            "--quick",
            "--out",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=REPO,
    )
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    return json.loads((out / "gpu_check.json").read_text()), (out / "gpu_check.md").read_text(), proc.stdout


def test_quick_cpu_run_passes_its_correctness_section(quick_run):
    data, _, _ = quick_run
    assert data["passed"] is True
    checks = data["checks"]
    assert not [c for c in checks if c["status"] == "FAIL"]
    sections = {c["section"] for c in checks}
    assert "backward vs autograd (float64)" in sections
    kernels = {c["name"] for c in checks if c["section"] == "backward vs autograd (float64)"}
    for name in ("ElmanScan elu", "FusedElmanScan relu last", "FastRNNScan tanh", "FusedFastRNNScan relu",
                 "ShiftScan", "FusedShiftScan last", "JANETScan", "GRUScan"):  # fmt: skip
        assert name in kernels
    assert sum(n.startswith("NRUScan") for n in kernels) == 2
    trained = {c["name"] for c in checks if c["section"] == "every cell trains on cpu"}
    assert trained == {f"{cell} × {task}" for cell in list_cells() for task in ("copy", "addition")}
    members = [c for c in checks if c["section"] == "bundle member vs solo run (cpu)"]
    assert {c["name"].split()[0] for c in members} == set(FUSED_CELLS)
    for c in members:  # a deviation is reported as a number, within the stated tolerance
        assert c["status"] == "pass" and 0 <= c["max_rel"] <= c["tol"]
    (graph,) = [c for c in checks if c["section"] == "graphed step vs eager step"]
    assert graph["status"] == "refused" and "CUDA" in graph["note"]


def test_quick_cpu_run_writes_the_table_with_sane_numbers(quick_run):
    data, md, stdout = quick_run
    rows = data["rows"]
    for shape in SHAPES:
        mine = [r for r in rows if r["shape"] == shape and r["cell"] == "rnn"]
        native = [("native", 1)] if shape == "addition750" else []  # relu: torch's kernel is an option
        assert [(r["mode"], r["K"]) for r in mine] == [("solo", 1), *native] + [
            (mode, k) for k in (1, 2, 4) for mode in ("eager", "graph")
        ]
        for r in mine:
            if r["mode"] == "graph":  # no CUDA here: said so, no number
                assert r["ms_step"] is None and "CUDA" in r["note"]
                continue
            assert r["ms_step"] > 0 and r["ms_min"] > 0 and r["steps"] == 2
            assert r["ms_member"] == pytest.approx(r["ms_step"] / r["K"])
            assert r["member_steps_per_s"] == pytest.approx(1000 * r["K"] / r["ms_step"])
            assert r["dims"].startswith("T=") and "B=16" in r["dims"]
    assert any(r["cell"] == "srnn" and r["mode"] == "eager" and r["ms_step"] for r in rows)
    assert [p["task"] for p in data["projection"]] == list(SHAPES)
    for p in data["projection"]:
        assert p["runs"] == 2112 and p["bundles"] == [462, 462, 594, 594]
        assert p["budget_steps"] == 375_000  # 100 epochs of 60,000 / 16
        assert math.isfinite(p["eager_hours"]) and p["eager_hours"] > 0 and p["solo_hours"] > 0
        assert not math.isfinite(p["graph_hours"])  # not measured on the CPU
    assert data["env"]["torch"] == torch.__version__ and data["env"]["device"] == "cpu"
    for text in (md, stdout):
        assert "### Timing" in text and "### Projection" in text and "### Correctness" in text
        assert "| psmnist | T=784" in text


# ----- the helper --------------------------------------------------------------------------------------

# three grid points of one layout (chain, fbchain, identity: W row-major), differing in lr and seed
BASE = {"task": "copy", "hidden": 16, "task_params": {"seq_len": 24, "n_train": 64, "n_val": 16}}
POINTS = [
    {"lr": 1e-3, "seed": 1, "cell_params": {"init": "chain"}},
    {"lr": 3e-3, "seed": 2, "cell_params": {"init": "fbchain", "scale": 0.05}},
    {"lr": 5e-4, "seed": 1, "cell_params": {"init": "identity"}},
]


def configs(steps: int, **common) -> list[dict]:
    return [
        {**BASE, **p, "steps": steps, "eval_every": steps, "early_stop_loss": None, "device": "cpu", **common}
        for p in POINTS
    ]


@pytest.mark.parametrize("optimizer", ["rmsprop", "adam"])
def test_the_bundles_eager_step_is_train_fuseds_step_bit_for_bit(optimizer):
    steps = 7
    results = train_fused(configs(steps, optimizer=optimizer))
    bundle = Bundle.of(configs(steps, optimizer=optimizer))
    for _ in range(steps):
        bundle.step()
    w = bundle.model.params[bundle.model.names.index("cell.weight_hh")]
    for k, r in enumerate(results):
        assert r.status == "done" and torch.equal(w[k], r.recurrent_matrix)


def test_graphs_refuse_the_cpu_with_what_to_run_instead():
    with pytest.raises(GraphUnsupported, match=r"CUDA.*Bundle\.step"):
        GraphedStep(Bundle.of(configs(3)))


class StandInGraph:
    """What a captured CUDA graph does, for the CPU: each replay runs the captured function on the
    same buffers, and leaves no Python state behind (the kernels run, the interpreter does not)."""

    def __init__(self, fn, out, optimizer):
        self.fn, self.out, self.optimizer = fn, out, optimizer

    def replay(self):
        taken = self.optimizer.step_count
        self.out.copy_(self.fn())
        self.optimizer.step_count = taken


@pytest.fixture
def stand_in_graphs(monkeypatch):
    """GraphedStep on the CPU, in `Bundle`s and in `train_fused`: no streams, no sync probe, and a
    capture that records the step without running it (each replay runs it). Returns a maker of
    GraphedSteps; `make.captures` counts the captures, wherever they happen."""
    captures, made = [], []

    def capture(self, inputs):
        b = self.bundle
        for p in b.model.params:
            p.grad = None
        out = torch.empty(b.size)
        self.graph, self.losses = (
            StandInGraph(lambda: b.forward_backward(inputs).detach(), out, b.optimizer),
            out,
        )
        self.captures += 1
        captures.append(b.size)
        made.append(self)

    monkeypatch.setattr(graphs, "graphs_available", lambda device: None)
    monkeypatch.setattr(fused_steps, "graphs_available", lambda device: None)
    monkeypatch.setattr(graphs, "side_stream", lambda step: contextlib.nullcontext())
    monkeypatch.setattr(graphs, "sync_errors", lambda on: contextlib.nullcontext())
    monkeypatch.setattr(graphs.GraphedStep, "_capture", capture)

    def make(bundle, warmup=3):
        return GraphedStep(bundle, warmup)

    make.captures = captures
    make.steps = made  # each GraphedStep at its captures
    return make


#: a learning rate that moves: halved after the first epoch (4 steps) and decayed at every step
MOVING_RATE = {"lr_drop_epochs": [1], "lr_drop_factor": 0.5, "lr_decay_steps": 3}


@pytest.mark.parametrize(
    "optimizer, rate",
    [("rmsprop", {}), ("adam", {}), ("keras_adam", {}), ("rmsprop", MOVING_RATE), ("adam", MOVING_RATE)],
)
def test_a_graphed_run_takes_the_eager_runs_steps(stand_in_graphs, optimizer, rate):
    """Warm-ups, the capture (which takes no step itself), replays, and the optimiser's per-step factors
    (Adam's, a moving rate's) from device buffers: the same losses and weights as the eager steps, and
    the same step count."""
    steps = 9
    eager = Bundle.of(configs(steps, optimizer=optimizer, **rate))
    eager_losses = torch.stack([eager.step() for _ in range(steps)])
    graphed = stand_in_graphs(Bundle.of(configs(steps, optimizer=optimizer, **rate)))
    graph_losses = torch.stack([graphed.step() for _ in range(steps)])
    assert graphed.graph is not None and graphed.calls == steps
    assert graphed.bundle.optimizer.step_count == eager.optimizer.step_count == steps
    assert torch.equal(graph_losses, eager_losses)
    for p, q in zip(graphed.bundle.model.params, eager.model.params, strict=True):
        assert torch.equal(p, q)
    assert (graphed.bundle.optimizer.static_factors is not None) == (optimizer != "rmsprop" or bool(rate))


def test_a_step_that_synchronises_is_refused_at_the_probe(stand_in_graphs, monkeypatch):
    step = stand_in_graphs(Bundle.of(configs(5)), warmup=2)
    step.step()  # the first warm-up is no probe
    monkeypatch.setattr(
        Bundle,
        "forward_backward",
        lambda self, inputs: (_ for _ in ()).throw(RuntimeError("called a synchronizing CUDA operation")),
    )
    with pytest.raises(GraphUnsupported, match="synchronises with the host"):
        step.step()


def test_a_batch_of_another_shape_starts_the_graph_over(stand_in_graphs):
    """An epoch's last, partial batch: the graph is dropped and that batch is the first warm-up of the
    next capture; the steps are the eager bundle's, bit for bit."""
    eager, graphed_bundle = Bundle.of(configs(9)), Bundle.of(configs(9))
    step = stand_in_graphs(graphed_bundle, warmup=2)
    batches = [eager.next_batch() for _ in range(8)]
    batches[3] = {s: (x[:, :3], y[:, :3]) for s, (x, y) in batches[3].items()}
    losses = [(eager.step(b), step.step(b)) for b in batches]
    # warm-ups 1–2, capture at 3; 4 (short) and 5 (full again) each start over; warm-up 6, capture at 7
    assert stand_in_graphs.captures == [len(POINTS)] * 2
    assert step.calls == 4 and step.graph is not None
    for a, b in losses:
        assert torch.equal(a, b)
    for p, q in zip(graphed_bundle.model.params, eager.model.params, strict=True):
        assert torch.equal(p, q)


@pytest.mark.parametrize("optimizer", ["rmsprop", "adam"])
def test_train_fused_with_graphs_is_train_fused_without_them(stand_in_graphs, optimizer):
    """The loop's graphed path (`cuda_graphs`, a GPU's default): warm-ups, captures, a new graph after
    each partial batch and after a member leaves (early stop at its first evaluation), Adam's factors
    in device buffers — every member's result the eager loop's, bit for bit (here with the stand-in
    graph; on an H100, with real ones: benchmarks/gpu_check/)."""
    steps = 24

    def runs(graphs_on):
        partial = {**BASE["task_params"], "n_train": 120}  # 7 batches of 16 and one of 8 an epoch
        cs = configs(steps, optimizer=optimizer, eval_every=6, cuda_graphs=graphs_on, task_params=partial)
        cs[1] = {**cs[1], "early_stop_loss": 1e6}  # leaves at its first evaluation
        return train_fused(cs)

    eager = runs(False)
    assert stand_in_graphs.captures == []
    graphed = runs(True)
    assert len(stand_in_graphs.captures) >= 2 and stand_in_graphs.captures[-1] == len(POINTS) - 1
    for e, g in zip(eager, graphed, strict=True):
        assert (e.status, e.steps, e.reason) == (g.status, g.steps, g.reason)
        assert [(x.step, x.train_loss, x.val_loss) for x in e.history] == [
            (x.step, x.train_loss, x.val_loss) for x in g.history
        ]
        assert torch.equal(e.recurrent_matrix, g.recurrent_matrix)
    assert graphed[1].steps == 6 and graphed[0].steps == steps


def test_cuda_graphs_is_no_part_of_a_trials_identity_and_takes_no_graph_off_cuda():
    """An execution setting, like the device: the same hash either way; and on a machine without CUDA
    no bundle is graphed (its steps after the first are timed by a calibration)."""
    from trainers.config import resolve
    from trainers.fused import steps_to_pace, trains_graphed

    on, off = (resolve(configs(6, cuda_graphs=v)[0]) for v in (True, False))
    assert on.config_hash() == off.config_hash()
    assert not trains_graphed(on.config) and steps_to_pace(on.config) == 1


def test_a_graph_that_is_replaced_lets_its_memory_go_at_once(stand_in_graphs):
    """Members leaving make a new graph; the old one (and its inputs, outputs and Adam's buffers) is
    closed there, not left to a garbage collection (the loop's stepper and its GraphedStep refer to
    each other): on a GPU its pool is the step's activations for the old bundle size."""
    cs = configs(24, optimizer="adam", eval_every=6, cuda_graphs=True)
    cs[1] = {**cs[1], "early_stop_loss": 1e6}
    train_fused(cs)
    steps = list(dict.fromkeys(stand_in_graphs.steps))  # distinct GraphedSteps, in order
    assert len(steps) >= 2  # one for three members, one for the two left
    assert all(
        s.graph is None and s.losses is None and s.inputs == {} for s in steps
    )  # all closed at the end
    assert steps[-1].bundle.optimizer.static_factors is None


def test_a_step_that_synchronises_trains_eagerly_in_train_fused(stand_in_graphs, monkeypatch):
    """In the loop (`fallback`), a host sync found at the probe is not a failure: that step is redone
    eagerly (the optimiser had not run) and the run goes on eagerly — every number the eager loop's."""
    real = fused.BundleSteps.forward_backward
    calls = {"n": 0}

    def syncing(self, batch):
        calls["n"] += 1
        if calls["n"] == fused.GRAPH_WARMUP:  # the probe: fail before the optimiser runs
            raise RuntimeError("called a synchronizing CUDA operation")
        return real(self, batch)

    eager = train_fused(configs(12, optimizer="adam", cuda_graphs=False))
    monkeypatch.setattr(fused.BundleSteps, "forward_backward", syncing)
    graphed = train_fused(configs(12, optimizer="adam", cuda_graphs=True))
    assert stand_in_graphs.captures == []  # nothing captured: eager from the probe on
    for e, g in zip(eager, graphed, strict=True):
        assert g.status == "done" and torch.equal(e.recurrent_matrix, g.recurrent_matrix)


def test_batches_whose_shape_keeps_changing_make_the_steps_eager(stand_in_graphs):
    """varcopy draws a lag per batch: its shape changes every step, so no graph would ever replay.
    After FRUITLESS_RESTARTS starts that replayed nothing, the steps are eager for good — the same
    numbers, no capture."""
    bundle = Bundle.of(configs(12))
    eager = Bundle.of(configs(12))
    step = graphs.GraphedStep(bundle, fallback=True)
    for i in range(10):
        batch = {s: (x[:, : 3 + i % 2], y[:, : 3 + i % 2]) for s, (x, y) in eager.next_batch().items()}
        assert torch.equal(step.step(batch), eager.step(batch))
    assert step.eager and stand_in_graphs.captures == [] and step.graph is None
    for p, q in zip(bundle.model.params, eager.model.params, strict=True):
        assert torch.equal(p, q)


# ----- host reads: what a CUDA graph cannot hold, found on the CPU --------------------------------------

#: ATen ops that read a device tensor's values on the host (on CUDA each waits for the device, and a
#: graph capture refuses it): a tensor to a Python number (`float`, `bool`, `item`), and ops whose
#: output's shape depends on the values
HOST_READING_OPS = {
    "_local_scalar_dense", "is_nonzero", "nonzero", "masked_select", "equal",
    "_unique2", "unique_dim", "unique_consecutive", "repeat_interleave",
}  # fmt: skip
#: Tensor methods that hand the values to Python (on a CPU tensor they copy nothing, so no ATen op shows)
HOST_READING_METHODS = {"tolist", "numpy", "cpu"}


class HostReads(TorchDispatchMode):
    """Records every ATen op of `HOST_READING_OPS` that runs inside it (with `Methods`, the methods)."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func.overloadpacket.__name__
        if name in HOST_READING_OPS or (name in ("index", "index_put", "index_put_") and _masks(args)):
            self.seen.append(name)
        return func(*args, **(kwargs or {}))


def _masks(args) -> bool:
    """Whether an indexing op's indices hold a boolean mask (its result's shape is the mask's count)."""
    indices = args[1] if len(args) > 1 else ()
    return any(isinstance(i, torch.Tensor) and i.dtype in (torch.bool, torch.uint8) for i in indices)


class Methods(TorchFunctionMode):
    def __init__(self, seen: list[str]) -> None:
        super().__init__()
        self.seen = seen

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if getattr(func, "__name__", "") in HOST_READING_METHODS:
            self.seen.append(func.__name__)
        return func(*args, **(kwargs or {}))


@contextlib.contextmanager
def host_reads():
    with HostReads() as ops, Methods(ops.seen):
        yield ops.seen


def test_the_host_read_probe_sees_what_a_graph_would_refuse():
    """The probe below bites: each way a step can read a value on the host is seen (on the CPU,
    where torch's sync debug mode sees nothing)."""
    t = torch.randn(5)
    for read in (
        lambda: float(t[0]),
        lambda: bool(t.any()),
        lambda: t.sum().item(),
        lambda: t.tolist(),
        lambda: t[t > 0],
        lambda: t.clone().index_put_((t > 0,), torch.tensor(1.0)),
        lambda: t.nonzero(),
    ):
        with host_reads() as seen:
            read()
        assert seen, read
    with host_reads() as seen:
        torch.where(t > 0, t, t * 2).mul_(t[0]).sum()  # all on the device
    assert seen == []


#: a bundle of two members, on a task whose loss reads the last state (addition) and on one whose loss
#: reads a sequence (copy)
GRAPH_MEMBERS = [{"lr": 1e-3, "seed": 1}, {"lr": 3e-3, "seed": 2}]


@pytest.mark.parametrize("task", ["addition", "copy"])
@pytest.mark.parametrize("cell", sorted(FUSED_CELLS))
@pytest.mark.parametrize("optimizer, rate", [("rmsprop", {}), ("adam", {}), ("rmsprop", MOVING_RATE)])
def test_a_graphable_cells_step_reads_nothing_on_the_host(cell, task, optimizer, rate):
    """What a CUDA graph captures (`forward_backward`: forward, losses, backward, clip, optimiser)
    must not read a value on the host: a graph cannot hold it, and on a GPU the probe at the last
    warm-up would train the bundle eagerly. Checked on the CPU for every fused cell, as a
    `GraphedStep` runs it (the optimiser's per-step factors, Adam's or a moving rate's, in buffers); a
    cell that must read one is marked not `graphable`, and then this test shows why."""
    common = {
        "cell": cell, "task": task, "hidden": 8, "task_params": {"seq_len": 24, "n_train": 32, "n_val": 16},
        "optimizer": optimizer, "steps": 4, "eval_every": 4, "early_stop_loss": None, "device": "cpu", **rate,
    }  # fmt: skip
    bundle = Bundle.of([{**m, **common} for m in GRAPH_MEMBERS])
    opt = bundle.optimizer
    if opt.varies:  # as GraphedStep sets them: the per-step factors in device buffers
        opt.static_factors = tuple(torch.empty_like(f) for f in opt.factors(1, torch.device("cpu")))
    for _ in range(2):  # the first step allocates (the workspace, the optimiser's state)
        if opt.static_factors is not None:
            for buffer, f in zip(
                opt.static_factors, opt.factors(opt.step_count + 1, torch.device("cpu")), strict=True
            ):
                buffer.copy_(f)
        batch = bundle.next_batch()
        with host_reads() as seen:
            losses = bundle.forward_backward(batch)
        bundle.model.after_step()
    assert torch.isfinite(losses).all()
    if FUSED_CELLS[cell].graphable:
        assert seen == [], f"{cell}: its step reads {sorted(set(seen))} on the host"
    else:
        assert seen, f"{cell} is marked not graphable, but its step reads nothing on the host: mark it so"
