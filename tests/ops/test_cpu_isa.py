"""The CPU micro-kernels of every instruction set agree with the dense oracle.

The C core compiles its micro-kernels for AVX-512, AVX2 + FMA and the baseline
instruction set and runs the widest the CPU has; TORCH_LATTICE_CPU_ISA caps it,
which lets this machine run the narrower ones too.  Channel counts cover every
block shape: 4, 2 and 1 vectors per block and tails narrower than one vector,
in float32 and float64, for every dataflow, forward and every gradient.
"""

from __future__ import annotations

import pytest
import torch
from cpu_isa_helpers import widest_isa
from cuda_helpers import table_reference
from dense_oracle import dense_subm

import torch_lattice as tl
from torch_lattice.nn import functional as F
from torch_lattice.ops._runtime import _C

ISAS = ["avx512", "avx2", "baseline"]
# Every level TORCH_LATTICE_CPU_ISA names, widest first: avx512_bf16 adds the
# bfloat16 dot-product kernels (tests/ops/test_cpu_half.py) to avx512's float ones,
# amx_bf16 the bfloat16 forward's AMX tile kernel.
LEVELS = ["amx_bf16", "avx512_bf16", *ISAS]
# (c_in, c_out): a 1-column output, tails only, one full AVX-512 block of
# float32 (64), and every narrower remainder: 130 = 64 + 64 + 2 floats;
# 37 = 32 + 4 + 1 floats; 24 = 16 + 8 floats (a 32-byte leftover block);
# 20 = 16 + 4 floats (a 16-byte one); 23 = 16 + 4 + 2 + 1 doubles.
# c_in >= 64 runs the weight gradient's packed panel kernel: 66 and 67 leave
# a zero-padded strip of 2 and 3 input channels; c_out 17, 33 and 3 leave
# scalar columns after 2+2, 3+3+2 or no vector blocks.  With AVX-512 the panel
# reads x rows whose c_in is a multiple of 4 in place, from c_in = 32 where
# 32 <= c_out <= 48 (16 where 32 < c_out < 48): 44x32, 36x35 (2 vectors, then
# 3 scalar columns), 20x36 (2 vectors and a 16-byte block), 40x63 (3 vectors,
# then narrower blocks and a scalar column), and 64x64.  The forward splits
# weights wider than 16 KiB per kernel row into panels (read in place on these
# small scenes where the rows allow: test_forward_packs_or_reads_in_place_alike):
# 260x72 runs three (or more) panels; 40x400 runs two column tiles (384 + 16),
# the first in several panels, the second in a narrow one.  Layers one vector wide and
# deep keep their weights in registers (rows_8_vv): 16x16 floats on AVX-512,
# 8x8 (AVX2 floats, AVX-512 doubles), 4x4 and 2x2 below that.  With AVX-512 a
# forward whose c_out leaves a partial vector computes it whole over weight panels
# padded with zeros and writes only its columns (masked), and the weight gradient's
# row passes read the dy rows' partial vector masked: 24, 20, 37, 23, 72 and 130
# above, 9x40 (8 rows of 3 vectors, the last half used) and 48x56 (4 rows of 4).
# With AVX-512 the weight gradient of a c_out more than one vector and at most two
# wide runs 12 input channels a pass where the rest leaves whole 8-row passes:
# 24x24 (12 + 12, partial vector), 44x32 (8 + 12 + 12 + 12), 33x23 (8 + 12 + 12 +
# 1) in float32, and 20x12 (8 + 12, 12 doubles = 8 + 4) in float64.  With AVX2, where
# c_out is 2 or 4 whole vectors, it runs 6 channels a pass: 16x16 (6 + 6 + 4, also in
# float64) and 33x23 (6 x 4 + 4 + 4 + 1, columns 16 + 4 + 3).
CHANNELS = [(3, 1), (7, 37), (64, 64), (19, 130), (33, 23), (5, 24), (6, 20), (66, 17),
            (67, 33), (128, 3), (260, 72), (40, 400), (16, 16), (8, 8), (4, 4), (2, 2),
            (9, 40), (48, 56), (24, 24), (44, 32), (20, 12), (36, 35), (20, 36),
            (40, 63)]
TOL = {torch.float32: 2e-5, torch.float64: 1e-12}


