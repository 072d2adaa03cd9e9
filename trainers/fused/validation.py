"""A bundle's validation: each member's (mean validation loss, mean metric) as the solo loop's
`evaluate` computes it alone, from fused forward passes over its own validation set.
"""

from __future__ import annotations

import torch

from trainers.fused.members import Member
from trainers.fused.model import FusedModel
from trainers.runtime import ValidationSums

#: bytes of recurrence buffers one validation pass may use (members are evaluated in chunks that fit)
EVAL_BUFFER_BYTES = 256 * 2**20


@torch.no_grad()
def validate(model: FusedModel, members: list[Member]) -> list[tuple[float, float | None]]:
    """Each member's (mean validation loss, mean metric) as the loop's `evaluate` computes it alone.

    The same batches of its own validation set go through the fused forward (each member's outputs
    are its solo model's, bit for bit), and its loss and metric are summed batch by batch in the same
    order. Members go in chunks whose buffers fit `EVAL_BUFFER_BYTES` (a large validation batch may
    leave one member per pass: then it costs what a solo evaluation costs).
    """
    cfg = members[0].config  # shared fields only
    device = model.params[0].device
    N = cfg.hidden
    n_val, batch_size = len(members[0].data.val_split), cfg.eval_batch_size
    sums = [ValidationSums() for _ in members]
    for start in range(0, n_val, batch_size):
        batch = {}  # per seed: members with one seed share a validation set
        for m in members:
            if m.config.seed not in batch:
                batch[m.config.seed] = m.data.task.encode(
                    m.data.val_split.take(slice(start, start + batch_size)), device
                )
        xs = [batch[m.config.seed][0] for m in members]
        T, b = xs[0].shape[0], xs[0].shape[1]
        stores = model.spec.stores  # e.g. xp and hs
        chunk = max(1, EVAL_BUFFER_BYTES // (stores * (T + 1) * b * N * xs[0].element_size()))
        for first in range(0, len(members), chunk):
            rows = slice(first, min(first + chunk, len(members)))
            outs = model.forward(xs[rows], rows, model.eval_workspace)
            for m, member_sums, out in zip(members[rows], sums[rows], outs, strict=True):
                member_sums.add(m.data.task, out, batch[m.config.seed][1], b)
    return [member_sums.means(m.data.task) for m, member_sums in zip(members, sums, strict=True)]
