"""The vanilla RNN as other papers' code ran it: the NRU authors' RNN-orth / RNN-id, myTorch's RNNCell
(`apsarath/myTorch:myTorch/memory/RNNCell.py`) with `layer_norm: True` and Xavier-normal input weights
(docs/protocol.md §4), checked against a transcription of their cell; and Rotman & Wolf's, torch's
`nn.RNN` with its default init and two biases (docs/protocol.md §2), checked against `nn.RNN` itself."""

import math

import pytest
import torch
import torch.nn.functional as F

import trainers
from search_spaces import get_preset
from tests.trainers.references import forward_backward
from trainers import ConfigError, resolve
from trainers.cells.rnn import RNNCell, RNNConfig
from trainers.cells.urnn import URNNCell, URNNConfig
from trainers.fused import fusable_key
from trainers.initializers import INITIALIZERS, glorot_uniform
from trainers.model import build_model, count_params


def gen(seed=0):
    return torch.Generator().manual_seed(seed)


def mytorch_rnn_reference(cell, x, activation):
    """myTorch's RNNCell.forward, step by step, on this cell's weights (transposed to their x·W form):
    pre = [x_t, h] · [W_i2h; W_h2h] + b_h, LayerNorm(pre) when `layer_norm`, then the activation."""
    W_h = torch.cat((cell.weight_ih.t(), cell.weight_hh.t()), 0)  # their torch.cat((W_i2h, W_h2h), 0)
    fn = {"relu": F.relu, "tanh": torch.tanh}[activation]
    h = x.new_zeros(x.shape[1], cell.hidden_size)
    hs = []
    for x_t in x:
        pre_hidden = torch.add(torch.mm(torch.cat((x_t, h), 1), W_h), cell.bias)
        if cell.norm is not None:
            pre_hidden = F.layer_norm(pre_hidden, (cell.hidden_size,), cell.norm.weight, cell.norm.bias, 1e-5)
        h = fn(pre_hidden)
        hs.append(h)
    return torch.stack(hs)


@pytest.mark.parametrize("activation", ["relu", "tanh"])
@pytest.mark.parametrize("init", ["orthogonal", "identity"])
def test_the_layer_norm_rnn_equals_mytorchs_cell_forward_and_backward(activation, init):
    cfg = RNNConfig(init=init, nonlinearity=activation, input_init="xavier_normal", layer_norm=True)
    cell = RNNCell(cfg, 3, 6, gen(3))  # γ ≠ 1, β ≠ 0, b ≠ 0 (`forward_backward`): a misplaced term shows
    (hs, grads), (hs_ref, grads_ref) = forward_backward(
        cell, lambda x: mytorch_rnn_reference(cell, x, activation)
    )
    assert set(grads) == set(grads_ref) == {"weight_hh", "weight_ih", "bias", "norm.weight", "norm.bias"}
    torch.testing.assert_close(hs, hs_ref, rtol=1e-10, atol=1e-12)
    for name, g in grads.items():
        assert g.abs().max() > 0, name  # every parameter is reached
        torch.testing.assert_close(g, grads_ref[name], rtol=1e-9, atol=1e-11)


def test_without_layer_norm_the_plain_recurrence_is_unchanged():
    """layer_norm off: the scan, numbers bit for bit those of a cell that never had the field."""
    cfg = RNNConfig(init="orthogonal", nonlinearity="relu")
    ln = RNNCell(RNNConfig(init="orthogonal", nonlinearity="relu", layer_norm=True), 3, 6, gen(1))
    plain = RNNCell(cfg, 3, 6, gen(1))
    assert plain.norm is None and ln.norm is not None
    assert torch.equal(plain.weight_hh, ln.weight_hh) and torch.equal(plain.weight_ih, ln.weight_ih)
    x = torch.randn(9, 2, 3, generator=gen(2))
    with torch.no_grad():
        ln.norm.weight.fill_(2.0)  # LN changes the states: it is really on the path
        assert not torch.allclose(ln(x), plain(x))


