"""bfloat16 and float16 convolutions on the CPU run in their own type: float sums, one
rounding per output, for every instruction set.

Implicit GEMM's forward, input gradient (the same kernel on the transposed map) and
weight gradient read half-type features and weights as they are: the bfloat16 forward
through AMX tiles where the CPU has them (``amx_bf16``), bfloat16 through vdpbf16ps dot
products where the CPU has AVX512_BF16 (``avx512_bf16``), otherwise both
types through float rows converted in registers (F16C for float16).  TORCH_LATTICE_CPU_ISA
caps the instruction set, so this machine runs the narrower paths too.  The reference
is the float64 dense oracle of the same half-valued inputs: every output must be that
value rounded once to the half type (within the float sums' own error), not rounded
after each kernel row.
"""

from __future__ import annotations

import copy

import pytest
import torch
from cpu_isa_helpers import widest_isa
from dense_oracle import dense_subm

import torch_lattice as tl
from torch_lattice.nn import functional as F
from torch_lattice.ops._runtime import _C
from torch_lattice.ops.conv import sparse_conv

HALF = [torch.bfloat16, torch.float16]
ISAS = ["amx_bf16", "avx512_bf16", "avx512", "avx2", "baseline"]
# The levels whose bfloat16 kernels read subnormal inputs and products as 0 (the rule of
# both vdpbf16ps and tdpbf16ps).
FLUSHING = ("amx_bf16", "avx512_bf16")
# (c_in, c_out): odd c_in (a lone last channel for the pair kernels), single
# columns, partial 16-column vectors, 4+2+1 vector blocks (112 = 64 + 32 + 16),
# panels (260x72: wider than one L1 panel) and two column tiles (40x400).
CHANNELS = [(1, 1), (3, 17), (7, 37), (16, 16), (33, 112), (64, 64), (5, 130), (260, 72),
            (40, 400)]


def _runnable(isa: str) -> bool:
    """Whether capping at ``isa`` runs ``isa``'s kernels on this CPU."""
    return ISAS.index(isa) >= ISAS.index(widest_isa())


def _scene(cin: int, dtype: torch.dtype, points: int = 700,
           extent: int = 9) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(cin)
    coords = torch.unique(torch.randint(0, extent, (points, 4), generator=g), dim=0)
    coords[:, 0] %= 2
    coords = torch.unique(coords, dim=0)
    return torch.randn(coords.shape[0], cin, generator=g).to(dtype), coords


