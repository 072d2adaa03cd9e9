"""The gated cells (lstm, gru, janet): paper parameter counts, initialisers, chrono, kernels vs eager math.

Shapes, gradient through time and determinism are covered for every registered cell by test_contract.py.
"""

import math

import pytest
import torch

from tests.trainers.learning import assert_learns
from tests.trainers.references import forward_backward
from trainers import ConfigError, resolve
from trainers.cells.gru import GRUCell, GRUConfig
from trainers.cells.janet import JANETCell, JANETConfig
from trainers.cells.lstm import LSTMCell, LSTMConfig
from trainers.kernels_gated import GRUScan, JANETScan, gru
from trainers.model import SequenceModel, build_model, count_params

LSTM_INITS = ["keras", "plain", "mytorch"]


def gen(seed=0):
    return torch.Generator().manual_seed(seed)


# --- parameter counts (SGORNN paper, Tables 1 and 2; docs/protocol.md §5) ------------------------------


@pytest.mark.parametrize("init", LSTM_INITS)
def test_lstm_addition_model_has_the_papers_67201_parameters(init):
    resolved = resolve({"task": "addition", "cell": "lstm", "hidden": 128, "cell_params": {"init": init}})
    assert count_params(build_model(resolved, resolved.make_task())) == 67_201


def test_lstm_har2_model_has_the_papers_19009_parameters():
    g = gen()
    model = SequenceModel(LSTMCell(LSTMConfig(), 9, 64, g), 1, "last", g)  # HAR-2: 9 channels, 1 sigmoid unit
    assert count_params(model) == 19_009


def test_gru_keeps_both_biases_and_janet_has_two_gates():
    assert count_params(GRUCell(GRUConfig(), 2, 128, gen())) == 3 * (2 * 128 + 128 * 128 + 2 * 128)
    assert count_params(JANETCell(JANETConfig(), 2, 128, gen())) == 2 * (2 * 128 + 128 * 128 + 128)


def test_the_reset_before_gru_has_mytorchs_parameters_and_initial_weights():
    """myTorch's GRUCell: W_i2{r,z,h} [d, N], W_h2{r,z,h} [N, N], b_{r,z,h} [N]; `_reset_parameters`:
    xavier_normal on the three input blocks, then orthogonal on the three recurrent, zero biases — the
    same draws from the same generator, in their order."""
    d, N = 10, 82  # their copy GRU: h = 82 (the NRU preset)
    cell = GRUCell(GRUConfig(reset="before", init="mytorch"), d, N, gen(7))
    assert cell.bias_hh is None and count_params(cell) == 3 * (d * N + N * N + N)
    g = gen(7)
    W_i = [torch.nn.init.xavier_normal_(torch.empty(N, d), generator=g) for _ in range(3)]
    W_h = [torch.nn.init.orthogonal_(torch.empty(N, N), generator=g) for _ in range(3)]
    assert torch.equal(cell.weight_ih, torch.cat(W_i)) and torch.equal(cell.weight_hh, torch.cat(W_h))
    assert not cell.bias_ih.any()
    for block in cell.weight_hh.detach().split(N):
        torch.testing.assert_close(block @ block.T, torch.eye(N), atol=1e-5, rtol=0)