def test_the_initial_weights_follow_mytorch():
    """Xavier-normal V with the relu gain (std √2·√(2/(d + N))), drawn after the initialiser's W; W = I
    exactly for RNN-id, orthogonal for RNN-orth; b = 0, γ = 1, β = 0."""
    d, N = 100, 400
    for init in ("identity", "orthogonal"):
        cfg = RNNConfig(init=init, nonlinearity="relu", input_init="xavier_normal", layer_norm=True)
        cell = RNNCell(cfg, d, N, gen(7))
        g = gen(7)
        w, _ = INITIALIZERS.get(init)(N, d, 1.0, 0.99, 0.9, g)
        v = torch.nn.init.xavier_normal_(torch.empty(N, d), math.sqrt(2.0), generator=g)
        assert torch.equal(cell.weight_hh, w) and torch.equal(cell.weight_ih, v)
        assert (
            torch.equal(cell.norm.weight, torch.ones(N)) and not cell.norm.bias.any() and not cell.bias.any()
        )
    assert torch.equal(RNNCell(RNNConfig(init="identity"), d, N, gen()).weight_hh, torch.eye(N))
    std = math.sqrt(2.0) * math.sqrt(2.0 / (d + N))
    assert abs(cell.weight_ih.std().item() / std - 1) < 0.03  # 40,000 draws: ~0.4 % standard error
    tanh = RNNCell(RNNConfig(nonlinearity="tanh", input_init="xavier_normal"), d, N, gen(7))
    assert abs(tanh.weight_ih.std().item() / (5 / 3 * math.sqrt(2.0 / (d + N))) - 1) < 0.03


def test_the_urnns_glorot_input_is_the_rnns_input_init():
    """urnn keeps Keras' Glorot-uniform V by default (drawn after the initialiser's W, as before)."""
    d, N = 2, 16
    cell = URNNCell(URNNConfig(), d, N, gen(5))
    g = gen(5)
    INITIALIZERS.get("orthogonal")(N, d, 1.0, 0.99, 0.9, g)
    assert torch.equal(cell.weight_ih, glorot_uniform(N, d, g))
    chain = RNNCell(RNNConfig(input_init="glorot"), d, N, gen(5))  # the chain draws nothing
    assert torch.equal(chain.weight_ih, glorot_uniform(N, d, gen(5)))


def test_the_layer_norm_rnn_trains_alone_and_refuses_another_backend():
    base = {"task": "addition", "task_params": {"seq_len": 20}, "cell": "rnn", "hidden": 8}
    with_ln = resolve({**base, "cell_params": {"layer_norm": True}})
    assert fusable_key(with_ln) is None  # the fused scan has no normalisation: it trains alone
    assert fusable_key(resolve({**base, "cell_params": {"input_init": "xavier_normal"}})) is not None
    with pytest.raises(ConfigError, match="backend 'scan' has no layer normalisation"):
        resolve({**base, "cell_params": {"layer_norm": True, "backend": "scan"}})
    with pytest.raises(ConfigError, match="none for elu"):
        resolve({**base, "cell_params": {"input_init": "xavier_normal", "nonlinearity": "elu"}})


@pytest.mark.parametrize("preset", ["nru2019-copy100", "nru2019-denoise100", "nru2019-varcopy200"])
def test_the_nru_presets_rnns_are_mytorchs(preset):
    """RNN-orth / RNN-id at h = 143 with layer normalisation: the paper's ~23.5k parameters on copy."""
    points = [(m, p) for m, p in get_preset(preset).points() if m in ("rnn-orth", "rnn-id")]
    assert {m for m, _ in points} == {"rnn-orth", "rnn-id"}
    for _, point in points:
        rest = dict(point)
        cfg = trainers.TrainConfig(task=str(rest.pop("task")), cell=str(rest.pop("cell")))
        resolved = resolve(trainers.apply_overrides(cfg, rest))
        cell = resolved.cell_config
        assert cell.layer_norm and cell.input_init == "xavier_normal" and cell.nonlinearity == "relu"
        model = build_model(resolved, resolved.make_task())
        N, d, out = 143, model.cell.input_size, model.readout.out_features
        assert count_params(model) == N * N + N * d + N + 2 * N + (N + 1) * out
    if preset == "nru2019-copy100":
        assert count_params(model) == 23_604  # the paper: ~23.5k for every model


