"""The one trial-config schema: `TrainConfig`, its resolution against the registries, and its hash.

A trial is fully described by a `TrainConfig`: the trial-level fields below plus the task's and the
cell's own config dataclasses (as dicts). `resolve` fills every default, so the resolved dict is the
trial's identity (the ledger keys trials by `config_hash`). Defaults are Orhan & Pitkow's protocol
(docs/protocol.md §1.5): RMSprop (ρ 0.9, ε 1e-7), global gradient-norm clip 10,
batch 16, 100 epochs with validation once per epoch, early stop once validation loss < 0.0025, and
training to the end of the budget whatever the loss does (only a non-finite loss ends a trial).
Whether a trial succeeded is not part of it: a study judges that (`trainers.criterion`).
"""

from __future__ import annotations

import dataclasses
import hashlib
import itertools
import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from search_spaces.space import did_you_mean
from trainers import plugins
from trainers.numerics_modes import ENV, MODES, default_mode
from trainers.params import UNHASHED_DEFAULT, ConfigError, build, field_names, unhashed_defaults

# The registries (`trainers.cells`, `trainers.tasks`: torch) are imported where a config meets them, so the
# schema, its defaults and TRAINER_VERSION import without torch (a study spec, the service's ledger reads).
if TYPE_CHECKING:
    from trainers.cells import Cell
    from trainers.tasks import Task

#: Bumped whenever a change alters what a given config computes (results keyed by hash + version).
#: 2: elu as TensorFlow computes it, exp(a) − 1 (torch's elu uses expm1; ~1e-7 apart), in every kernel.
#: 3: the scan's ∂V as (xᵀ∂a)ᵀ and per-step cross-entropy over a [1, C, T·B] view (few classes): the
#:    same gradients and losses, summed in another order (faster on the CPU).
#: 4: the authors' protocol to the last detail (docs/protocol.md §1.6): cross-entropy as Keras 2 computes
#:    it where the authors used Keras (tasks' `prob_clip`, on for copy, psMNIST and HAR-2); a finite loss
#:    never fails a trial (the divergence stop is the opt-in `divergence_guard`); the success criterion
#:    left the trial config (a study judges success, so studies that differ only in it share runs).
#: 5: janet, gru and nru as whole-sequence autograd functions with hand-written backwards
#:    (trainers/kernels_gated.py, kernels_nru.py): the same gradients summed in another order, and the
#:    NRU's forward reorganised (L5 norm from V³|V|, heads summed in one baddbmm).
#: 6: nru with ReLU heads (`use_relu`): where a head's ρ(p qᵀ) is all zero (n = ε) its ∂V has no norm
#:    term, as in autograd's F.normalize, instead of NaN (ε⁵ underflowed in float32). Every other
#:    config computes what it computed under 5, bit for bit.
#: 7: a numerics mode per trial (`numerics`, trainers/numerics.py): MKL's reproducibility mode always,
#:    and by default the portable mode (MKL's COMPATIBLE branch, ATen's AVX2 kernels), whose numbers are
#:    the same on any x86-64 CPU with AVX2; `numerics=native` is the CPU's own kernels, as before but
#:    alignment-independent (MKL AUTO,STRICT).
#: 8: on a GPU only (no CPU number moved: the ledger fingerprint of the fixed grid is identical): float32
#:    is IEEE float32 (TF32 off in cuDNN, where torch leaves it on), and the Elman cell's `backend=auto`
#:    is the scan on every device (it was cuDNN's RNN for relu/tanh on CUDA, which sums in another
#:    order than a bundle's scan; `backend=native` still runs it). docs/gpu.md.
#: 9: the portable mode on the CPU (issue 33): the optimisers' √ is correctly rounded (torch's, MKL's
#:    vsSqrt, starts from rsqrtps, whose bits differ between Intel and AMD: an EPYC and a Xeon parted in
#:    the last bit of the first RMSprop step) and a float64 log (PTB's baseline, the LSTM's chrono bias)
#:    is the C library's, not MKL's (rcpps); a solo run on the CPU in the portable mode steps with
#:    trainers.optim.Optimizer. The native mode and the GPU compute what they computed under 8.
#: 10: Keras's losses as TensorFlow differentiated them (docs/protocol.md §1.6, §5): a probability lying
#:    exactly on the clip's bound (1 − ε is 0.99999988 in float32, where confident outputs land) keeps
#:    its gradient, as tf.clip_by_value's Minimum and Maximum pass it on a tie (torch 2.14.1's clamp
#:    passed none; 2.11's passed it); HAR-2's default loss is the sigmoid cross-entropy on the logits, unclipped, which SGORNN's
#:    Keras 2.3.1 on TF 1.15 computed (the clip-and-logit formula was Keras 2.2.4's, now `prob_clip` ε).
#:    Presets (new values, no default moved): Emami et al.'s Adam is `keras_adam` (tf.keras' ε on √v),
#:    SRNN's copy reads out 10 classes (`classes`), as their code did.
TRAINER_VERSION = "10"