@pytest.mark.parametrize("peepholes", [False, True])
def test_bias_hh_is_nn_lstms_second_bias_drawn_and_trained_as_there(peepholes):
    """`init="plain"` with `bias_hh`: nn.LSTM's parameters, drawn in its order from U(±1/√N), and its
    states and gradients (Rotman & Wolf's LSTM baseline; awd-lstm-lm's). With peepholes the two biases
    enter the plain-autograd path summed, as the kernel sums them."""
    d, N = 3, 6
    cell = LSTMCell(LSTMConfig(init="plain", bias_hh=True, peepholes=peepholes), d, N, gen(11))
    ref = torch.nn.LSTM(d, N).double()
    g = gen(11)
    with torch.no_grad():
        for p in ref.parameters():  # weight_ih_l0, weight_hh_l0, bias_ih_l0, bias_hh_l0
            p.copy_(torch.empty(p.shape).uniform_(-1 / math.sqrt(N), 1 / math.sqrt(N), generator=g))
    pairs = {
        "weight_ih": "weight_ih_l0",
        "weight_hh": "weight_hh_l0",
        "bias": "bias_ih_l0",
        "bias_hh": "bias_hh_l0",
    }
    ours, theirs = dict(cell.named_parameters()), dict(ref.named_parameters())
    for a, b in pairs.items():
        assert torch.equal(ours[a].double(), theirs[b].detach()), a
    assert count_params(cell) == count_params(ref) + (3 * N if peepholes else 0)
    if peepholes:
        return  # nn.LSTM has none: `mytorch_lstm_reference` checks that path
    cell = cell.double()
    x = torch.randn(13, 4, d, generator=gen(2), dtype=torch.float64)
    target = torch.randn(13, 4, N, generator=gen(3), dtype=torch.float64)
    ours_out = cell(x)
    (ours_out * target).sum().backward()
    out, _ = ref(x)
    (out * target).sum().backward()
    torch.testing.assert_close(ours_out, out, rtol=1e-12, atol=1e-12)
    for a, b in pairs.items():
        torch.testing.assert_close(ours[a].grad, theirs[b].grad, rtol=1e-10, atol=1e-12)


def test_the_peephole_lstm_has_mytorchs_parameters():
    """myTorch's LSTMCell: four W_x2k [d, N], four W_h2k [N, N], three peepholes W_c2{i,f,o} [N], four
    biases [N]; the peepholes drawn from U(0, 1) (`nn.init.uniform_`). Their copy LSTM (h = 70, the NRU
    preset) with a 9-class readout has the paper's ~23.5k parameters."""
    d, N = 10, 70
    cell = LSTMCell(LSTMConfig(init="mytorch", peepholes=True), d, N, gen(7))
    assert count_params(cell) == 4 * (d * N + N * N + N) + 3 * N == 22_890
    assert count_params(SequenceModel(cell, 9, "sequence", gen(8))) == 23_529
    g = gen(7)
    plain = LSTMCell(LSTMConfig(init="mytorch"), d, N, g)  # the same draws before the peepholes
    assert plain.peephole is None and torch.equal(plain.weight_hh, cell.weight_hh)
    assert torch.equal(cell.peephole, torch.nn.init.uniform_(torch.empty(3, N), 0.0, 1.0, generator=g))


def test_the_reset_before_gru_refuses_a_backend_that_has_none():
    with pytest.raises(ConfigError, match="backend 'scan' has no reset-before GRU"):
        resolve({"task": "addition", "cell": "gru", "cell_params": {"reset": "before", "backend": "scan"}})


# --- initialisers -----------------------------------------------------------------------------------------


def test_lstm_keras_init():
    N, d = 32, 5
    cell = LSTMCell(LSTMConfig(init="keras"), d, N, gen())
    w = cell.weight_hh.detach()  # [4N, N]: Keras' [N, 4N] recurrent kernel has orthonormal rows
    assert torch.allclose(w.t() @ w, torch.eye(N), atol=1e-5)
    assert cell.weight_ih.abs().max() <= math.sqrt(6 / (d + 4 * N))  # Glorot-uniform over all gates
    b = cell.bias.detach()
    assert torch.all(b[N : 2 * N] == 1) and torch.all(b[:N] == 0) and torch.all(b[2 * N :] == 0)


def test_lstm_mytorch_init_is_orthogonal_per_gate():
    N = 16
    cell = LSTMCell(LSTMConfig(init="mytorch"), 3, N, gen())
    for w in cell.weight_hh.detach().split(N):
        assert torch.allclose(w @ w.t(), torch.eye(N), atol=1e-5)
    assert torch.equal(cell.bias.detach()[N : 2 * N], torch.ones(N))


def test_lstm_plain_init_is_pytorchs_uniform_and_forget_bias_overrides():
    N = 25
    cell = LSTMCell(LSTMConfig(init="plain"), 3, N, gen())
    for p in cell.parameters():
        assert p.abs().max() <= 1 / math.sqrt(N)
    assert cell.bias[N : 2 * N].std() > 0  # drawn, not a constant
    cell = LSTMCell(LSTMConfig(init="plain", forget_bias=2.5), 3, N, gen())
    assert torch.all(cell.bias.detach()[N : 2 * N] == 2.5)


