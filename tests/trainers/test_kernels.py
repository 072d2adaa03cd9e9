"""The hand-written recurrent scan: exact gradients, and the same numbers as torch's native kernel."""

import pytest
import torch

from trainers.kernels import elman_rnn

pytestmark = pytest.mark.numerics  # CI runs them under every numerics mode


def inputs(seed: int = 0, T: int = 6, B: int = 3, N: int = 5, d: int = 2):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(T, B, d, generator=g, dtype=torch.double)
    h0 = torch.randn(B, N, generator=g, dtype=torch.double).requires_grad_()
    wi = torch.randn(N, d, generator=g, dtype=torch.double).requires_grad_()
    wr = (0.6 * torch.randn(N, N, generator=g, dtype=torch.double)).requires_grad_()
    b = torch.randn(N, generator=g, dtype=torch.double).requires_grad_()
    return x, h0, wi, wr, b


@pytest.mark.parametrize("nonlinearity", ["elu", "relu", "tanh"])
def test_scan_gradients_match_finite_differences(nonlinearity):
    x, h0, wi, wr, b = inputs()
    fn = lambda x, h0, wi, wr, b: elman_rnn(x, h0, wi, wr, b, nonlinearity, "scan")  # noqa: E731
    assert torch.autograd.gradcheck(fn, (x.requires_grad_(), h0, wi, wr, b))


@pytest.mark.parametrize("nonlinearity", ["elu", "relu", "tanh"])
def test_scan_matches_an_unrolled_autograd_reference(nonlinearity):
    x, h0, wi, wr, b = inputs(1)
    act = {"elu": torch.nn.functional.elu, "relu": torch.relu, "tanh": torch.tanh}[nonlinearity]
    h, ref = h0, []
    for t in range(x.shape[0]):
        h = act(x[t] @ wi.T + b + h @ wr.T)
        ref.append(h)
    ours = elman_rnn(x, h0, wi, wr, b, nonlinearity, "scan")
    assert torch.allclose(ours, torch.stack(ref), atol=1e-12)


@pytest.mark.parametrize("nonlinearity", ["relu", "tanh"])
def test_native_kernel_matches_scan_with_one_bias(nonlinearity):
    x, h0, wi, wr, b = inputs(2)
    a = elman_rnn(x, h0, wi, wr, b, nonlinearity, "scan")
    c = elman_rnn(x, h0, wi, wr, b, nonlinearity, "native")
    assert torch.allclose(a, c, atol=1e-12)
    ga = torch.autograd.grad(a.sum(), (wr, b))
    gc = torch.autograd.grad(c.sum(), (wr, b))
    assert all(torch.allclose(p, q, atol=1e-10) for p, q in zip(ga, gc, strict=True))


class _VFSpy:
    """torch._VF, recording how the native path hands its parameters over."""

    def __init__(self, real):
        self.real, self.contiguous = real, []

    def __getattr__(self, name):
        fn = getattr(self.real, name)

        def call(x, hx, params, *rest):
            self.contiguous.append([p.is_contiguous() for p in params])
            return fn(x, hx, params, *rest)

        return call


def test_native_kernel_gets_contiguous_weights_from_a_transposed_w(monkeypatch):
    """cuDNN views its weights into one flat buffer and refuses a transposed W ("view size is not
    compatible", seen on an H100: the chain and orthogonal initialisers' W is a Qᵀ); the native path
    hands over contiguous copies, through which the gradient still reaches W."""
    x, h0, wi, wr, b = inputs(3)
    w_t = wr.detach().t().contiguous().t().requires_grad_()  # W's values, laid out transposed
    assert not w_t.is_contiguous()
    spy = _VFSpy(torch._VF)
    monkeypatch.setattr(torch, "_VF", spy)
    out = elman_rnn(x, h0, wi, w_t, b, "relu", "native")
    assert spy.contiguous == [[True, True, True, True]]
    (grad,) = torch.autograd.grad(out.sum(), (w_t,))
    (ref,) = torch.autograd.grad(elman_rnn(x, h0, wi, wr, b, "relu", "scan").sum(), (wr,))
    assert torch.allclose(grad, ref, atol=1e-10)


@pytest.mark.parametrize("nonlinearity", ["relu", "tanh"])
def test_auto_is_the_scan_so_a_solo_run_computes_what_its_bundle_computes(nonlinearity, monkeypatch):
    """`auto` takes the scan (the kernel `FusedElmanScan` runs for a bundle) on every device: torch's
    kernel sums in another order, and a grid point that amplifies rounding then parts from its
    bundled run (docs/gpu.md). Here: auto never calls torch's kernel, and gives the scan's numbers."""
    x, h0, wi, wr, b = inputs(4)
    spy = _VFSpy(torch._VF)
    monkeypatch.setattr(torch, "_VF", spy)
    auto = elman_rnn(x, h0, wi, wr, b, nonlinearity, "auto")
    assert spy.contiguous == []
    assert torch.equal(auto, elman_rnn(x, h0, wi, wr, b, nonlinearity, "scan"))
    with pytest.raises(ValueError, match="backend 'cudnn': choose auto, scan, native or persistent"):
        elman_rnn(x, h0, wi, wr, b, nonlinearity, "cudnn")


def test_native_kernel_refuses_elu():
    x, h0, wi, wr, b = inputs()
    with pytest.raises(ValueError, match="no elu"):
        elman_rnn(x, h0, wi, wr, b, "elu", "native")


def test_elu_is_tensorflows_exp_minus_one():
    """Orhan & Pitkow's Keras code ran TensorFlow's Elu: a < 0 ? exp(a) − 1 : a (not expm1)."""
    from trainers.kernels import act_

    a = torch.linspace(-6.0, 3.0, 1001)
    h = act_(a.clone(), "elu")
    assert torch.equal(h, torch.where(a < 0, torch.exp(a) - 1.0, a))
    assert not torch.equal(h, torch.nn.functional.elu(a))  # torch's expm1 rounds differently somewhere
    assert torch.allclose(h, torch.nn.functional.elu(a), rtol=0, atol=1e-6)
