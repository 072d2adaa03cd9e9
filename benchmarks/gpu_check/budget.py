"""The device time: the run's budget, what each timed shape gets of it, and the cost model that skips a
bundle whose predicted cost does not fit (saying so), so that one device session allows a rerun."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch

GRAPH_CHECKS_S = 40.0  # kept on CUDA for the step-level graph checks, which run after the timing
CLOSING_S = 10.0  # kept for the projection, the table and the files


def default_budget(device: torch.device) -> float:
    """The whole run's seconds, the NRU's C++ build included (the device session has 15 minutes)."""
    return 360.0 if device.type == "cuda" else 240.0


class Clock:
    """Seconds since the start, against the whole run's budget."""

    def __init__(self, budget: float) -> None:
        self.start = time.perf_counter()
        self.budget = budget

    def elapsed(self) -> float:
        return time.perf_counter() - self.start

    def left(self) -> float:
        return self.budget - self.elapsed()

    def next_deadline(self, parts_left: int, reserve: float) -> float:
        """A `perf_counter` deadline for the next of `parts_left` parts: an equal share of what is
        left once `reserve` seconds are set aside."""
        return time.perf_counter() + (self.left() - reserve) / parts_left


def timing_reserve(device: torch.device, graph_checks: bool) -> float:
    """Seconds the timing leaves for what runs after it: the graph checks of every fused cell (after
    the timing, so that a capture gone wrong cannot take the timing down with it) and the closing."""
    return CLOSING_S + (GRAPH_CHECKS_S if graph_checks and device.type == "cuda" else 0.0)


@dataclass
class Plan:
    ks: list[int]  # bundle sizes
    warm: int  # untimed steps first
    timed: int  # timed steps (their median is the figure)

    @classmethod
    def of(cls, ks: str | None, steps: int | None, quick: bool, device: torch.device) -> Plan:
        return cls(
            [int(k) for k in (ks or ("1,2,4" if quick else "1,8,64,462,594")).split(",")],
            1 if quick and device.type == "cpu" else 4,
            steps or (2 if quick else 6),
        )

    @property
    def total(self) -> int:
        return self.warm + self.timed


@dataclass
class CostModel:
    """Predicted seconds of one bundle's set-up and steps, from what the shape measured so far."""

    per_member: dict[str, float] = field(
        default_factory=lambda: {"eager": 0.0, "graph": 0.0}
    )  # s a member-step
    setup_per_member: float = 0.05  # s to build one member's share of a bundle

    def predict(self, mode: str, K: int, steps: int) -> float:
        guess = self.per_member[mode] or self.per_member["eager"] or 0.01
        return K * self.setup_per_member + (steps + 2) * K * guess

    def set_up(self, K: int, seconds: float) -> None:
        self.setup_per_member = max(self.setup_per_member * 0.5, seconds / K)

    def stepped(self, mode: str, ms_member: float | None) -> None:
        self.per_member[mode] = (ms_member or 0.0) / 1e3