def test_janet_init_follows_mytorch():
    N = 20
    cell = JANETCell(JANETConfig(), 3, N, gen())
    for w in cell.weight_hh.detach().split(N):
        assert torch.allclose(w @ w.t(), torch.eye(N), atol=1e-5)
    b = cell.bias.detach()
    assert torch.all(b[:N] == 1.0) and torch.all(b[N:] == 0.0)


@pytest.mark.parametrize("cls", [LSTMCell, GRUCell, JANETCell])
def test_weights_come_from_the_generator(cls):
    a, b, c = (cls(cls.Config(), 2, 8, gen(seed)) for seed in (1, 1, 2))
    assert all(torch.equal(p, q) for p, q in zip(a.parameters(), b.parameters(), strict=True))
    assert not torch.equal(a.weight_hh, c.weight_hh)


# --- chrono initialisation (NRU authors' code: integers in {1..t_max}; docs/protocol.md §4) ---------------


def chrono_integers(b_f: torch.Tensor) -> torch.Tensor:
    k = b_f.detach().double().exp()
    assert torch.allclose(k, k.round(), atol=1e-4)  # b_f = log of an integer
    return k.round().long()


@pytest.mark.parametrize("init", LSTM_INITS)
def test_lstm_chrono_bias(init):
    N, t_max = 400, 5
    cell = LSTMCell(LSTMConfig(init=init, forget_bias=3.0, chrono_tmax=t_max), 2, N, gen())
    b = cell.bias.detach()
    k = chrono_integers(b[N : 2 * N])
    assert set(k.tolist()) == set(range(1, t_max + 1))  # every integer in [1, t_max], nothing else
    assert torch.equal(b[:N], -b[N : 2 * N])  # b_i = −b_f


def test_janet_chrono_bias():
    N, t_max = 400, 4
    b = JANETCell(JANETConfig(chrono_tmax=t_max), 2, N, gen()).bias.detach()
    assert set(chrono_integers(b[:N]).tolist()) == set(range(1, t_max + 1))
    assert torch.all(b[N:] == 0)


@pytest.mark.parametrize("cell", ["lstm", "janet"])
def test_chrono_tmax_must_be_positive(cell):
    with pytest.raises(ConfigError, match="chrono_tmax"):
        resolve({"task": "addition", "cell": cell, "cell_params": {"chrono_tmax": 0}})


# --- native kernels and the JANET loop against eager references (float64) ---------------------------------


def lstm_reference(cell, x):
    N = cell.hidden_size
    h = c = x.new_zeros(x.shape[1], N)
    hs = []
    for x_t in x:
        a = x_t @ cell.weight_ih.t() + h @ cell.weight_hh.t() + cell.bias  # one bias per gate
        i, f, g, o = a.split(N, 1)
        c = torch.sigmoid(f) * c + torch.sigmoid(i) * torch.tanh(g)
        h = torch.sigmoid(o) * torch.tanh(c)
        hs.append(h)
    return torch.stack(hs)


def mytorch_lstm_reference(cell, x):
    """myTorch's LSTMCell.forward (`apsarath/myTorch:myTorch/memory/LSTMCell.py`, 2018: the NRU authors'
    LSTM, Graves 2013's peepholes), step by step, on this cell's weights (their x·W form; their gate
    blocks i, f, o, c are ours i, f, o, g)."""
    N = cell.hidden_size
    W_x, W_h = cell.weight_ih.t(), cell.weight_hh.t()  # [d, 4N], [N, 4N]: i, f, g, o
    b = cell.bias if cell.bias_hh is None else cell.bias + cell.bias_hh  # theirs has one; two enter summed
    blk = {"i": slice(0, N), "f": slice(N, 2 * N), "c": slice(2 * N, 3 * N), "o": slice(3 * N, 4 * N)}
    W = {
        k: torch.cat((W_x[:, s], W_h[:, s]), 0) for k, s in blk.items()
    }  # their torch.cat((W_x2k, W_h2k), 0)
    W_c2i, W_c2f, W_c2o = cell.peephole
    h = c = x.new_zeros(x.shape[1], N)
    hs = []
    for x_t in x:
        c_input = torch.cat((x_t, h), 1)
        i = torch.sigmoid(torch.mm(c_input, W["i"]) + b[blk["i"]] + c * W_c2i)
        f = torch.sigmoid(torch.mm(c_input, W["f"]) + b[blk["f"]] + c * W_c2f)
        cp = torch.tanh(torch.mm(c_input, W["c"]) + b[blk["c"]])
        c = f * c + i * cp
        o = torch.sigmoid(torch.mm(c_input, W["o"]) + b[blk["o"]] + c * W_c2o)
        h = o * torch.tanh(c)
        hs.append(h)
    return torch.stack(hs)