def _scene(cin: int, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(cin)
    coords = torch.unique(torch.randint(0, 9, (700, 4), generator=g), dim=0)
    coords[:, 0] %= 2
    coords = torch.unique(coords, dim=0)
    feats = torch.randn(coords.shape[0], cin, generator=g, dtype=torch.float64)
    return feats.to(dtype), coords


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=str)
@pytest.mark.parametrize("channels", CHANNELS, ids=lambda c: f"{c[0]}x{c[1]}")
def test_every_isa_matches_dense(
    isa: str, dtype: torch.dtype, channels: tuple[int, int], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TORCH_LATTICE_CPU_ISA", isa)
    cin, cout = channels
    feats, coords = _scene(cin, dtype)
    torch.manual_seed(cout)
    conv = tl.nn.SubmConv3d(cin, cout, 3, bias=False).to(dtype)
    w64 = conv.weight.detach().double().requires_grad_()
    x64 = feats.double().requires_grad_()
    ref = dense_subm(x64, coords, w64, None, 3)
    gy = torch.randn(ref.shape, generator=torch.Generator().manual_seed(5), dtype=torch.float64)
    ref_dx, ref_dw = torch.autograd.grad((ref * gy).sum(), [x64, w64])
    scale = max(float(ref.detach().abs().max()), 1.0)
    for dataflow in F.Dataflow:
        conv.config = F.ConvConfig(dataflow=dataflow)
        x = feats.clone().requires_grad_()
        y = conv(tl.SparseTensor(x, coords))
        dx, dw = torch.autograd.grad((y.feats * gy.to(dtype)).sum(), [x, conv.weight])
        tol = TOL[dtype] * scale
        torch.testing.assert_close(y.feats.double(), ref, rtol=0, atol=tol)
        torch.testing.assert_close(dx.double(), ref_dx, rtol=0, atol=tol)
        torch.testing.assert_close(dw.double(), ref_dw, rtol=0, atol=tol * 10)


def test_cpu_isa_reports_the_cap(monkeypatch: pytest.MonkeyPatch) -> None:
    widest = widest_isa()
    assert widest in LEVELS
    for cap in LEVELS:
        monkeypatch.setenv("TORCH_LATTICE_CPU_ISA", cap)
        assert _C.cpu_isa() == LEVELS[max(LEVELS.index(cap), LEVELS.index(widest))]


@pytest.mark.skipif(widest_isa() == "baseline", reason="the CPU has only the baseline set")
def test_cap_selects_other_kernels(monkeypatch: pytest.MonkeyPatch) -> None:
    # The baseline kernels round each multiply and add apart, the AVX2 and
    # AVX-512 ones fuse them: float32 results differ in the last bits, which
    # shows the cap reaches the C core.
    feats, coords = _scene(64, torch.float32)
    conv = tl.nn.SubmConv3d(64, 64, 3)
    out = {}
    for isa in ("auto", "baseline"):
        monkeypatch.setenv("TORCH_LATTICE_CPU_ISA", isa)
        with torch.no_grad():
            out[isa] = conv(tl.SparseTensor(feats, coords)).feats
    assert not torch.equal(out["auto"], out["baseline"])
    torch.testing.assert_close(out["auto"], out["baseline"], rtol=1e-5, atol=1e-5)


def test_unknown_isa_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TORCH_LATTICE_CPU_ISA", "sse9")
    feats, coords = _scene(4, torch.float32)
    conv = tl.nn.SubmConv3d(4, 4, 3)
    rule = "TORCH_LATTICE_CPU_ISA must be auto, amx_bf16, avx512_bf16, avx512, avx2"
    with pytest.raises(ValueError, match=rule):
        conv(tl.SparseTensor(feats, coords))


# Each output column's sums do not depend on the block shape that computes it: a layer's
# first columns equal, bit for bit, the whole of a narrower layer with the same weights
# there.  16 columns of float32 (8 of float64) are exactly 2 AVX2 vectors, whose forward
# runs its 8-row groups in blocks of 6 rows, where 32 (16) run blocks of 4 rows x 2
# vectors and 24 (12) blocks of 4 x 3; 12 columns (6) leave a vector and a part, in
# groups of 4.  Same for the input gradient, over the reversed map.
NARROW = [(16, 32), (16, 24), (12, 24)]


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=str)
@pytest.mark.parametrize("layer", ["subm3", "k2s2", "k2s2_transposed"])
@pytest.mark.parametrize("widths", NARROW, ids=lambda w: f"{w[0]}of{w[1]}")
def test_columns_do_not_depend_on_the_block_shape(
    isa: str, dtype: torch.dtype, layer: str, widths: tuple[int, int],
    monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    monkeypatch.setenv("TORCH_LATTICE_CPU_ISA", isa)
    narrow, wide = (w if dtype == torch.float32 else w // 2 for w in widths)
    feats, coords = _scene(wide, dtype)
    x = tl.SparseTensor(feats, coords)

    def make(c_in: int, c_out: int) -> tl.nn.Module:
        if layer == "subm3":
            return tl.nn.SubmConv3d(c_in, c_out, 3, bias=False)
        if layer == "k2s2":
            return tl.nn.Conv3d(c_in, c_out, 2, stride=2, bias=False)
        return tl.nn.ConvTranspose3d(c_in, c_out, 2, stride=2, bias=False)

    if layer == "k2s2_transposed":  # upsample a coarse tensor onto the fine support
        with torch.no_grad():
            x = tl.nn.Conv3d(wide, wide, 2, stride=2, bias=False).to(dtype)(x)

    def run(module: tl.nn.Module, feats: torch.Tensor) -> torch.Tensor:
        return module(x.replace(feats)).feats  # x's support: a transpose finds its map

    torch.manual_seed(0)
    big = make(wide, wide).to(dtype)
    # Forward: the narrow layer's weights are the wide one's first output columns.
    small = make(wide, narrow).to(dtype)
    with torch.no_grad():
        small.weight.copy_(big.weight[:, :, :narrow])
        y_big, y_small = run(big, x.feats), run(small, x.feats)
    assert torch.equal(y_small, y_big[:, :narrow])
    # Input gradient: the narrow layer reads the wide one's first input channels.
    small_in = make(narrow, wide).to(dtype)
    with torch.no_grad():
        small_in.weight.copy_(big.weight[:, :narrow, :])
    gy = torch.randn(y_big.shape, generator=torch.Generator().manual_seed(1), dtype=dtype)
    xs = x.feats.clone().requires_grad_()
    xn = x.feats[:, :narrow].clone().requires_grad_()
    (dx_big,) = torch.autograd.grad((run(big, xs) * gy).sum(), xs)
    (dx_small,) = torch.autograd.grad((run(small_in, xn) * gy).sum(), xn)
    assert torch.equal(dx_small, dx_big[:, :narrow])


# The forward reads its weight panels in place below TL_FWD_PACK_MIN_ROWS output rows
# (csrc/core/tl_dataflow_implicit_gemm_tiles.h) and packs them from there (with AVX-512,
# always where C_out leaves a partial vector): the same sums either way, so a table's first
# rows alone give the bits they get at the head of a table long enough to pack.
PACK_MIN_ROWS = 4096


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=str)
@pytest.mark.parametrize("channels", [(96, 96), (260, 72), (40, 400), (128, 256)],
                         ids=lambda c: f"{c[0]}x{c[1]}")
def test_forward_packs_or_reads_in_place_alike(
    isa: str, dtype: torch.dtype, channels: tuple[int, int], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TORCH_LATTICE_CPU_ISA", isa)
    c_in, c_out = channels
    g = torch.Generator().manual_seed(c_in)
    n_in, k, head = 2000, 27, 300
    nbr = torch.randint(-1, n_in, (PACK_MIN_ROWS + 5, k), generator=g, dtype=torch.int32)
    x = torch.randn(n_in, c_in, generator=g, dtype=dtype)
    w = torch.randn(k, c_in, c_out, generator=g, dtype=dtype) / c_in**0.5
    rev = torch.full((n_in, k), -1, dtype=torch.int32)  # the backward's; unused here
    with torch.no_grad():
        y_all = torch.ops.lattice.sparse_conv(x, w, nbr, rev)
        y_head = torch.ops.lattice.sparse_conv(x, w, nbr[:head].contiguous(), rev)
    assert torch.equal(y_head, y_all[:head])
    # Both right: the head against a float64 gather over the same table.
    want, _ = table_reference(x, w, torch.zeros(head, c_out, dtype=dtype), nbr[:head])
    torch.testing.assert_close(y_head.double(), want, rtol=TOL[dtype], atol=TOL[dtype])
