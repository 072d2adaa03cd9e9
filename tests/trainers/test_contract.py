"""Every registered cell on every task: shapes, gradient through time, determinism, no NaN.

A new cell or task is covered by being registered (trainers.cells / trainers.tasks)."""

import pytest
import torch

from trainers import resolve
from trainers.cells import list_cells
from trainers.model import build_model
from trainers.tasks import get_task, list_tasks

CPU = torch.device("cpu")
PAIRS = [(cell, task) for cell in list_cells() for task in list_tasks()]
# Cell settings under which a signal can persist for any T (a chain forgets after N steps by design).
CELL_PARAMS = {
    "srnn": {"hyper_size": 8},
    "nru": {"memory_size": 16, "heads": 4},
    "rnn": {"init": "orthogonal"},
}
# Tasks whose data are files read in a fixed order: the seed changes the weights, not the data.


def setup(cell, task, params, seed=1):
    resolved = resolve(
        {
            "task": task,
            "cell": cell,
            "hidden": 12,
            "seed": seed,
            "task_params": params[task],
            "cell_params": CELL_PARAMS.get(cell, {}),
        }
    )
    t = resolved.make_task()
    x, y = t.encode(t.val_split().take(slice(0, 4)), CPU)
    return resolved, t, build_model(resolved, t), x, y


@pytest.mark.parametrize("cell,task", PAIRS)
def test_output_shape_and_finite_loss(cell, task, tiny_task_params):
    _, t, model, x, y = setup(cell, task, tiny_task_params)
    out = model(x)
    expected = (t.seq_len, 4, t.output_dim) if t.output == "sequence" else (4, t.output_dim)
    assert out.shape == expected
    loss = t.loss(out, y)
    assert loss.ndim == 0 and torch.isfinite(loss)


@pytest.mark.parametrize("cell,task", PAIRS)
def test_gradient_reaches_the_first_step(cell, task, tiny_task_params):
    _, _, model, x, _ = setup(cell, task, tiny_task_params)
    x = x[:40]  # 40 steps: long enough, short enough to avoid float32 underflow
    if model.embedding is not None:  # token ids: take the gradient at the embedding's output
        x = model.embedding(x)
    x = x.detach().clone().requires_grad_()
    model.cell(x)[-1].pow(2).sum().backward()
    assert x.grad is not None and x.grad[0].abs().sum() > 0  # the last state depends on step 0
    assert all(torch.isfinite(p.grad).all() for p in model.cell.parameters() if p.grad is not None)


@pytest.mark.parametrize("cell,task", PAIRS)
def test_same_seed_same_model_other_seed_other_data(cell, task, tiny_task_params):
    _, _, m1, x1, _ = setup(cell, task, tiny_task_params, seed=5)
    _, _, m2, x2, _ = setup(cell, task, tiny_task_params, seed=5)
    assert torch.equal(x1, x2)
    assert torch.equal(m1(x1), m2(x2))
    _, _, _, x3, _ = setup(cell, task, tiny_task_params, seed=6)
    assert not get_task(task).seeded_data or not torch.equal(x1, x3)


@pytest.mark.parametrize("cell", list_cells())
def test_every_cell_is_a_cell_built_from_its_config_and_the_init_generator(cell):
    """The constructor contract: (config, input_size, hidden_size, gen); `gen` fixes the weights."""
    import inspect

    from trainers.cells import Cell, get_cell

    cls = get_cell(cell)
    assert issubclass(cls, Cell) and not inspect.isabstract(cls)
    assert list(inspect.signature(cls.__init__).parameters)[1:] == [
        "config",
        "input_size",
        "hidden_size",
        "gen",
    ]
    config = cls.resolve(cls.Config(**CELL_PARAMS.get(cell, {})), "tanh")
    a, b = (cls(config, 3, 12, torch.Generator().manual_seed(7)) for _ in range(2))
    c = cls(config, 3, 12, torch.Generator().manual_seed(8))
    same = [torch.equal(p, q) for p, q in zip(a.parameters(), b.parameters(), strict=True)]
    other = [torch.equal(p, q) for p, q in zip(a.parameters(), c.parameters(), strict=True)]
    assert all(same) and not all(other)


def test_a_cell_without_forward_cannot_be_built():
    from trainers.cells import Cell

    class Incomplete(Cell):
        name = "incomplete"
        Config = dict

    with pytest.raises(TypeError, match="abstract"):
        Incomplete({}, 1, 2, torch.Generator())


def test_a_cost_setting_the_config_lacks_is_refused_by_the_contract():
    """A cell's `cost_settings` names settings of its Config: a misspelt one left the setting it meant
    one calibration shape for all its values, and nothing said so."""
    from trainers.cells.rnn import RNNCell
    from trainers.contract import check_cell

    class Misspelt(RNNCell):
        cost_settings = frozenset({"input_gian"})

    class Declared(RNNCell):
        cost_settings = frozenset({"input_gain"})

    (problem,) = [p for p in check_cell(Misspelt) if p.check == "settings"]
    assert "['input_gian']" in str(problem) and "not fields of" in str(problem)
    assert [p for p in check_cell(Declared) if p.check == "settings"] == []


def test_a_cell_that_mixes_its_examples_only_with_its_state_draws_on_breaks_the_batch_check(monkeypatch):
    """The batch check runs a drawing cell (SRNN's uRNN) with its draws off, where an example's initial
    state would otherwise follow its place in the batch; a cell that mixes examples only while drawing
    passed it. It also runs the draws on, among two sets of other examples, through copies of the cell."""
    from trainers.cells import CELLS
    from trainers.cells.arjovsky_urnn import ArjovskyURNNCell
    from trainers.contract import check_cell

    class Mixer(ArjovskyURNNCell):
        name = "contract_mixer"

        def forward(self, x):
            out = super().forward(x)
            return out - 0.5 * out.mean(1, keepdim=True) if self.draws_state else out

    monkeypatch.setitem(CELLS._items, Mixer.name, Mixer)
    found = [str(p) for p in check_cell(Mixer)]
    assert len(found) == 2 and all(
        p.startswith("batch: on task") and "must be its own" in p for p in found
    ), found
    assert check_cell(ArjovskyURNNCell) == []  # drawing, and each example's own