def gru_reference(cell, x):
    N = cell.hidden_size
    h = x.new_zeros(x.shape[1], N)
    hs = []
    for x_t in x:
        xr, xz, xn = (x_t @ cell.weight_ih.t() + cell.bias_ih).split(N, 1)
        hr, hz, hn = (h @ cell.weight_hh.t() + cell.bias_hh).split(N, 1)
        r, z = torch.sigmoid(xr + hr), torch.sigmoid(xz + hz)
        n = torch.tanh(xn + r * hn)  # the reset gate multiplies W_hn h + b_hn
        h = (1 - z) * n + z * h
        hs.append(h)
    return torch.stack(hs)


def mytorch_gru_reference(cell, x):
    """myTorch's GRUCell.forward (`apsarath/myTorch:myTorch/memory/GRUCell.py`, 2018: the NRU authors'
    GRU), step by step, on this cell's weights (transposed to their x·W form): the reset gate multiplies
    h before the candidate's product, one bias per gate."""
    N = cell.hidden_size
    W_ih, W_hh, b = cell.weight_ih.t(), cell.weight_hh.t(), cell.bias_ih  # [d, 3N], [N, 3N], [3N]
    W_r = torch.cat((W_ih[:, :N], W_hh[:, :N]), 0)  # their torch.cat((self._W_i2r, self._W_h2r), 0)
    W_z = torch.cat((W_ih[:, N : 2 * N], W_hh[:, N : 2 * N]), 0)
    W_i2h, W_h2h, b_r, b_z, b_h = W_ih[:, 2 * N :], W_hh[:, 2 * N :], b[:N], b[N : 2 * N], b[2 * N :]
    h = x.new_zeros(x.shape[1], N)
    hs = []
    for x_t in x:
        c_input = torch.cat((x_t, h), 1)
        r = torch.sigmoid(torch.add(torch.mm(c_input, W_r), b_r))
        z = torch.sigmoid(torch.add(torch.mm(c_input, W_z), b_z))
        hp = torch.tanh(torch.mm(x_t, W_i2h) + torch.mm(h * r, W_h2h) + b_h)
        h = ((1 - z) * hp) + (z * h)
        hs.append(h)
    return torch.stack(hs)


def janet_reference(cell, x):
    """myTorch's JANETCell.forward, step by step, on this cell's weights (transposed to x·W form)."""
    N = cell.hidden_size
    W_f = torch.cat([cell.weight_ih[:N].t(), cell.weight_hh[:N].t()], 0)  # [d + N, N]
    W_c = torch.cat([cell.weight_ih[N:].t(), cell.weight_hh[N:].t()], 0)
    b_f, b_c = cell.bias[:N], cell.bias[N:]
    h = x.new_zeros(x.shape[1], N)
    hs = []
    for x_t in x:
        xh = torch.cat([x_t, h], 1)
        f = torch.sigmoid(xh @ W_f + b_f)
        h = f * h + (1 - f) * torch.tanh(xh @ W_c + b_c)  # c_t = h_t
        hs.append(h)
    return torch.stack(hs)


