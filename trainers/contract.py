"""The contracts of a cell and a task, checked on a running class (issue 38): what `memsweep plugins check`
runs over a plugin, and what the door runs before a study trains one.

A cell (`trainers.cells.base.Cell`) must
- be a concrete subclass built as (config, input_size, hidden_size, gen), its `Config` a dataclass whose
  every field has a default;
- draw its initial weights from `gen` alone: the same generator seed gives the same weights, and torch's
  global generator is not touched (a seed must fix the trial);
- map x [T, B, d] to finite states [T, B, N], through which the gradient reaches the first step, each
  example's states its own whatever the batch (4 examples as a batch of 4 or among 1,200: a trial trains
  in batches of 16 and validates in batches of 1,000);
- give a finite initial loss on the papers' tasks (addition, copy), and, when it declares a fused form,
  train each member of a bundle exactly as alone (bit for bit, a few steps).

A task (`trainers.tasks.base.Task`) must be built from its `Config` (at its `check_params`) and a seed;
draw its data from its own generators (the global one untouched; the same seed the same data, another seed
other data unless `seeded_data` is False); encode batches of the shapes it declares; and give a finite,
positive baseline and a finite initial loss under an Elman cell.

Each check returns `Problem`s naming the check and what is wrong; none means the contract holds. Every
check that can run does, whatever the others found (a cell that draws from the global generator and mixes
its examples is told both at once); one that cannot, as an earlier one failed (nothing runs on a cell that
cannot be built), is named in a `not checked` problem that says which.
"""

from __future__ import annotations

import copy
import dataclasses
import inspect
import math
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch

from trainers import numerics
from trainers.cells import Cell
from trainers.numerics import use as use_numerics
from trainers.tasks import Task

#: the papers' tasks a cell is checked on, at small sizes: one read at the last step, one at every step
CELL_TASKS: dict[str, dict[str, Any]] = {
    "addition": {"seq_len": 20, "n_train": 32, "n_val": 16},
    "copy": {"seq_len": 30, "n_train": 32, "n_val": 16},
}
HIDDEN = 12
CPU = torch.device("cpu")


@dataclass(frozen=True)
class Problem:
    check: str  # which rule: "constructor", "generator", "shapes", "loss", "gradient", "fused", …
    message: str

    def __str__(self) -> str:
        return f"{self.check}: {self.message}"


def _not_checked(checks: str, because: str) -> Problem:
    return Problem("not checked", f"{checks}: {because}")


@contextmanager
def _global_rng_watch(problems: list[Problem], what: str) -> Iterator[None]:
    """Record a problem when the block draws from torch's global generator."""
    before = torch.get_rng_state()
    yield
    if not torch.equal(before, torch.get_rng_state()):
        problems.append(
            Problem(
                "generator",
                f"{what} drew from torch's global random generator: draw from the trial's generator "
                "(`gen` for a cell's weights, `trainers.seeding.generator(seed, stream)` for a task's data) "
                "so that a seed fixes the trial",
            )
        )


def _dataclass_defaults(cls: type, what: str) -> list[Problem]:
    config = getattr(cls, "Config", None)
    if not (isinstance(config, type) and dataclasses.is_dataclass(config)):
        return [
            Problem("config", f"{what}.Config must be a dataclass of its hyperparameters, got {config!r}")
        ]
    if not config.__dataclass_params__.frozen:  # type: ignore[attr-defined]
        return [
            Problem(
                "config",
                f"{what}.Config must be a frozen dataclass (`@dataclass(frozen=True)`): a trial's settings "
                "are its identity, and must not change once resolved",
            )
        ]
    missing = [
        f.name
        for f in dataclasses.fields(config)
        if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
    ]
    if missing:
        return [
            Problem("config", f"{what}.Config fields {missing} have no default: give each one its paper's")
        ]
    return []


def _settings(cls: Any, kind: str) -> list[Problem]:
    """No setting named like a trial's own, which a study's value would set instead
    (`trainers.config.own_clash`). One a cell shares with a task is no problem of the cell's: a study
    that pairs them is refused (`setting_clash`), and the checks below build it on addition and copy
    whatever it shares with them."""
    from trainers.config import own_clash

    if not dataclasses.is_dataclass(getattr(cls, "Config", None)):
        return []  # (no settings to name: `_dataclass_defaults` says what is wrong)
    why = own_clash(kind, cls.name, cls)
    return [] if why is None else [Problem("settings", why)]


