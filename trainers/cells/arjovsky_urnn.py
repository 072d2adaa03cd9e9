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
come from the cell's own generator, seeded from the trial's `init` stream after the weights, so a seed
fixes them; their order follows the forward calls, so a trial's numbers also depend on its validation
batches, as theirs depended on torch's global generator. `initial_state="zero"` is z_0 = 0, a departure.
The contract checks the batch independence of such a cell with its draws off (`Cell.state_draws_off`).

Parameters in their construction order, from the trial's generator: θ₁, v₁, θ₂, v₂, θ₃, P, then W_in (their
`itoh`, drawn after the readout there). 8n + N·d trained numbers: their 1,024 + 512·d at n = 128.
Solo only (no fused form): the recurrence runs as plain autograd, step by step, in complex64.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Literal

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


def mod_relu(z: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    """relu(|z| + b) · z / (|z| + 1e−6), |z| = √(Re² + Im²) (their `modReLU`; its gradient at z = 0 is
    not finite, as theirs). The √ is `trainers.numerics.sqrt`: torch.sqrt's numbers, correctly rounded
    on the CPU in the portable mode (MKL's float32 √ starts from rsqrtps, whose bits each vendor sets)."""
    norm = numerics.sqrt(z.real.pow(2) + z.imag.pow(2))  # torch.sqrt, but portable on the CPU
    return z * (torch.relu(norm + bias) / (norm + 1e-6))


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
            seed = int(torch.randint(0, 2**62, (1,), generator=gen))
        self.state_gen = torch.Generator().manual_seed(seed)  # z_0's draws (initial_state "uniform")
        self.draws_state = config.initial_state == "uniform"

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

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        T, B, _ = x.shape
        N, n = self.hidden_size, self.hidden_size // 2
        xin = x if self.weight_ih is None else x @ self.weight_ih.t()  # [T, B, N]
        xc = torch.complex(xin[..., :n], xin[..., n:])
        if self.draws_state:
            bound = math.sqrt(1.5 / n)
            h0 = torch.empty(B, N).uniform_(-bound, bound, generator=self.state_gen).to(x.device, x.dtype)
        else:
            h0 = x.new_zeros(B, N)
        z, zs = torch.complex(h0[:, :n], h0[:, n:]), []
        for t in range(T):
            z = mod_relu(self.unitary(z) + xc[t], self.bias)
            zs.append(z)
        states = torch.stack(zs)  # [T, B, n] complex
        return torch.cat([states.real, states.imag], dim=-1)  # [T, B, N]: [Re | Im]

    def recurrent_matrix(self) -> torch.Tensor:
        """U as the real [N, N] map of [Re | Im]: [[Re U, −Im U], [Im U, Re U]]."""
        n = self.hidden_size // 2
        with torch.no_grad():
            eye = torch.eye(
                n, dtype=torch.complex64 if self.bias.dtype == torch.float32 else torch.complex128
            )
            u = self.unitary(eye.to(self.bias.device)).t()  # column j: U e_j
            return torch.cat([torch.cat([u.real, -u.imag], 1), torch.cat([u.imag, u.real], 1)], 0)

    def input_matrix(self) -> torch.Tensor | None:
        return None if self.weight_ih is None else self.weight_ih.detach()
