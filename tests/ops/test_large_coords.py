"""Coordinates up to 2^31 - 1 in every family (issue 13, defects 1 and 2).

Without ``spatial_range`` the inferred extent ``max + 1`` reaches 2^31, which does not
fit int32; it must be computed wide.  Each family is run on coordinates whose maximum is
exactly 2^31 - 1 and on the same coordinates shifted down by ``SHIFT`` (a multiple of every
stride used, so convolution is translation-equivariant on the lattice).  The results
must match bitwise: the same rows shifted by ``SHIFT / stride`` in the same order, the
same features, the same gradients.  The shifted-down rows keep a margin from 0 so that
no output is clipped at the low end either.
"""

from __future__ import annotations

import pytest
import torch

import torch_lattice as tl
from torch_lattice import _C
from torch_lattice import nn as tnn
from torch_lattice.nn import functional as F

H = 2**31 - 1
LO, HI = 16, 23  # shifted-down coordinates lie in [LO, HI]
SHIFT = H - HI  # 2^31 - 24, a multiple of 8
DATAFLOWS = list(F.Dataflow)


def _coords(n: int = 40, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    rows = torch.randint(LO, HI + 1, (4 * n, 3), generator=g)
    b = torch.randint(0, 2, (4 * n, 1), generator=g)
    rows = torch.unique(torch.cat([b, rows], dim=1), dim=0)[:n]
    rows[-1] = torch.tensor([1, HI, HI, HI])  # the top corner: 2^31 - 1 once shifted up
    return torch.unique(rows, dim=0)


def _pair(channels: int = 3, seed: int = 0, spatial_range=None):
    lo = _coords(seed=seed)
    hi = lo.clone()
    hi[:, 1:] += SHIFT
    assert int(hi.max()) == H
    feats = torch.randn(
        len(lo), channels, dtype=torch.float64, generator=torch.Generator().manual_seed(seed)
    )
    x_lo = tl.SparseTensor(feats.clone().requires_grad_(), lo)
    x_hi = tl.SparseTensor(feats.clone().requires_grad_(), hi, spatial_range=spatial_range)
    return x_lo, x_hi


def _check_same(y_lo, y_hi, stride: int) -> None:
    assert y_lo.stride == y_hi.stride
    expect = y_lo.coords.long().clone()
    expect[:, 1:] += SHIFT // stride
    assert torch.equal(y_hi.coords.long(), expect)
    assert torch.equal(y_lo.feats, y_hi.feats)


def _run_pair(make, x_lo, x_hi, stride: int):
    """Runs ``make(x)`` (returns a SparseTensor) on both, compares values and grads."""
    torch.manual_seed(1)
    y_lo = make(x_lo)
    torch.manual_seed(1)
    y_hi = make(x_hi)
    _check_same(y_lo, y_hi, stride)
    g = torch.randn_like(y_lo.feats)
    (gl,) = torch.autograd.grad(y_lo.feats, x_lo.feats, g)
    (gh,) = torch.autograd.grad(y_hi.feats, x_hi.feats, g)
    assert torch.equal(gl, gh)
    return y_lo, y_hi


def _module(cls, *args, **kwargs):
    torch.manual_seed(7)
    return cls(*args, **kwargs).double()


@pytest.mark.parametrize("dataflow", DATAFLOWS, ids=lambda d: d.name)
@pytest.mark.parametrize(
    "name,factory,stride",
    [
        ("subm3", lambda c: _module(tnn.SubmConv3d, 3, 4, 3, **c), 1),
        ("subm3_dil2", lambda c: _module(tnn.SubmConv3d, 3, 4, 3, dilation=2, **c), 1),
        ("conv_k2s2", lambda c: _module(tnn.Conv3d, 3, 4, 2, stride=2, **c), 2),
        ("conv_k3s2p1", lambda c: _module(tnn.Conv3d, 3, 4, 3, stride=2, padding=1, **c), 2),
        ("conv_k3s1p1", lambda c: _module(tnn.Conv3d, 3, 4, 3, stride=1, padding=1, **c), 1),
        ("conv_k3s1", lambda c: _module(tnn.Conv3d, 3, 4, 3, stride=1, **c), 1),
        ("norm_subm3", lambda c: _module(tnn.NormalizedSubmConv3d, 3, 4, 3, **c), 1),
    ],
)
def test_conv_families_near_int32_max(name, factory, stride, dataflow):
    x_lo, x_hi = _pair()
    layer = factory({"config": F.ConvConfig(dataflow=dataflow)})
    _run_pair(layer, x_lo, x_hi, stride)
    # weight gradients too
    layer.zero_grad()
    layer(x_lo).feats.square().sum().backward()
    w_lo = layer.weight.grad.clone()
    layer.zero_grad()
    layer(x_hi).feats.square().sum().backward()
    assert torch.equal(w_lo, layer.weight.grad)


@pytest.mark.parametrize(
    "name,factory",
    [
        ("transpose", lambda: _module(tnn.ConvTranspose3d, 4, 2, 2, stride=2)),
        ("transpose_k3p1", lambda: _module(tnn.ConvTranspose3d, 4, 2, 3, stride=2, padding=1)),
        ("generative", lambda: _module(tnn.GenerativeConvTranspose3d, 4, 2, 2, stride=2)),
        ("norm_transpose", lambda: _module(tnn.NormalizedConvTranspose3d, 4, 2, 2, stride=2)),
        (
            "norm_generative",
            lambda: _module(tnn.NormalizedGenerativeConvTranspose3d, 4, 2, 2, stride=2),
        ),
    ],
)
def test_transpose_families_near_int32_max(name, factory):
    x_lo, x_hi = _pair()
    down = _module(
        tnn.Conv3d, 3, 4, 3 if "k3p1" in name else 2, stride=2, padding=1 if "k3p1" in name else 0
    )
    up = factory()

    def net(x):
        return up(down(x))

    _y_lo, y_hi = _run_pair(net, x_lo, x_hi, 1)
    if "generative" not in name:  # the inverse transpose returns onto the input support
        assert torch.equal(y_hi.coords, x_hi.coords)
    else:  # generated fine rows reach 2^31 - 1 (SHIFT and HI + 1 are even)
        assert int(y_hi.coords[:, 1:].max()) == H


@pytest.mark.parametrize("cls", [tnn.MaxPool3d, tnn.AvgPool3d, tnn.SumPool3d])
@pytest.mark.parametrize("ks,stride,padding", [(2, 2, 0), (3, 2, 1), (3, 1, 1)])
def test_pooling_near_int32_max(cls, ks, stride, padding):
    x_lo, x_hi = _pair()
    pool = cls(ks, stride, padding)
    _run_pair(pool, x_lo, x_hi, stride)


def test_global_pooling_near_int32_max():
    x_lo, x_hi = _pair()
    for pool in (tnn.GlobalAvgPool(), tnn.GlobalMaxPool()):
        assert torch.equal(pool(x_lo), pool(x_hi))


def test_explicit_extent_matches_inferred():
    """spatial_range = 2^31 on every axis gives what the inferred extent gives."""
    _x_lo, x_hi = _pair()
    _, x_ex = _pair(spatial_range=(2, 2**31, 2**31, 2**31))
    assert x_hi.support.grid_range() == (2**31, 2**31, 2**31)
    for layer in (
        _module(tnn.Conv3d, 3, 4, 2, stride=2),
        _module(tnn.Conv3d, 3, 4, 3, stride=2, padding=1),
        tnn.MaxPool3d(2, 2),
    ):
        a, b = layer(x_hi), layer(x_ex)
        assert torch.equal(a.coords, b.coords)
        assert torch.equal(a.feats, b.feats)
        assert b.spatial_range[1:] == (2**30,) * 3


def test_voxelize_devoxelize_near_int32_max():
    g = torch.Generator().manual_seed(3)
    # Multiples of 1/1024, so that lo + SHIFT (< 2^31) and every fraction are exact.
    lo = torch.randint(LO * 1024, (HI + 1) * 1024, (200, 3), generator=g).double() / 1024
    hi = lo + SHIFT
    assert torch.equal(hi - SHIFT, lo)
    feats = torch.randn(200, 2, dtype=torch.float64, generator=g)
    v_lo = tl.voxelize(lo, feats, reduction="mean")
    v_hi = tl.voxelize(hi, feats, reduction="mean")
    _check_same(v_lo, v_hi, 1)
    assert int(v_hi.coords[:, 1:].max()) <= H
    for interp in ("nearest", "trilinear"):
        a = tl.devoxelize(lo, v_lo, interpolation=interp)
        b = tl.devoxelize(hi, v_hi, interpolation=interp)
        assert torch.equal(a, b), interp


def test_padding_past_int32_names_padding_and_range():
    """Defect 2: outputs past 2^31 - 1 raise a ValueError naming padding and the range."""
    _, x_hi = _pair()
    _, x_ex = _pair(spatial_range=(2, 2**31, 2**31, 2**31))
    for x in (x_hi, x_ex):
        with pytest.raises(ValueError, match=r"padding \(2, 2, 2\).*spatial_range.*2\^31"):
            _module(tnn.Conv3d, 3, 4, 3, stride=1, padding=2)(x)
        with pytest.raises(ValueError, match=r"padding.*int32"):
            tnn.MaxPool3d(2, 1, padding=1)(x)


def test_generative_past_int32_names_stride():
    _, x_hi = _pair()
    with pytest.raises(ValueError, match=r"stride.*kernel_size.*int32"):
        # stride-1 input, generative stride 1 kernel 2: 2^31 - 1 + 1 overflows
        _module(tnn.GenerativeConvTranspose3d, 3, 2, 2, stride=1)(x_hi)


GEOM = ((3, 3, 3), (1, 1, 1), (0, 0, 0), (1, 1, 1))


@pytest.mark.parametrize(
    "fn,args,pattern",
    [
        ("generate", (0, 0, GEOM, (2**31 + 1, 1, 1), 0, 0), r"generate: out_range\[0\].*2\^31"),
        ("generate", (0, 0, GEOM, (1, -1, 1), 0, 0), r"generate: out_range\[1\]"),
        ("generate_bound", (0, GEOM, (1, 1, 2**31 + 5), 1), r"generate_bound: out_range\[2\]"),
        ("generate_bound", (-1, GEOM, (1, 1, 1), 1), r"generate_bound: n_in"),
        ("generate", (0, -1, GEOM, (1, 1, 1), 0, 0), r"generate: n_in"),
        (
            "generate",
            (0, 0, ((3, 0, 3), (1, 1, 1), (0, 0, 0), (1, 1, 1)), (1, 1, 1), 0, 0),
            r"generate: kernel_size must be >= 1.*axis 1",
        ),
        (
            "generate",
            (0, 0, ((3, 3, 3), (1, 1, 1), (0, -1, 0), (1, 1, 1)), (1, 1, 1), 0, 0),
            r"generate: padding must be >= 0",
        ),
        (
            "generative",
            (0, 0, ((2, 2, 2), (0, 1, 1), (0, 0, 0), (1, 1, 1)), 0, 0),
            r"generative: stride must be >= 1",
        ),
        (
            "kmap_build",
            (0, 0, 0, 0, ((3, 3, 3), (1, 1, 1), (0, 0, 0), (1, 1, 0)), 0, 1),
            r"kmap_build: dilation must be >= 1",
        ),
        (
            "generate",
            (0, 0, ((65536, 65536, 1), (1, 1, 1), (0, 0, 0), (1, 1, 1)), (1, 1, 1), 0, 0),
            r"generate: kernel_size volume .* int32",
        ),
    ],
)
def test_c_errors_name_argument_and_rule(fn, args, pattern):
    """Defect 2 at the C boundary: no bare "invalid argument"."""
    with pytest.raises((ValueError, OverflowError), match=pattern):
        getattr(_C, fn)(*args)


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("dataflow", DATAFLOWS, ids=lambda d: d.name)
def test_cuda_near_int32_max_matches_cpu(dataflow):
    """The CUDA supports, maps and kernels accept coordinates up to 2^31 - 1."""
    _, x_hi = _pair()
    cfg = {"config": F.ConvConfig(dataflow=dataflow)}
    layers = [
        _module(tnn.SubmConv3d, 3, 4, 3, **cfg),
        _module(tnn.Conv3d, 3, 4, 3, stride=2, padding=1, **cfg),
        _module(tnn.Conv3d, 3, 4, 2, stride=2, **cfg),
        tnn.MaxPool3d(3, 2, 1),
    ]
    x_cuda = tl.SparseTensor(x_hi.feats.detach().float().cuda(), x_hi.coords.cuda())
    for layer in layers:
        ref = layer(x_hi)
        got = layer.float().cuda()(x_cuda)
        layer.double().cpu()
        assert torch.equal(got.coords.cpu(), ref.coords)
        torch.testing.assert_close(got.feats.double().cpu(), ref.feats, rtol=1e-4, atol=1e-4)
    down = _module(tnn.Conv3d, 3, 4, 2, stride=2)
    gen = _module(tnn.GenerativeConvTranspose3d, 4, 2, 2, stride=2)
    ref = gen(down(x_hi))
    got = gen.float().cuda()(down.float().cuda()(x_cuda))
    assert torch.equal(got.coords.cpu(), ref.coords)
    torch.testing.assert_close(got.feats.double().cpu(), ref.feats, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("dataflow", DATAFLOWS, ids=lambda d: d.name)
def test_target_conditioned_near_int32_max(dataflow):
    """Conv3d(..., coordinates=) and ConvTranspose3d(src, target) on rows near 2^31 - 1."""
    x_lo, x_hi = _pair()
    cfg = F.ConvConfig(dataflow=dataflow)
    down = _module(tnn.Conv3d, 3, 4, 3, stride=2, padding=1, config=cfg)
    up = _module(tnn.ConvTranspose3d, 4, 2, 3, stride=2, padding=1)

    def net(x):
        coarse = torch.unique(x.coords.long() // torch.tensor([1, 2, 2, 2]), dim=0)
        y = down(x, coordinates=coarse)
        return up(y, x.coords)

    _y_lo, y_hi = _run_pair(net, x_lo, x_hi, 1)
    assert torch.equal(y_hi.coords, x_hi.coords)
