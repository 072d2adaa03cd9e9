"""One trial seed fixes everything: each consumer (data, shuffling, weights, permutation) gets its own stream."""

from __future__ import annotations

import hashlib

import torch


def derive_seed(seed: int, stream: str) -> int:
    """A 63-bit seed for `stream`, a pure function of (seed, stream): streams never share draws."""
    digest = hashlib.sha256(f"memsweep:{seed}:{stream}".encode()).digest()
    return int.from_bytes(digest[:8], "little") & (2**63 - 1)


def generator(seed: int, stream: str) -> torch.Generator:
    """A CPU torch.Generator for `stream` of trial `seed` (data are drawn on the CPU, then moved)."""
    return torch.Generator().manual_seed(derive_seed(seed, stream))