CASES = {
    "lstm-plain": (lambda g: LSTMCell(LSTMConfig(init="plain"), 3, 6, g), lstm_reference),
    "lstm-chrono": (lambda g: LSTMCell(LSTMConfig(chrono_tmax=20), 3, 6, g), lstm_reference),
    "lstm-peepholes": (
        lambda g: LSTMCell(LSTMConfig(init="mytorch", peepholes=True, chrono_tmax=20), 3, 6, g),
        mytorch_lstm_reference,
    ),
    "lstm-peepholes-bias-hh": (
        lambda g: LSTMCell(LSTMConfig(init="plain", peepholes=True, bias_hh=True), 3, 6, g),
        mytorch_lstm_reference,
    ),
    "gru": (lambda g: GRUCell(GRUConfig(), 3, 6, g), gru_reference),
    "gru-reset-before": (
        lambda g: GRUCell(GRUConfig(reset="before", init="mytorch"), 3, 6, g),
        mytorch_gru_reference,
    ),
    "janet": (lambda g: JANETCell(JANETConfig(), 3, 6, g), janet_reference),
    "janet-chrono": (lambda g: JANETCell(JANETConfig(chrono_tmax=20), 3, 6, g), janet_reference),
}


@pytest.mark.parametrize("case", CASES)
def test_cell_equals_its_eager_reference_forward_and_backward(case):
    make, reference = CASES[case]
    cell = make(gen(3))
    (hs, grads), (hs_ref, grads_ref) = forward_backward(cell, lambda x: reference(cell, x))
    assert hs.shape == (17, 4, 6)
    assert list(grads) == list(grads_ref) == [name for name, _ in cell.named_parameters()]
    torch.testing.assert_close(hs, hs_ref, rtol=1e-10, atol=1e-12)
    for g, g_ref in zip(grads.values(), grads_ref.values(), strict=True):
        torch.testing.assert_close(g, g_ref, rtol=1e-9, atol=1e-11)


# --- each cell learns addition T=50 (a few seconds to ~25 s of CPU each) -----------------------------------


@pytest.mark.slow
@pytest.mark.numerics
@pytest.mark.parametrize("cell", ["lstm", "gru", "janet"])
def test_learns_addition_t50(cell):
    """At least 2 of seeds 1–3 end below half the baseline (1/12); each stops at 0.02 (0.24 × the line).
    Margin (AMD EPYC, 2026-11-26, both numerics modes alike): the second seed had stopped by step 1,200
    (lstm), 600 (gru) and 500 (janet) of the 2,500 budgeted."""
    assert_learns(
        {
            "task": "addition",
            "task_params": {"seq_len": 50, "data": "fresh", "n_val": 1000},
            "cell": cell,
            "hidden": 64,
            "optimizer": "adam",
            "lr": 3e-3,
            "batch_size": 32,
            "steps": 2500,
            "eval_every": 100,
            "early_stop_loss": 0.02,
        }
    )


# --- the whole-sequence kernels (trainers.kernels_gated) ---------------------------------------------------


def janet_eager(cell, x):
    """The JANET cell's former eager loop (hoisted input projection, one addmm per step): the
    reference `JANETScan` replaced."""
    T, B, d = x.shape
    N = cell.hidden_size
    xp = torch.addmm(cell.bias, x.reshape(T * B, d), cell.weight_ih.t()).view(T, B, 2 * N)
    h = x.new_zeros(B, N)
    hs = []
    for xp_t in xp.unbind(0):
        a = torch.addmm(xp_t, h, cell.weight_hh.t())  # [B, 2N]
        f, c = torch.sigmoid(a[:, :N]), torch.tanh(a[:, N:])
        h = torch.lerp(c, h, f)  # f ⊙ h_{t−1} + (1 − f) ⊙ c
        hs.append(h)
    return torch.stack(hs)


def kernel_inputs(gates: int, seed: int = 0, T: int = 5, B: int = 3, N: int = 4, d: int = 2):
    """x, weight_ih, weight_hh, the biases and h0 in float64, all requiring grad (gates = 2: JANET's
    one bias; 3: GRU's two)."""
    g = gen(seed)
    randn = lambda *shape: torch.randn(*shape, generator=g, dtype=torch.float64).requires_grad_()  # noqa: E731
    biases = [randn(gates * N)] if gates == 2 else [randn(gates * N), randn(gates * N)]
    return [randn(T, B, d), randn(gates * N, d), randn(gates * N, N), *biases, randn(B, N)]


def test_janet_scan_gradients_match_finite_differences(one_thread):
    assert torch.autograd.gradcheck(JANETScan.apply, kernel_inputs(2))  # x, W_x, W_h, b and h0


