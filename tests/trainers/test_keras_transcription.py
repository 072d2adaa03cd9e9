"""memsweep's default Orhan & Pitkow protocol (docs/protocol.md §1) against an independent transcription of
the authors' Keras 2.2.4 / TensorFlow model and training step (their train.py), written here in plain
autograd from Keras's and TensorFlow's source, one small function per piece; and Emami et al.'s students
(docs/protocol.md §3: their tf.keras SimpleRNN, its URNN projection and tf.keras' Adam) the same way.

The transcription starts from memsweep's initial weights (what the initialisers draw is tested elsewhere)
and fits memsweep's batches; the cell, the readout, the loss, the clip and the optimiser are its own. It
must give `trainers.train`'s training loss at every step, its validation loss after every step (all the
weights, readout included) and its trained W and V. A change to memsweep's cell, loss, clip or optimiser
that departs from what Keras computed fails here; one that only reorders float32 sums does not.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import pytest
import torch

from search_spaces.emami2019 import GAUSSIAN_20DB, SPARSE_15DB
from search_spaces.orhan2020 import ADDITION_750, COPY_500
from search_spaces.space import SearchSpace
from trainers import resolve, train
from trainers.config import Resolved, TrainConfig
from trainers.model import build_model
from trainers.numerics import default_mode
from trainers.runtime import training_batches
from trainers.tasks import TASKS
from trainers.tasks.base import cross_entropy, keras_clip

pytestmark = pytest.mark.numerics  # the numbers themselves: CI runs them under every numerics mode

# Float32 noise, not room for another formula. memsweep and the transcription compute the same float32
# formulas in other orders (the scan's hoisted x Vᵀ + b against Keras's per-step (x K + b) + h R, torch's
# softmax kernel against exp(z − max)/Σ, torch's clip coefficient c/(n + 1e-6) against Keras's c/n, and,
# on another CPU, other kernels), so they part by a few ulps (2⁻²³ ≈ 1.2e-7) and RMSprop carries that on.
# Measured on these cases (Xeon, portable AVX2 and native AVX-512): losses at most 8.5e-7 relative, W and V
# at most 4.4e-7 of their largest entry. 1e-5 is float32's own error on these trajectories (the
# transcription in float32 parts from itself in float64 by up to 7.6e-6, addition-identity's clipped
# steps amplifying it): a tighter bound would test rounding, not formulas. The departures tried move the
# losses further: ε inside the √ by 3e-5 to 1.5e-3, a per-tensor clip by 1.5e-2 to 5e-2 (the clipped
# cases), two biases (nn.RNN's) by 1e-2 to 0.7; Keras's loss against log-softmax shows in the loss test.
RTOL = 1e-5
WEIGHT_TOL = 1e-5  # of the matrix's largest entry: entries that start at zero have no relative precision
KERAS_EPSILON = 1e-7  # keras.backend.epsilon(): the loss's clip and RMSprop's ε
CPU = torch.device("cpu")


# ---------------------------------------------------------------------------------------------------
# The transcription: Keras 2.2.4 on TensorFlow 1.x, float32 (Keras's floatx), batch-major [B, T, ·].


class TFElu(torch.autograd.Function):
    """TF's Elu and EluGrad kernels (tensorflow/core/kernels/relu_op_functor.h): y = exp(a) − 1 where
    a < 0, else a; the gradient g·(y + 1) where y < 0, else g."""

    @staticmethod
    def forward(ctx: Any, a: torch.Tensor) -> torch.Tensor:
        y = torch.where(a < 0, torch.exp(a.clamp(max=0.0)) - 1.0, a)
        ctx.save_for_backward(y)
        return y

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> torch.Tensor:
        (y,) = ctx.saved_tensors
        return torch.where(y < 0, g * (y + 1.0), g)


def tf_relu(a: torch.Tensor) -> torch.Tensor:
    """TF's Relu and ReluGrad: a·[a > 0], whose gradient g·[a > 0] autograd takes through the mask."""
    return a * (a > 0).to(a.dtype)


