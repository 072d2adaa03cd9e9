"""Contractive teacher RNN (Emami et al. 2019, §5; `melikaemami/URNN:urnn_synth_test.py`;
docs/protocol.md §3).

A random ReLU RNN generates the data; a student learns its input → output map:
    h_t = relu(W h_{t−1} + W_in x_t + b),  h_0 = 0,   y0_t = W_out h_t + b_out,   y_t = y0_t + w_t
with nin 2, nh 4, nout 2, T 1,000 steps, 700 training and 300 test sequences (the test set is the
validation set). As in the code's `SyntheticRNN` (Keras `SimpleRNN(relu)` + `Dense(linear)`):
- W = I − ε AᵀA/‖A‖²_F (paper eq. 6: singular values in (1 − ε, 1)), A ~ N(0, 1)^{nh×nh}, ε = 0.01.
  `normalize=False` gives the code's W = I − ε AᵀA (`gen_rand_weights`), which is not contractive
  to within ε (smallest singular value ≈ 0.9 at ε = 0.01). W is symmetric, so Keras' row convention
  h·W does not matter.
- W_in, b, W_out, b_out ~ N(0, 1).
- Bias calibration (`adjust_biases`): 100 calibration sequences from the input law; 100 iterations of
  activity_j = mean over sequences and time of [h_j > 1e-3], then b ← b − 0.1·(activity − 0.6).
  No convergence check (the code's is commented out).
- Inputs x = N(0, 1)·[U(0, 1) < sparse_in]: dense Gaussian at sparse_in = 1 (the 20 dB experiment),
  sparse_in = 0.02 for the paper's 15 dB experiment (the code has no flag for it).
- Noise: one scalar wvar = mean(y0²)·10^(−SNR/10) over all sequences, steps and outputs (a mean square,
  so the output bias counts as signal), w ~ N(0, wvar).
A realisation (weights, calibration, the 1,000 sequences and their noise) is a pure function of
`teacher_seed`, or of the trial seed when that is None, drawn in the code's order.
Loss: MSE over all steps, outputs and sequences (Keras `mean_squared_error`).
Metric: R² = 1 − MSE_test / Var(y_test), where Var(y_test) is the variance of each output over the
test sequences and steps, averaged over the outputs (= the MSE of the best constant predictor, the
per-output mean). The paper defines no R² and its code computes none (facts §1.5); the per-output
centring keeps a constant prediction at R² = 0 despite the random output biases. Every test sequence
has T·nout values, so the loop's mean over sequences of 1 − MSE_i / Var is exactly this R².
`describe()` reports the optimal R² at the noise level, 1 − wvar / Var(y_test) (the paper's dashed line).
Random baseline: the memoryless predictor (the per-output mean of y_test) has loss Var(y_test), so
R² = 1 − val_loss / baseline_loss.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any, Literal

import torch
import torch.nn.functional as F

from trainers.seeding import generator
from trainers.tasks.base import Split, Task, Tensors

ACTIVE = 1e-3  # a unit counts as active when h > 1e-3 (adjust_biases)
TARGET_ACTIVITY = 0.6  # paper: "each hidden state is on some target 60% of the time"
CALIBRATION_RATE = 0.1  # b ← b − 0.1·(activity − target)


@dataclass(frozen=True)
class TeacherConfig:
    n_in: int = 2  # the code's nin
    n_hidden: int = 4  # nh (the true system's state size)
    n_out: int = 2  # nout
    seq_len: int = 1000  # nt
    n_train: int = 700  # ntr
    n_val: int = 300  # nts (test = validation)
    epsilon: float = 0.01  # ε in W = I − ε AᵀA/‖A‖² (the code's hard-coded 0.01)
    normalize: bool = True  # paper eq. (6); False: the code's I − ε AᵀA
    snr_db: float = 20.0  # paper: 20 dB (dense input) or 15 dB (sparse_in 0.02); the code's CLI default is 10
    sparse_in: float = 1.0  # probability that an input entry is nonzero
    calibration_sequences: int = 100  # ns_cal
    calibration_iters: int = 100  # nit
    teacher_seed: int | None = None  # the realisation; None: the trial seed


@dataclass(frozen=True)
class Teacher:
    """The true system's parameters (float64, column convention: h_t = relu(W h_{t−1} + W_in x_t + b))."""

    W: torch.Tensor  # [nh, nh]
    W_in: torch.Tensor  # [nh, nin]
    b: torch.Tensor  # [nh]
    W_out: torch.Tensor  # [nout, nh]
    b_out: torch.Tensor  # [nout]

    @torch.no_grad()
    def run(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """x [n, T, nin] → (h [n, T, nh], y0 [n, T, nout]), in float64."""
        drive = (x.double() @ self.W_in.T + self.b).transpose(0, 1).contiguous()  # [T, n, nh]: W_in x_t + b
        W_T = self.W.T.contiguous()
        h = torch.zeros(x.shape[0], self.W.shape[0], dtype=torch.float64)
        hs = []
        for drive_t in drive:
            h = torch.addmm(drive_t, h, W_T).relu_()  # relu(W h_{t−1} + W_in x_t + b), rows = sequences
            hs.append(h)
        H = torch.stack(hs, 1)  # [n, T, nh]
        return H, H @ self.W_out.T + self.b_out


def recurrent_matrix(A: torch.Tensor, epsilon: float, normalize: bool) -> torch.Tensor:
    """W = I − ε AᵀA/‖A‖²_F (paper eq. 6), or the code's I − ε AᵀA."""
    AtA = A.T @ A
    if normalize:
        AtA = AtA / A.pow(2).sum()  # ‖A‖²_F ≥ λ_max(AᵀA), so W's singular values lie in (1 − ε, 1)
    return torch.eye(A.shape[0], dtype=A.dtype) - epsilon * AtA


def draw_inputs(n: int, c: TeacherConfig, gen: torch.Generator) -> torch.Tensor:
    """x = N(0, 1)·[U(0, 1) < sparse_in], [n, T, nin] float64."""
    shape = (n, c.seq_len, c.n_in)
    gauss = torch.randn(shape, generator=gen, dtype=torch.float64)
    return gauss * (torch.rand(shape, generator=gen, dtype=torch.float64) < c.sparse_in)


def activity(h: torch.Tensor) -> torch.Tensor:
    """Per-unit fraction of (sequence, step) pairs with h > 1e-3, [nh]."""
    return (h > ACTIVE).double().mean((0, 1))


@dataclass(frozen=True)
class Realisation:
    teacher: Teacher
    x: torch.Tensor  # [ntr + nts, T, nin] float32
    y: torch.Tensor  # [ntr + nts, T, nout] float32, with noise
    noise_var: float  # wvar
    activity: torch.Tensor  # [nh] on the generated sequences
    calibration_activity: torch.Tensor  # [nh] measured at the last calibration iteration (before its update)


@functools.lru_cache(maxsize=2)
def realise(c: TeacherConfig, seed: int) -> Realisation:
    """The teacher and its data, drawn in `urnn_synth_test.py`'s order from one seed."""
    gen = generator(seed, "teacher")
    f64 = torch.float64
    A = torch.randn(c.n_hidden, c.n_hidden, generator=gen, dtype=f64)
    W = recurrent_matrix(A, c.epsilon, c.normalize)
    W_in = torch.randn(c.n_hidden, c.n_in, generator=gen, dtype=f64)
    b = torch.randn(c.n_hidden, generator=gen, dtype=f64)
    W_out = torch.randn(c.n_out, c.n_hidden, generator=gen, dtype=f64)
    b_out = torch.randn(c.n_out, generator=gen, dtype=f64)
    teacher = Teacher(W, W_in, b, W_out, b_out)

    x_cal = draw_inputs(c.calibration_sequences, c, gen)
    measured = torch.full((c.n_hidden,), float("nan"), dtype=f64)
    for _ in range(c.calibration_iters):
        measured = activity(teacher.run(x_cal)[0])
        teacher = Teacher(W, W_in, teacher.b - CALIBRATION_RATE * (measured - TARGET_ACTIVITY), W_out, b_out)

    x = draw_inputs(c.n_train + c.n_val, c, gen)
    h, y0 = teacher.run(x)
    noise_var = float(y0.pow(2).mean()) * 10 ** (-c.snr_db / 10)
    y = y0 + noise_var**0.5 * torch.randn(y0.shape, generator=gen, dtype=f64)
    return Realisation(teacher, x.float(), y.float(), noise_var, activity(h), measured)


class TeacherTask(Task):
    name = "teacher"
    Config = TeacherConfig
    output = "sequence"
    default_nonlinearity = "relu"  # the students are SimpleRNN(relu)
    metric_name = "r2"
    supports_fresh = False
    check_params = {"seq_len": 50, "n_train": 16, "n_val": 8, "calibration_sequences": 8}  # noqa: RUF012
    config: TeacherConfig

    def __init__(self, config: TeacherConfig, seed: int) -> None:
        super().__init__(config, seed)
        for name in ("n_in", "n_hidden", "n_out", "seq_len", "n_train", "n_val", "calibration_sequences"):
            if getattr(config, name) < 1:
                raise ValueError(f"teacher: {name} must be at least 1")
        if not 0.0 < config.sparse_in <= 1.0:
            raise ValueError("teacher: sparse_in must be in (0, 1]")

    @property
    def realisation(self) -> Realisation:
        c = self.config
        return realise(c, self.seed if c.teacher_seed is None else c.teacher_seed)

    @property
    def teacher(self) -> Teacher:
        return self.realisation.teacher

    @property
    def seq_len(self) -> int:
        return self.config.seq_len

    @property
    def input_dim(self) -> int:
        return self.config.n_in

    @property
    def output_dim(self) -> int:
        return self.config.n_out

    @property
    def data_regime(self) -> Literal["fixed", "fresh"]:
        return "fixed"

    def train_split(self) -> Split:
        r = self.realisation
        return Split((r.x[: self.config.n_train], r.y[: self.config.n_train]))

    def val_split(self) -> Split:
        r = self.realisation
        return Split((r.x[self.config.n_train :], r.y[self.config.n_train :]))

    @functools.cached_property
    def target_var(self) -> float:
        """Var(y_test): each output's variance over test sequences and steps, averaged over outputs."""
        y = self.val_split().tensors[1].double()  # [nts, T, nout]
        return float(y.var(dim=(0, 1), unbiased=False).mean())

    @property
    def baseline_loss(self) -> float:
        return self.target_var

    @property
    def optimal_r2(self) -> float:
        return 1.0 - self.realisation.noise_var / self.target_var

    def encode(self, batch: Tensors, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        x, y = batch  # [B, T, nin], [B, T, nout]
        return x.transpose(0, 1).to(device), y.transpose(0, 1).to(device)  # time-major

    def loss(self, out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return F.mse_loss(out, y)  # out [T, B, nout]

    def metric_sum(self, out: torch.Tensor, y: torch.Tensor) -> float:
        mse = (out - y).pow(2).mean((0, 2))  # [B]: each sequence's MSE
        return float((1.0 - mse / self.target_var).sum())

    def describe(self) -> dict[str, Any]:
        r = self.realisation
        return {
            **super().describe(),
            "noise_var": r.noise_var,
            "target_var": self.target_var,
            "optimal_r2": self.optimal_r2,
            "hidden_activity": [round(float(a), 4) for a in r.activity],
            "recurrent_singular_values": [float(s) for s in torch.linalg.svdvals(r.teacher.W)],
        }
