"""Hidden chain motifs: the recurrent weight profile of units ordered by peak time (Orhan & Pitkow 2020 §3.2, Figs. 5–6).

After Rajan et al. (2016): inject a unit pulse of input at t = 0, let the network run `steps` = 100 steps
with no input, order the units by the time of their peak activity (a small seeded jitter breaks ties),
and average W_ij over each diagonal of the reordered matrix, i.e. as a function of the order difference
i − j (positive: from an earlier- to a later-peaking unit). A pure feedforward chain peaks at i − j = 1
and is zero elsewhere; trained orthogonal RNNs show an asymmetric bump at small positive i − j (Fig. 5);
the sigmoid gates of trained LSTMs are roughly monotonic in i − j (Fig. 6a–c).

    h_0 = f(p),   h_t = f(W h_{t−1} + b),   t = 1..steps,   p the pulse: V·1 (a unit pulse in every input)

"Peak activity" is the peak of |h_i(t)| (linear networks can go negative); the jitter is uniform in
[0, 0.5) steps, so it reorders only units that peak at the same step. The per-network profile is
`weight_profile`; `mean_profile` averages many (e.g. a study's successful trials) with the standard error.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from trainers.analysis.networks import activation
from trainers.seeding import generator

STEPS = 100  # §3.2
JITTER = 0.5  # peak-time jitter in steps: below 1, so it only breaks ties


@dataclass(frozen=True)
class WeightProfile:
    offsets: list[int]  # i − j = −(N−1)..N−1
    mean: list[float]  # mean W_ij over the units ordered by peak time, per offset

    @property
    def peak(self) -> int:
        """The offset i − j with the largest mean weight."""
        return self.offsets[max(range(len(self.mean)), key=self.mean.__getitem__)]


@dataclass(frozen=True)
class ProfileStats:
    offsets: list[int]
    mean: list[float]  # mean over networks of their profiles
    sem: list[float] | None  # standard error of that mean (None for a single network)
    count: int  # networks averaged

    @property
    def peak(self) -> int:
        return self.offsets[max(range(len(self.mean)), key=self.mean.__getitem__)]

    def to_dict(self) -> dict[str, object]:
        return {
            "offsets": self.offsets,
            "mean": self.mean,
            "sem": self.sem,
            "count": self.count,
            "peak": self.peak,
        }


def pulse_response(
    w: torch.Tensor,
    pulse: torch.Tensor,
    steps: int = STEPS,
    nonlinearity: str = "linear",
    bias: torch.Tensor | None = None,
) -> torch.Tensor:
    """Activity [steps + 1, N] after a pulse at t = 0 with no input afterwards: h_0 = f(p), h_t = f(W h_{t−1} + b)."""
    f = activation(nonlinearity)
    w64 = w.detach().to(torch.float64).cpu()  # [N, N]
    b = (
        torch.zeros(w64.shape[0], dtype=torch.float64)
        if bias is None
        else bias.detach().to(torch.float64).cpu()
    )
    h = f(pulse.detach().to(torch.float64).cpu().reshape(-1) + b)  # h_0 [N]
    rows = [h]
    for _ in range(steps):
        h = f(w64 @ h + b)
        rows.append(h)
    return torch.stack(rows)  # [steps + 1, N]


def peak_order(activity: torch.Tensor, seed: int = 1, jitter: float = JITTER) -> torch.Tensor:
    """Units [N] (long) sorted by the time of their peak |activity| [T, N]; a seeded jitter breaks ties."""
    peak_time = activity.abs().argmax(dim=0).to(torch.float64)  # [N] (first peak on exact ties in time)
    noise = torch.rand(peak_time.shape, generator=generator(seed, "profile-jitter"), dtype=torch.float64)
    return torch.argsort(peak_time + jitter * noise, stable=True)  # rank r → unit order[r]


def weight_profile(w: torch.Tensor, order: torch.Tensor) -> WeightProfile:
    """Mean W_ij as a function of the order difference i − j, units relabelled by rank in `order` [N]."""
    w64 = w.detach().to(torch.float64).cpu()
    n = w64.shape[0]
    if w64.shape != (n, n) or order.shape != (n,):
        raise ValueError(f"W must be [N, N] and order [N]; got {tuple(w.shape)} and {tuple(order.shape)}")
    ranked = w64[order][:, order]  # ranked[a, b] = W[order[a], order[b]]: from rank b to rank a
    offsets = list(range(-(n - 1), n))
    mean = [float(torch.diagonal(ranked, offset=-d).mean().item()) for d in offsets]  # a − b = d
    return WeightProfile(offsets, mean)


def network_profile(
    w: torch.Tensor,
    pulse: torch.Tensor,
    steps: int = STEPS,
    nonlinearity: str = "linear",
    bias: torch.Tensor | None = None,
    seed: int = 1,
) -> WeightProfile:
    """A network's weight profile (Fig. 5): pulse response → peak-time order → mean W_ij over i − j."""
    return weight_profile(w, peak_order(pulse_response(w, pulse, steps, nonlinearity, bias), seed))


def mean_profile(profiles: Sequence[WeightProfile]) -> ProfileStats:
    """Average profiles of networks of one size; the standard error is std (ddof 1) / √count."""
    if not profiles:
        raise ValueError("mean_profile needs at least one profile")
    offsets = profiles[0].offsets
    if any(p.offsets != offsets for p in profiles):
        raise ValueError("profiles differ in size N; average networks of one size only")
    stack = torch.tensor([p.mean for p in profiles], dtype=torch.float64)  # [count, 2N − 1]
    count = len(profiles)
    sem = (stack.std(dim=0, correction=1) / math.sqrt(count)).tolist() if count > 1 else None
    return ProfileStats(offsets, stack.mean(dim=0).tolist(), sem, count)
