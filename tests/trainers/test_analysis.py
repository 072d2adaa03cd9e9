"""Orhan & Pitkow's matrix-level analyses (trainers.analysis), the Table 3 LSTM initialisers, `analyze` CLI.

Figures checked: Fig. 1b (Ganguli's J_tot = 1 for normal W; the chain's exact J(k)), Fig. 1c (transient
amplification), Fig. 2a–c and Figs. 7a, 8 (chain decodes s_1 better than orthogonal), Table 2 (Henrici
index), Fig. 5 (a chain's weight profile peaks at i − j = 1, also when the chain is hidden by relabelling),
Table 3 / Fig. 6 (LSTM chain, orthogonal, mixed gates; the mixed sigmoid gates' rising profile).
"""

import json
import math

import pytest
import torch

from trainers import ConfigError, resolve
from trainers.analysis import (
    DivergentSeriesError,
    WeightProfile,
    decode_first_signal,
    fisher_memory,
    henrici_index,
    mean_profile,
    network,
    network_profile,
    weight_profile,
)
from trainers.cells.lstm import LSTMCell, LSTMConfig
from trainers.cli import main
from trainers.initializers import chain

F64 = torch.float64


@pytest.fixture(autouse=True)
def one_thread():
    """Small matrices: one intra-op thread is many times faster than several (and deterministic)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def gen(seed=0):
    return torch.Generator().manual_seed(seed)


def haar(n, seed):
    q, r = torch.linalg.qr(torch.randn(n, n, generator=gen(seed), dtype=F64))
    return q * torch.sign(torch.diagonal(r))


def unit(n, seed):
    v = torch.randn(n, generator=gen(seed + 100), dtype=F64)
    return v / v.norm()


def normal_matrices(n=30):
    """Normal W with ρ(W) < 1: scaled orthogonal, symmetric, diagonal, and complex-eigenvalue rotations."""
    q = haar(n, 1)
    eig = torch.rand(n, generator=gen(2), dtype=F64) * 1.98 - 0.99  # real spectrum in (−0.99, 0.99)
    blocks = torch.zeros(n, n, dtype=F64)  # 2×2 rotations r·R(θ): complex pairs r e^{±iθ}
    for k in range(0, n, 2):
        r, th = 0.3 + 0.69 * k / n, 0.4 * k
        blocks[k : k + 2, k : k + 2] = r * torch.tensor(
            [[math.cos(th), -math.sin(th)], [math.sin(th), math.cos(th)]]
        )
    return {
        "orthogonal-0.5": 0.5 * haar(n, 3),
        "orthogonal-0.9": 0.9 * haar(n, 4),
        "orthogonal-0.99": 0.99 * haar(n, 5),
        "symmetric": q @ torch.diag(eig) @ q.T,
        "diagonal": torch.diag(eig),
        "rotations": q @ blocks @ q.T,
        "zero": torch.zeros(n, n, dtype=F64),
    }


NORMAL = normal_matrices()


# --- Fisher memory (§2.1 eq. 3–4, Fig. 1b–c) ---------------------------------------------------------------


@pytest.mark.parametrize("name", NORMAL)
def test_ganguli_total_fisher_memory_of_a_normal_network_is_one(name):
    w = NORMAL[name]
    assert henrici_index(w) < 1e-6  # really normal
    for seed in range(3):
        fm = fisher_memory(w, unit(w.shape[0], seed))
        assert abs(fm.j_tot - 1.0) < 1e-6
        assert abs(sum(fm.j) + fm.tail - fm.j_tot) < 1e-9  # the curve and its tail add up to J_tot
        assert fm.tail < 1e-6


@pytest.mark.parametrize("init", ["identity", "orthogonal"])
def test_fig1_normal_initialisers_have_unit_memory(init):
    net = network(init, 100)  # λ = 0.99, a unit-norm random input
    assert net.scale == 0.99 and abs(float(net.v.norm()) - 1) < 1e-12
    fm = fisher_memory(net.w, net.v)
    assert abs(fm.j_tot - 1.0) < 1e-6  # the initialiser's W is float32: normal to ~1e-7
    assert max(fm.amplification) == pytest.approx(1.0)  # no transient amplification in a normal network


def test_pure_chain_memory_is_one_over_k_plus_one_for_k_below_n():
    """α = 1, v = e₁: C = diag(1, 2, …, N), so J(k) = 1/(k+1) for k < N, 0 after; J_tot = H_N exactly."""
    n = 100
    net = network("chain", n, 1.0)
    assert torch.equal(net.v, torch.eye(n, dtype=F64)[0])  # the source unit
    fm = fisher_memory(net.w, net.v)
    assert fm.exact and fm.tol == 0.0 and fm.terms >= n
    assert len(fm.j) == n  # Wᴺ v = 0: the chain forgets after N steps
    for k, j in enumerate(fm.j):
        assert j == pytest.approx(1 / (k + 1), abs=1e-14)
    assert fm.j_tot == pytest.approx(sum(1 / k for k in range(1, n + 1)), abs=1e-12)  # H_100 ≈ 5.187
    assert fm.tail == pytest.approx(0.0, abs=1e-12)
    assert fisher_memory(net.w, net.v, horizon=150).j[n:] == [0.0] * 50  # J(k) = 0 for k ≥ N


@pytest.mark.parametrize("alpha", [0.5, 1.02, 2.0])
def test_chain_memory_for_any_alpha(alpha):
    """J(k) = α^{2k} / Σ_{m≤k} α^{2m} for k < N; ‖Wᵏv‖² = α^{2k} (Fig. 1c: amplification when α > 1)."""
    n = 50
    net = network("chain", n, alpha)
    fm = fisher_memory(net.w, net.v, horizon=n)  # the whole curve (α < 1 would stop once J_tot is reached)
    expected = [alpha ** (2 * k) / sum(alpha ** (2 * m) for m in range(k + 1)) for k in range(n)]
    alpha32 = float(torch.tensor(alpha, dtype=torch.float32))  # W is built in float32
    assert fm.j == pytest.approx(expected, rel=1e-5)
    assert fm.j_tot == pytest.approx(sum(expected), rel=1e-5)
    assert fm.amplification == pytest.approx([alpha32 ** (2 * k) for k in range(n)], rel=1e-9)
    assert 1.0 <= fm.j_tot <= n  # Ganguli: J_tot ≤ N for any W


def test_fbchain_amplifies_transiently_and_beats_the_normal_bound():
    net = network("fbchain", 100)  # forward 0.99, β = 0.04: ρ(W) = 2√(0.99·0.04)·cos(π/101) ≈ 0.40
    fm = fisher_memory(net.w, net.v)
    assert not fm.exact and fm.tail < 1e-6
    assert 1.0 < fm.j_tot <= 100
    k_peak = max(range(len(fm.amplification)), key=fm.amplification.__getitem__)
    assert fm.amplification[k_peak] > 10 and k_peak > 50  # amplified over O(N) steps, then it dies (Fig. 1c)


def test_random_non_normal_network_stays_under_n():
    w = 0.4 * torch.randn(20, 20, generator=gen(7), dtype=F64) / math.sqrt(20) + 0.6 * torch.diag(
        torch.ones(19, dtype=F64), -1
    )
    fm = fisher_memory(w, unit(20, 0))
    assert 0 < fm.j_tot <= 20
    assert abs(sum(fm.j) + fm.tail - fm.j_tot) < 1e-9


@pytest.mark.parametrize("init,scale", [("orthogonal", 1.0), ("identity", 1.01), ("fbchain", 0.3)])
def test_fisher_memory_of_an_unstable_network_says_why(init, scale):
    net = network(init, 40, scale, fb_forward=1.0 if init == "fbchain" else 0.99)  # fbchain: 2√0.3 > 1
    with pytest.raises(DivergentSeriesError, match="spectral radius"):
        fisher_memory(net.w, net.v)


# --- Henrici index (§3.2, Table 2) -------------------------------------------------------------------------


@pytest.mark.parametrize("name", NORMAL)
def test_henrici_index_is_zero_for_normal_matrices(name):
    assert henrici_index(NORMAL[name]) < 1e-6


@pytest.mark.parametrize("alpha", [0.5, 1.0, 1.05])
def test_henrici_index_of_a_chain_is_its_frobenius_norm(alpha):
    w, _ = chain(30, 1, alpha, 0.0, 0.9, gen())
    assert henrici_index(w) == pytest.approx(alpha * math.sqrt(29), rel=1e-6)  # nilpotent: all λ = 0
    assert henrici_index(w) > 0


# --- linear decoding (§2.2, Fig. 2, Appendix A, Figs. 7–8) -------------------------------------------------


def decode(init, nonlinearity, sigma, seed=1):
    net = network(init, 100, inputs="paper", seed=seed)  # scale 1.01; v = e₁ or N(0, 1/√N) entries
    return decode_first_signal(net.w, net.v, nonlinearity, sigma, seed=seed)


def test_appendix_a_networks():
    chain_net, orth_net = network("chain", 100, inputs="paper"), network("orthogonal", 100, inputs="paper")
    assert chain_net.scale == orth_net.scale == 1.01
    assert torch.equal(chain_net.v, torch.eye(100, dtype=F64)[0])
    assert 0.7 < float(orth_net.v.norm()) < 1.3  # std 1/√N: about as strong as e₁
    svals = torch.linalg.svdvals(orth_net.w)
    assert torch.allclose(svals, torch.full_like(svals, 1.01), atol=1e-5)


@pytest.mark.parametrize("init", ["chain", "orthogonal"])
def test_fig2a_noiseless_linear_network_decodes_perfectly(init):
    d = decode(init, "linear", 0.0)
    assert d.r2 > 0.999 and d.r2_heldout > 0.999 and d.r2_optimal == pytest.approx(1.0, abs=1e-6)


@pytest.mark.parametrize(
    "nonlinearity,sigma",
    [("linear", 0.1), ("linear", 0.01), ("elu", 0.0), ("tanh", 0.0), ("relu", 0.0)],
    ids=["fig2b-noise-0.1", "fig7a-noise-0.01", "fig2c-elu", "fig8a-tanh", "fig8b-relu"],
)
def test_chain_decodes_the_first_signal_better_than_orthogonal(nonlinearity, sigma):
    c, o = decode("chain", nonlinearity, sigma), decode("orthogonal", nonlinearity, sigma)
    assert c.trials == 250 and c.steps == 100
    assert c.r2 > o.r2  # the paper's in-sample R²
    assert c.r2_heldout > o.r2_heldout  # and on fresh trials
    if nonlinearity == "linear":
        assert c.r2_optimal is not None and o.r2_optimal is not None
        assert c.r2_optimal > o.r2_optimal  # the population optimum (closed form)
    else:
        assert c.r2_optimal is None


def test_heldout_r2_matches_the_optimum_better_than_the_in_sample_r2():
    d = decode("chain", "linear", 0.1)
    assert d.r2_optimal is not None
    assert d.r2 > d.r2_optimal > d.r2_heldout  # in-sample is inflated by fitting 101 coefficients


# --- weight profile (§3.2, Figs. 5–6) ----------------------------------------------------------------------


def test_pure_chain_profile_peaks_at_one():
    net = network("chain", 40, 1.0)
    p = network_profile(net.w, net.v)  # pulse at the source unit
    assert p.peak == 1
    assert p.offsets == list(range(-39, 40))
    assert p.mean[p.offsets.index(1)] == pytest.approx(1.0)
    assert all(m == 0 for d, m in zip(p.offsets, p.mean, strict=True) if d != 1)


@pytest.mark.parametrize("nonlinearity", ["linear", "elu", "relu", "tanh"])
def test_a_hidden_chain_is_found_after_relabelling_the_units(nonlinearity):
    n, alpha = 50, 1.02
    w, _ = chain(n, 1, alpha, 0.0, 0.9, gen())
    perm = torch.randperm(n, generator=gen(3))  # unit k of the chain is unit perm[k] of the network
    hidden_w = torch.zeros(n, n)
    hidden_w[perm[:, None], perm[None, :]] = w
    pulse = torch.zeros(n, dtype=F64)
    pulse[perm[0]] = 1.0  # the pulse enters at the chain's source
    p = network_profile(hidden_w, pulse, nonlinearity=nonlinearity)
    assert p.peak == 1 and p.mean[p.offsets.index(1)] == pytest.approx(alpha, rel=1e-6)


def test_ties_are_broken_by_a_seeded_jitter():
    w = torch.zeros(6, 6)  # every unit peaks at t = 0
    pulse = torch.ones(6, dtype=F64)
    a, b = network_profile(w, pulse, seed=1), network_profile(w, pulse, seed=1)
    assert a == b


def test_mean_profile_and_standard_error():
    p1 = WeightProfile([-1, 0, 1], [0.0, 1.0, 2.0])
    p2 = WeightProfile([-1, 0, 1], [2.0, 1.0, 4.0])
    stats = mean_profile([p1, p2])
    assert stats.count == 2 and stats.mean == [1.0, 1.0, 3.0] and stats.peak == 1
    assert stats.sem == pytest.approx([1.0, 0.0, 1.0])  # std (ddof 1) / √2
    assert mean_profile([p1]).sem is None
    with pytest.raises(ValueError, match="size"):
        mean_profile([p1, WeightProfile([0], [1.0])])


def test_profile_averaged_over_hidden_chains():
    profiles = []
    for seed in range(5):
        w, _ = chain(20, 1, 1.0, 0.0, 0.9, gen())
        perm = torch.randperm(20, generator=gen(seed))
        hw = torch.zeros(20, 20)
        hw[perm[:, None], perm[None, :]] = w + 0.01 * torch.randn(20, 20, generator=gen(seed + 10))
        pulse = torch.zeros(20, dtype=F64)
        pulse[perm[0]] = 1.0
        profiles.append(network_profile(hw, pulse))
    stats = mean_profile(profiles)
    assert stats.peak == 1 and stats.count == 5 and stats.sem is not None


# --- LSTM initialisers of Table 3 (gate order i, f, g, o as PyTorch's weight layout) -----------------------

N, D = 12, 3


def blocks(t):
    return t.detach().split(N)  # i, f, g, o


def sub_diagonal(alpha):
    return alpha * torch.diag(torch.ones(N - 1), -1)


def test_lstm_chain_init_puts_a_chain_in_every_gate():
    cell = LSTMCell(LSTMConfig(init="chain"), D, N, gen())
    for w_hh, w_ih in zip(blocks(cell.weight_hh), blocks(cell.weight_ih), strict=True):
        assert torch.equal(w_hh, sub_diagonal(1.02))  # W_ij = α δ_{j,i−1}, the authors' α = 1.02
        assert torch.equal(w_ih, 0.9 * torch.eye(N, D))  # input at the chain's source
    cell = LSTMCell(LSTMConfig(init="chain", scale=1.0), D, N, gen())
    assert torch.equal(blocks(cell.weight_hh)[2], sub_diagonal(1.0))


def test_lstm_orthogonal_init_scales_an_orthogonal_matrix_per_gate():
    cell = LSTMCell(LSTMConfig(init="orthogonal", scale=0.9), D, N, gen())
    ws = blocks(cell.weight_hh)
    for w in ws:
        assert torch.allclose(w @ w.t(), 0.81 * torch.eye(N), atol=1e-5)  # λ Q, λ = 0.9
    assert not torch.equal(ws[0], ws[1])  # each gate its own Q
    w_default = LSTMCell(LSTMConfig(init="orthogonal"), D, N, gen()).weight_hh.detach()[:N]
    assert float(w_default.norm()) == pytest.approx(math.sqrt(N), rel=1e-5)  # λ = 1 by default
    v = LSTMCell(LSTMConfig(init="orthogonal"), D, 400, gen()).weight_ih.detach()
    assert float(v.std()) == pytest.approx(0.9 / math.sqrt(400), rel=0.05)  # N(0, std 0.9/√N)


def test_lstm_mixed_init_chain_in_the_update_gate_rising_profile_elsewhere():
    cell = LSTMCell(LSTMConfig(init="mixed"), D, N, gen())
    w_i, w_f, w_g, w_o = blocks(cell.weight_hh)
    assert torch.equal(w_g, sub_diagonal(1.02))  # the tanh (update / candidate) gate is the chain
    assert torch.equal(w_i, w_f) and torch.equal(w_i, w_o)
    identity_order = torch.arange(N)
    prof = weight_profile(w_i, identity_order)
    steps = [b - a for a, b in zip(prof.mean, prof.mean[1:], strict=False)]
    assert all(s > 0 for s in steps)  # monotonically increasing in i − j
    assert prof.mean[0] == pytest.approx(-0.01) and prof.mean[-1] == pytest.approx(0.01)  # ε = 0.01
    assert network_profile(w_g, torch.eye(N, dtype=F64)[0]).peak == 1
    for w_ih in blocks(cell.weight_ih):
        assert torch.equal(w_ih, 0.9 * torch.eye(N, D))


@pytest.mark.parametrize("init", ["orthogonal", "chain", "mixed"])
def test_table3_inits_keep_pytorch_default_biases_and_options(init):
    cell = LSTMCell(LSTMConfig(init=init), D, N, gen())
    b = cell.bias.detach()
    assert b.abs().max() <= 1 / math.sqrt(N) and b.std() > 0  # nn.LSTM's U(−1/√N, 1/√N)
    cell = LSTMCell(LSTMConfig(init=init, forget_bias=1.0), D, N, gen())
    assert torch.all(cell.bias.detach()[N : 2 * N] == 1.0)
    resolved = resolve(
        {"task": "addition", "cell": "lstm", "hidden": N, "cell_params": {"init": init, "scale": "1.0"}}
    )
    assert resolved.cell_config.scale == 1.0
    out = LSTMCell(resolved.cell_config, 2, N, gen())(torch.randn(5, 4, 2, generator=gen()))
    assert out.shape == (5, 4, N) and torch.isfinite(out).all()


def test_lstm_scale_is_rejected_where_it_does_nothing():
    with pytest.raises(ConfigError, match="scale"):
        resolve({"task": "addition", "cell": "lstm", "cell_params": {"init": "keras", "scale": 1.0}})


# --- `python -m trainers analyze` (in process: the JSON shapes) --------------------------------------------


def run_cli(capsys, *args):
    code = main(["analyze", *args])
    out, err = capsys.readouterr()
    return code, out, err


def test_cli_fisher_json(capsys):
    code, out, _ = run_cli(capsys, "fisher", "--init", "chain", "--scale", "2.0", "--hidden", "50", "--json")
    assert code == 0
    data = json.loads(out)
    assert len(data["j"]) == 50 and len(data["amplification"]) == 50
    assert data["j"][:3] == pytest.approx([1.0, 0.8, 0.8 * 20 / 21])  # 4ᵏ / Σ_{m≤k} 4ᵐ
    assert data["j_tot"] == pytest.approx(sum(4**k * 3 / (4 ** (k + 1) - 1) for k in range(50)))
    assert data["exact"] is True and data["init"] == "chain" and data["scale"] == 2.0


def test_cli_fisher_several_networks_and_a_divergent_one(capsys):
    code, out, _ = run_cli(capsys, "fisher", "--init", "chain,identity", "--hidden", "20", "--json")
    assert code == 0
    rows = json.loads(out)["networks"]
    assert [r["init"] for r in rows] == ["chain", "identity"] and rows[1]["j_tot"] == pytest.approx(1.0)
    code, _, err = run_cli(capsys, "fisher", "--init", "orthogonal", "--scale", "1.0", "--hidden", "20")
    assert code == 2 and "spectral radius" in err


def test_cli_decode_json(capsys):
    code, out, _ = run_cli(capsys, "decode", "--init", "chain", "--nonlinearity", "elu", "--json")
    assert code == 0
    data = json.loads(out)
    assert {"r2", "r2_heldout", "r2_optimal", "trials", "steps", "sigma"} <= set(data)
    assert 0.5 < data["r2"] <= 1 and data["trials"] == 250 and data["scale"] == 1.01


def write_json(tmp_path, name, payload):
    path = tmp_path / name
    path.write_text(json.dumps(payload))
    return str(path)


def test_cli_henrici_of_a_saved_matrix_and_an_lstm_gate(tmp_path, capsys):
    w, _ = chain(10, 1, 1.0, 0.0, 0.9, gen())
    path = write_json(
        tmp_path, "recurrent_matrix.json", {"W": w.tolist(), "convention": "W_ij: from unit j to unit i"}
    )
    code, out, _ = run_cli(capsys, "henrici", "--matrix", path, "--json")
    assert code == 0
    data = json.loads(out)
    assert (
        data["henrici_index"] == pytest.approx(3.0)
        and data["hidden"] == 10
        and data["spectral_radius"] == 0.0
    )
    lstm = LSTMCell(LSTMConfig(init="mixed"), 2, 10, gen())
    path = write_json(tmp_path, "lstm.json", {"W": lstm.weight_hh.tolist()})
    code, _, err = run_cli(capsys, "henrici", "--matrix", path)
    assert code == 2 and "--gate" in err
    code, out, _ = run_cli(capsys, "henrici", "--matrix", path, "--gate", "g", "--json")
    assert code == 0 and json.loads(out)["henrici_index"] == pytest.approx(1.02 * 3.0, rel=1e-6)
    code, out, _ = run_cli(capsys, "henrici", "--init", "orthogonal", "--json")
    assert code == 0 and json.loads(out)["henrici_index"] < 1e-5


def test_cli_profile_json(tmp_path, capsys):
    code, out, _ = run_cli(capsys, "profile", "--init", "chain", "--hidden", "30", "--json")
    assert code == 0
    data = json.loads(out)
    assert data["peak"] == 1 and data["count"] == 1 and data["sem"] is None and len(data["mean"]) == 59
    paths = []
    for seed in range(3):  # hidden chains, relabelled, as files with their input matrix
        w, v = chain(8, 1, 1.0, 0.0, 1.0, gen())
        perm = torch.randperm(8, generator=gen(seed))
        hw, hv = torch.zeros(8, 8), torch.zeros(8, 1)
        hw[perm[:, None], perm[None, :]], hv[perm] = w, v
        paths += ["--matrix", write_json(tmp_path, f"m{seed}.json", {"W": hw.tolist(), "V": hv.tolist()})]
    code, out, _ = run_cli(capsys, "profile", *paths, "--nonlinearity", "elu", "--json")
    data = json.loads(out)
    assert code == 0 and data["count"] == 3 and data["peak"] == 1 and len(data["sem"]) == 15


PNG_ARGS = {
    "fisher": ["--init", "chain,fbchain,identity,orthogonal"],  # Fig. 1b–c
    "decode": ["--init", "chain,orthogonal", "--nonlinearity", "elu", "--trials", "50"],  # Fig. 2c
    "profile": ["--init", "chain"],  # Fig. 5
}


@pytest.mark.parametrize("analysis", PNG_ARGS)
def test_cli_png(tmp_path, capsys, analysis):
    pytest.importorskip("matplotlib")
    png = tmp_path / f"{analysis}.png"
    code, _, _ = run_cli(capsys, analysis, *PNG_ARGS[analysis], "--hidden", "20", "--png", str(png))
    assert code == 0 and png.stat().st_size > 1000