def _cost_settings(cls: Any, what: str) -> list[Problem]:
    """`cost_settings` names settings of the cell's `Config` (a name it does not have would leave the
    setting it meant one shape for all its values, and the plan's estimate off, without a word)."""
    if not dataclasses.is_dataclass(getattr(cls, "Config", None)):
        return []
    unknown = sorted(set(cls.cost_settings) - {f.name for f in dataclasses.fields(cls.Config)})
    if not unknown:
        return []
    return [
        Problem("settings", f"{what}.cost_settings names {unknown}, which are not fields of {what}.Config")
    ]


def _class(cls: Any, base: type, what: str) -> list[Problem]:
    """A concrete subclass of `base` (a cell's or task's contract starts there), checked in this process's
    numerics mode (the first check fixes it: `trainers.numerics`)."""
    use_numerics(numerics.current() or numerics.default_mode())
    if not (isinstance(cls, type) and issubclass(cls, base)):
        return [Problem("class", f"{what} is not a subclass of {base.__module__}.{base.__qualname__}")]
    if inspect.isabstract(cls):
        missing = sorted(getattr(cls, "__abstractmethods__", ()))
        return [Problem("class", f"{what} leaves abstract methods unimplemented: {missing}")]
    return []


def check_cell(cls: type[Cell]) -> list[Problem]:
    """Every rule of the cell contract on `cls`, registered under `cls.name` (in this process's numerics
    mode: the first check fixes it, `trainers.numerics`)."""
    what = getattr(cls, "__qualname__", repr(cls))
    problems = _class(cls, Cell, what)
    if problems:
        return [*problems, _not_checked("every other check", f"they need a concrete {Cell.__qualname__}")]
    problems = _dataclass_defaults(cls, what) + _settings(cls, "cell") + _cost_settings(cls, what)
    params = list(inspect.signature(cls.__init__).parameters)[1:]
    if params[:4] != ["config", "input_size", "hidden_size", "gen"]:
        problems.append(
            Problem(
                "constructor",
                f"{what}.__init__ takes {params}; the contract is (config, input_size, hidden_size, gen)",
            )
        )
    else:
        problems += _cell_weights(cls)
    from trainers.fused.cells import FUSED_CELLS  # a built-in's fused form, or the plugin's `fused`

    on_tasks = "shapes, loss, gradient, batch" + (", fused" if cls.name in FUSED_CELLS else "")
    if any(p.check == "constructor" for p in problems):
        why = "they need a cell built at its defaults (constructor, above)"
        return [*problems, _not_checked(f"parameters, generator, {on_tasks}", why)]
    if any(p.check == "settings" for p in problems):
        why = "no trial resolves the cell until the setting is renamed (settings, above)"
        return [*problems, _not_checked(on_tasks, why)]
    for task, task_params in CELL_TASKS.items():
        problems += _cell_on_task(cls.name, task, task_params)
    if cls.name in FUSED_CELLS:
        if any(p.check in ("forward", "shapes") for p in problems):
            problems.append(
                _not_checked("fused", "a bundle needs the cell's solo states (forward, shapes, above)")
            )
        else:
            problems += _fused_equals_solo(cls.name)
    return problems


def _cell_weights(cls: type[Cell]) -> list[Problem]:
    problems: list[Problem] = []
    try:
        config = cls.resolve(cls.Config(), "tanh")

        def build(seed: int) -> Cell:
            return cls(config, 3, HIDDEN, torch.Generator().manual_seed(seed))

        with _global_rng_watch(problems, f"building a {cls.name!r} cell"):
            a, b = build(7), build(7)
    except Exception as exc:  # the cell's own code: any error is a broken contract
        return [Problem("constructor", f"building it at its defaults failed: {_describe(exc)}")]
    pa, pb = (list(m.parameters()) for m in (a, b))
    if not pa:
        problems.append(Problem("parameters", "it has no parameters to train"))
    elif not all(torch.equal(p, q) for p, q in zip(pa, pb, strict=True)):
        problems.append(
            Problem("generator", "the same generator seed gave other weights: draw them from `gen` alone")
        )
    return problems  # another seed may give the same weights: a deterministic initialiser (a chain) has none


def _resolve(cell: str, task: str, task_params: dict[str, Any], seed: int = 1) -> Any:
    """The trial the checks build on `task`: a cell that shares a setting's name with it resolves here
    (each at its default), for a study pairs them only where its task is that one, and refuses it
    there (`trainers.config.setting_clash`)."""
    from trainers.config import resolve

    config = {"task": task, "cell": cell, "hidden": HIDDEN, "seed": seed, "task_params": task_params}
    return resolve(config, refuse_shared=False)


