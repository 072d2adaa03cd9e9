"""Check 1a: every hand-written backward against autograd through its eager reference (references.py),
in float64 on the device, then against finite differences (torch's gradcheck) at a tiny shape."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Sequence

import torch

from benchmarks.gpu_check.judge import KERNEL_RTOL, failed, judged
from benchmarks.gpu_check.references import elman_ref, fastrnn_ref, gru_ref, janet_ref, nru_ref, shift_ref
from benchmarks.gpu_check.report import Report
from trainers.cells.fastrnn import fast_rnn, fused_fast_rnn
from trainers.cells.srnn import FusedShiftScan, ShiftScan
from trainers.kernels import ElmanScan, fused_elman_rnn
from trainers.kernels_gated import GRUScan, JANETScan
from trainers.kernels_nru import NRUScan

Fn = Callable[..., Sequence[torch.Tensor]]
Case = tuple[str, Fn, Fn, list[torch.Tensor]]  # name, the kernel, its reference, inputs that require grad
K = 3  # members of a fused scan


class Draw:
    """float64 tensors on the device from one seeded generator, drawn in the cases' order."""

    def __init__(self, device: torch.device, seed: int) -> None:
        self.device, self.g = device, torch.Generator().manual_seed(seed)

    def param(self, *shape: int, scale: float = 1.0) -> torch.Tensor:
        return (
            (scale * torch.randn(*shape, generator=self.g, dtype=torch.float64))
            .to(self.device)
            .requires_grad_()
        )

    def data(self, *shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=self.g, dtype=torch.float64).to(self.device)

    def uniform(self, low: float, width: float) -> torch.Tensor:
        """[K, 1] in [low, low + width), requiring grad (FastRNN's α, β)."""
        u = torch.rand(K, 1, generator=self.g, dtype=torch.float64)
        return (low + width * u).to(self.device).requires_grad_()

    def scalar(self, value: float) -> torch.Tensor:
        return torch.tensor([value], dtype=torch.float64, device=self.device).requires_grad_()


def kernel_cases(device: torch.device, T: int, B: int, N: int, d: int, seed: int) -> Iterator[Case]:
    """Every case in float64 on `device`, at sequence length T, batch B, hidden N and input d."""
    draw = Draw(device, seed)
    yield from elman_cases(draw, T, B, N, d)
    yield from fastrnn_cases(draw, T, B, N, d)
    yield from shift_cases(draw, T, B, N)
    yield from gated_cases(draw, T, B, N, d)
    yield from nru_cases(draw, T, B, N, d)


def elman_cases(draw: Draw, T: int, B: int, N: int, d: int) -> Iterator[Case]:
    w_scale = 0.9 / math.sqrt(N)
    for f in ("elu", "relu", "tanh"):
        x = draw.data(T, B, d)
        yield (
            f"ElmanScan {f}",
            lambda w_in, b, h0, w, x=x, f=f: (ElmanScan.apply(x, w_in, b, h0, w, f),),
            lambda w_in, b, h0, w, x=x, f=f: (elman_ref(x, w_in, b, h0, w, f),),
            [draw.param(N, d), draw.param(N), draw.param(B, N), draw.param(N, N, scale=w_scale)],
        )
        xs = [draw.data(T, B, d) for _ in range(K)]
        for last in (False, True):

            def ref_fused(h0, w_in, w, b, xs=xs, f=f, last=last):  # type: ignore[no-untyped-def]
                outs = [elman_ref(x, w_in[k], b[k], h0[k], w[k], f) for k, x in enumerate(xs)]
                return tuple(o[-1] if last else o for o in outs)

            yield (
                f"FusedElmanScan {f}{' last' if last else ''}",
                lambda h0, w_in, w, b, xs=xs, f=f, last=last: fused_elman_rnn(xs, h0, w_in, w, b, f, last),
                ref_fused,
                [
                    draw.param(K, B, N),
                    draw.param(K, N, d),
                    draw.param(K, N, N, scale=w_scale),
                    draw.param(K, N),
                ],
            )