@dataclass(frozen=True)
class TrainConfig:
    task: str = "copy"
    cell: str = "rnn"
    hidden: int = 100
    seed: int = 1  # fixes data, permutation, weights and shuffling
    # optimiser
    # rmsprop: Keras' and torch's (the same rule); adam: torch's, ε added to the bias-corrected √v;
    # keras_adam: Keras' and TensorFlow's (and torch's before 1.3), ε added to √v, the bias corrections
    # folded into the rate; amsgrad, keras_amsgrad: AMSGrad in either form, the running maximum of v in
    # place of v (torch's and Keras' `amsgrad=True`; the NRU code's copy runs, torch 0.4: keras_amsgrad)
    optimizer: Literal["rmsprop", "adam", "keras_adam", "amsgrad", "keras_amsgrad"] = "rmsprop"
    lr: float = 1e-4
    rho: float = 0.9  # RMSprop's moving-average decay (Keras rho, torch alpha)
    betas: tuple[float, float] = (0.9, 0.999)  # Adam
    eps: float = 1e-7  # Keras' epsilon
    clip_norm: float | None = 10.0  # global gradient-norm clip (Keras 2.2.4 clipnorm); None: off
    # the learning rate's course (`trainers.optim.LearningRate`); constant by default, as every paper's code
    # but SGORNN's ran it. `lr_drop_epochs`: the rate is multiplied by `lr_drop_factor` once each listed
    # number of epochs is done (a Keras LearningRateScheduler's step function, torch's MultiStepLR: SGORNN's
    # HAR-2, ÷10 after 200 epochs). `lr_decay_steps` S: Keras 2's optimiser `decay` set to lr / S, the rate of
    # update n then lr / (1 + lr·(n − 1)/S), computed in float32 as Keras did (SGORNN's addition code asks a
    # "linear decay to zero" over S updates that way; it is lr / (1 + lr) after S updates). Added after TRAINER_VERSION
    # 10: a trial that keeps their defaults hashes as it did (`UNHASHED_DEFAULT`).
    lr_drop_epochs: tuple[int, ...] = field(default=(), metadata=UNHASHED_DEFAULT)
    lr_drop_factor: float = field(default=0.1, metadata=UNHASHED_DEFAULT)
    lr_decay_steps: int | None = field(default=None, metadata=UNHASHED_DEFAULT)
    batch_size: int = 16
    # the readout's initial weights (`trainers.model.SequenceModel`): "glorot", Keras' Dense (Glorot-uniform,
    # zero bias: Orhan's, Emami's, SGORNN's code); "xavier_normal", myTorch's (the NRU code: N(0, √(2/(N + C))),
    # zero bias); "plain", torch's nn.Linear (U(±1/√N) weights and bias: SRNN's code)
    readout_init: Literal["glorot", "xavier_normal", "plain"] = field(
        default="glorot", metadata=UNHASHED_DEFAULT
    )
    # budget and evaluation
    epochs: int = 100
    steps: int | None = None  # when set, the budget in optimiser steps (replaces epochs)
    eval_every: int | None = None  # steps between evaluations; None: once per epoch
    eval_batch_size: int = 1000  # validation batch: moves the validation loss's rounding only
    early_stop_loss: float | None = 0.0025  # stop once validation loss < this; None: never
    # Not the papers' protocol (Keras trains on): a finite loss above this × the baseline fails the
    # trial. An opt-in for exploratory sweeps; None (default): only a non-finite loss fails a trial.
    divergence_guard: float | None = None
    # which CPU kernels compute the numbers (trainers/numerics.py): portable (the same numbers on any
    # x86-64 CPU with AVX2) or native (this CPU's fastest); part of the trial's identity
    numerics: str = field(default_factory=default_mode)
    # execution: where and how a trial runs, not what it trains (threads and eval_batch_size move its
    # rounding, and enter its identity where they leave their defaults: ROUNDING_FIELDS)
    device: str = "auto"  # auto | cpu | cuda | cuda:N
    threads: int = 1  # intra-op threads on CPU; 1 is fastest for small RNNs (benchmarks/)
    # on a GPU, a fused bundle's training step replays as one CUDA graph (trainers/fused/graphs.py: the same
    # numbers as its eager step, and faster: both measured in docs/gpu.md); False: every step eager.
    # No effect on the CPU or in a solo run.
    cuda_graphs: bool = True
    # components' own configs (fields of the task's and the cell's Config dataclasses)
    task_params: Mapping[str, Any] = field(default_factory=dict)
    cell_params: Mapping[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["betas"] = list(self.betas)
        d["lr_drop_epochs"] = list(self.lr_drop_epochs)
        d["task_params"] = dict(self.task_params)
        d["cell_params"] = dict(self.cell_params)
        return d


TOP_FIELDS = field_names(TrainConfig)
EXECUTION_FIELDS = ("device", "threads", "eval_batch_size", "cuda_graphs")  # not in the identity's base
#: execution fields that move a trial's rounding, not what it trains, with the values under which a
#: trial's hash is its base hash (`config_hash`): the thread count (MKL and oneDNN split sums by it;
#: portable mode cannot pin it, docs/reproducibility.md) and the validation batch (the loss is summed
#: batch by batch). A trial that leaves one hashes apart, so the ledger never reuses its result for
#: another's; the hashes of every trial that keeps them (and of every stored one) stay as they were.
ROUNDING_FIELDS: Mapping[str, int] = {"threads": 1, "eval_batch_size": 1000}
#: what a trial run on more than one thread computes, beyond `TRAINER_VERSION` (in every trial's hash):
#: 1 since every thread of the OpenMP pool flushes denormals as the trial's own does
#: (`trainers.runtime.flush_denormals`). Before, a pool thread kept the flags the process's history gave
#: it, so a result recorded then with threads > 1 is never reused for a trial of now (migration 0008).
THREADED_VERSION = "1"


@dataclass(frozen=True)
class Resolved:
    """A config with every default filled in, and the component classes it names."""

    config: TrainConfig
    task_cls: type[Task]
    task_config: Any
    cell_cls: type[Cell]
    cell_config: Any

    def make_task(self) -> Task:
        return self.task_cls(self.task_config, self.config.seed)

    def to_dict(self) -> dict[str, Any]:
        return self.config.to_dict()

    def config_hash(self) -> str:
        return config_hash(self.to_dict())


def config_hash(resolved: Mapping[str, Any]) -> str:
    """Identity of a trial: sha256 of its resolved config (execution-only fields dropped), and of the
    plugins it uses (their distribution, version and code: `trainers.plugins`), so a run of another
    plugin version is never taken for this one. A trial of built-ins hashes as it always did: a trial's,
    task's or cell's field added since (`trainers.params.UNHASHED_DEFAULT`) is left out while it holds its
    default.
    A `ROUNDING_FIELDS` value other than its default then joins the identity (`with_rounding`)."""
    from trainers.cells import CELLS
    from trainers.tasks import TASKS

    added_here = unhashed_defaults(TrainConfig)
    ident = {
        k: v
        for k, v in resolved.items()
        if k not in EXECUTION_FIELDS and not (k in added_here and _plain(v) == _plain(added_here[k]))
    }
    for kind, registry in (("task", TASKS), ("cell", CELLS)):
        name, params = resolved.get(kind), resolved.get(f"{kind}_params")
        if isinstance(name, str) and isinstance(params, Mapping) and name in registry:
            added = unhashed_defaults(registry.get(name).Config)
            ident[f"{kind}_params"] = {k: v for k, v in params.items() if not (k in added and v == added[k])}
    ident["trainer_version"] = TRAINER_VERSION
    used = plugins.identities(str(resolved.get("cell", "")), str(resolved.get("task", "")))
    if used:
        ident["plugins"] = used
    base = hashlib.sha256(json.dumps(ident, sort_keys=True, default=str).encode()).hexdigest()[:16]
    return with_rounding(base, resolved)


def _plain(value: Any) -> Any:
    """A value as JSON holds it (a tuple as a list), so a stored config compares with a default."""
    return list(value) if isinstance(value, tuple) else value


def with_rounding(base: str, resolved: Mapping[str, Any]) -> str:
    """The hash of a trial whose identity without execution fields hashes to `base`: `base` itself
    while its `ROUNDING_FIELDS` hold their defaults, else `base` and those values (and, with threads,
    `THREADED_VERSION`) hashed again. A function of the base hash and the stored config alone, so the
    ledger's migration 0008 (which holds its own copy, as a migration must) re-keyed the trials stored
    before these fields joined the hash."""
    moved = {k: resolved.get(k, v) for k, v in ROUNDING_FIELDS.items() if resolved.get(k, v) != v}
    if not moved:
        return base
    if "threads" in moved:
        moved["threaded"] = THREADED_VERSION
    tail = "".join(f"/{k}={moved[k]}" for k in sorted(moved))
    return hashlib.sha256(f"{base}{tail}".encode()).hexdigest()[:16]


def from_dict(values: Mapping[str, Any]) -> TrainConfig:
    """A TrainConfig from a (possibly partial) dict; nested `task_params` / `cell_params` kept raw."""
    values = dict(values)
    task_params = dict(values.pop("task_params", None) or {})
    cell_params = dict(values.pop("cell_params", None) or {})
    values.pop("trainer_version", None)
    if "betas" in values:
        values["betas"] = _betas(values["betas"])
    if "lr_drop_epochs" in values:
        values["lr_drop_epochs"] = _drop_epochs(values["lr_drop_epochs"])
    cfg = build(TrainConfig, values, where="trial config")
    return dataclasses.replace(cfg, task_params=task_params, cell_params=cell_params)


def _betas(value: Any) -> tuple[float, float]:
    """Adam's (β₁, β₂): two numbers, each in [0, 1)."""
    fix = "give two numbers in [0, 1), e.g. [0.9, 0.999] (Adam's β₁, β₂)"
    if isinstance(value, str) or not isinstance(value, (list, tuple)) or len(value) != 2:
        raise ConfigError(f"betas = {value!r} is not a pair: {fix}")
    try:
        betas = (float(value[0]), float(value[1]))
    except (TypeError, ValueError):
        raise ConfigError(f"betas = {value!r} is not a pair of numbers: {fix}") from None
    if not all(0.0 <= b < 1.0 for b in betas):
        raise ConfigError(f"betas = {list(betas)} out of range: {fix}")
    return betas


def _drop_epochs(value: Any) -> tuple[int, ...]:
    """The epochs after which the learning rate drops: whole numbers ≥ 1, increasing (one number: one drop;
    none: no drop)."""
    fix = "give the epoch count after which the rate drops, or an increasing list of them: 200, [100, 200] (none: [])"
    if value is None:
        return ()
    items = [value] if isinstance(value, (int, float)) and not isinstance(value, bool) else value
    if isinstance(items, str) or not isinstance(items, (list, tuple)):
        raise ConfigError(f"lr_drop_epochs = {value!r} is not a list of epochs: {fix}")
    epochs = []
    for item in items:
        whole = isinstance(item, int) or (isinstance(item, float) and item.is_integer())
        if isinstance(item, bool) or not whole or item < 1:
            raise ConfigError(
                f"lr_drop_epochs = {value!r}: {item!r} is not a whole number of epochs ≥ 1: {fix}"
            )
        epochs.append(int(item))
    if any(b <= a for a, b in itertools.pairwise(epochs)):
        raise ConfigError(f"lr_drop_epochs = {value!r} is not increasing: {fix}")
    return tuple(epochs)


#: what `device` may name
DEVICE_FORMS = "auto, cpu, cuda or cuda:N"


def check_training(cfg: TrainConfig) -> None:
    """The optimiser's, the budget's and the execution's values: in range, or refused naming the field."""
    for name, minimum in (
        ("hidden", 1), ("batch_size", 1), ("epochs", 1), ("threads", 1), ("eval_batch_size", 1),
    ):  # fmt: skip
        if getattr(cfg, name) < minimum:
            raise ConfigError(f"{name} = {getattr(cfg, name)} must be at least {minimum}")
    for name in ("steps", "eval_every"):
        value = getattr(cfg, name)
        if value is not None and value < 1:
            raise ConfigError(f"{name} = {value} must be a positive integer, or none")
    if cfg.lr <= 0:
        raise ConfigError(f"lr = {cfg.lr} must be positive")
    _drop_epochs(cfg.lr_drop_epochs)
    if not cfg.lr_drop_factor > 0:
        raise ConfigError(
            f"lr_drop_factor = {cfg.lr_drop_factor} must be positive: the learning rate is multiplied by it "
            "after each of lr_drop_epochs (0.1: ÷10)"
        )
    if cfg.lr_decay_steps is not None and cfg.lr_decay_steps < 1:
        raise ConfigError(
            f"lr_decay_steps = {cfg.lr_decay_steps} must be a positive integer, or none: Keras's decay is "
            "lr / lr_decay_steps (SGORNN's code: the budget in steps)"
        )
    if not 0.0 <= cfg.rho < 1.0:
        raise ConfigError(f"rho = {cfg.rho} must be in [0, 1): RMSprop's moving-average decay (Keras: 0.9)")
    if cfg.eps <= 0:
        raise ConfigError(f"eps = {cfg.eps} must be positive: the optimiser's denominator term (Keras: 1e-7)")
    _betas(cfg.betas)
    for name, what in (
        ("clip_norm", "the global gradient-norm clip (Keras 2.2.4 clipnorm: 10); none: no clip"),
        ("divergence_guard", "a multiple of the baseline loss above which a trial fails; none: off"),
    ):
        value = getattr(cfg, name)
        if value is not None and not value > 0:
            raise ConfigError(f"{name} = {value} must be positive, or none: {what}")
    if cfg.early_stop_loss is not None and cfg.early_stop_loss < 0:
        raise ConfigError(f"early_stop_loss = {cfg.early_stop_loss} must be at least 0, or none (never stop)")
    kind, _, index = cfg.device.partition(":")
    if kind not in ("auto", "cpu", "cuda") or (index and (kind != "cuda" or not index.isdigit())):
        raise ConfigError(f"device = {cfg.device!r} is not a device: use {DEVICE_FORMS}")


def check_task_config(task_cfg: Any, where: str) -> None:
    """The fields tasks share by name: example counts at least 1 (none: all, where a task allows it) and
    Keras' probability clip in (0, 0.5)."""
    for name in ("n_train", "n_val"):
        value = getattr(task_cfg, name, None)
        if value is not None and value < 1:
            raise ConfigError(f"{where}: {name} = {value} must be at least 1")
    clip = getattr(task_cfg, "prob_clip", None)
    if clip is not None and not 0.0 < clip < 0.5:
        raise ConfigError(
            f"{where}: prob_clip = {clip} must be in (0, 0.5): probabilities are clipped to "
            "[prob_clip, 1 − prob_clip] (Keras 2: 1e-7); none: log-softmax"
        )


def resolve(config: TrainConfig | Mapping[str, Any], *, refuse_shared: bool = True) -> Resolved:
    """Check every name and value against the registries and fill every default. `refuse_shared=False`
    lets a cell that shares a setting's name with its task resolve, both at the values given (the
    contract's checks build a cell on tasks no study of it may use: `trainers.contract`); a study's
    trial always refuses it (`setting_clash`)."""
    from trainers.cells import CELLS
    from trainers.tasks import TASKS

    cfg = config if isinstance(config, TrainConfig) else from_dict(config)
    for kind, name in (("task", cfg.task), ("cell", cfg.cell)):
        # a plugin of this name that could not join, or one that shadows a built-in
        for why in plugins.refusals(kind, name):
            raise ConfigError(why)
    task_cls = TASKS.get(cfg.task)
    cell_cls = CELLS.get(cfg.cell)
    if refuse_shared:
        clash = setting_clash(cfg.task, task_cls, cfg.cell, cell_cls)
    else:
        clash = own_clash("cell", cfg.cell, cell_cls) or own_clash("task", cfg.task, task_cls)
    if clash is not None:
        raise ConfigError(clash)
    task_cfg: Any = build(task_cls.Config, cfg.task_params, where=f"task {cfg.task!r}")
    cell_cfg: Any = build(cell_cls.Config, cfg.cell_params, where=f"cell {cfg.cell!r}")
    cell_cfg = cell_cls.resolve(cell_cfg, task_cls.default_nonlinearity)
    if getattr(task_cfg, "data", "fixed") == "fresh" and not task_cls.supports_fresh:
        raise ConfigError(f"task {cfg.task!r} has no fresh-batch regime; use data=fixed")
    check_training(cfg)
    check_task_config(task_cfg, f"task {cfg.task!r}")
    try:
        cell_cls.check_hidden(cell_cfg, cfg.hidden)
    except ConfigError as exc:
        raise ConfigError(f"cell {cfg.cell!r}: {exc}") from None
    check_representable(dataclasses.asdict(cfg), "")
    check_representable(dataclasses.asdict(task_cfg), f"task {cfg.task!r}: ")
    check_representable(dataclasses.asdict(cell_cfg), f"cell {cfg.cell!r}: ")
    if cfg.numerics not in MODES:
        raise ConfigError(
            f"numerics = {cfg.numerics!r} is not a numerics mode; valid: {', '.join(MODES)} "
            "(portable: the same numbers on any x86-64 CPU with AVX2; native: this CPU's fastest kernels; "
            f"a trial that names none takes ${ENV})"
        )
    full = dataclasses.replace(
        cfg, task_params=dataclasses.asdict(task_cfg), cell_params=dataclasses.asdict(cell_cfg)
    )
    return Resolved(full, task_cls, task_cfg, cell_cls, cell_cfg)


def own_clash(kind: str, name: str, cls: type[Cell] | type[Task]) -> str | None:
    """Why a study could never set one of this cell's (task's) settings by its name: it is named like
    the trial's own (`eps`, `lr`, …), which a name sets first (`apply_overrides`); None otherwise. A plugin
    cell with a setting `eps` had a study's `eps` sent to the optimiser, its own staying at its default
    while the tables said it varied."""
    shared = sorted(set(field_names(cls.Config)) & set(TOP_FIELDS))
    return _clash_message(kind, name, shared, "the trial's own") if shared else None


def setting_clash(task: str, task_cls: type[Task], cell: str, cell_cls: type[Cell]) -> str | None:
    """Why a study of this task and cell could not set one of their settings by its name, or None: one
    named like the trial's own (`own_clash`), or a setting the cell shares with the task, which the
    task's takes. No built-in cell or task shares a name with another scope."""
    shared = sorted(set(field_names(cell_cls.Config)) & set(field_names(task_cls.Config)))
    return (
        own_clash("cell", cell, cell_cls)
        or own_clash("task", task, task_cls)
        or (_clash_message("cell", cell, shared, f"those of task {task!r}") if shared else None)
    )


def _clash_message(kind: str, name: str, shared: list[str], taker: str) -> str:
    return (
        f"{kind} {name!r} has a setting named like {taker} ({', '.join(map(repr, shared))}): a study's "
        f"{shared[0]!r} would set {taker} first, never the {kind}'s, which would stay at its default while the "
        f"tables said it varied. Rename the setting (e.g. {f'{name}_{shared[0]}'!r}) in the plugin's Config and grid"
    )


#: a trial computes in float32 (torch's default dtype) and stores integers as 64-bit
FLOAT_MAX = 3.4028234663852886e38  # torch.finfo(torch.float32).max, IEEE 754's largest single
INT_LIMIT = 2**63


def check_representable(values: Mapping[str, Any], where: str) -> None:
    """Every number a trial uses fits its dtype: a float is finite and at most float32's largest (lr =
    1e308 would overflow in the optimiser), an integer fits 64 bits (the ledger, torch). Refused here,
    before a study holds it, not as a failed trial."""
    for name, value in values.items():
        items = value if isinstance(value, (list, tuple)) else (value,)
        for v in items:
            if isinstance(v, bool) or not isinstance(v, (int, float)):
                continue
            if isinstance(v, float) and not (math.isfinite(v) and abs(v) <= FLOAT_MAX):
                raise ConfigError(
                    f"{where}{name} = {value!r} cannot be represented in float32, the trials' dtype: "
                    f"give a finite number of at most ±{FLOAT_MAX:.4g}"
                )
            if isinstance(v, int) and not -INT_LIMIT <= v < INT_LIMIT:
                raise ConfigError(f"{where}{name} = {value!r} does not fit a 64-bit integer (|n| < 2**63)")


def apply_overrides(cfg: TrainConfig, overrides: Mapping[str, Any]) -> TrainConfig:
    """Set fields by name: a trial field, else the task's, else the cell's (`task.x` / `cell.x` force one)."""
    from trainers.cells import CELLS
    from trainers.tasks import TASKS

    top: dict[str, Any] = {}
    task_params = dict(cfg.task_params)
    cell_params = dict(cfg.cell_params)
    task_cls = TASKS.get(cfg.task)
    cell_cls = CELLS.get(cfg.cell)
    task_fields, cell_fields = field_names(task_cls.Config), field_names(cell_cls.Config)
    for key, value in overrides.items():
        scope, _, name = key.rpartition(".")
        if scope == "task" or (not scope and name not in TOP_FIELDS and name in task_fields):
            if name not in task_fields:
                near = did_you_mean(name, task_fields)
                raise ConfigError(
                    f"unknown field {name!r} for task {cfg.task!r}; {near + ' ' if near else ''}valid: "
                    + ", ".join(task_fields)
                )
            task_params[name] = value
        elif scope == "cell" or (not scope and name not in TOP_FIELDS and name in cell_fields):
            if name not in cell_fields:
                near = did_you_mean(name, cell_fields)
                raise ConfigError(
                    f"unknown field {name!r} for cell {cfg.cell!r}; {near + ' ' if near else ''}valid: "
                    + ", ".join(cell_fields)
                )
            cell_params[name] = value
        elif not scope and name in TOP_FIELDS and name not in ("task_params", "cell_params"):
            top[name] = value
        else:
            valid = sorted({*TOP_FIELDS, *task_fields, *cell_fields} - {"task_params", "cell_params"})
            near = did_you_mean(key, valid)
            raise ConfigError(
                f"unknown config field {key!r}; {near + ' ' if near else ''}valid fields "
                f"for task {cfg.task!r} and cell {cfg.cell!r}: " + ", ".join(valid)
            )
    base = cfg.to_dict()
    base.update(top)
    base["task_params"], base["cell_params"] = task_params, cell_params
    return from_dict(base)
