"""The four initialisers exactly as Orhan & Pitkow §3.1.1 specify (docs/protocol.md §1.4)."""

import math

import pytest
import torch

from trainers.cells.rnn import RNNCell, RNNConfig
from trainers.initializers import INITIALIZERS

N, D = 8, 3


def make(init: str, scale: float, n: int = N, d: int = D, seed: int = 0):
    return INITIALIZERS.get(init)(n, d, scale, 0.99, 0.9, torch.Generator().manual_seed(seed))


def test_chain_is_the_subdiagonal_w_ij_alpha_delta_j_i_minus_1():
    w, v = make("chain", 1.3)
    for i in range(N):
        for j in range(N):
            assert w[i, j].item() == pytest.approx(1.3 if j == i - 1 else 0.0)
    assert torch.equal(v, 0.9 * torch.eye(N, D))


def test_chain_carries_the_input_from_unit_0_to_higher_units():
    # Orientation: a pulse injected by V at unit 0 reaches unit k after k steps (W h, column convention).
    w, v = make("chain", 1.0)
    h = v @ torch.tensor([1.0, 0.0, 0.0])
    assert h.nonzero().flatten().tolist() == [0]
    for k in range(1, 4):
        h = w @ h
        assert h.nonzero().flatten().tolist() == [k]


def test_fbchain_forward_099_and_feedback_beta():
    w, v = make("fbchain", 0.25)
    for i in range(N):
        for j in range(N):
            expected = 0.99 if j == i - 1 else (0.25 if j == i + 1 else 0.0)
            assert w[i, j].item() == pytest.approx(expected)
    assert torch.equal(v, 0.9 * torch.eye(N, D))


def test_identity_is_lambda_i_with_gaussian_input():
    w, _ = make("identity", 0.7)
    assert torch.allclose(w, 0.7 * torch.eye(N))
    _, v = make("identity", 1.0, n=400, d=50)
    assert v.std().item() == pytest.approx(0.9 / math.sqrt(400), rel=0.05)  # a standard deviation
    assert abs(v.mean().item()) < 0.01


def test_orthogonal_is_lambda_times_an_orthogonal_matrix():
    w, _v = make("orthogonal", 1.1)
    assert torch.allclose(w.T @ w, 1.21 * torch.eye(N), atol=1e-5)
    assert not torch.allclose(w.abs(), 1.1 * torch.eye(N))  # dense, not a signed permutation
    w2, _ = make("orthogonal", 1.1, seed=1)
    assert not torch.allclose(w, w2)


def test_cell_uses_the_initialiser_and_a_zero_bias():
    cell = RNNCell(
        RNNConfig(init="chain", scale=1.0, nonlinearity="elu"), D, N, torch.Generator().manual_seed(0)
    )
    w, v = make("chain", 1.0)
    assert torch.equal(cell.weight_hh.data, w) and torch.equal(cell.weight_ih.data, v)
    assert cell.bias is not None and torch.count_nonzero(cell.bias) == 0
    assert torch.equal(cell.recurrent_matrix(), w)


def test_unknown_initialiser_lists_the_valid_ones():
    with pytest.raises(KeyError, match="chain, fbchain, identity, orthogonal"):
        INITIALIZERS.get("chian")