def fastrnn_cases(draw: Draw, T: int, B: int, N: int, d: int) -> Iterator[Case]:
    w_scale = 0.9 / math.sqrt(N)
    for f in ("relu", "tanh"):
        for last in (False, True):
            yield (
                f"FastRNNScan {f}{' last' if last else ''}",
                lambda x, w_in, w, bias, a, b, f=f, last=last: (
                    fast_rnn(x, w_in, w, bias, a, b, f)[-1 if last else slice(None)],
                ),
                lambda x, w_in, w, bias, a, b, f=f, last=last: (
                    fastrnn_ref(x, w_in, w, bias, a, b, f)[-1 if last else slice(None)],
                ),
                [
                    draw.param(T, B, d),
                    draw.param(N, d),
                    draw.param(N, N, scale=w_scale),
                    draw.param(N),
                    draw.scalar(0.3),
                    draw.scalar(0.6),
                ],
            )
    xs = [draw.data(T, B, d) for _ in range(K)]
    for last in (False, True):

        def ref_fast(w_in, bias, w, a, b, xs=xs, last=last):  # type: ignore[no-untyped-def]
            outs = [fastrnn_ref(x, w_in[k], w[k], bias[k], a[k], b[k], "relu") for k, x in enumerate(xs)]
            return tuple(o[-1] if last else o for o in outs)

        yield (
            f"FusedFastRNNScan relu{' last' if last else ''}",
            lambda w_in, bias, w, a, b, xs=xs, last=last: fused_fast_rnn(
                xs, w_in, bias, w, a, b, "relu", last
            ),
            ref_fast,
            [
                draw.param(K, N, d),
                draw.param(K, N),
                draw.param(K, N, N, scale=w_scale),
                draw.uniform(0.2, 0.1),
                draw.uniform(0.5, 0.3),
            ],
        )


def shift_cases(draw: Draw, T: int, B: int, N: int) -> Iterator[Case]:
    yield ("ShiftScan", lambda b: (ShiftScan.apply(b),), lambda b: (shift_ref(b),), [draw.param(T, B, N)])
    for last in (False, True):
        yield (
            f"FusedShiftScan{' last' if last else ''}",
            lambda *bs, last=last: FusedShiftScan.apply(last, None, *bs),
            lambda *bs, last=last: tuple(shift_ref(b)[-1] if last else shift_ref(b) for b in bs),
            [draw.param(T, B, N) for _ in range(K)],
        )


def gated_cases(draw: Draw, T: int, B: int, N: int, d: int) -> Iterator[Case]:
    w_scale = 0.9 / math.sqrt(N)
    yield (
        "JANETScan",
        lambda x, w_ih, w_hh, bias, h0: (JANETScan.apply(x, w_ih, w_hh, bias, h0),),
        lambda x, w_ih, w_hh, bias, h0: (janet_ref(x, w_ih, w_hh, bias, h0),),
        [
            draw.param(T, B, d),
            draw.param(2 * N, d),
            draw.param(2 * N, N, scale=w_scale),
            draw.param(2 * N),
            draw.param(B, N),
        ],
    )
    yield (
        "GRUScan",
        lambda x, w_ih, w_hh, b_ih, b_hh, h0: (GRUScan.apply(x, w_ih, w_hh, b_ih, b_hh, h0),),
        lambda x, w_ih, w_hh, b_ih, b_hh, h0: (gru_ref(x, w_ih, w_hh, b_ih, b_hh, h0),),
        [
            draw.param(T, B, d),
            draw.param(3 * N, d),
            draw.param(3 * N, N, scale=w_scale),
            draw.param(3 * N),
            draw.param(3 * N),
            draw.param(B, N),
        ],
    )


