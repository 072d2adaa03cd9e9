"""Arjovsky, Shah & Bengio's unitary evolution RNN (uRNN, 2016), as Rotman & Wolf's code runs it
(`rotmanmi/SRNN:models/urnncell.py`, the uRNN of their Figs. 2 and 3; docs/protocol.md §2).

A complex state of n = N/2 units, kept as N reals [Re | Im] (the states the readout sees, as their
`end_fc` reads 2n): with z_t the complex state,

    z_t = modReLU(U z_{t−1} + x̃_t),   U = D₃ R₂ F⁻¹ D₂ P R₁ F D₁,   modReLU(z) = relu(|z| + b) · z / (|z| + 1e−6)

- D_k = diag(e^{iθ_k}), θ_k ~ U(−π, π) (their `DiagonalMatrix`);
- R_k = I − 2 v_k v_kᴴ / ‖v_k‖², Re v_k and Im v_k ~ U(−1, 1) (`ReflectionMatrix`);
- F the unnormalised DFT and F⁻¹ its inverse (torch's `fft` / `ifft`, whose inverse divides by n);
- P a fixed random permutation of the units (`PermutationMatrix`, not trained);
- b the modReLU bias, zero at init; |z| = √(Re² + Im²) as their `magnitude` computes it;
- x̃_t = W_in x_t split into [Re | Im] halves: W_in [N, d] Xavier-uniform with no bias (their `itoh`,
  `input_map="linear"`), or x_t itself (`input_map="identity"`: their copy model embeds the symbols into
  2n and feeds the embedding in as it is; d must then be N).

`initial_state="uniform"` (theirs): z_0's 2n reals ~ U(±√(1.5/n)), drawn per example at every forward (their
`URNN.forward` draws h_i when none is given, and none ever is), training and validation alike. The draws
come from the cell's own two generators, seeded from the trial's `init` stream after the weights, so a
seed fixes them: training's, fresh at every step; evaluation's, set back to its seed as each evaluation
begins (`train(False)`, which `model.eval()` calls), so that every evaluation draws the same initial states
for the same validation examples. Theirs came from torch's one global generator, shared with the data
and every evaluation, so that their numbers moved with how often they evaluated; ours do not: an
evaluation measures the weights alone, and the training draws are the same whatever the evaluation
cadence. `initial_state="zero"` is z_0 = 0, a departure.
The contract checks the batch independence of such a cell with its draws off (`Cell.state_draws_off`).

Parameters in their construction order and laws, from the trial's generator (their draws' laws, not
their generator's stream: their `rand` then `uniform_` for v, and their `itoh`'s discarded Kaiming draw,
are not replayed): θ₁, v₁, θ₂, v₂, θ₃, P, then W_in (their `itoh`, drawn after the readout there).
8n + N·d trained numbers: their 1,024 + 256·d at n = 128 (N = 256).
Solo only (no fused form). U is built once per forward as its real form W = [[Re U, −Im U], [Im U, Re U]]
(the structured product applied to the identity, in complex64, differentiable), and the recurrence runs
as one autograd function over all steps (`ModReLUScan`): one GEMM a step and a hand-written backward.
The same function as their step-by-step structured product, with a dense product's rounding; 6× faster
than the structured product step by step under autograd on the CPU (195 → 33 ms a training step at
T = 120, B = 20, N = 256; one thread). modReLU's √ is `trainers.numerics.sqrt`: torch.sqrt's numbers,
correctly rounded on the CPU in the portable mode (MKL's float32 √ starts from rsqrtps, whose bits each
vendor sets).
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Literal

import torch
from torch import nn

from trainers import numerics
from trainers.cells.base import Cell
from trainers.params import ConfigError

InputMap = Literal["linear", "identity"]
InitialState = Literal["uniform", "zero"]


@dataclass(frozen=True)
class ArjovskyURNNConfig:
    input_map: InputMap = "linear"  # their `itoh` (Xavier-uniform, no bias), or the inputs as they are
    initial_state: InitialState = (
        "uniform"  # theirs: U(±√(1.5/n)) per example, every forward; "zero": z_0 = 0
    )


def diagonal(theta: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
    """diag(e^{iθ}) z, as their `comp_mul(cos θ, sin θ, …)`."""
    return torch.complex(torch.cos(theta), torch.sin(theta)) * z


def reflection(v: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
    """(I − 2 v vᴴ / ‖v‖²) z for z [B, n], v complex [n]."""
    vhz = (z * v.conj()).sum(-1, keepdim=True)  # vᴴ z per example [B, 1]
    sq_norm = v.real.pow(2).sum() + v.imag.pow(2).sum()
    return z - (2.0 / sq_norm) * vhz * v


MOD_RELU_EPS = 1e-6  # their modReLU's |z| + 1e−6


class ModReLUScan(torch.autograd.Function):
    """h_t = modReLU(W h_{t−1} + x_t) over all T steps, the complex state kept as reals [B, 2n] =
    [Re | Im] and U as its real form W [2n, 2n]: one GEMM a step forward, and a backward written by hand
    (one GEMM a step, dW in one GEMM over all steps), as `trainers.kernels.ElmanScan` does for the Elman
    cells. modReLU, per unit: r = |a| = √(Re² + Im²), s = relu(r + b) / (r + 1e−6), out = a·s; its
    gradient, with g·a = g_Re·Re + g_Im·Im: ∂a = g·s + (g·a)·s′(r)·a / r, s′(r) = (1[r + b > 0]·(r + 1e−6)
    − relu(r + b)) / (r + 1e−6)², ∂b = (g·a)·1[r + b > 0] / (r + 1e−6). At a = 0 exactly (a zero state
    and a zero input: `initial_state="zero"` on psMNIST's black pixels) the second term's limit, 0, is
    taken where autograd through √ (and their code) gives NaN. Without gradients (a validation) the
    pre-activations and norms are not kept: one step's scratch instead of [T, B, N] and [T, B, n]."""

    @staticmethod
    def forward(
        ctx: Any, x: torch.Tensor, h0: torch.Tensor, w: torch.Tensor, bias: torch.Tensor
    ) -> torch.Tensor:
        T, B, N = x.shape
        n = N // 2
        w_t = w.t()
        keep = any(ctx.needs_input_grad)  # a validation's forward keeps nothing for a backward
        hs = x.new_empty(T + 1, B, N)  # h_0 … h_T
        pre = x.new_empty(T if keep else 1, B, N)
        norms = x.new_empty(T if keep else 1, B, n)
        hs[0] = h0
        for t in range(T):
            a = torch.addmm(x[t], hs[t], w_t, out=pre[t if keep else 0])
            pairs = a.view(B, 2, n)
            r = numerics.sqrt(pairs.pow(2).sum(1))  # torch.sqrt, but portable on the CPU
            norms[t if keep else 0] = r
            scale = torch.relu(r + bias) / (r + MOD_RELU_EPS)
            torch.mul(pairs, scale.unsqueeze(1), out=hs[t + 1].view(B, 2, n))
        if keep:
            ctx.save_for_backward(hs, pre, norms, w, bias)
        return hs[1:]

    @staticmethod
    def backward(
        ctx: Any, grad: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        hs, pre, norms, w, bias = ctx.saved_tensors
        T, B, N = pre.shape
        n = N // 2
        d_pre = torch.empty_like(pre)
        d_bias = torch.zeros_like(bias)
        dh = torch.zeros_like(hs[0])
        for t in range(T - 1, -1, -1):
            g = (grad[t] + dh).view(B, 2, n)
            a = pre[t].view(B, 2, n)
            r = norms[t]
            shifted = r + bias
            on = (shifted > 0).to(r.dtype)
            denom = r + MOD_RELU_EPS
            lifted = torch.relu(shifted)
            scale = lifted / denom
            ga = (g * a).sum(1)  # g·a per unit [B, n]
            slope = (on * denom - lifted) / (denom * denom)
            radial = torch.where(r > 0, ga * slope / r, 0.0)  # its limit at a = 0: 0 (g·a is 0 there)
            torch.add(g * scale.unsqueeze(1), a * radial.unsqueeze(1), out=d_pre[t].view(B, 2, n))
            d_bias += (ga * on / denom).sum(0)
            dh = d_pre[t] @ w
        d_w = d_pre.reshape(T * B, N).t() @ hs[:-1].reshape(T * B, N)
        return d_pre, dh, d_w, d_bias


class ArjovskyURNNCell(Cell):
    name = "arjovsky_urnn"
    Config = ArjovskyURNNConfig
    config: ArjovskyURNNConfig
    perm: torch.Tensor  # P, a buffer

    def __init__(
        self, config: ArjovskyURNNConfig, input_size: int, hidden_size: int, gen: torch.Generator
    ) -> None:
        super().__init__(config, input_size, hidden_size, gen)
        n, d = hidden_size // 2, input_size
        if config.input_map == "identity" and d != hidden_size:
            raise ConfigError(
                f"{self.name}: input_map 'identity' feeds the inputs in as the complex state's {hidden_size} "
                f"reals, but they have {d}: embed them into {hidden_size} (copy's embed_dim) or take "
                "input_map 'linear'"
            )
        self.bias = nn.Parameter(torch.zeros(n))  # modReLU's b

        def phase() -> torch.Tensor:  # θ ~ U(−π, π)
            return torch.empty(n).uniform_(-math.pi, math.pi, generator=gen)

        def vector() -> torch.Tensor:  # [Re v; Im v] ~ U(−1, 1)
            return torch.empty(2, n).uniform_(-1.0, 1.0, generator=gen)

        with torch.no_grad():  # their URNNCell's order: D1, R1, D2, R2, D3, P
            self.theta1, self.v1 = nn.Parameter(phase()), nn.Parameter(vector())
            self.theta2, self.v2 = nn.Parameter(phase()), nn.Parameter(vector())
            self.theta3 = nn.Parameter(phase())
            self.register_buffer("perm", torch.randperm(n, generator=gen))
            self.weight_ih = None
            if config.input_map == "linear":
                self.weight_ih = nn.Parameter(
                    nn.init.xavier_uniform_(torch.empty(hidden_size, d), generator=gen)
                )
            seed, self.eval_seed = (int(s) for s in torch.randint(0, 2**62, (2,), generator=gen))
        # z_0's draws (initial_state "uniform"): in training, fresh at every forward; in evaluation (eval
        # mode), from a generator set back to its seed as each evaluation begins (`train`)
        self.train_gen = torch.Generator().manual_seed(seed)
        self.eval_gen = torch.Generator().manual_seed(self.eval_seed)
        self.draws_state = config.initial_state == "uniform"

    def train(self, mode: bool = True) -> ArjovskyURNNCell:
        """nn.Module's, and as an evaluation begins (`model.eval()`) the evaluation's draws start over:
        every evaluation draws the same initial states for the same examples, so the validation loss is
        a function of the weights alone, and the training draws, never taken by an evaluation, do not
        depend on how often a trial evaluates."""
        if not mode:
            self.eval_gen.manual_seed(self.eval_seed)
        super().train(mode)
        return self

    @classmethod
    def check_hidden(cls, config: ArjovskyURNNConfig, hidden: int) -> None:
        if hidden % 2:
            raise ConfigError(
                f"hidden = {hidden} counts the complex state's reals (n = N/2 units: their hidden 128 is "
                f"N = 256), so it must be even: take {hidden + 1}"
            )

    @contextmanager
    def state_draws_off(self) -> Iterator[None]:
        drawn, self.draws_state = self.draws_state, False
        try:
            yield
        finally:
            self.draws_state = drawn

    def _complex(self, v: torch.Tensor) -> torch.Tensor:
        return torch.complex(v[0], v[1])

    def unitary(self, z: torch.Tensor) -> torch.Tensor:
        """U z for z complex [B, n]: D₃ R₂ F⁻¹ D₂ P R₁ F D₁ z."""
        z = torch.fft.fft(diagonal(self.theta1, z), dim=-1)
        z = reflection(self._complex(self.v1), z)[:, self.perm]
        z = torch.fft.ifft(diagonal(self.theta2, z), dim=-1)
        return diagonal(self.theta3, reflection(self._complex(self.v2), z))

    def real_form(self) -> torch.Tensor:
        """U as the real [N, N] map of [Re | Im], W = [[Re U, −Im U], [Im U, Re U]], built by applying the
        structured product to the identity (differentiable: the step's gradient reaches θ and v through it)."""
        n = self.hidden_size // 2
        eye = torch.eye(n, dtype=torch.complex64 if self.bias.dtype == torch.float32 else torch.complex128)
        u = self.unitary(eye.to(self.bias.device)).t()  # column j: U e_j
        return torch.cat([torch.cat([u.real, -u.imag], 1), torch.cat([u.imag, u.real], 1)], 0)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B = x.shape[1]
        N, n = self.hidden_size, self.hidden_size // 2
        xin = x if self.weight_ih is None else x @ self.weight_ih.t()  # [T, B, N]
        if self.draws_state:
            bound = math.sqrt(1.5 / n)
            draws = self.train_gen if self.training else self.eval_gen
            h = torch.empty(B, N).uniform_(-bound, bound, generator=draws).to(x.device, x.dtype)
        else:
            h = x.new_zeros(B, N)
        # U once per forward, as a dense real map: one GEMM a step in place of the structured product's
        # dozen small complex operations (the same function; the rounding of a dense product)
        states: torch.Tensor = ModReLUScan.apply(xin.contiguous(), h, self.real_form(), self.bias)
        return states  # [T, B, N]: [Re | Im]

    def recurrent_matrix(self) -> torch.Tensor:
        """U as the real [N, N] map of [Re | Im]: [[Re U, −Im U], [Im U, Re U]]."""
        with torch.no_grad():
            return self.real_form()

    def input_matrix(self) -> torch.Tensor | None:
        return None if self.weight_ih is None else self.weight_ih.detach()