def _ulp(ref: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """One unit in the last place of ``dtype`` at each value of ``ref`` (float64)."""
    info = torch.finfo(dtype)
    exp = torch.floor(torch.log2(ref.abs().clamp_min(info.smallest_normal)))
    return torch.exp2(exp) * info.eps


def _assert_rounded_once(y: torch.Tensor, ref: torch.Tensor, dtype: torch.dtype,
                         sums: int, allowance: torch.Tensor | float = 0.0) -> None:
    """``y`` is ``ref`` rounded to ``dtype``: within half an ulp, plus the float sums'
    own error over ``sums`` terms and ``allowance``."""
    assert y.dtype == dtype
    scale = float(ref.abs().max()) if ref.numel() else 0.0
    bound = 0.5 * _ulp(ref, dtype) + sums * 2.0**-23 * max(scale, 1.0) + allowance
    err = (y.double() - ref).abs()
    worst = float((err - bound).max().detach()) if err.numel() else 0.0
    assert worst <= 0, f"an output is off by more than its rounding ({worst:.3g} beyond)"


def _amx_only() -> None:
    if widest_isa() != "amx_bf16":
        pytest.skip(f"this CPU has no AMX tiles (widest: {widest_isa()})")


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("dtype", HALF, ids=["bf16", "fp16"])
@pytest.mark.parametrize("channels", CHANNELS, ids=lambda c: f"{c[0]}x{c[1]}")
def test_half_forward_and_gradients_are_rounded_once(
    isa: str, dtype: torch.dtype, channels: tuple[int, int], monkeypatch: pytest.MonkeyPatch
) -> None:
    if not _runnable(isa):
        pytest.skip(f"this CPU has no {isa} kernels (widest: {widest_isa()})")
    monkeypatch.setenv("TORCH_LATTICE_CPU_ISA", isa)
    _check_rounded_once(dtype, channels, _scene(channels[0], dtype))


# float16 shapes on the tiles: the forward only (16 x 32 up to 64 x 64), both (from
# 64 x 64), odd c_in, partial 16-column blocks, two column tiles.
AMX_F16_CHANNELS = [(16, 32), (33, 112), (5, 130), (64, 64), (96, 96), (260, 72), (40, 400)]


@pytest.mark.parametrize("channels", AMX_F16_CHANNELS, ids=lambda c: f"{c[0]}x{c[1]}")
def test_amx_float16_is_rounded_once(channels: tuple[int, int],
                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """float16 through the AMX tiles, on a scene of enough rows for the forward to take
    them (256; 1024 here): as the other kernels, each output within half a float16 ulp
    of the float64 oracle plus the float sums' own error."""
    _amx_only()
    monkeypatch.setenv("TORCH_LATTICE_CPU_ISA", "amx_bf16")
    feats, coords = _scene(channels[0], torch.float16, 3000, 16)
    assert feats.shape[0] >= 1024
    _check_rounded_once(torch.float16, channels, (feats, coords))


def _check_rounded_once(dtype: torch.dtype, channels: tuple[int, int],
                        scene: tuple[torch.Tensor, torch.Tensor]) -> None:
    """A SubmConv3d's forward, input and weight gradients in ``dtype`` against the
    float64 dense oracle of the same half-valued inputs."""
    cin, cout = channels
    feats, coords = scene
    torch.manual_seed(cout)
    conv = tl.nn.SubmConv3d(cin, cout, 3, bias=False).to(dtype)
    conv.config = F.ConvConfig(dataflow=F.Dataflow.ImplicitGEMM)
    x = feats.clone().requires_grad_()
    y = conv(tl.SparseTensor(x, coords)).feats
    gy = torch.randn(y.shape, generator=torch.Generator().manual_seed(5)).to(dtype)
    dx, dw = torch.autograd.grad(y, [x, conv.weight], gy)

    x64 = feats.double().requires_grad_()
    w64 = conv.weight.detach().double().requires_grad_()
    ref = dense_subm(x64, coords, w64, None, 3)
    ref_dx, ref_dw = torch.autograd.grad(ref, [x64, w64], gy.double())
    # The weight gradient sums over pairs: its float error is bounded by the sum of
    # the absolute products (the same oracle on |x| and |dy|).
    w_abs = torch.zeros_like(w64).requires_grad_()
    abs_ref = dense_subm(x64.detach().abs(), coords, w_abs, None, 3)
    (abs_dw,) = torch.autograd.grad(abs_ref, [w_abs], gy.double().abs())
    _assert_rounded_once(y, ref.detach(), dtype, 27 * cin)
    _assert_rounded_once(dx, ref_dx, dtype, 27 * cout)
    _assert_rounded_once(dw, ref_dw, dtype, 0, 2.0**-16 * abs_dw)


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("dtype", HALF, ids=["bf16", "fp16"])
def test_half_values_convert_exactly(isa: str, dtype: torch.dtype,
                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """A 1x1x1 convolution by 1 returns every half value (all 65,536 bit patterns)
    as it was: the conversions to float and back lose nothing, infinities stay, NaN
    stays NaN.  bfloat16 dot products and tiles treat subnormal inputs as 0
    (AVX512_BF16's and AMX-BF16's rule), an error below the smallest normal."""
    if not _runnable(isa):
        pytest.skip(f"this CPU has no {isa} kernels (widest: {widest_isa()})")
    monkeypatch.setenv("TORCH_LATTICE_CPU_ISA", isa)
    bits = torch.arange(-(2**15), 2**15, dtype=torch.int32).to(torch.int16)
    x = bits.view(dtype).reshape(-1, 1)
    y = _pointwise(x, torch.ones(1, 1, 1, dtype=dtype))
    nan = torch.isnan(x)
    assert torch.equal(torch.isnan(y), nan)
    xf, yf = x[~nan].double(), y[~nan].double()
    if isa in FLUSHING and dtype is torch.bfloat16:
        sub = xf.abs() < torch.finfo(dtype).smallest_normal
        assert torch.equal(yf[~sub], xf[~sub])
        assert bool((yf[sub] == 0).all())
    else:
        assert torch.equal(yf, xf)


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("dtype", HALF, ids=["bf16", "fp16"])
def test_half_outputs_round_like_torch(isa: str, dtype: torch.dtype,
                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """One product per output is exact in float, so the result is torch's own rounding
    of it, bit for bit: ties to even, overflow to infinity, subnormal results kept."""
    if not _runnable(isa):
        pytest.skip(f"this CPU has no {isa} kernels (widest: {widest_isa()})")
    monkeypatch.setenv("TORCH_LATTICE_CPU_ISA", isa)
    g = torch.Generator().manual_seed(3)
    info = torch.finfo(dtype)
    # Magnitudes from below the smallest normal to past the largest finite value.
    lo, hi = torch.log2(torch.tensor(info.tiny)) - 8, torch.log2(torch.tensor(info.max)) + 1
    mag = torch.exp2(lo + (hi - lo) * torch.rand(20000, generator=g))
    x = (mag * torch.randn(20000, generator=g).sign()).to(dtype).reshape(-1, 1)
    x = x[torch.isfinite(x.float()).squeeze(1)]
    if isa in FLUSHING and dtype is torch.bfloat16:  # subnormal inputs read as 0
        x = x[(x.float().abs() >= info.smallest_normal).squeeze(1)]
    for w in (1.0, 0.3, 1.7, 3.1, 1e-3, 2.0**-7, 300.0):
        wt = torch.tensor(w, dtype=dtype).reshape(1, 1, 1)
        y = _pointwise(x, wt)
        product = x.float() * wt.float().reshape(())
        expect = product.to(dtype)
        if isa in FLUSHING and dtype is torch.bfloat16:  # subnormal products: 0
            small = product.abs() < info.smallest_normal
            expect = torch.where(small, torch.zeros_like(expect), expect)
            y = torch.where(small, torch.zeros_like(y), y)
        assert torch.equal(y, expect), f"weight {w}"


def _pointwise(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """``x @ weight[0]`` through the implicit-GEMM op on a one-row map (one product per
    output).  Not through a 1x1x1 module: that one runs torch's own matmul."""
    row = torch.arange(x.shape[0], dtype=torch.int32).reshape(-1, 1)
    return sparse_conv(x, weight, row, row)


def test_bf16_cap_selects_the_dot_product_kernels(monkeypatch: pytest.MonkeyPatch) -> None:
    """avx512_bf16 runs other kernels than avx512 (dot products of channel pairs, whose
    sums round differently in the last float bits); both stay within bfloat16's
    rounding of each other."""
    if not _runnable("avx512_bf16"):
        pytest.skip(f"this CPU has no AVX512_BF16 (widest: {widest_isa()})")
    feats, coords = _scene(64, torch.bfloat16)
    torch.manual_seed(0)
    conv = tl.nn.SubmConv3d(64, 64, 3, bias=False).to(torch.bfloat16)
    out = {}
    for isa in ("avx512_bf16", "avx512"):
        monkeypatch.setenv("TORCH_LATTICE_CPU_ISA", isa)
        assert _C.cpu_isa() == isa
        with torch.no_grad():
            out[isa] = conv(tl.SparseTensor(feats, coords)).feats
    assert not torch.equal(out["avx512_bf16"], out["avx512"])
    torch.testing.assert_close(out["avx512_bf16"], out["avx512"], rtol=2**-7, atol=1e-2)


def test_amx_cap_selects_the_tile_kernels(monkeypatch: pytest.MonkeyPatch) -> None:
    """amx_bf16 runs the bfloat16 forward through AMX tiles, other kernels than
    avx512_bf16's dot products (the tile unit sums the channels in its own order);
    both stay within bfloat16's rounding of each other, for the forward and for the
    input gradient (the same kernel on the transposed map)."""
    if widest_isa() != "amx_bf16":
        pytest.skip(f"this CPU has no AMX tiles (widest: {widest_isa()})")
    feats, coords = _scene(64, torch.bfloat16)
    torch.manual_seed(0)
    conv = tl.nn.SubmConv3d(64, 96, 3, bias=False).to(torch.bfloat16)
    conv.config = F.ConvConfig(dataflow=F.Dataflow.ImplicitGEMM)
    gy = torch.randn(feats.shape[0], 96, generator=torch.Generator().manual_seed(1))
    out, grad = {}, {}
    for isa in ("amx_bf16", "avx512_bf16"):
        monkeypatch.setenv("TORCH_LATTICE_CPU_ISA", isa)
        assert _C.cpu_isa() == isa
        x = feats.clone().requires_grad_()
        out[isa] = conv(tl.SparseTensor(x, coords)).feats
        (grad[isa],) = torch.autograd.grad(out[isa], [x], gy.to(torch.bfloat16))
    assert not torch.equal(out["amx_bf16"], out["avx512_bf16"])
    for got in (out, grad):
        torch.testing.assert_close(got["amx_bf16"], got["avx512_bf16"], rtol=2**-7, atol=1e-2)


def test_amx_float16_products_are_exact(monkeypatch: pytest.MonkeyPatch) -> None:
    """float16 layers of 16 x 32 multiply-adds per pair and more run through the AMX
    tiles as sums of four bfloat16 products (each value split into a high and a low
    part).  With one nonzero channel per row each output is one product, so it must be
    torch's rounding of the exact product, bit for bit; dropping any of the four
    products (the low parts' 2^-16-relative one included) shows up here."""
    _amx_only()
    monkeypatch.setenv("TORCH_LATTICE_CPU_ISA", "amx_bf16")
    g = torch.Generator().manual_seed(11)
    n, cin, cout = 4000, 32, 48
    info = torch.finfo(torch.float16)
    mag = torch.exp2(torch.empty(n).uniform_(-20.0, 7.0, generator=g))
    x = torch.zeros(n, cin, dtype=torch.float16)
    x[:, 5] = (mag * torch.randn(n, generator=g).sign()).to(torch.float16)
    w = (torch.randn(1, cin, cout, generator=g) * 3).to(torch.float16)
    y = _pointwise(x, w)
    expect = (x[:, 5:6].float() * w[0, 5:6].float()).to(torch.float16)
    assert bool((expect.float().abs() < info.max).all())
    assert torch.equal(y, expect)


@pytest.mark.parametrize("where", ["x", "weight", "dy"])
def test_amx_float16_infinities_and_nan_take_the_float_kernels(
    where: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An infinity or NaN does not split into two finite parts, so a call that meets
    one (in x, the weights, or dy) reruns through the float kernels: the two results
    that read it have the same bits as the float kernels' (cap avx512), infinities and
    NaN where they have them, not NaN from infinity minus infinity."""
    _amx_only()
    cin = cout = 128  # the tiles for the forward and for the weight gradient
    feats, coords = _scene(cin, torch.float16, 3000, 16)
    torch.manual_seed(3)
    conv = tl.nn.SubmConv3d(cin, cout, 3, bias=False).to(torch.float16)
    conv.config = F.ConvConfig(dataflow=F.Dataflow.ImplicitGEMM)
    gy = torch.randn(feats.shape[0], cout, generator=torch.Generator().manual_seed(2))
    gy = gy.to(torch.float16)
    special = {"x": feats, "weight": conv.weight.data, "dy": gy}[where]
    special.view(-1)[[7, 900]] = torch.tensor([float("inf"), float("nan")], dtype=torch.float16)
    got = {}
    for isa in ("amx_bf16", "avx512"):
        monkeypatch.setenv("TORCH_LATTICE_CPU_ISA", isa)
        x = feats.clone().requires_grad_()
        y = conv(tl.SparseTensor(x, coords)).feats
        got[isa] = (y, *torch.autograd.grad(y, [x, conv.weight], gy))
    reads = {"x": ("y", "dw"), "weight": ("y", "dx"), "dy": ("dx", "dw")}[where]
    for name, a, b in zip(("y", "dx", "dw"), got["amx_bf16"], got["avx512"], strict=True):
        assert torch.equal(a.isnan(), b.isnan())
        if name in reads:
            assert torch.equal(a.nan_to_num(), b.nan_to_num()), name
            assert not bool(a.isfinite().all()), name


def test_amx_float16_matches_the_float_kernels(monkeypatch: pytest.MonkeyPatch) -> None:
    """The float16 tile path and the float kernels (F16C) both sum exact float16
    products in float: their forwards, input and weight gradients agree within one
    float16 rounding, and the tiles are taken (the bits differ)."""
    _amx_only()
    feats, coords = _scene(96, torch.float16, 3000, 16)
    torch.manual_seed(4)
    conv = tl.nn.SubmConv3d(96, 80, 3, bias=False).to(torch.float16)
    conv.config = F.ConvConfig(dataflow=F.Dataflow.ImplicitGEMM)
    gy = torch.randn(feats.shape[0], 80, generator=torch.Generator().manual_seed(6))
    got = {}
    for isa in ("amx_bf16", "avx512"):
        monkeypatch.setenv("TORCH_LATTICE_CPU_ISA", isa)
        x = feats.clone().requires_grad_()
        y = conv(tl.SparseTensor(x, coords)).feats
        got[isa] = (y, *torch.autograd.grad(y, [x, conv.weight], gy.to(torch.float16)))
    for a, b in zip(got["amx_bf16"], got["avx512"], strict=True):
        assert not torch.equal(a, b)
        scale = float(b.detach().abs().max())  # float sums' own error: far below 1e-3
        torch.testing.assert_close(a, b, rtol=2**-10, atol=1e-3 * scale)


def test_amx_float16_values_convert_exactly(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every finite float16 bit pattern (subnormals and the largest values included)
    through a 32 -> 32 identity layer on the tile path comes back as it was: the split
    into bfloat16 parts and their products lose nothing.  (-0 comes back as +0, as from
    any sum with a +0 term: x * 1 + 0 * 0.)"""
    _amx_only()
    monkeypatch.setenv("TORCH_LATTICE_CPU_ISA", "amx_bf16")
    bits = torch.arange(-(2**15), 2**15, dtype=torch.int32).to(torch.int16)
    values = bits.view(torch.float16)
    values = values[torch.isfinite(values)]
    x = values.reshape(-1, 32)
    y = _pointwise(x, torch.eye(32, dtype=torch.float16).reshape(1, 32, 32))
    assert torch.equal(y.float(), x.float())


# Where the half types are staged through the float kernels (no dot-product or tile
# kernels at these caps), their forward adds the same products in the same order.
# AVX-512's staged kernels are built the same way but have not been checked bit for bit
# on an AVX-512 CPU yet (docs/benchmarks/README.md, round thirty-five), so not listed.
STAGED = ["avx2", "baseline"]


@pytest.mark.parametrize("isa", STAGED)
@pytest.mark.parametrize("dtype", HALF, ids=["bf16", "fp16"])
@pytest.mark.parametrize("channels", [(16, 16), (40, 24), (64, 64), (260, 72)],
                         ids=lambda c: f"{c[0]}x{c[1]}")
@pytest.mark.parametrize("family", ["subm_k3", "k3_s2_p1", "k2_s2"])
def test_staged_half_forward_is_the_float_forward_rounded(
    isa: str, dtype: torch.dtype, channels: tuple[int, int], family: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The staged forward and input gradient in ``dtype`` are the float32 ones of the same
    values rounded once, bit for bit: the same tiles, panels and kernel-row order (the
    centre first on odd kernels), so a half-type model agrees with its float32 twin."""
    if not _runnable(isa):
        pytest.skip(f"this CPU has no {isa} kernels (widest: {widest_isa()})")
    monkeypatch.setenv("TORCH_LATTICE_CPU_ISA", isa)
    cin, cout = channels
    feats, coords = _scene(cin, dtype, 6000, 24)
    torch.manual_seed(cin + cout)
    conv = {"subm_k3": lambda: tl.nn.SubmConv3d(cin, cout, 3, bias=False),
            "k3_s2_p1": lambda: tl.nn.Conv3d(cin, cout, 3, stride=2, padding=1, bias=False),
            "k2_s2": lambda: tl.nn.Conv3d(cin, cout, 2, stride=2, bias=False)}[family]()
    conv.config = F.ConvConfig(dataflow=F.Dataflow.ImplicitGEMM)
    conv.weight.data = conv.weight.data.to(dtype).float()
    half = copy.deepcopy(conv).to(dtype)
    x = feats.clone().requires_grad_()
    y = half(tl.SparseTensor(x, coords)).feats
    gy = torch.randn(y.shape, generator=torch.Generator().manual_seed(7)).to(dtype)
    (dx,) = torch.autograd.grad(y, [x], gy)
    xf = feats.float().requires_grad_()
    yf = conv(tl.SparseTensor(xf, coords)).feats
    (dxf,) = torch.autograd.grad(yf, [xf], gy.float())
    assert torch.equal(y, yf.to(dtype))
    assert torch.equal(dx, dxf.to(dtype))
