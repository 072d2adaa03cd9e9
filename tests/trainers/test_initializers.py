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


# ----- the readout's initial weights (`readout_init`) ---------------------------------------------


def test_the_readout_is_drawn_as_each_papers_code_drew_it():
    """glorot: Keras' Dense (the default, as before: what every recorded trial drew); xavier_normal: the NRU
    code's `_W_h2o`, N(0, √(2/(N + C))) and a zero bias; plain: torch's nn.Linear, U(±1/√N) weight then
    bias. Each from the trial's generator, after the cell's weights."""
    from trainers.initializers import glorot_uniform
    from trainers.model import readout

    n, c = 400, 100
    keras = readout(n, c, "glorot", torch.Generator().manual_seed(3))
    assert torch.equal(keras.weight, glorot_uniform(c, n, torch.Generator().manual_seed(3)))
    assert not keras.bias.any()
    mytorch = readout(n, c, "xavier_normal", torch.Generator().manual_seed(3))
    want = torch.nn.init.xavier_normal_(torch.empty(c, n), generator=torch.Generator().manual_seed(3))
    assert torch.equal(mytorch.weight, want) and not mytorch.bias.any()
    assert abs(mytorch.weight.std().item() / math.sqrt(2 / (n + c)) - 1) < 0.03  # 40,000 draws
    g = torch.Generator().manual_seed(3)
    plain = readout(n, c, "plain", g)
    bound = 1 / math.sqrt(n)
    w = torch.empty(c, n).uniform_(-bound, bound, generator=torch.Generator().manual_seed(3))
    assert torch.equal(plain.weight, w) and bool((plain.bias.abs() <= bound).all()) and plain.bias.any()
    with pytest.raises(ValueError, match="choose glorot, xavier_normal or plain"):
        readout(n, c, "kaiming", g)


def test_a_trials_readout_init_reaches_its_model_and_the_default_hashes_as_before():
    from trainers import resolve
    from trainers.model import build_model

    base = {"task": "addition", "task_params": {"seq_len": 20}, "cell": "rnn", "hidden": 8}
    default, plain = resolve(base), resolve({**base, "readout_init": "plain"})
    assert default.config_hash() == resolve({**base, "readout_init": "glorot"}).config_hash()
    assert plain.config_hash() != default.config_hash()
    m0, m1 = (build_model(r, r.make_task()) for r in (default, plain))
    assert torch.equal(m0.cell.weight_hh, m1.cell.weight_hh)  # the cell's draws come first, unchanged
    assert not m0.readout.bias.any() and m1.readout.bias.any()