def _cell_on_task(cell: str, task: str, task_params: dict[str, Any]) -> list[Problem]:
    """Shapes, then a finite initial loss, the gradient through time and the batch of `cell` on `task`
    (the three, each whatever the others found)."""
    from trainers.model import build_model

    problems: list[Problem] = []
    where = f"on task {task!r}"
    try:
        resolved = _resolve(cell, task, task_params)
        t = resolved.make_task()
        x, y = t.encode(t.val_split().take(slice(0, 4)), CPU)
        model = build_model(resolved, t)
        with _global_rng_watch(problems, f"a forward pass {where}"):
            states = model.cell(x)
    except Exception as exc:
        return [
            Problem("forward", f"{where}: {_describe(exc)}"),
            _not_checked(f"shapes, loss, gradient, batch {where}", "they need its states"),
        ]
    expected = (x.shape[0], x.shape[1], HIDDEN)
    if tuple(states.shape) != expected:
        return [
            Problem(
                "shapes",
                f"{where}: states of shape {tuple(states.shape)} for inputs {tuple(x.shape)}; the contract is [T, B, N] = {expected}",
            ),
            _not_checked(f"loss, gradient, batch {where}", "they need states of the contract's shape"),
        ]
    try:
        loss = t.loss(model(x), y)
    except Exception as exc:
        problems.append(Problem("loss", f"{where}: the initial loss could not be computed: {_describe(exc)}"))
    else:
        if not torch.isfinite(loss):
            problems.append(Problem("loss", f"{where}: the initial loss is {loss.item()}, not finite"))
    return problems + _gradient(model.cell, x, where) + _batch_independent(model.cell, x, where)