def torch_rnn_from(gen_seed, d, N):
    """nn.RNN(d, N) (tanh) whose `reset_parameters` drew from the generator: U(±1/√N) over its parameters
    in their order (weight_ih_l0, weight_hh_l0, bias_ih_l0, bias_hh_l0)."""
    rnn = torch.nn.RNN(d, N).double()
    g = gen(gen_seed)
    with torch.no_grad():
        for p in rnn.parameters():
            p.copy_(torch.empty(p.shape).uniform_(-1 / math.sqrt(N), 1 / math.sqrt(N), generator=g))
    return rnn


def test_plain_init_and_bias_hh_are_nn_rnns_weights_forward_and_gradients():
    d, N = 3, 6
    cell = RNNCell(RNNConfig(init="plain", bias_hh=True, nonlinearity="tanh"), d, N, gen(11))
    ref = torch_rnn_from(11, d, N)
    pairs = {
        "weight_ih": "weight_ih_l0",
        "weight_hh": "weight_hh_l0",
        "bias": "bias_ih_l0",
        "bias_hh": "bias_hh_l0",
    }
    ours = dict(cell.named_parameters())
    theirs = dict(ref.named_parameters())
    assert set(ours) == set(pairs)
    for a, b in pairs.items():
        torch.testing.assert_close(ours[a].double(), theirs[b].detach(), rtol=0, atol=0)  # the same draws
    cell = cell.double()
    x = torch.randn(13, 4, d, generator=gen(2), dtype=torch.float64)
    target = torch.randn(13, 4, N, generator=gen(3), dtype=torch.float64)
    (cell(x) * target).sum().backward()
    out, _ = ref(x)
    (out * target).sum().backward()
    torch.testing.assert_close(cell(x), out, rtol=1e-12, atol=1e-12)
    for a, b in pairs.items():
        torch.testing.assert_close(ours[a].grad, theirs[b].grad, rtol=1e-10, atol=1e-12)


def test_bias_hh_needs_bias_and_plain_has_no_scale():
    base = {"task": "addition", "task_params": {"seq_len": 20}, "cell": "rnn", "hidden": 8}
    with pytest.raises(ConfigError, match="set bias true with it"):
        resolve({**base, "cell_params": {"bias_hh": True, "bias": False}})
    with pytest.raises(ConfigError, match="no effect with init 'plain'"):
        resolve({**base, "cell_params": {"init": "plain", "scale": 0.5}})


def test_the_srnn_presets_rnn_and_lstm_are_torchs():
    """srnn2020's RNN and LSTM baselines: nn.RNN(tanh) and nn.LSTM, default init and two biases; the
    addition RNN has their 17,025 parameters (128·2 + 128² + 2·128, and the readout's 128 + 1)."""
    for preset in ("srnn2020-addition", "srnn2020-copy"):
        points = {m: p for m, p in get_preset(preset).points()}
        for model in ("rnn", "lstm"):
            rest = dict(points[model])
            cfg = trainers.TrainConfig(task=str(rest.pop("task")), cell=str(rest.pop("cell")))
            resolved = resolve(trainers.apply_overrides(cfg, rest))
            assert resolved.cell_config.init == "plain" and resolved.cell_config.bias_hh
            if (preset, model) == ("srnn2020-addition", "rnn"):
                assert count_params(build_model(resolved, resolved.make_task())) == 17_025