def nru_cases(draw: Draw, T: int, B: int, N: int, d: int) -> Iterator[Case]:
    """Two variants: k=4 m=4 with mean over heads; k=2 m=8 with ρ = ReLU, LayerNorm and a sum."""
    for k, M, use_relu, ln, reduction in ((4, 4, False, False, "mean"), (2, 8, True, True, "sum")):
        s = math.isqrt(M * k)
        H = 2 * k + 4 * s
        scale = 1.0 / k if reduction == "mean" else 1.0
        inputs = [
            draw.param(T, B, d),
            draw.param(N, d + N + M, scale=0.5 / math.sqrt(N)),
            draw.param(N),
            draw.param(H, N + M, scale=0.5 / math.sqrt(N)),
            draw.param(H),
        ]
        if ln:
            gain = (1.0 + 0.2 * torch.randn(N, generator=draw.g, dtype=torch.float64)).to(draw.device)
            inputs += [gain.requires_grad_(), draw.param(N, scale=0.2)]

        def ours_nru(x, w, b, wh, bh, lnw=None, lnb=None, k=k, M=M, use_relu=use_relu, scale=scale):  # type: ignore[no-untyped-def]
            return NRUScan.apply(x, w, b, wh, bh, lnw, lnb, k, M, use_relu, scale, 1e-5, True)

        def ref_nru(x, w, b, wh, bh, lnw=None, lnb=None, k=k, M=M, use_relu=use_relu, reduction=reduction):  # type: ignore[no-untyped-def]
            return nru_ref(
                x, w, b, wh, bh, (lnw, lnb) if lnw is not None else None, k, M, use_relu, reduction
            )

        name = f"NRUScan k={k} m={M}{' relu' if use_relu else ''}{' layer-norm' if ln else ''} {reduction}"
        yield (name, ours_nru, ref_nru, inputs)


def check_kernels(report: Report, device: torch.device, quick: bool) -> None:
    """Each kernel's outputs and every input's gradient under a random projection, against autograd
    through its eager reference; then torch's gradcheck (finite differences) at a tiny shape."""
    section = "backward vs autograd (float64)"
    T, B, N, d = (12, 3, 6, 2) if quick else (40, 4, 16, 3)
    small = {name: (ours, inputs) for name, ours, _, inputs in kernel_cases(device, 4, 2, 4, 2, seed=1)}
    for name, ours, ref, inputs in kernel_cases(device, T, B, N, d, seed=0):
        try:
            check = judged(section, name, against_autograd(ours, ref, inputs, device), KERNEL_RTOL)
            s_ours, s_inputs = small[name]
            if not torch.autograd.gradcheck(s_ours, s_inputs, raise_exception=False):
                check.status, check.note = "FAIL", (check.note + " gradcheck failed").strip()
            else:
                check.note = (check.note + " gradcheck ok").strip()
            report.add(check)
        except Exception as exc:
            report.add(failed(section, name, exc))


def against_autograd(
    ours: Fn, ref: Fn, inputs: list[torch.Tensor], device: torch.device
) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """(ours, reference) pairs: the outputs, then every input's gradient of one random projection."""
    outs, refs = ours(*inputs), ref(*inputs)
    g = torch.Generator().manual_seed(7)
    weights = [torch.randn(r.shape, generator=g, dtype=r.dtype).to(device) for r in refs]
    loss_o = torch.stack([(o * w).sum() for o, w in zip(outs, weights, strict=True)]).sum()
    loss_r = torch.stack([(r * w).sum() for r, w in zip(refs, weights, strict=True)]).sum()
    grads_o = torch.autograd.grad(loss_o, inputs, allow_unused=True)
    grads_r = torch.autograd.grad(loss_r, inputs, allow_unused=True)
    pairs = list(zip(outs, refs, strict=True))
    for go, gr, x in zip(grads_o, grads_r, inputs, strict=True):
        pairs.append(
            (go if go is not None else torch.zeros_like(x), gr if gr is not None else torch.zeros_like(x))
        )
    return pairs
