"""Orhan & Pitkow's four initialisers of a vanilla RNN: recurrent matrix W [N, N] and input matrix V [N, d].

Convention: h_t = f(W h_{t−1} + V x_t + b), so W_ij is the weight from unit j to unit i (PyTorch's
`weight_hh`, applied as h·Wᵀ). Paper §3.1.1 and docs/protocol.md §1.4:
- chain:       W_ij = α δ_{j,i−1}  — the SUB-diagonal: unit i−1 feeds unit i, input enters at unit 0
               (the source end) through V = 0.9·I_{N×d}. (The authors' torch helper used the
               super-diagonal, which sends the chain toward the input's unit; we do not.)
- fbchain:     W_ij = 0.99 δ_{j,i−1} + β δ_{j,i+1}; V = 0.9·I_{N×d}.
- identity:    W = λ I;  V_ij ~ N(0, std 0.9/√N) (Keras RandomNormal(stddev=0.9/√N)).
- orthogonal:  W = λ Q, Q a uniformly random orthogonal matrix; V as for identity.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
from torch import nn

from trainers.registry import Registry


def glorot_uniform(fan_out: int, fan_in: int, gen: torch.Generator) -> torch.Tensor:
    """Keras `glorot_uniform` for a [fan_out, fan_in] matrix: U(±√(6 / (fan_in + fan_out)))."""
    bound = math.sqrt(6.0 / (fan_in + fan_out))
    return torch.empty(fan_out, fan_in).uniform_(-bound, bound, generator=gen)


def torch_default_linear(n_in: int, n_out: int, gen: torch.Generator) -> nn.Linear:
    """nn.Linear with PyTorch's default init (U(±1/√fan_in) for weight and bias), drawn from `gen`."""
    layer = nn.Linear(n_in, n_out, device="meta").to_empty(device="cpu")  # no draw from the global RNG
    bound = 1.0 / math.sqrt(n_in)
    with torch.no_grad():
        nn.init.kaiming_uniform_(layer.weight, a=math.sqrt(5), generator=gen)  # = U(±bound)
        nn.init.uniform_(layer.bias, -bound, bound, generator=gen)
    return layer


# (hidden N, input d, scale, forward weight of fbchain, input gain, generator) → (W [N, N], V [N, d])
Initializer = Callable[[int, int, float, float, float, torch.Generator], tuple[torch.Tensor, torch.Tensor]]

INITIALIZERS: Registry[Initializer] = Registry("initializer")


def source_input(n: int, d: int, gain: float) -> torch.Tensor:
    """V = gain·I_{N×d}: input dimension k drives unit k, the chain's source end."""
    return gain * torch.eye(n, d)


def gaussian_input(n: int, d: int, gain: float, gen: torch.Generator) -> torch.Tensor:
    """V_ij ~ N(0, std = gain/√N)."""
    return torch.randn(n, d, generator=gen) * (gain / math.sqrt(n))


def random_orthogonal(n: int, gen: torch.Generator) -> torch.Tensor:
    """Haar-random orthogonal matrix: QR of a Gaussian matrix with R's diagonal signs folded into Q."""
    q, r = torch.linalg.qr(torch.randn(n, n, generator=gen, dtype=torch.float64))
    signed: torch.Tensor = q * torch.sign(torch.diagonal(r))
    return signed.float()


@INITIALIZERS.register("chain")
def chain(n: int, d: int, alpha: float, forward: float, gain: float, gen: torch.Generator):  # type: ignore[no-untyped-def]
    w = alpha * torch.diag(torch.ones(n - 1), -1)  # W[i, i−1] = α
    return w, source_input(n, d, gain)


@INITIALIZERS.register("fbchain")
def fbchain(n: int, d: int, beta: float, forward: float, gain: float, gen: torch.Generator):  # type: ignore[no-untyped-def]
    w = forward * torch.diag(torch.ones(n - 1), -1) + beta * torch.diag(torch.ones(n - 1), 1)
    return w, source_input(n, d, gain)


@INITIALIZERS.register("identity")
def identity(n: int, d: int, lam: float, forward: float, gain: float, gen: torch.Generator):  # type: ignore[no-untyped-def]
    return lam * torch.eye(n), gaussian_input(n, d, gain, gen)


@INITIALIZERS.register("orthogonal")
def orthogonal(n: int, d: int, lam: float, forward: float, gain: float, gen: torch.Generator):  # type: ignore[no-untyped-def]
    w = lam * random_orthogonal(n, gen)
    return w, gaussian_input(n, d, gain, gen)
