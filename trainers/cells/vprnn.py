"""VPRNN: an Elman RNN whose recurrent matrix is a product of permuted Givens-rotation sublayers.

Taylor-Melanson et al. 2021, as used by the SGORNN paper (eq. 2: φ(Θ) = R₁Q₁ … R_kQ_k) and its code
(`wtaylor17/VPRNN:vprnn/layers.py`, `wtaylor17/keras-vpnn:vpnn/layers/rotation.py`; docs/protocol.md §5):

    h_t = f(W_in x_t + U h_{t−1} + b),   h_0 = 0,   U = Rotation_k ∘ … ∘ Rotation_1  (orthogonal)

Each `Rotation` sublayer first applies its own FIXED random permutation (drawn once, never trained),
then rotates the first half of the coordinates against the second half with N/2 angles θ:
y_i = c x_i − s x_j, y_j = c x_j + s x_i (c = cos θ, s = sin θ, j = i + N/2). The code's
`n_rotations = 7` builds 7 sublayers, an (unused) diagonal, then 7 more: the paper's k = 14
sublayers, our `rotations`. θ ~ U(−0.05, 0.05) (Keras 'uniform'), W_in Glorot-uniform, b = 0, no
diagonal (`use_diag=False`), relu (the SGORNN scripts; VPRNN's own default is 'cheby', not offered).

Orientation: Keras computes h·U_k with U_k = layer(I) (row vectors), i.e. the sublayers act on h.
In our column convention W = U_kᵀ, so `W h` applies the sublayers to h in the same order.
The matrix is materialised once per forward pass, then the recurrence runs through the Elman kernel.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch
from torch import nn

from trainers.cells.base import Cell
from trainers.cells.rnn import recurrence
from trainers.initializers import glorot_uniform
from trainers.params import ConfigError
from trainers.persistent import check_elman_hidden


def check_rotations(hidden: int, rotations: int, theta_bound: float) -> None:
    """What rotation sublayers need (`Rotations`; vprnn's and sgornn's), refused at config time."""
    if hidden % 2 or hidden < 2:
        raise ConfigError(
            f"rotation sublayers pair units: hidden size {hidden} must be even (e.g. {hidden + 1})"
        )
    if rotations < 1:
        raise ConfigError(
            f"rotations = {rotations} must be at least 1 (the SGORNN paper uses 14 for N = 128)"
        )
    if not theta_bound >= 0:
        raise ConfigError(f"theta_bound = {theta_bound} must be at least 0: θ ~ U(−theta_bound, theta_bound)")


class Rotations(nn.Module):
    """k permuted rotation sublayers on R^N: trainable angles θ [k, N/2], fixed permutations [k, N]."""

    perms: torch.Tensor  # a buffer: saved and moved with the module, never trained

    def __init__(self, n: int, k: int, theta_bound: float, gen: torch.Generator) -> None:
        super().__init__()
        check_rotations(n, k, theta_bound)
        perms = torch.stack([torch.randperm(n, generator=gen) for _ in range(k)])  # [k, N], fixed
        self.register_buffer("perms", perms)
        self.theta = nn.Parameter(torch.empty(k, n // 2).uniform_(-theta_bound, theta_bound, generator=gen))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Apply the sublayers in order to the columns of x [N, M] (Keras `Rotation.call`, transposed)."""
        return rotate(x, self.theta, self.perms)

    def matrix(self) -> torch.Tensor:
        """W [N, N] with W h = sublayers(h): column j is the sublayers applied to e_j (= Keras' layer(I)ᵀ)."""
        return rotation_matrix(self.theta, self.perms)


def rotate(x: torch.Tensor, theta: torch.Tensor, perms: torch.Tensor) -> torch.Tensor:
    """The sublayers with angles θ [k, N/2] and permutations [k, N] applied to the columns of x [N, M];
    or, with a leading member dimension K on all three, each member's own (a fused bundle). Members
    get their cos and sin one call each: torch splits a tensor's elements between vectorised and
    scalar code by position, so a member's angles are computed as its solo run computes them. The
    gathers, products and sums then run over all members at once: single multiplies, adds and copies
    round alike wherever an element falls, so each member stays bit for bit its solo run (tested)."""
    if theta.dim() == 2:
        c, s = torch.cos(theta).unsqueeze(-1), torch.sin(theta).unsqueeze(-1)  # [k, N/2, 1]
    else:
        c = torch.stack([torch.cos(t) for t in theta.unbind(0)]).unsqueeze(-1)  # [K, k, N/2, 1]
        s = torch.stack([torch.sin(t) for t in theta.unbind(0)]).unsqueeze(-1)
    half = x.shape[-2] // 2
    for i in range(perms.shape[-2]):
        p = x.gather(-2, perms[..., i, :, None].expand(x.shape))  # the sublayer's permutation first
        xi, xj, ck, sk = p[..., :half, :], p[..., half:, :], c[..., i, :, :], s[..., i, :, :]
        x = torch.cat([ck * xi - sk * xj, ck * xj + sk * xi], -2)  # rotate pairs (i, i + N/2)
    return x


def rotation_matrix(theta: torch.Tensor, perms: torch.Tensor) -> torch.Tensor:
    """W [N, N] = the sublayers applied to I; [K, N, N] for a bundle's θ [K, k, N/2], perms [K, k, N]."""
    n = perms.shape[-1]
    eye = torch.eye(n, device=theta.device, dtype=theta.dtype).expand(*perms.shape[:-2], n, n)
    return rotate(eye, theta, perms)


@dataclass(frozen=True)
class VPRNNConfig:
    rotations: int = 14  # rotation sublayers in all (the paper's k; the code's n_rotations = 7, twice)
    theta_bound: float = 0.05  # θ ~ U(−bound, bound), Keras 'uniform'
    nonlinearity: Literal["elu", "relu", "tanh"] = "relu"
    bias: bool = True  # Keras cell bias, zero-initialised
    # see trainers.kernels; "persistent" (the Triton kernel, issue 37) only when asked for
    backend: Literal["auto", "scan", "native", "persistent"] = "auto"


class VPRNNCell(Cell):
    name = "vprnn"
    Config = VPRNNConfig
    config: VPRNNConfig

    def __init__(self, config: VPRNNConfig, input_size: int, hidden_size: int, gen: torch.Generator) -> None:
        super().__init__(config, input_size, hidden_size, gen)
        self.weight_ih = nn.Parameter(glorot_uniform(hidden_size, input_size, gen))  # W_in [N, d]
        self.rotations = Rotations(hidden_size, config.rotations, config.theta_bound, gen)  # U via θ [k, N/2]
        self.bias = nn.Parameter(torch.zeros(hidden_size)) if config.bias else None

    @classmethod
    def check_hidden(cls, config: VPRNNConfig, hidden: int) -> None:
        check_rotations(hidden, config.rotations, config.theta_bound)
        check_elman_hidden(config.backend, hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h0 = x.new_zeros(x.shape[1], self.hidden_size)  # [B, N]
        w = self.rotations.matrix()  # [N, N], orthogonal; autograd carries ∂W back to θ
        return recurrence(x, h0, self.weight_ih, w, self.bias, self.config.nonlinearity, self.config.backend)

    def recurrent_matrix(self) -> torch.Tensor:
        with torch.no_grad():
            return self.rotations.matrix()
