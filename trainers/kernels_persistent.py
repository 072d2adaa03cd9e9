"""Persistent recurrent kernels (issue 37): one Triton program per bundle member (and batch slice) runs
all T steps, forward and backward, instead of one batched launch per time step. The Elman kernel keeps
its W on chip; SRNN's shift kernel (at the end of this module, `persistent_shift_scan`) keeps its state
in registers.

    forward   a_t = xp_t + h_{t−1} Wᵀ,  h_t = f(a_t)                      t = 1 … T, every h_t stored
    backward  ∂a_t = (g_t + ∂a_{t+1} W) ⊙ f'(a_t),  ∂W = Σ_t ∂a_tᵀ h_{t−1}   t = T … 1, in one program

f is elu (TensorFlow's: a if a ≥ 0 else exp(a) − 1, as `trainers.kernels.elu_`), relu or tanh, and
f' is written through h_t as `trainers.kernels.act_grad` writes it. Every product is
`tl.dot(..., input_precision="ieee")`: IEEE float32 (or float64), never TF32 (docs/gpu.md, fidelity).
The forward holds h and Wᵀ in column blocks of 16 hidden units (`_column_blocks`; wider past N = 128),
tiles small enough that nothing spills at Orhan's N = 100 (one [128 × 128] product spilled heavily);
`tools/kernel_report.py` compiles both kernels for sm_90 without a GPU and prints registers and spills.
The input projection xp = x Vᵀ + b and ∂V, ∂b, ∂x stay outside the kernel, per member, with the very
code `FusedElmanScan` runs (`project_members`, `input_grads`): d is 1–10 at Orhan's shapes, so they
are a small part of the step.

A member's program runs the same operations in the same order whatever K is (the grid is K × batch
slices; no launch parameter depends on K), so on a GPU a bundle member should equal its K = 1 run bit
for bit — the property `benchmarks/persistent_kernel.py` measures on a lent card. ∂W is summed on chip in
a fixed order (time steps descending) and written once per member and batch slice; slices are added
on the host in slice order.

Its reference is `trainers.kernels.FusedElmanScan` (tests/trainers/test_persistent_kernel.py, on the
CPU under Triton's interpreter); its benchmark `benchmarks/persistent_kernel.py`. It is used only when
asked for: the Elman family's `backend="persistent"` (`trainers.kernels.elman_rnn` runs a solo trial as
a bundle of one, `trainers.fused.cells` a bundle), or `persistent_elman_rnn` called directly; importing
`trainers` does not import this module or Triton. SRNN's shift kernel likewise: its reference is
`trainers.cells.srnn.FusedShiftScan`, whose numbers it gives bit for bit
(tests/trainers/test_persistent_shift.py), and it runs only for SRNN's `backend="persistent"`
(`SRNNCell.forward` runs a solo trial as a bundle of one, `trainers.fused.cells` a bundle).

Triton decides at decoration time whether a kernel is compiled or interpreted: on the CPU set
`TRITON_INTERPRET=1` before this module is first imported. The kernels call only `triton.language`
builtins (no `tl.zeros`, itself a @triton.jit function), so they interpret even where Triton was
imported before the variable was set.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from typing import Any

import torch
import triton
import triton.language as tl
from triton.language.extra.cuda import libdevice
from triton.runtime.errors import OutOfResources

from trainers.kernels import ACTIVATIONS, Workspace, input_grads, project_members

#: whether this module's kernels run under Triton's interpreter (numpy on the CPU), fixed at import
INTERPRETED: bool = bool(triton.knobs.runtime.interpret)

_ACT_CODE = {name: i for i, name in enumerate(ACTIVATIONS)}  # elu 0, relu 1, tanh 2: a constexpr each

#: batch rows per program; 16 is Orhan's batch (one program a member). A tl.dot's inner dimension must
#: be at least 8 for float32 on NVIDIA GPUs, which ∂W's product (over batch rows) is
BLOCK_B = 16
#: warps per program: compiled for sm_90 here (tools/kernel_report.py: Triton 3.8 and 3.6, no GPU), at
#: N = 100 and 128 neither kernel spills at 8 warps and both do at 4 (docs/gpu.md); to be swept on a card
NUM_WARPS = 8
#: warps per program of SRNN's shift kernels (elementwise on a [BLOCK_B, BLOCK_N] tile, 16 × 128 at the SRNN
#: presets): compiled for sm_90 here, 4 warps keep it in 120 (forward) and 152 (backward) registers without
#: spills; not yet measured on a card
SHIFT_WARPS = 4
#: the forward's column blocks at most (`_column_blocks`): its loop body holds NB² tile products, unrolled
MAX_BLOCKS = 8


@triton.jit
def _exp(a, LIBDEVICE: tl.constexpr):
    # libdevice's expf on a GPU (what torch's CUDA exp calls; tl.exp is ex2.approx there); the
    # interpreter has no libdevice and runs numpy's exp
    if LIBDEVICE:
        return libdevice.exp(a)
    else:
        return tl.exp(a)


@triton.jit
def _act(a, ACT: tl.constexpr, LIBDEVICE: tl.constexpr):
    """h = f(a), elementwise on a tile."""
    if ACT == 0:  # elu as TensorFlow: max(a, 0) + (exp(min(a, 0)) − 1), kernels.elu_'s order
        # NaN kept, as torch's maximum and minimum keep it (a GPU's max.f32 returns the other operand;
        # the flag must be written in the call: the compiler takes no PropagateNan held in a variable)
        pos = tl.maximum(a, 0.0, propagate_nan=tl.PropagateNan.ALL)
        return pos + (_exp(tl.minimum(a, 0.0, propagate_nan=tl.PropagateNan.ALL), LIBDEVICE) - 1.0)
    elif ACT == 1:
        return tl.maximum(a, 0.0, propagate_nan=tl.PropagateNan.ALL)  # relu(NaN) = NaN, as torch's
    else:
        if LIBDEVICE:
            return libdevice.tanh(a)
        else:  # interpreter: tanh through exp (a few ulp from torch's tanh; the tests allow for it)
            e = tl.exp(-2.0 * tl.abs(a))
            r = (1.0 - e) / (1.0 + e)
            return tl.where(a < 0, -r, r)


@triton.jit
def _act_grad(h, ACT: tl.constexpr):
    """f'(a) through h = f(a), as kernels.act_grad: elu' = min(h + 1, 1); relu' = [h > 0]; tanh' = 1 − h²."""
    if ACT == 0:
        return tl.minimum(h + 1.0, 1.0, propagate_nan=tl.PropagateNan.ALL)
    elif ACT == 1:
        return tl.where(h > 0, 1.0, 0.0).to(h.dtype)
    else:
        return 1.0 - h * h


@triton.jit
def _elman_forward(
    xp_ptr,  # [K, T, B, N] contiguous: x_t Vᵀ + b
    h0_ptr,  # [K, B, N] contiguous
    w_ptr,  # [K, N, N], any strides (a transposed W stays transposed)
    hs_ptr,  # [K, T + 1, B, N] contiguous, out: h_0 … h_T
    T,
    B,
    N,
    s_wk,
    s_wr,
    s_wc,
    ACT: tl.constexpr,
    BLOCK_B: tl.constexpr,
    BLOCK_C: tl.constexpr,
    NB: tl.constexpr,
    LIBDEVICE: tl.constexpr,
):
    # The hidden units in NB column blocks of BLOCK_C (`_column_blocks`; the last one partial, masked
    # and kept at 0): h is a tuple of NB tiles [BLOCK_B, BLOCK_C], Wᵀ one of NB × NB tiles
    # [BLOCK_C, BLOCK_C] (block row b, column c at b + c·NB), so that each product is a small tile's
    # and what a thread holds fits its registers (one [BLOCK_N, BLOCK_N] product spilled: docs/gpu.md)
    k = tl.program_id(0).to(tl.int64)  # the member
    rows = tl.program_id(1) * BLOCK_B + tl.arange(0, BLOCK_B)  # this program's batch slice
    inner = tl.arange(0, BLOCK_C)
    slab = B * N  # one [B, N] state
    hs = hs_ptr + k * (T + 1) * slab
    xp = xp_ptr + k * T * slab
    # tuples grow by concatenation (Triton's compiler has no starred expressions: ruff's RUF005 off), in
    # unrolled loops whose element count mypy cannot follow (its ignores)
    h = ()
    wt = ()
    for c in tl.static_range(NB):
        cols = c * BLOCK_C + inner
        m = (rows < B)[:, None] & (cols < N)[None, :]
        off = rows[:, None] * N + cols[None, :]
        h_c = tl.load(h0_ptr + k * slab + off, mask=m, other=0.0)
        tl.store(hs + off, h_c, mask=m)
        h = h + (h_c,)  # type: ignore[assignment]  # noqa: RUF005
        for b in tl.static_range(NB):
            # Wᵀ[j, i] = W[i, j], j in block b, i in block c: loaded once, on chip for all T steps
            j = b * BLOCK_C + inner
            mw = (j < N)[:, None] & (cols < N)[None, :]
            w_bc = tl.load(w_ptr + k * s_wk + cols[None, :] * s_wr + j[:, None] * s_wc, mask=mw, other=0.0)
            wt = wt + (w_bc,)  # type: ignore[assignment]  # noqa: RUF005
    for t in range(T):
        h_new = ()
        for c in tl.static_range(NB):
            cols = c * BLOCK_C + inner
            m = (rows < B)[:, None] & (cols < N)[None, :]
            off = rows[:, None] * N + cols[None, :]
            # a_t's block c = Σ_b h_{t−1}'s block b · Wᵀ's tile (b, c) + xp_t's block c: the product
            # first (summed over b in order) and then the sum, as addmm rounds. With one block (N ≤ 16)
            # Triton's compiler folds xp into the product's accumulator (CombineDotAddFPattern: a
            # product whose accumulator is 0, then an add), so there xp comes first, as it did at
            # every N in the kernel before the blocks
            acc = tl.dot(h[0], wt[c * NB], input_precision="ieee")  # type: ignore[misc]
            for b in tl.static_range(1, NB):
                acc = tl.dot(h[b], wt[c * NB + b], acc, input_precision="ieee")
            a = acc + tl.load(xp + t * slab + off, mask=m, other=0.0)
            h_c = _act(a, ACT, LIBDEVICE)  # padded columns: f(0) = 0 for elu, relu and tanh
            tl.store(hs + (t + 1) * slab + off, h_c, mask=m)
            h_new = h_new + (h_c,)  # type: ignore[assignment]  # noqa: RUF005
        h = h_new


@triton.jit
def _elman_backward(
    hs_ptr,  # [K, T + 1, B, N]: the forward's states
    w_ptr,  # [K, N, N], any strides
    g_ptr,  # [K, T, B, N] ∂L/∂h_t, or with LAST [K, B, N] ∂L/∂h_T alone
    ga_ptr,  # [K, T, B, N] out: ∂L/∂a_t (= ∂L/∂xp_t)
    dw_ptr,  # [K, S, N, N] out: ∂W from batch slice s (S slices)
    dh0_ptr,  # [K, B, N] out: ∂L/∂h_0
    T,
    B,
    N,
    s_wk,
    s_wr,
    s_wc,
    ACT: tl.constexpr,
    LAST: tl.constexpr,
    BLOCK_B: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    k = tl.program_id(0).to(tl.int64)
    s = tl.program_id(1)
    rows = s * BLOCK_B + tl.arange(0, BLOCK_B)
    cols = tl.arange(0, BLOCK_N)
    m = (rows < B)[:, None] & (cols < N)[None, :]
    mw = (cols < N)[:, None] & (cols < N)[None, :]
    # W [BLOCK_N, BLOCK_N] (not transposed: ∂h_{t−1} = ∂a_t W), on chip for all T steps
    w = tl.load(w_ptr + k * s_wk + cols[:, None] * s_wr + cols[None, :] * s_wc, mask=mw, other=0.0)
    slab = B * N
    off = rows[:, None] * N + cols[None, :]
    hs = hs_ptr + k * (T + 1) * slab
    ga_out = ga_ptr + k * T * slab
    if LAST:  # ∂L/∂h_T arrives alone; earlier states only through their successors
        carry = tl.load(g_ptr + k * slab + off, mask=m, other=0.0)
    else:
        carry = tl.full([BLOCK_B, BLOCK_N], 0.0, dtype=hs_ptr.dtype.element_ty)
    g = g_ptr + k * T * slab
    dw = tl.full([BLOCK_N, BLOCK_N], 0.0, dtype=hs_ptr.dtype.element_ty)  # ∂W, summed on chip
    h = tl.load(hs + T * slab + off, mask=m, other=0.0)  # h_t, carried down from t = T
    for i in range(T):
        t = T - 1 - i  # ∂a for h_{t+1} = f(a_{t+1}); arrays are 0-based over t = 0 … T−1
        # g_t + ∂a_{t+1} W (with LAST, g_t = 0 but at t = T, already in carry)
        dh = carry if LAST else carry + tl.load(g + t * slab + off, mask=m, other=0.0)
        ga = dh * _act_grad(h, ACT)
        tl.store(ga_out + t * slab + off, ga, mask=m)
        h = tl.load(hs + t * slab + off, mask=m, other=0.0)  # h_{t−1} (in the equations' 1-based t)
        dw += tl.dot(tl.trans(ga), h, input_precision="ieee")  # ∂a_tᵀ h_{t−1}: [N, BB] · [BB, N]
        carry = tl.dot(ga, w, input_precision="ieee")  # ∂a_t W, the next step's ∂h from its successor
    tl.store(dh0_ptr + k * slab + off, carry, mask=m)
    dw_out = dw_ptr + (k * tl.num_programs(1) + s) * N * N
    tl.store(dw_out + cols[:, None] * N + cols[None, :], dw, mask=mw)


def _block_n(n: int) -> int:
    return max(16, int(triton.next_power_of_2(n)))


def _column_blocks(n: int) -> tuple[int, int]:
    """The forward's column blocks (BLOCK_C, NB): the narrowest power-of-two width from 16 (a tl.dot's
    least) that covers n hidden units in at most MAX_BLOCKS blocks. N = 100: 7 blocks of 16 (112
    columns computed, where one power-of-two block computed 128); N = 25: 2 of 16."""
    block_c = 16
    while triton.cdiv(n, block_c) > MAX_BLOCKS:
        block_c *= 2
    return block_c, triton.cdiv(n, block_c)


def _check_device(t: torch.Tensor) -> None:
    if t.device.type == "cpu" and not INTERPRETED:
        raise RuntimeError(
            "backend 'persistent' (the Triton kernel of trainers.kernels_persistent) runs on a CUDA GPU, and on "
            "the CPU only under Triton's interpreter, which was off when the kernel was imported: on the CPU "
            "use backend 'auto' or 'scan' (the same recurrence: trainers.kernels), or set TRITON_INTERPRET=1 "
            "in the environment before the trainers start, for a slow check of the kernel's arithmetic"
        )


@contextlib.contextmanager
def _on_chip(kernel: str, n: int) -> Iterator[None]:
    """A launch whose program needs more of the GPU's shared memory (or registers) than it has: the
    error names the backend, the card's limit and the fix. `trainers.persistent.ELMAN_MAX_HIDDEN` refuses
    what no H100 or H200 holds at config time; smaller cards hold less (docs/gpu.md: N = 128's backward
    needs 112 KB, which an A100 has, and an RTX 30xx / 40xx or L4, 99 KB a block, has not)."""
    try:
        yield
    except OutOfResources as exc:
        unit = " bytes" if "memory" in str(exc.name) else ""
        raise RuntimeError(
            f"backend 'persistent': the {kernel} kernel at hidden {n} needs {exc.required}{unit} of "
            f"{exc.name} a program, and this GPU has {exc.limit}{unit}: use backend 'auto' (the same "
            "recurrence, cuBLAS), or a smaller hidden size"
        ) from exc


def _forward_launch(
    xp: torch.Tensor, h0: torch.Tensor, w: torch.Tensor, hs: torch.Tensor, nonlinearity: str
) -> tuple[tuple[int, int], tuple[Any, ...], dict[str, Any]]:
    """`_elman_forward`'s grid, arguments and constexprs, as `elman_forward` launches it (and
    tools/kernel_report.py compiles it, from tensors on the meta device)."""
    K, T, B, N = xp.shape
    grid = (K, triton.cdiv(B, BLOCK_B))
    block_c, nb = _column_blocks(N)
    meta = dict(
        ACT=_ACT_CODE[nonlinearity], BLOCK_B=BLOCK_B, BLOCK_C=block_c, NB=nb, LIBDEVICE=not INTERPRETED
    )
    return grid, (xp, h0, w, hs, T, B, N, *w.stride()), meta


def elman_forward(
    xp: torch.Tensor, h0: torch.Tensor, w: torch.Tensor, nonlinearity: str, out: torch.Tensor | None = None
) -> torch.Tensor:
    """hs [K, T + 1, B, N] (h_0 … h_T) from xp [K, T, B, N] (contiguous), h0 [K, B, N] and W [K, N, N]."""
    _check_device(xp)
    K, T, B, N = xp.shape
    hs = out if out is not None else xp.new_empty(K, T + 1, B, N)
    grid, args, meta = _forward_launch(xp, h0.contiguous(), w, hs, nonlinearity)
    with _on_chip("Elman forward", N):
        _elman_forward[grid](*args, **meta, num_warps=NUM_WARPS)
    return hs


def _backward_launch(
    hs: torch.Tensor,
    w: torch.Tensor,
    g: torch.Tensor,
    grad_a: torch.Tensor,
    dw: torch.Tensor,
    dh0: torch.Tensor,
    nonlinearity: str,
    last: bool,
) -> tuple[tuple[int, int], tuple[Any, ...], dict[str, Any]]:
    """`_elman_backward`'s grid, arguments and constexprs, as `elman_backward` launches it (and
    tools/kernel_report.py compiles it)."""
    K, T, B, N = hs.shape[0], hs.shape[1] - 1, hs.shape[2], hs.shape[3]
    grid = (K, triton.cdiv(B, BLOCK_B))
    meta = dict(ACT=_ACT_CODE[nonlinearity], LAST=last, BLOCK_B=BLOCK_B, BLOCK_N=_block_n(N))
    return grid, (hs, w, g, grad_a, dw, dh0, T, B, N, *w.stride()), meta


def elman_backward(
    hs: torch.Tensor, w: torch.Tensor, g: torch.Tensor, nonlinearity: str, last: bool, grad_a: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """(∂W [K, N, N], ∂h0 [K, B, N]), with ∂a written into grad_a [K, T, B, N], from the forward's hs
    and g: ∂L/∂h_t [K, T, B, N], or with `last` ∂L/∂h_T [K, B, N] (both contiguous)."""
    _check_device(hs)
    K, B, N = hs.shape[0], hs.shape[2], hs.shape[3]
    slices = triton.cdiv(B, BLOCK_B)
    dw = hs.new_empty(K, slices, N, N)
    dh0 = hs.new_empty(K, B, N)
    grid, args, meta = _backward_launch(hs, w, g, grad_a, dw, dh0, nonlinearity, last)
    with _on_chip("Elman backward", N):
        _elman_backward[grid](*args, **meta, num_warps=NUM_WARPS)
    grad_w = dw[:, 0]
    for s in range(1, slices):  # slice order, elementwise: the same sums whatever K is
        grad_w = grad_w + dw[:, s]
    return grad_w, dh0


class PersistentElmanScan(torch.autograd.Function):
    """`FusedElmanScan` through the persistent kernel: the same inputs and outputs (and ∂x for member
    inputs that need it, as `ElmanScan` gives; `FusedElmanScan` gives none)."""

    @staticmethod
    def forward(
        ctx: Any,
        h0: torch.Tensor,
        w_in: torch.Tensor,
        w: torch.Tensor,
        bias: torch.Tensor | None,
        nonlinearity: str,
        last: bool,
        workspace: Workspace | None,
        *xs: torch.Tensor,
    ) -> tuple[torch.Tensor, ...]:
        ws = workspace if workspace is not None else Workspace()
        (T, B, _d), K, N = xs[0].shape, len(xs), w.shape[1]
        xp = project_members(xs, w_in, bias, ws)  # member k's x_t Vᵀ + b, FusedElmanScan's own code
        hs = elman_forward(xp, h0, w, nonlinearity, out=ws.get("hs", (K, T + 1, B, N), h0))
        ctx.nonlinearity, ctx.last, ctx.workspace, ctx.has_bias = nonlinearity, last, ws, bias is not None
        ctx.save_for_backward(hs, w, w_in, *xs)
        return tuple(hs[:, T].unbind(0) if last else hs[:, 1:].unbind(0))

    @staticmethod
    def backward(ctx: Any, *grads: torch.Tensor | None) -> tuple[torch.Tensor | None, ...]:
        hs, w, w_in, *xs = ctx.saved_tensors
        K, T, B, N = hs.shape[0], hs.shape[1] - 1, hs.shape[2], hs.shape[3]
        ws: Workspace = ctx.workspace
        outs = hs[:, T].unbind(0) if ctx.last else hs[:, 1:].unbind(0)
        grads_k = [g if g is not None else torch.zeros_like(o) for g, o in zip(grads, outs, strict=True)]
        shape = (K, B, N) if ctx.last else (K, T, B, N)
        g = torch.stack(grads_k, out=ws.get("grad_hs", shape, hs))
        grad_a = ws.get("xp", (K, T, B, N), hs)  # the forward's xp buffer, dead once the loop has run
        grad_w, grad_h0 = elman_backward(hs, w, g, ctx.nonlinearity, ctx.last, grad_a)
        # ∂V_k, ∂b_k (and ∂x_k where asked) per member, by ElmanScan's own code
        per_member = [input_grads(x, grad_a[k], True, ctx.has_bias) for k, x in enumerate(xs)]
        grad_in = torch.stack([gi for gi, _ in per_member if gi is not None])
        grad_b = torch.stack([gb for _, gb in per_member if gb is not None]) if ctx.has_bias else None
        need_x = ctx.needs_input_grad[7:]
        grad_xs = [grad_a[k] @ w_in[k] if need else None for k, need in enumerate(need_x)]
        return (
            grad_h0 if ctx.needs_input_grad[0] else None,
            grad_in,
            grad_w,
            grad_b,
            None,
            None,
            None,
            *grad_xs,
        )


def persistent_elman_rnn(
    xs: Sequence[torch.Tensor],
    h0: torch.Tensor,
    w_in: torch.Tensor,
    w_rec: torch.Tensor,
    bias: torch.Tensor | None,
    nonlinearity: str,
    last: bool = False,
    workspace: Workspace | None = None,
) -> tuple[torch.Tensor, ...]:
    """`trainers.kernels.fused_elman_rnn` through the persistent kernel: K networks
    h_t = f(W_k h_{t−1} + V_k x_t + b_k) on xs[k] [T, B, d], member k's states [T, B, N] (or [B, N]
    with `last`). A solo run is a bundle of one. Outputs live in `workspace` until its next use."""
    if nonlinearity not in ACTIVATIONS:
        raise ValueError(f"nonlinearity {nonlinearity!r}: choose one of {', '.join(ACTIVATIONS)}")
    return PersistentElmanScan.apply(h0, w_in, w_rec, bias, nonlinearity, last, workspace, *xs)  # type: ignore[no-any-return]


# SRNN's shift recurrence (Rotman & Wolf 2020, `trainers.cells.srnn`): no weights, so a program (one per
# member and batch slice) is elementwise on its [BLOCK_B, BLOCK_N] tile, which stays in registers for all
# T steps.
#
#     forward   h_1 = ReLU(b_1),  h_t = ReLU(b_t + roll(h_{t−1}, +1))           t = 2 … T, every h_t stored
#     backward  ∂z_T = G_T ⊙ m_T,  ∂z_t = G_t ⊙ m_t + m_t ⊙ roll(∂z_{t+1}, −1)   t = T−1 … 1,  m_t = [h_t > 0]
#
# The shift never moves a register: the tile holds the state in a frame that turns with time,
# u_t[j] = h_t[(j + t) mod N] (t 0-based), in which roll(h_{t−1}, +1) is u_{t−1} itself:
# u_t[j] = ReLU(b_t[(j + t) mod N] + u_{t−1}[j]). So step t reads b_t and writes h_t at unit (j + t) mod N,
# and lane j keeps its value; the backward carries ∂z in the same frame. (Rolling the registers instead
# moves values across lanes every step: a tl.gather, which Triton 3.8 compiles for sm_90 to shuffles and
# two shared-memory layout changes a step, or h_{t−1} stored and read back shifted behind a
# tl.debug_barrier, which the interpreter runs as a no-op, so a missing barrier would not show on the
# CPU.) Every operation is
# elementwise (an add, a max, a 0/1 product) in `FusedShiftScan`'s order, so the states and ∂b are its
# numbers bit for bit on any device (an FMA of m ⊙ roll + G ⊙ m rounds once, as the add after an exact
# product does).


@triton.jit
def _shift_forward(
    b_ptr,  # [K, T, B, N] contiguous: the drives b_t
    hs_ptr,  # [K, T, B, N] contiguous, out: h_1 … h_T
    T,
    B,
    N,
    BLOCK_B: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    k = tl.program_id(0).to(tl.int64)  # the member
    rows = tl.program_id(1) * BLOCK_B + tl.arange(0, BLOCK_B)  # this program's batch slice
    cols = tl.arange(0, BLOCK_N)  # lanes j, padded to a power of two: masked
    m = (rows < B)[:, None] & (cols < N)[None, :]
    slab = B * N
    b = b_ptr + k * T * slab + rows[:, None] * N
    hs = hs_ptr + k * T * slab + rows[:, None] * N
    unit = cols % N  # (j + t) mod N, the unit lane j holds at step t (padded lanes kept in range too)
    # h_1 = ReLU(b_1 + roll(h_0 = 0)), torch.clamp's; NaN propagates, as torch's clamp and relu
    h = tl.maximum(tl.load(b + unit[None, :], mask=m, other=0.0), 0.0, propagate_nan=tl.PropagateNan.ALL)
    tl.store(hs + unit[None, :], h, mask=m)
    for t in range(1, T):
        unit = tl.where(unit == N - 1, 0, unit + 1)
        # ReLU(b_t + roll(h_{t−1}, +1)), torch.add's order
        h = tl.maximum(
            tl.load(b + t * slab + unit[None, :], mask=m, other=0.0) + h,
            0.0,
            propagate_nan=tl.PropagateNan.ALL,
        )
        tl.store(hs + t * slab + unit[None, :], h, mask=m)


@triton.jit
def _shift_backward(
    hs_ptr,  # [K, T, B, N]: the forward's states
    g_ptr,  # [K, T, B, N] ∂L/∂h_t, or with LAST [K, B, N] ∂L/∂h_T alone
    gz_ptr,  # [K, T, B, N] out: ∂L/∂z_t (= ∂L/∂b_t)
    T,
    B,
    N,
    LAST: tl.constexpr,
    BLOCK_B: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    k = tl.program_id(0).to(tl.int64)
    rows = tl.program_id(1) * BLOCK_B + tl.arange(0, BLOCK_B)
    cols = tl.arange(0, BLOCK_N)
    m = (rows < B)[:, None] & (cols < N)[None, :]
    slab = B * N
    hs = hs_ptr + k * T * slab + rows[:, None] * N
    gz = gz_ptr + k * T * slab + rows[:, None] * N
    g = g_ptr + k * (1 if LAST else T) * slab + rows[:, None] * N
    zero = tl.full([BLOCK_B, BLOCK_N], 0.0, dtype=hs_ptr.dtype.element_ty)
    unit = (cols + T - 1) % N  # the forward's frame at the last step, turned back one unit a step
    # t = T: ∂z_T = G_T ⊙ m_T (with LAST, G_T is all of g)
    mask = tl.where(tl.load(hs + (T - 1) * slab + unit[None, :], mask=m, other=0.0) > 0, 1.0, 0.0).to(
        zero.dtype
    )
    g_t = tl.load(g + (0 if LAST else (T - 1) * slab) + unit[None, :], mask=m, other=0.0)
    carry = g_t * mask
    tl.store(gz + (T - 1) * slab + unit[None, :], carry, mask=m)
    for i in range(T - 1):
        t = T - 2 - i  # 0-based, the reference's loop from T − 2 down to 0
        unit = tl.where(unit == 0, N - 1, unit - 1)  # lane j's carry is ∂z_{t+1} at unit j + t + 1
        mask = tl.where(tl.load(hs + t * slab + unit[None, :], mask=m, other=0.0) > 0, 1.0, 0.0).to(
            zero.dtype
        )
        # G_t ⊙ m_t first (with LAST, G_t = +0, the reference's zeroed buffer), then addcmul's m_t ⊙ roll
        g_t = zero if LAST else tl.load(g + t * slab + unit[None, :], mask=m, other=0.0)
        carry = g_t * mask + mask * carry
        tl.store(gz + t * slab + unit[None, :], carry, mask=m)


def shift_forward(b: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    """hs [K, T, B, N] (h_1 … h_T) from the drives b [K, T, B, N] (contiguous)."""
    _check_device(b)
    K, T, B, N = b.shape
    hs = out if out is not None else torch.empty_like(b)
    with _on_chip("SRNN shift forward", N):
        _shift_forward[(K, triton.cdiv(B, BLOCK_B))](
            b, hs, T, B, N, BLOCK_B=BLOCK_B, BLOCK_N=_block_n(N), num_warps=SHIFT_WARPS
        )
    return hs


def shift_backward(
    hs: torch.Tensor, g: torch.Tensor, last: bool, out: torch.Tensor | None = None
) -> torch.Tensor:
    """∂L/∂b [K, T, B, N] from the forward's hs and g: ∂L/∂h_t [K, T, B, N], or with `last` ∂L/∂h_T
    [K, B, N] (both contiguous)."""
    _check_device(hs)
    K, T, B, N = hs.shape
    gz = out if out is not None else torch.empty_like(hs)
    with _on_chip("SRNN shift backward", N):
        _shift_backward[(K, triton.cdiv(B, BLOCK_B))](
            hs, g, gz, T, B, N, LAST=last, BLOCK_B=BLOCK_B, BLOCK_N=_block_n(N), num_warps=SHIFT_WARPS
        )
    return gz


class PersistentShiftScan(torch.autograd.Function):
    """`FusedShiftScan` through the persistent kernel: the same inputs and outputs (`last`, a workspace,
    member k's drive b_k [T, B, N]; its states [T, B, N], or h_T [B, N] with `last`), the same numbers."""

    @staticmethod
    def forward(
        ctx: Any, last: bool, workspace: Workspace | None, *drives: torch.Tensor
    ) -> tuple[torch.Tensor, ...]:
        ws = workspace if workspace is not None else Workspace()
        (T, B, N), K = drives[0].shape, len(drives)
        b = torch.stack(drives, out=ws.get("drive", (K, T, B, N), drives[0]))
        hs = shift_forward(b, out=ws.get("hs", (K, T, B, N), drives[0]))
        ctx.last, ctx.workspace = last, ws
        ctx.save_for_backward(hs)
        return tuple(hs[:, T - 1].unbind(0) if last else hs.unbind(0))

    @staticmethod
    def backward(ctx: Any, *grads: torch.Tensor | None) -> tuple[torch.Tensor | None, ...]:
        (hs,) = ctx.saved_tensors
        K, T, B, N = hs.shape
        ws: Workspace = ctx.workspace
        shape = (K, B, N) if ctx.last else (K, T, B, N)
        g = torch.stack(
            [g if g is not None else hs.new_zeros(shape[1:]) for g in grads], out=ws.get("grad", shape, hs)
        )
        gz = shift_backward(hs, g, ctx.last, out=ws.get("drive", (K, T, B, N), hs))  # the drives are dead
        return (None, None, *gz.unbind(0))


def persistent_shift_scan(
    drives: Sequence[torch.Tensor], last: bool = False, workspace: Workspace | None = None
) -> tuple[torch.Tensor, ...]:
    """`FusedShiftScan.apply(last, workspace, *drives)` through the persistent kernel: K networks
    h_t = ReLU(b_t + roll(h_{t−1}, +1)) on their drives [T, B, N], member k's states [T, B, N] (or [B, N]
    with `last`). A solo run is a bundle of one. Outputs live in `workspace` until its next use."""
    return PersistentShiftScan.apply(last, workspace, *drives)  # type: ignore[no-any-return]
