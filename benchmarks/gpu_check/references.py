"""The hand-written scans' references: each recurrence written step by step in plain torch, so that
autograd through it is the gradient the kernels' backwards must give (checked in kernels.py)."""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
import torch.nn.functional as F


def _act(a: torch.Tensor, f: str) -> torch.Tensor:
    if f == "elu":
        return torch.where(a > 0, a, torch.expm1(a))
    return torch.relu(a) if f == "relu" else torch.tanh(a)


def elman_ref(
    x: torch.Tensor, w_in: torch.Tensor, b: torch.Tensor, h0: torch.Tensor, w: torch.Tensor, f: str
) -> torch.Tensor:
    xp, h, hs = x @ w_in.t() + b, h0, []
    for t in range(x.shape[0]):
        h = _act(xp[t] + h @ w.t(), f)
        hs.append(h)
    return torch.stack(hs)


def fastrnn_ref(
    x: torch.Tensor,
    w_in: torch.Tensor,
    w: torch.Tensor,
    bias: torch.Tensor,
    a: torch.Tensor,
    b: torch.Tensor,
    f: str,
) -> torch.Tensor:
    xp = x @ w_in.t() + bias
    h, hs = xp.new_zeros(xp.shape[1:]), []
    for t in range(x.shape[0]):
        h = a * _act(xp[t] + h @ w.t(), f) + b * h
        hs.append(h)
    return torch.stack(hs)


def shift_ref(b: torch.Tensor) -> torch.Tensor:
    h, hs = torch.relu(b[0]), []
    hs.append(h)
    for t in range(1, b.shape[0]):
        h = torch.relu(b[t] + h.roll(1, -1))
        hs.append(h)
    return torch.stack(hs)


def janet_ref(
    x: torch.Tensor, w_ih: torch.Tensor, w_hh: torch.Tensor, bias: torch.Tensor, h0: torch.Tensor
) -> torch.Tensor:
    N, gx, h, hs = h0.shape[1], x @ w_ih.t() + bias, h0, []
    for t in range(x.shape[0]):
        a = gx[t] + h @ w_hh.t()
        f, c = torch.sigmoid(a[:, :N]), torch.tanh(a[:, N:])
        h = f * h + (1 - f) * c
        hs.append(h)
    return torch.stack(hs)


def gru_ref(
    x: torch.Tensor,
    w_ih: torch.Tensor,
    w_hh: torch.Tensor,
    b_ih: torch.Tensor,
    b_hh: torch.Tensor,
    h0: torch.Tensor,
) -> torch.Tensor:
    N, h, hs = h0.shape[1], h0, []
    for t in range(x.shape[0]):
        xr, xz, xn = torch.split(x[t] @ w_ih.t() + b_ih, N, 1)
        hr, hz, hn = torch.split(h @ w_hh.t() + b_hh, N, 1)
        r, z = torch.sigmoid(xr + hr), torch.sigmoid(xz + hz)
        h = (1 - z) * torch.tanh(xn + r * hn) + z * h
        hs.append(h)
    return torch.stack(hs)


def nru_ref(
    x: torch.Tensor,
    w: torch.Tensor,
    b: torch.Tensor,
    wh: torch.Tensor,
    bh: torch.Tensor,
    ln: tuple[torch.Tensor, torch.Tensor] | None,
    k: int,
    M: int,
    use_relu: bool,
    reduction: str,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The authors' NRU step (apsarath/NRU NRU.py), heads stacked [α(k), β(k), p^w q^w (2s), p^e q^e (2s)]."""
    N, s = w.shape[0], math.isqrt(M * k)
    rho: Callable[[torch.Tensor], torch.Tensor] = torch.relu if use_relu else (lambda t: t)
    h, m, hs, ms = x.new_zeros(x.shape[1], N), x.new_zeros(x.shape[1], M), [], []
    for t in range(x.shape[0]):
        pre = torch.cat([x[t], h, m], 1) @ w.t() + b
        h = torch.relu(F.layer_norm(pre, (N,), ln[0], ln[1], 1e-5) if ln is not None else pre)
        o = torch.cat([h, m], 1) @ wh.t() + bh
        alpha, beta = rho(o[:, :k]), rho(o[:, k : 2 * k])
        vs = []
        for j in range(2):
            p, q = (
                o[:, 2 * k + 2 * s * j : 2 * k + 2 * s * j + s],
                o[:, 2 * k + 2 * s * j + s : 2 * k + 2 * s * (j + 1)],
            )
            v = (p.unsqueeze(2) * q.unsqueeze(1)).reshape(-1, k, M)
            vs.append(F.normalize(rho(v), p=5, dim=2, eps=1e-12))
        delta = alpha.unsqueeze(2) * vs[0] - beta.unsqueeze(2) * vs[1]
        m = m + (delta.mean(1) if reduction == "mean" else delta.sum(1))
        hs.append(h)
        ms.append(m)
    return torch.stack(hs), torch.stack(ms)