class TFClipByValue(torch.autograd.Function):
    """tf.clip_by_value and its gradient (ClipByValue's, Minimum/Maximum's before it): g passes where
    lo ≤ x ≤ hi, ties included, and is zero strictly outside."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, lo: float, hi: float) -> torch.Tensor:
        ctx.save_for_backward(x)
        ctx.lo, ctx.hi = lo, hi
        return x.clamp(lo, hi)

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> tuple[torch.Tensor, None, None]:
        (x,) = ctx.saved_tensors
        return g * ((x >= ctx.lo) & (x <= ctx.hi)).to(g.dtype), None, None


def simple_rnn(x: torch.Tensor, K: torch.Tensor, R: torch.Tensor, b: torch.Tensor, act: Any) -> torch.Tensor:
    """keras/layers/recurrent.py SimpleRNNCell.call, stepped by K.rnn: h_t = act((x_t K + b) + h_{t−1} R)."""
    B, T, _ = x.shape  # x [B, T, d]; K [d, N], R [N, N], h_0 = 0
    h = x.new_zeros(B, R.shape[0])
    hs = []
    for t in range(T):
        h = act((x[:, t] @ K + b) + h @ R)
        hs.append(h)
    return torch.stack(hs, 1)  # [B, T, N]


def keras_softmax(z: torch.Tensor) -> torch.Tensor:
    """keras/activations.py softmax for ndim > 2: e = exp(z − max z); e / Σ e."""
    e = torch.exp(z - z.max(-1, keepdim=True).values)
    return e / e.sum(-1, keepdim=True)


def categorical_crossentropy(target: torch.Tensor, output: torch.Tensor) -> torch.Tensor:
    """keras/backend/tensorflow_backend.py categorical_crossentropy (from_logits=False): output /= Σ output;
    tf.clip_by_value(output, ε, 1 − ε); −Σ target·log(output) over the last axis."""
    output = output / output.sum(-1, keepdim=True)
    output = TFClipByValue.apply(output, KERAS_EPSILON, 1.0 - KERAS_EPSILON)
    return -(target * torch.log(output)).sum(-1)


def mean_squared_error(target: torch.Tensor, output: torch.Tensor) -> torch.Tensor:
    """keras/losses.py mean_squared_error: the mean over the last axis of (output − target)²."""
    return ((output - target) ** 2).mean(-1)


def weighted_objective(score: torch.Tensor) -> torch.Tensor:
    """keras/engine/training_utils.py weighted_masked_objective with unit sample weights: the mean over
    every axis after the batch's, then over the batch."""
    while score.dim() > 1:
        score = score.mean(-1)
    return score.mean()


def clip_by_global_norm(grads: list[torch.Tensor], c: float) -> tuple[list[torch.Tensor], bool]:
    """keras/optimizers.py Optimizer.get_gradients with clipnorm: ONE norm n = √(Σ_g Σ g²) over every
    gradient, then each g·(c/n) when n ≥ c (its `clip_norm`); and whether it clipped. No clip for c = 0."""
    n = torch.sqrt(sum((g * g).sum() for g in grads))
    if c > 0 and n >= c:
        return [g * (c / n) for g in grads], True
    return grads, False


def rmsprop_(
    params: list[torch.Tensor], grads: list[torch.Tensor], accs: list[torch.Tensor], lr: float | torch.Tensor
) -> None:
    """keras/optimizers.py RMSprop.get_updates at Keras 2.2.4's defaults ρ = 0.9, ε = 1e-7, no decay:
    a ← ρa + (1 − ρ)g²;  p ← p − lr·g / (√a + ε)."""
    rho = 0.9
    for p, g, a in zip(params, grads, accs, strict=True):
        a.copy_(rho * a + (1.0 - rho) * g * g)
        p.sub_(lr * g / (torch.sqrt(a) + KERAS_EPSILON))