def test_gru_scan_gradients_match_finite_differences(one_thread):
    assert torch.autograd.gradcheck(GRUScan.apply, kernel_inputs(3))  # x, W_i, W_h, b_i, b_h and h0


@pytest.mark.parametrize("chrono", [None, 50])
def test_janet_scan_is_the_former_eager_loop_forward_bit_for_bit_and_backward_close(chrono, one_thread):
    """Float32, the benchmark's shape (N=100, d=10, B=16, T=200): the forward runs the eager loop's
    very ops; the hand-written backward sums in another order."""
    cell = JANETCell(JANETConfig(chrono_tmax=chrono), 10, 100, gen(0))
    x = torch.rand(200, 16, 10, generator=gen(1))
    target = torch.randn(200, 16, 100, generator=gen(2))
    hs, ref = cell(x), janet_eager(cell, x)
    assert torch.equal(hs, ref)
    ours = torch.autograd.grad((hs * target).sum(), list(cell.parameters()))
    theirs = torch.autograd.grad((ref * target).sum(), list(cell.parameters()))
    for g, g_ref in zip(ours, theirs, strict=True):
        torch.testing.assert_close(g, g_ref, rtol=0, atol=1e-5 * g_ref.abs().max().item())


def test_gru_scan_agrees_with_torchs_kernel_and_nn_gru_on_the_same_weights(one_thread):
    """Float32, the benchmark's shape: forward and every gradient within a few roundings of nn.GRU;
    backend="native" is nn.GRU's own kernel, bit for bit."""
    scan = GRUCell(GRUConfig(backend="scan"), 10, 100, gen(0))
    native = GRUCell(GRUConfig(backend="native"), 10, 100, gen(0))
    ref = torch.nn.GRU(10, 100)
    with torch.no_grad():
        for p, q in zip(
            ref.parameters(), scan.parameters(), strict=True
        ):  # weight_ih, weight_hh, bias_ih, bias_hh
            p.copy_(q)
    x = torch.rand(200, 16, 10, generator=gen(1))
    target = torch.randn(200, 16, 100, generator=gen(2))
    hs, hs_native, hs_ref = scan(x), native(x), ref(x)[0]
    assert torch.equal(hs_native, hs_ref)
    torch.testing.assert_close(hs, hs_ref, rtol=0, atol=1e-5)
    ours = torch.autograd.grad((hs * target).sum(), list(scan.parameters()))
    theirs = torch.autograd.grad((hs_ref * target).sum(), list(ref.parameters()))
    for g, g_ref in zip(ours, theirs, strict=True):
        torch.testing.assert_close(g, g_ref, rtol=0, atol=1e-5 * g_ref.abs().max().item())


def test_gru_backend_auto_is_the_scan_on_the_cpu_and_a_typo_is_refused():
    x, *_, h0 = kernel_inputs(3)
    cell = GRUCell(GRUConfig(), 2, 4, gen(0)).double()
    weights = (cell.weight_ih, cell.weight_hh, cell.bias_ih, cell.bias_hh)
    auto = gru(x, h0, *weights)
    assert torch.equal(auto, GRUScan.apply(x, *weights, h0))
    assert not torch.equal(auto, gru(x, h0, *weights, backend="native"))  # another order of sums
    with pytest.raises(ValueError, match="backend"):
        gru(x, h0, *weights, backend="cudnn")


def test_initial_weights_are_the_same_draws_as_before_the_kernels():
    """sha256 of the initial parameters, recorded from the cells before issue 17 (JANET: the
    Xavier-normal draws and the biases; its orthogonal W_h goes through LAPACK)."""
    assert param_digest(GRUCell(GRUConfig(), 3, 8, gen(11)).parameters()) == "fcea96ae2903df9c"
    janet = JANETCell(JANETConfig(), 3, 8, gen(11))
    assert param_digest([janet.weight_ih, janet.bias]) == "a2a921d47e89712e"
    chrono = JANETCell(JANETConfig(chrono_tmax=50), 3, 8, gen(11))
    assert param_digest([chrono.weight_ih, chrono.bias]) == "9a8e9337d267b4da"


def param_digest(params) -> str:
    import hashlib

    flat = torch.cat([p.detach().flatten() for p in params])
    return hashlib.sha256(flat.numpy().tobytes()).hexdigest()[:16]