def _gradient(cell: Any, x: torch.Tensor, where: str) -> list[Problem]:
    """The gradient of the state after N/2 steps reaches the first input, and every parameter's is finite."""
    try:
        xs = x[: HIDDEN // 2].detach().clone().requires_grad_()  # within N steps: a chain forgets after N
        cell(xs)[-1].pow(2).sum().backward()
    except Exception as exc:
        return [Problem("gradient", f"{where}: no gradient through the states: {_describe(exc)}")]
    if xs.grad is None or not xs.grad[0].abs().sum() > 0:
        return [Problem("gradient", f"{where}: the state after N/2 steps does not depend on the first input")]
    if not all(torch.isfinite(p.grad).all() for p in cell.parameters() if p.grad is not None):
        return [Problem("gradient", f"{where}: a parameter's gradient is not finite")]
    return []


#: the batch a cell's states are checked in beside a batch of 4: above a trial's validation batch (1,000)
LARGE_BATCH = 1200


def _batch_independent(cell: Any, x: torch.Tensor, where: str) -> list[Problem]:
    """The same 4 examples' states as a batch of 4 (with gradients, as a trial trains) and among
    `LARGE_BATCH` − 4 others (without, as it validates), rounding apart: a GEMM's blocking may follow the
    batch. A cell that draws its initial state at random at every forward (`Cell.state_draws_off`) is
    checked so with its draws off, and with them on among two sets of others, each through a copy of the
    cell (the same draws ahead of both): an example's states may follow its place in the batch, not the
    examples around it."""
    gen = torch.Generator().manual_seed(0)

    def among_others() -> torch.Tensor:  # other examples around the 4
        others = torch.rand(x.shape[0], LARGE_BATCH - x.shape[1], x.shape[2], generator=gen, dtype=x.dtype)
        return torch.cat([x, others], dim=1)

    big, other_big = among_others(), among_others()
    try:
        with cell.state_draws_off():
            states = cell(x)
            with torch.no_grad():
                among = cell(big)
        with torch.no_grad():  # the draws on: two copies, the same generators' states
            drawn = copy.deepcopy(cell)(big)[:, : x.shape[1]], copy.deepcopy(cell)(other_big)[:, : x.shape[1]]
    except Exception as exc:
        return [Problem("batch", f"{where}: a batch of {big.shape[1]} failed: {_describe(exc)}")]
    if tuple(among.shape) != (x.shape[0], big.shape[1], states.shape[2]):
        return [
            Problem(
                "batch",
                f"{where}: states of shape {tuple(among.shape)} for a batch of {big.shape[1]} "
                f"(inputs {tuple(big.shape)}); the contract is [T, B, N]: a trial validates in batches of 1,000",
            )
        ]
    mixed = not torch.allclose(among[:, : x.shape[1]], states.detach(), rtol=1e-4, atol=1e-5, equal_nan=True)
    mixed = mixed or not torch.allclose(*drawn, rtol=1e-4, atol=1e-5, equal_nan=True)
    if mixed:
        return [
            Problem(
                "batch",
                f"{where}: 4 examples' states differ as a batch of 4 and among {big.shape[1]}: each example's "
                "states must be its own, whatever the batch around it",
            )
        ]
    return []


def _fused_equals_solo(cell: str, steps: int = 6) -> list[Problem]:
    """Two members of a bundle (other seeds and learning rates) against their solo runs, a few steps."""
    from trainers.config import resolve
    from trainers.fused import train_fused
    from trainers.loop import train

    configs = [
        resolve(
            {
                "task": "addition",
                "cell": cell,
                "hidden": HIDDEN,
                "seed": seed,
                "lr": lr,
                "steps": steps,
                "eval_every": steps // 2,
                "batch_size": 4,
                "task_params": CELL_TASKS["addition"],
                "numerics": numerics.current(),
            },
            refuse_shared=False,  # as `_resolve`
        )
        for seed, lr in ((1, 1e-3), (2, 3e-3))
    ]
    try:
        bundle = train_fused(configs)
    except Exception as exc:
        return [Problem("fused", f"a bundle of two failed: {_describe(exc)}")]
    problems = []
    for k, (config, member) in enumerate(zip(configs, bundle, strict=True)):
        alone = train(config)
        ours, theirs = _curve(member), _curve(alone)
        if member.status != alone.status or ours != theirs:
            problems.append(
                Problem(
                    "fused",
                    f"member {k} of a bundle is not its solo run bit for bit (losses {ours} in the bundle, "
                    f"{theirs} alone; status {member.status} vs {alone.status}): "
                    "fix the fused form or set `fused = None` to train solo",
                )
            )
    return problems


def _curve(result: Any) -> list[tuple[float, float]]:
    return [(e.train_loss, e.val_loss) for e in result.history]


def check_task(cls: type[Task]) -> list[Problem]:
    """Every rule of the task contract on `cls`, registered under `cls.name`."""
    what = getattr(cls, "__qualname__", repr(cls))
    problems = _class(cls, Task, what)
    if problems:
        return [*problems, _not_checked("every other check", f"they need a concrete {Task.__qualname__}")]
    problems = _dataclass_defaults(cls, what) + _settings(cls, "task")
    params = dict(cls.check_params)

    def data(seed: int) -> tuple[Task, tuple[torch.Tensor, torch.Tensor]]:
        task = _resolve("rnn", cls.name, params, seed).make_task()
        return task, task.encode(task.val_split().take(slice(0, 4)), CPU)

    try:
        with _global_rng_watch(problems, f"building task {cls.name!r} and its data"):
            t, (x, y) = data(1)
            _, (x_again, _) = data(1)
            _, (x_other, _) = data(2)
    except Exception as exc:
        return [
            *problems,
            Problem("data", f"building it at check_params {params} failed: {_describe(exc)}"),
            _not_checked("generator, shapes, baseline, loss", "they need its data"),
        ]
    if not torch.equal(x, x_again):
        problems.append(
            Problem("generator", "the same seed gave other data: draw them from the trial seed's generators")
        )
    if cls.seeded_data and torch.equal(x, x_other):
        problems.append(Problem("generator", "another seed gave the same data, but `seeded_data` is True"))
    baseline = t.baseline_loss
    if not (isinstance(baseline, (int, float)) and math.isfinite(baseline) and baseline > 0):
        problems.append(
            Problem(
                "baseline",
                f"baseline_loss is {baseline!r}: give the memoryless predictor's loss, finite and positive",
            )
        )
    want = (t.seq_len, 4) if t.input_vocab is not None else (t.seq_len, 4, t.input_dim)
    if tuple(x.shape) != want or (t.input_vocab is None and x.dtype != torch.float32):
        return [
            *problems,
            Problem(
                "shapes",
                f"encode gave x {tuple(x.shape)} {x.dtype}; the contract is {want} float32 (time-major)",
            ),
            _not_checked("loss", "it needs batches of the declared shapes"),
        ]
    from trainers.model import build_model

    try:
        out = build_model(_resolve("rnn", cls.name, params), t)(x)
        loss = t.loss(out, y)
    except Exception as exc:
        return [*problems, Problem("loss", f"an Elman cell's output could not be scored: {_describe(exc)}")]
    if loss.ndim != 0 or not torch.isfinite(loss):
        problems.append(
            Problem("loss", f"the initial loss under an Elman cell is {loss}, not one finite number")
        )
    return problems


def _describe(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"


CHECKS: dict[str, Callable[[Any], list[Problem]]] = {"cell": check_cell, "task": check_task}
