"""The cell against the paper: eq. 2 transcribed, the constraint |u| ≤ mag^{1/T}, the initial weights
drawn from `gen` alone, and the plugin joining memsweep's registry by its entry point."""

from __future__ import annotations

import math

import pytest
import torch
from trainers import ConfigError, resolve, train
from trainers.cells import get_cell, list_cells
from trainers.fused import FUSED_CELLS
from trainers.plugins import installed

from memsweep_indrnn import IndRNNCell, IndRNNConfig
from memsweep_indrnn.scan import FusedIndScan, IndScan


def make_cell(seed: int = 0, d: int = 3, N: int = 12, **config: object) -> IndRNNCell:
    return IndRNNCell(IndRNNConfig(**config), d, N, torch.Generator().manual_seed(seed))  # type: ignore[arg-type]


def paper_equation(x: torch.Tensor, w: torch.Tensor, u: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Eq. 2 step by step, in float64: h_t = ReLU(W x_t + u ⊙ h_{t−1} + b), h_0 = 0."""
    x, w, u, b = (t.double() for t in (x, w, u, b))
    h = torch.zeros(x.shape[1], w.shape[0], dtype=torch.float64)
    states = []
    for x_t in x:
        h = torch.relu(x_t @ w.T + u * h + b)
        states.append(h)
    return torch.stack(states)


# ----- the plugin ------------------------------------------------------------------------------------


def test_the_entry_point_registers_the_cell_and_its_fused_form() -> None:
    plugins = {(p.kind, p.name): p for p in installed()}
    plugin = plugins[("cell", "indrnn")]
    assert plugin.problem is None and plugin.distribution == "memsweep-indrnn" and plugin.version == "0.1.0"
    assert plugin.identity.startswith("memsweep-indrnn==0.1.0+") and len(plugin.digest) == 16
    assert "indrnn" in list_cells() and get_cell("indrnn") is IndRNNCell
    assert FUSED_CELLS["indrnn"] is IndRNNCell.fused


def test_a_bad_value_is_refused_where_the_config_resolves() -> None:
    for bad in ({"T": 0}, {"mag": 0.5}, {"input_std": -1.0}):
        with pytest.raises(ConfigError, match="indrnn"):
            resolve({"task": "addition", "cell": "indrnn", "cell_params": bad})


# ----- the equation ----------------------------------------------------------------------------------


@pytest.mark.parametrize("bias", [True, False])
def test_forward_is_the_papers_equation(bias: bool) -> None:
    """Random weights of both signs (some units decay, some alternate, some grow to the bound): the
    cell's float32 states against eq. 2 in float64."""
    cell = make_cell(d=3, N=12, bias=bias, T=10)
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        cell.weight_ih.copy_(torch.randn(12, 3, generator=g))
        cell.weight_hh.copy_(torch.empty(12).uniform_(-1.07, 1.07, generator=g))
        if cell.bias is not None:
            cell.bias.copy_(torch.randn(12, generator=g) * 0.5)
    x = torch.randn(9, 5, 3, generator=g)
    b = cell.bias if cell.bias is not None else torch.zeros(12)
    expected = paper_equation(x, cell.weight_ih, cell.weight_hh, b)
    assert 0.2 < (expected > 0).double().mean() < 0.8  # both sides of ReLU's kink are exercised
    torch.testing.assert_close(cell(x).double(), expected, rtol=1e-5, atol=1e-6)


def test_the_hand_written_backward_is_the_gradient_of_the_equation() -> None:
    g = torch.Generator().manual_seed(2)
    drive = torch.randn(6, 3, 4, generator=g, dtype=torch.float64).requires_grad_()
    u = torch.empty(4, dtype=torch.float64).uniform_(-1.2, 1.2, generator=g).requires_grad_()
    assert torch.autograd.gradcheck(IndScan.apply, (drive, u))


@pytest.mark.parametrize("last", [False, True])
def test_the_fused_backward_is_the_gradient_of_each_members_equation(last: bool) -> None:
    g = torch.Generator().manual_seed(3)
    drives = [torch.randn(5, 2, 4, generator=g, dtype=torch.float64).requires_grad_() for _ in range(3)]
    u = torch.empty(3, 4, dtype=torch.float64).uniform_(-1.2, 1.2, generator=g).requires_grad_()
    assert torch.autograd.gradcheck(lambda u, *d: FusedIndScan.apply(last, None, u, *d), (u, *drives))


def test_recurrent_matrix_is_diag_u_and_input_matrix_is_w() -> None:
    cell = make_cell()
    assert torch.equal(cell.recurrent_matrix(), torch.diag(cell.weight_hh.detach()))
    assert torch.equal(cell.input_matrix(), cell.weight_ih.detach())


# ----- the constraint --------------------------------------------------------------------------------


def test_after_step_clips_u_to_the_bound_and_leaves_the_rest() -> None:
    cell = make_cell(N=5, T=100, mag=2.0)
    bound = 2.0 ** (1 / 100)
    inside = [0.5, -0.999, 1.0]
    with torch.no_grad():
        cell.weight_hh.copy_(torch.tensor([1.5, -3.0, *inside]))
    w_before = cell.weight_ih.detach().clone()
    cell.after_step()
    u = cell.weight_hh.detach()
    assert torch.equal(u[:2], torch.tensor([bound, -bound], dtype=torch.float32))
    assert torch.equal(u[2:], torch.tensor(inside))
    assert torch.equal(cell.weight_ih, w_before) and cell.weight_hh.grad is None


def test_a_trained_networks_u_stays_within_the_bound() -> None:
    """A large learning rate pushes u past mag^{1/T} within a few steps; every step clips it back."""
    T = 8
    result = train(
        {
            "task": "addition",
            "cell": "indrnn",
            "hidden": 16,
            "steps": 30,
            "optimizer": "adam",
            "lr": 0.5,
            "early_stop_loss": None,
            "task_params": {"seq_len": T, "n_train": 64, "n_val": 32},
            "cell_params": {"T": T, "mag": 1.5},
        }
    )
    assert result.status == "done" and result.recurrent_matrix is not None
    u = torch.diagonal(result.recurrent_matrix)
    bound = torch.tensor(1.5 ** (1 / T), dtype=torch.float32)
    assert u.abs().max() == bound  # some unit was pushed to it, none is past it


# ----- the initial weights ---------------------------------------------------------------------------


def test_initial_weights_come_from_gen_alone() -> None:
    torch.manual_seed(123)
    state = torch.get_rng_state()
    a, b, c = make_cell(seed=7), make_cell(seed=7), make_cell(seed=8)
    assert torch.equal(torch.get_rng_state(), state)  # torch's global generator never drawn from
    same = [torch.equal(p, q) for p, q in zip(a.parameters(), b.parameters(), strict=True)]
    other = [torch.equal(p, q) for p, q in zip(a.parameters(), c.parameters(), strict=True)]
    assert (
        all(same) and not torch.equal(a.weight_ih, c.weight_ih) and not torch.equal(a.weight_hh, c.weight_hh)
    )
    assert not all(other)


@pytest.mark.parametrize(("recurrent_init", "low"), [("last_layer", 2 ** (-1 / 50)), ("first_layer", 0.0)])
def test_initial_ranges_are_the_authors(recurrent_init: str, low: float) -> None:
    """W ~ N(0, 0.001²), u ~ U(low, 2^{1/T}) (adding.py), b = 0."""
    cell = make_cell(d=40, N=2000, T=50, recurrent_init=recurrent_init)
    u, w = cell.weight_hh.detach(), cell.weight_ih.detach()
    high = 2 ** (1 / 50)
    assert u.min() >= low - 1e-7 and u.max() <= high and u.max() > high - 0.01 * (high - low)
    assert abs(float(u.mean()) - (low + high) / 2) < 4 * (high - low) / math.sqrt(
        12 * 2000
    )  # 4 standard errors
    assert math.isclose(float(w.std()), 0.001, rel_tol=0.02) and abs(float(w.mean())) < 1e-5
    assert cell.bias is not None and not cell.bias.any()
