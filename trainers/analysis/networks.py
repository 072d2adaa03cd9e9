"""The four networks of Orhan & Pitkow's Fig. 1 as the analyses use them: W from the initialisers, a scalar input v.

The analyses study h_t = f(W h_{t−1} + v s_t) with a scalar signal s_t (eq. 1 and 5). W comes from the
same initialiser a trial uses (`trainers.initializers`, drawn from the trial seed's `init` stream, so an
orthogonal W here is the W a trial with that seed and N starts from); v is its input matrix for d = 1:
- chain, fbchain:        v = e₁, the source unit (unit 0), "in order to achieve optimal memory" (§2.1);
- identity, orthogonal:  a Gaussian vector, v_i ~ N(0, std 1/√N) (Appendix A), so ‖v‖ ≈ 1.
`inputs="unit"` rescales v to ‖v‖ = 1 exactly, as Ganguli's theorem (J_tot = 1 for normal W) assumes;
`inputs="paper"` keeps Appendix A's draw.

Scales. Fig. 1's parameter values are not in the paper's text; the Fisher-memory defaults are the authors'
code defaults and the largest grid value below 1 (the series of eq. 3–4 need ρ(W) < 1 for normal W):
chain α = 1.02 and fbchain β = 0.04 (`NonnormalInit_torchrnn.py` defaults; fbchain's forward weight 0.99),
identity and orthogonal λ = 0.99 (§3.1.1 grid). The decoding experiments use 1.01 throughout (Appendix A).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

import torch
import torch.nn.functional as F

from trainers.initializers import INITIALIZERS
from trainers.params import ConfigError
from trainers.seeding import generator

FIG1_SCALE = {"chain": 1.02, "fbchain": 0.04, "identity": 0.99, "orthogonal": 0.99}  # see the docstring
APPENDIX_A_SCALE = {
    "chain": 1.01,
    "fbchain": 0.04,
    "identity": 1.01,
    "orthogonal": 1.01,
}  # fbchain: not in App. A
FB_FORWARD = 0.99  # fbchain's fixed forward weight (§3.1.1)

ACTIVATIONS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "linear": lambda x: x,
    "elu": F.elu,
    "tanh": torch.tanh,
    "relu": torch.relu,
}


def activation(name: str) -> Callable[[torch.Tensor], torch.Tensor]:
    """The nonlinearity f by name (`linear` is the identity)."""
    try:
        return ACTIVATIONS[name]
    except KeyError:
        raise ConfigError(f"unknown nonlinearity {name!r}; choose one of: {', '.join(ACTIVATIONS)}") from None


@dataclass(frozen=True)
class Network:
    """A recurrent matrix W [N, N] (W_ij from unit j to unit i) and a scalar input vector v [N], float64."""

    init: str
    scale: float
    w: torch.Tensor  # [N, N]
    v: torch.Tensor  # [N]

    @property
    def hidden(self) -> int:
        return int(self.w.shape[0])


def network(
    init: str,
    hidden: int,
    scale: float | None = None,
    *,
    inputs: Literal["unit", "paper"] = "unit",
    fb_forward: float = FB_FORWARD,
    seed: int = 1,
) -> Network:
    """One of the four networks with its scalar input; `scale` None: Fig. 1's (inputs="unit") or App. A's."""
    if hidden < 1:
        raise ConfigError(f"hidden = {hidden} must be at least 1")
    make = INITIALIZERS.get(init)  # unknown names list the valid ones
    if scale is None:
        scale = (FIG1_SCALE if inputs == "unit" else APPENDIX_A_SCALE)[init]
    w, V = make(hidden, 1, scale, fb_forward, 1.0, generator(seed, "init"))  # W [N, N], V [N, 1]
    v = V[:, 0].to(torch.float64)  # e₁ (chains) or N(0, 1/√N) entries (identity, orthogonal)
    if inputs == "unit":
        v = v / v.norm()
    return Network(init, float(scale), w.to(torch.float64), v)