@dataclasses.dataclass
class KerasRun:
    losses: list[float] = dataclasses.field(default_factory=list)  # each step's training loss
    val_losses: list[float] = dataclasses.field(default_factory=list)  # after each step
    W: torch.Tensor | None = None  # trained, in memsweep's convention: W = Rᵀ, V = Kᵀ
    V: torch.Tensor | None = None
    clipped: int = 0  # steps on which the global-norm clip acted
    saturated: int = 0  # training positions whose target's probability fell outside [ε, 1 − ε]


#: the rate of one update from its epoch and the updates done before it (Keras's `iterations`): a
#: LearningRateScheduler's and an optimiser's `decay` (`test_a_moving_rate_trains_as_keras_moves_it`)
KerasRate = Callable[[int, int], float | torch.Tensor]


def keras_run(resolved: Resolved, rate: KerasRate | None = None) -> KerasRun:
    """Orhan's train.py model, SimpleRNN → Dense → softmax (copy) or linear (addition), fitted by the
    functions above for the trial's steps from memsweep's initial weights on memsweep's batches, at the
    trial's `lr` or at `rate(epoch, iterations)` (Keras's epochs: `fit`'s passes of ⌈n_train / batch⌉
    updates)."""
    cfg, task = resolved.config, resolved.make_task()
    net = build_model(resolved, task)  # its initial weights; nothing of its arithmetic is used
    K = net.cell.weight_ih.detach().T.clone()  # [d, N]
    R = net.cell.weight_hh.detach().T.clone()  # [N, N]
    b = net.cell.bias.detach().clone()  # [N]
    D = net.readout.weight.detach().T.clone()  # Dense kernel [N, C]
    c = net.readout.bias.detach().clone()  # [C]
    params = [p.requires_grad_() for p in (K, R, b, D, c)]
    accs = [torch.zeros_like(p) for p in params]
    act = TFElu.apply if resolved.cell_config.nonlinearity == "elu" else tf_relu
    copy = task.output == "sequence"  # copy: return_sequences=True, softmax, categorical cross-entropy

    def fit_loss(x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, int]:
        """The batch's loss (x [T, B, d] time-major, as memsweep encodes it) and its saturated positions."""
        H = simple_rnn(x.transpose(0, 1), K, R, b, act)  # [B, T, N]
        if not copy:
            return weighted_objective(mean_squared_error(y, H[:, -1] @ D + c)), 0  # y [B, 1]
        p = keras_softmax(H @ D + c)  # [B, T, C]
        target = torch.nn.functional.one_hot(y.T, p.shape[-1]).to(p.dtype)  # y [T, B] → [B, T, C]
        p_y = (p * target).sum(-1) / p.sum(-1)
        saturated = int(((p_y < KERAS_EPSILON) | (p_y > 1.0 - KERAS_EPSILON)).sum())
        return weighted_objective(categorical_crossentropy(target, p)), saturated

    val_x, val_y = task.encode(task.val_split().take(slice(None)), CPU)
    batches = training_batches(task, cfg.batch_size, cfg.seed)
    run = KerasRun()
    per_epoch = -(-task.train_size // cfg.batch_size)
    for i in range(cfg.steps or 0):
        loss, saturated = fit_loss(*task.encode(next(batches), CPU))
        grads, clipped = clip_by_global_norm(list(torch.autograd.grad(loss, params)), cfg.clip_norm or 0.0)
        with torch.no_grad():
            rmsprop_(params, grads, accs, cfg.lr if rate is None else rate(i // per_epoch, i))
            run.val_losses.append(float(fit_loss(val_x, val_y)[0]))
        run.losses.append(float(loss.detach()))
        run.clipped += clipped
        run.saturated += saturated
    run.W, run.V = R.detach().T, K.detach().T
    return run


def assert_trains_as(result: Any, keras: KerasRun) -> None:
    """memsweep's run gives the transcription's training and validation loss at every step, within float32
    noise (RTOL), and its trained W and V (within WEIGHT_TOL of their largest entry)."""
    got = torch.tensor([[e.train_loss, e.val_loss] for e in result.history], dtype=torch.float64)
    want = torch.tensor([keras.losses, keras.val_losses], dtype=torch.float64).T
    torch.testing.assert_close(got, want, rtol=RTOL, atol=0.0, msg=lambda m: f"[train, val] losses: {m}")
    for matrix, mine, theirs in (
        ("W", result.recurrent_matrix, keras.W),
        ("V", result.input_matrix, keras.V),
    ):
        scale = float(theirs.abs().max())
        torch.testing.assert_close(
            mine, theirs, rtol=0.0, atol=WEIGHT_TOL * scale, msg=lambda m, w=matrix: f"{w}: {m}"
        )


# ---------------------------------------------------------------------------------------------------
# memsweep, training a trial of the preset as a study would (the preset's settings at a small shape).


def preset_trial(space: SearchSpace, model: str, **settings: Any) -> dict[str, Any]:
    """A trial config of preset `space`'s model `model`: its flat settings put where TrainConfig holds
    them (top level, task_params, cell_params)."""
    flat = {**space.base, **space.model(model).fixed, **settings}
    top = {f.name for f in dataclasses.fields(TrainConfig)}
    task_fields = {f.name for f in dataclasses.fields(TASKS.get(flat["task"]).Config)}
    config: dict[str, Any] = {"task_params": {}, "cell_params": {}}
    for key, value in flat.items():
        where = config if key in top else config["task_params" if key in task_fields else "cell_params"]
        where[key] = value
    return config


@dataclasses.dataclass(frozen=True)
class Case:
    space: SearchSpace
    model: str
    scale: float  # a value of the preset's grid, as is lr
    lr: float
    steps: int = 30
    clips: bool = False  # the global-norm clip acts on some step (checked: the case keeps its point)
    saturates: bool = False  # some target's probability passes the loss's clip


CASES = {
    # confident enough from step ~280 that some blanks' probabilities pass 1 − ε (the clip's zero gradient)
    "copy-chain": Case(COPY_500, "chain", 1.02, 8e-4, steps=320, saturates=True),
    "copy-fbchain": Case(COPY_500, "fbchain", 0.05, 3e-4),
    "copy-orthogonal": Case(COPY_500, "orthogonal", 1.0, 8e-4),
    "addition-identity": Case(ADDITION_750, "identity", 1.0, 1e-4, clips=True),  # every step clipped
    "addition-chain": Case(ADDITION_750, "chain", 1.05, 8e-4, clips=True),
}


def sgornn_har2_schedule(lr: float, drop: int) -> KerasRate:
    """SGORNN's HAR-2 `schedule(epoch, _)`: `args.lr / 10` once `epoch >= 200` (here `drop`), else
    `args.lr`, which Keras's LearningRateScheduler sets into the optimiser's float32 rate."""
    return lambda epoch, _: torch.tensor(lr / 10 if epoch >= drop else lr, dtype=torch.float32)


def keras_decay(lr: float, decay: float) -> KerasRate:
    """Keras 2.3.1 RMSprop.get_updates with `decay` (SGORNN's addition: decay = lr / (epochs · 100)):
    lr · (1 / (1 + decay · iterations)), each a float32 tensor of the graph."""

    def rate(_: int, iterations: int) -> torch.Tensor:
        lr_t, decay_t, it = (torch.tensor(v, dtype=torch.float32) for v in (lr, decay, float(iterations)))
        return lr_t * (1.0 / (1.0 + decay_t * it))

    return rate


@pytest.mark.parametrize("moving", ["drop", "decay"])
def test_a_moving_rate_trains_as_keras_moves_it(moving: str) -> None:
    """`lr_drop_epochs` is SGORNN's LearningRateScheduler (÷10 after a number of epochs: HAR-2's 200)
    and `lr_decay_steps` Keras 2's `decay` = lr / S (SGORNN's addition), as their Keras computed them;
    the same run at a constant rate does not train so."""
    lr, per_epoch = 8e-4, 2  # n_train 32, batch 16
    settings = {"lr_drop_epochs": [5]} if moving == "drop" else {"lr_decay_steps": 1}
    config = preset_trial(
        COPY_500, "orthogonal", scale=1.0, lr=lr, seq_len=24, hidden=16, seed=1, steps=30, eval_every=1,
        n_train=16 * per_epoch, n_val=16, device="cpu", threads=1, numerics=default_mode(), **settings,
    )  # fmt: skip
    result = train(config)
    assert result.status == "done", result.reason
    rate = sgornn_har2_schedule(lr, 5) if moving == "drop" else keras_decay(lr, lr / 1)
    assert_trains_as(result, keras_run(resolve(config), rate))
    with pytest.raises(AssertionError):
        assert_trains_as(result, keras_run(resolve(config)))


@pytest.mark.parametrize("name", CASES)
def test_memsweep_trains_as_the_authors_keras_code_did(name: str) -> None:
    case = CASES[name]
    config = preset_trial(
        case.space, case.model, scale=case.scale, lr=case.lr, seq_len=24, hidden=16, seed=1,
        steps=case.steps, eval_every=1, n_val=16, device="cpu", threads=1, numerics=default_mode(),
    )  # fmt: skip
    result = train(config)  # eval_every=1: each evaluation's train_loss is that one step's loss
    assert result.status == "done", result.reason
    keras = keras_run(resolve(config))
    coverage = (keras.clipped > 0, keras.saturated > 0)
    assert coverage == (case.clips, case.saturates), f"clipped {keras.clipped}, saturated {keras.saturated}"

    assert_trains_as(result, keras)


def test_the_copy_loss_is_keras_past_its_clip_too() -> None:
    """Targets far past the clip at both ends (loss capped at −ln ε, no gradient) and inside it: the loss
    and its gradient as Keras's, where training reaches the low end only when a run goes wrong."""
    task = resolve(preset_trial(COPY_500, "chain", seq_len=24, numerics=default_mode())).make_task()
    gen = torch.Generator().manual_seed(0)
    _, y = task.encode(task.sample(16, gen), CPU)  # y [T, B]
    logits = torch.randn(*y.shape, task.output_dim, generator=gen)
    wrong = torch.nn.functional.one_hot((y + 1) % task.output_dim, task.output_dim).bool()
    right = torch.nn.functional.one_hot(y, task.output_dim).bool()
    logits[:4] += 30.0 * wrong[:4]  # confidently wrong: p_y < ε
    logits[4:8] += 30.0 * right[4:8]  # confidently right: p_y > 1 − ε
    mine = logits.clone().requires_grad_()
    theirs = logits.transpose(0, 1).clone().requires_grad_()  # Keras's [B, T, C]
    loss = task.loss(mine, y)
    target = torch.nn.functional.one_hot(y.T, task.output_dim).float()
    keras = weighted_objective(categorical_crossentropy(target, keras_softmax(theirs)))
    torch.testing.assert_close(loss, keras, rtol=RTOL, atol=0.0)
    (g_mine,) = torch.autograd.grad(loss, mine)
    (g_theirs,) = torch.autograd.grad(keras, theirs)
    scale = float(g_theirs.abs().max())
    torch.testing.assert_close(g_mine, g_theirs.transpose(0, 1), rtol=0.0, atol=WEIGHT_TOL * scale)
    assert not g_theirs[:, :8].any()  # the clip's zero gradient is in play


def test_a_probability_on_the_clips_bound_keeps_its_gradient_as_in_tensorflow() -> None:
    """tf.clip_by_value is Minimum then Maximum, whose gradients pass on a tie: a probability lying exactly
    on ε or 1 − ε keeps its gradient, one strictly outside gets none. torch.clamp passes none on a bound,
    and a confident softmax output often lies exactly on 1 − ε in float32 (0.99999988)."""
    lo, hi = (float(torch.tensor(v, dtype=torch.float32)) for v in (KERAS_EPSILON, 1.0 - KERAS_EPSILON))
    values = [lo / 2, lo, 3e-7, 0.5, 0.9999997, hi, 1.0]  # below, on ε, inside ×3, on 1 − ε, above
    p = torch.tensor(values, dtype=torch.float32, requires_grad=True)
    q = torch.tensor(values, dtype=torch.float32, requires_grad=True)
    mine = keras_clip(p, KERAS_EPSILON)
    theirs = TFClipByValue.apply(q, KERAS_EPSILON, 1.0 - KERAS_EPSILON)
    assert torch.equal(mine, theirs)
    weights = torch.arange(1.0, len(values) + 1)
    (g_mine,) = torch.autograd.grad(torch.log(mine).mul(weights).sum(), p)
    (g_theirs,) = torch.autograd.grad(torch.log(theirs).mul(weights).sum(), q)
    assert torch.equal(g_mine, g_theirs)
    assert g_mine[[1, 5]].ne(0).all() and g_mine[[0, 6]].eq(0).all()

    # The copy loss: thousands of confident positions, some exactly on 1 − ε (the loss there is −ln(1 − ε),
    # as it is past the bound), and those keep a gradient.
    task = resolve(preset_trial(COPY_500, "chain", seq_len=24, numerics=default_mode())).make_task()
    gen = torch.Generator().manual_seed(0)
    _, y = task.encode(task.sample(256, gen), CPU)  # y [T, B]
    right = torch.nn.functional.one_hot(y, task.output_dim).bool()
    logits = 3.0 * torch.randn(*y.shape, task.output_dim, generator=gen)
    logits += right * (12.0 + 6.0 * torch.rand(*y.shape, 1, generator=gen))
    logits.requires_grad_()
    per_position = cross_entropy(logits, y, KERAS_EPSILON, reduction="none")  # [T, B]
    (grad,) = torch.autograd.grad(per_position.sum(), logits)
    # −ln(1 − ε) ≈ 2⁻²³ at or past the bound; the next probability below it, 1 − 3·2⁻²⁴, costs 1.5·2⁻²³
    at_or_past = per_position < 1.25 * 2**-23
    kept = grad.abs().sum(-1) > 0
    assert at_or_past.sum() > 100
    assert (at_or_past & kept).sum() > 10  # on the bound: TF's gradient, where torch.clamp's is zero
    assert (at_or_past & ~kept).sum() > 10  # past it: none, as in TF


# ---------------------------------------------------------------------------------------------------
# Emami et al.'s students (melikaemami/URNN:urnn_synth_test.py, tf.keras): SimpleRNN(relu,
# return_sequences) → TimeDistributed(Dense(linear)), the MSE over every step and output, tf.keras' Adam,
# and for the URNN the recurrent kernel replaced by its polar factor after every batch (`project`).


def keras_adam_(
    params: list[torch.Tensor], grads: list[torch.Tensor], ms: list[torch.Tensor], vs: list[torch.Tensor],
    lr: float, n: int,
) -> None:  # fmt: skip
    """tf.keras' Adam (optimizer_v2/adam.py → ApplyAdam) at its defaults β 0.9/0.999, ε 1e-7, step n ≥ 1:
    m ← β1 m + (1 − β1) g;  v ← β2 v + (1 − β2) g²;  p ← p − lr·√(1 − β2ⁿ)/(1 − β1ⁿ) · m / (√v + ε)."""
    beta1, beta2 = 0.9, 0.999
    rate = lr * (1.0 - beta2**n) ** 0.5 / (1.0 - beta1**n)
    for p, g, m, v in zip(params, grads, ms, vs, strict=True):
        m.copy_(beta1 * m + (1.0 - beta1) * g)
        v.copy_(beta2 * v + (1.0 - beta2) * g * g)
        p.sub_(rate * m / (torch.sqrt(v) + KERAS_EPSILON))


def polar(w: torch.Tensor) -> torch.Tensor:
    """Their `project`: U, s, Vt = svd(W); W ← U Vt (numpy on the float32 kernel)."""
    u, _, vh = torch.linalg.svd(w)
    return u @ vh


def keras_student_run(resolved: Resolved, project: bool) -> KerasRun:
    """Their student, fitted by the functions above for the trial's steps from memsweep's initial weights
    on memsweep's batches; `project`: the URNN's polar projection of the recurrent kernel after each batch."""
    cfg, task = resolved.config, resolved.make_task()
    net = build_model(resolved, task)
    K = net.cell.weight_ih.detach().T.clone()  # [d, N]
    R = net.cell.weight_hh.detach().T.clone()  # [N, N]
    b = net.cell.bias.detach().clone()  # [N]
    D = net.readout.weight.detach().T.clone()  # Dense kernel [N, nout]
    c = net.readout.bias.detach().clone()  # [nout]
    params = [p.requires_grad_() for p in (K, R, b, D, c)]
    ms, vs = [torch.zeros_like(p) for p in params], [torch.zeros_like(p) for p in params]

    def fit_loss(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """x [T, B, nin], y [T, B, nout] time-major, as memsweep encodes them; Keras's are batch-major."""
        H = simple_rnn(x.transpose(0, 1), K, R, b, tf_relu)  # [B, T, N]
        return weighted_objective(mean_squared_error(y.transpose(0, 1), H @ D + c))

    val_x, val_y = task.encode(task.val_split().take(slice(None)), CPU)
    batches = training_batches(task, cfg.batch_size, cfg.seed)
    run = KerasRun()
    for n in range(1, (cfg.steps or 0) + 1):
        loss = fit_loss(*task.encode(next(batches), CPU))
        grads = list(torch.autograd.grad(loss, params))  # no clipnorm
        with torch.no_grad():
            keras_adam_(params, grads, ms, vs, cfg.lr, n)
            if project:
                R.copy_(polar(R))
            run.val_losses.append(float(fit_loss(val_x, val_y)))
        run.losses.append(float(loss.detach()))
    run.W, run.V = R.detach().T, K.detach().T
    return run


STUDENTS = {  # (preset, model, teacher realisation, hidden): both figures' input laws, n below and above n_true
    "rnn-gaussian": (GAUSSIAN_20DB, "rnn", 1, 6),
    "urnn-gaussian": (GAUSSIAN_20DB, "urnn", 2, 8),
    "rnn-sparse": (SPARSE_15DB, "rnn", 3, 2),
    "urnn-sparse": (SPARSE_15DB, "urnn", 1, 4),
}


@pytest.mark.parametrize("name", STUDENTS)
def test_emamis_students_train_as_their_tf_keras_code_did(name: str) -> None:
    space, model, teacher, hidden = STUDENTS[name]
    config = preset_trial(
        space, model, hidden=hidden, teacher_seed=teacher, seq_len=40, n_train=30, n_val=10, seed=1,
        epochs=1, steps=24, eval_every=1, device="cpu", threads=1, numerics=default_mode(),
    )  # fmt: skip
    result = train(config)
    assert result.status == "done", result.reason
    keras = keras_student_run(resolve(config), project=model == "urnn")

    assert_trains_as(result, keras)
    val = [e.val_loss for e in result.history]
    assert val[-1] < 0.9 * val[0], "the student learns: a case that only tests a frozen network says little"
    if model == "urnn":  # on the orthogonal group after the last step, as theirs
        eye = torch.eye(hidden, dtype=torch.float64)
        torch.testing.assert_close(
            result.recurrent_matrix.double() @ result.recurrent_matrix.double().T, eye, rtol=0.0, atol=1e-6
        )
