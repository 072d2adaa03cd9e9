"""What one member adds to a fused bundle's working memory: the trainers' own model of their bundles,
by which the service sizes them to a device's memory (`service.study.packing`) and against which
`benchmarks/gpu_service.py` holds what a GPU really allocated."""

from __future__ import annotations

from typing import TYPE_CHECKING

from trainers.fused.cells import FUSED_CELLS
from trainers.model import build_model, count_params

if TYPE_CHECKING:
    from trainers.config import Resolved

#: float32: the bundle's tensors, as a trial computes (`trainers.config`)
FLOAT_BYTES = 4


def member_bytes(resolved: Resolved) -> int:
    """Working memory one member adds to a bundle, in bytes: for a training batch over the sequence, the
    [T, B, N] buffers its cell's recurrence keeps (`FusedCell.stores`: states, pre-activations, gates)
    and their gradients, its inputs and outputs; and its trainable parameters, counted on its model,
    with their gradients and two optimiser buffers (RMSprop's or Adam's)."""
    cfg = resolved.config
    task = resolved.make_task()  # cheap: data are made or read lazily
    stores = FUSED_CELLS[cfg.cell].stores if cfg.cell in FUSED_CELLS else 2
    d_in, d_out, length = task.input_dim, task.output_dim, task.seq_len
    activations = cfg.batch_size * length * (2 * stores * cfg.hidden + d_in + d_out)
    params = count_params(build_model(resolved, task))
    return FLOAT_BYTES * (activations + 4 * params)
