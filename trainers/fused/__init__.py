"""Fused trial bundles (issues 7, 17): K same-shape trials of one cell trained as one model in one process.

A bundle is K configs that agree on every shape and schedule field (`fusable_key`). Their weights are
stacked [K, …] and the recurrence runs for all members at once, as batched matmuls (`FusedElmanScan`,
`FusedFastRNNScan`) or, for SRNN's shift, elementwise ops over all members; the optimiser (RMSprop or
Adam) and the global-norm clip are written over the stacked tensors with per-member constants. Each
member returns its own `TrialResult`, what `train` returns for its config alone.

Equivalence with `train`, bit for bit: every float32 operation a member's solo run performs is
performed on its slice with the same rounding — the input projection, readout, loss and their
gradients per member with the solo ops; the recurrence's batched GEMMs run per member the kernel
`addmm` runs; f splits each member's elements between torch's vectorised and scalar paths as a
solo call does; clip and optimiser repeat torch's arithmetic (`max_norm / total` is a reciprocal
then a product). A GEMM also rounds by its operands' memory layout, so each member's parameters
keep their solo layout: the orthogonal initialiser's W comes out of QR column-major, the others'
row-major, and a bundle that mixes them trains as one sub-bundle per layout, one after the other.
Bit for bit matters: a copy run at lr 3e-3 turned a 1e-7 difference into 40 % of its loss within
400 steps.

The wing, bottom up (what it shares with the solo loop is `trainers.runtime`; it imports nothing
from `trainers.loop`):

- `cells`: which cells fuse and how each runs its recurrence for all members (`FUSED_CELLS`);
- `keys`: which trials may share a bundle (`fusable_key`, `check_fusable`);
- `stacked`: stacked tensors [K, …] that keep each member's solo memory layout;
- `model`, `optim`: the stacked model (`FusedModel`) and optimiser (`FusedOptimizer`);
- `graphs`: a bundle's step captured as one CUDA graph and replayed (`GraphedStep`; GPU only);
- `steps`: a bundle's training step, eager or graphed (`forward_backward`, `BundleSteps`);
- `members`, `validation`: each member set up as its solo run is, and evaluated as it is alone;
- `loop`: `train_fused`, members leaving, a bundle out of memory training again in halves;
- `memory`: what a member adds to a bundle's working memory (`member_bytes`), which packing sizes by;
- `bundle`: the step alone, set up as `train_fused` sets it up, for the benchmarks (`Bundle`).

The persistent Triton kernel of the Elman recurrence (issue 37) sits beside its reference, in
`trainers/kernels_persistent.py`; `cells._elman` runs it for members whose `backend` is "persistent".
"""

from trainers.fused.bundle import Bundle
from trainers.fused.cells import FUSED_CELLS, FusedCell
from trainers.fused.graphs import GRAPH_WARMUP, Batch, GraphedStep, GraphUnsupported, graphs_available
from trainers.fused.keys import SHARED_FIELDS, check_fusable, fusable_key
from trainers.fused.loop import out_of_memory, release_memory, train_fused
from trainers.fused.memory import member_bytes
from trainers.fused.model import FusedModel
from trainers.fused.optim import FusedOptimizer
from trainers.fused.steps import BundleSteps, forward_backward, steps_to_pace, trains_graphed

__all__ = [
    "FUSED_CELLS",
    "GRAPH_WARMUP",
    "SHARED_FIELDS",
    "Batch",
    "Bundle",
    "BundleSteps",
    "FusedCell",
    "FusedModel",
    "FusedOptimizer",
    "GraphUnsupported",
    "GraphedStep",
    "check_fusable",
    "forward_backward",
    "fusable_key",
    "graphs_available",
    "member_bytes",
    "out_of_memory",
    "release_memory",
    "steps_to_pace",
    "train_fused",
    "trains_graphed",
]
