"""Float64 dense-oracle conformance for ``SubmConv3d`` and ``Conv3d`` (API.md).

Every case scatters the sparse input into a dense grid, runs
``torch.nn.functional.conv3d`` with the dense weight ``w[o, i, rx, ry, rz] =
weight[(rx*Ky + ry)*Kz + rz, i, o]`` and reads it at the output support. Forward values
and the gradients wrt input features, weight and bias must match to 1e-10 relative in
float64. Supports are checked exactly:

- SubmConv3d: output coords == input coords, same (unsorted) order.
- Conv3d generated: {q in [0, R_out) : exists n, x[q*s - p + r_n*d] present}, sorted.
- Conv3d with ``coordinates=target``: target rows in target order.
"""

from __future__ import annotations

from collections.abc import Sequence

import pytest
import torch

import torch_lattice as tl

try:
    import conformance_helpers as ch
    import dense_oracle as oracle
except ImportError:  # tests/ may become a package; then they are imported through it
    from tests import conformance_helpers as ch
    from tests import dense_oracle as oracle

F64 = torch.float64
Geo = ch.Geo


# --------------------------------------------------------------------------------------
# SubmConv3d
# --------------------------------------------------------------------------------------

SUBM_CASES = [
    Geo(kernel=1, batches=1, bias=True),
    Geo(kernel=3, batches=1),
    Geo(kernel=3, batches=2, bias=True, dilation=2),
    Geo(kernel=3, batches=3, dilation=(1, 2, 1), extent=(6, 9, 7)),
    Geo(kernel=5, batches=1, bias=True, extent=(9, 9, 9), density=0.1),
    Geo(kernel=5, batches=2, dilation=2, extent=(11, 10, 12), density=0.08),
    Geo(kernel=(3, 1, 5), batches=2, bias=True),
    Geo(kernel=(1, 3, 3), batches=1, dilation=(2, 1, 1)),
    Geo(kernel=(5, 3, 1), batches=3, dilation=(1, 2, 2), extent=(10, 8, 6)),
    Geo(kernel=(3, 3, 1), batches=2, bias=True, in_stride=2),
    Geo(kernel=3, batches=2, bias=True, in_stride=(1, 2, 4), density=0.3),
    Geo(kernel=3, batches=1, dilation=(1, 2, 3), extent=(12, 12, 12), density=0.05),
]


def _subm_kwargs(geo: Geo) -> dict[str, object]:
    """SubmConv3d arguments of a case: kernel_size, dilation and bias."""
    return dict(kernel_size=geo.kernel, dilation=geo.dilation, bias=geo.bias)


@pytest.mark.parametrize("with_range", [True, False], ids=["range", "norange"])
@pytest.mark.parametrize("geo", SUBM_CASES, ids=ch.geo_id)
def test_subm_matches_dense_oracle(geo: Geo, with_range: bool) -> None:
    cin, cout = 3, 4
    seed = ch.seed_of(geo, str(with_range))
    feats, coords = oracle.random_geometry(seed, geo.batches, geo.extent, geo.density, cin)
    sr = (geo.batches, *geo.extent) if with_range else None
    conv = ch.make_conv(tl.nn.SubmConv3d, cin, cout, seed, **_subm_kwargs(geo))
    feats_before, coords_before = feats.clone(), coords.clone()
    leaf, x = ch.sparse_input(feats, coords, geo.in_stride, sr)
    y = conv(x)

    # Support-preserving: same rows, same order, same stride and range.
    ch.assert_coords_equal(y.coords, coords)
    assert tuple(y.stride) == oracle.triple(geo.in_stride)
    assert y.spatial_range == (None if sr is None else tuple(sr))
    assert y.feats.shape == (coords.shape[0], cout)

    ch.compare_with_oracle(
        conv,
        leaf,
        y.feats,
        lambda f, w, b: oracle.dense_subm(f, coords, w, b, geo.kernel, geo.dilation),
        grad_seed=1000 + seed,
    )
    # The call must not modify its input.
    assert torch.equal(feats, feats_before) and torch.equal(coords, coords_before)


# --------------------------------------------------------------------------------------
# Conv3d, generated support
# --------------------------------------------------------------------------------------

CONV_CASES = [
    Geo(kernel=1, stride=2, batches=1, bias=True),
    Geo(kernel=1, stride=3, padding=2, batches=2),
    Geo(kernel=2, stride=1, batches=1),
    Geo(kernel=2, stride=2, batches=2, bias=True),
    Geo(kernel=2, stride=2, padding=1, batches=3),
    Geo(kernel=2, stride=3, dilation=2, batches=1, extent=(10, 9, 11)),
    Geo(kernel=3, stride=1, batches=2, bias=True),
    Geo(kernel=3, stride=1, padding=1, batches=1),
    Geo(kernel=3, stride=2, padding=1, batches=2, in_stride=2),
    Geo(kernel=3, stride=2, dilation=2, batches=1, bias=True, extent=(10, 10, 10)),
    Geo(kernel=3, stride=3, padding=2, batches=3),
    Geo(kernel=3, stride=(1, 2, 3), padding=(0, 1, 2), batches=2, bias=True),
    Geo(kernel=3, stride=2, padding=2, dilation=2, batches=1, extent=(9, 11, 10)),
    Geo(kernel=5, stride=1, padding=2, batches=1, bias=True, density=0.1),
    Geo(kernel=5, stride=2, batches=2, extent=(10, 9, 8)),
    Geo(
        kernel=5,
        stride=3,
        padding=2,
        dilation=(1, 2, 1),
        batches=1,
        extent=(12, 12, 9),
        density=0.08,
    ),
    Geo(kernel=(3, 1, 2), stride=2, padding=1, batches=2),
    Geo(
        kernel=(3, 1, 2),
        stride=(2, 1, 3),
        padding=(1, 0, 2),
        dilation=(1, 2, 1),
        batches=1,
        bias=True,
        extent=(9, 8, 10),
    ),
    Geo(kernel=(2, 3, 1), stride=1, batches=3, bias=True),
    Geo(
        kernel=(2, 3, 1),
        stride=(2, 2, 1),
        padding=(0, 1, 0),
        dilation=(2, 1, 1),
        batches=2,
        in_stride=(2, 1, 1),
    ),
    Geo(kernel=2, stride=(1, 2, 1), padding=2, dilation=(2, 1, 2), batches=1),
    Geo(
        kernel=(1, 5, 3),
        stride=(3, 1, 2),
        padding=(2, 2, 0),
        batches=2,
        bias=True,
        extent=(7, 10, 8),
    ),
]


@pytest.mark.parametrize("with_range", [True, False], ids=["range", "norange"])
@pytest.mark.parametrize("geo", CONV_CASES, ids=ch.geo_id)
def test_conv_generated_matches_dense_oracle(geo: Geo, with_range: bool) -> None:
    cin, cout = 3, 2
    seed = ch.seed_of(geo, str(with_range))
    feats, coords = oracle.random_geometry(seed, geo.batches, geo.extent, geo.density, cin)
    sr = (geo.batches, *geo.extent) if with_range else None
    spatial = geo.extent if with_range else oracle.inferred_range(coords)
    r_out = oracle.output_range(spatial, geo.kernel, geo.stride, geo.padding, geo.dilation)
    assert min(r_out) >= 1, "test geometry must have a non-empty output range"
    expected = oracle.expected_conv_support(
        coords, geo.kernel, geo.stride, geo.padding, geo.dilation, sr
    )
    assert expected.shape[0] > 0, "test geometry must produce outputs"

    conv = ch.make_conv(tl.nn.Conv3d, cin, cout, seed, bias=geo.bias, **ch.strided_kwargs(geo))
    leaf, x = ch.sparse_input(feats, coords, geo.in_stride, sr)
    y = conv(x)

    ch.assert_coords_equal(y.coords, expected)
    assert tuple(y.stride) == ch.mul3(geo.in_stride, geo.stride)
    if with_range:
        assert tuple(y.spatial_range) == (geo.batches, *r_out)

    ch.compare_with_oracle(
        conv,
        leaf,
        y.feats,
        lambda f, w, b: oracle.dense_conv_at(
            f,
            coords,
            w,
            b,
            expected,
            geo.kernel,
            geo.stride,
            geo.padding,
            geo.dilation,
        ),
        grad_seed=1000 + seed,
    )


# --------------------------------------------------------------------------------------
# Conv3d with coordinates=target
# --------------------------------------------------------------------------------------

TARGET_CASES = [
    Geo(kernel=3, stride=1, padding=1, batches=1, bias=True),
    Geo(kernel=2, stride=2, batches=2, bias=True),
    Geo(kernel=3, stride=2, padding=1, batches=2, in_stride=2),
    Geo(kernel=1, stride=1, batches=1, bias=True),
    Geo(
        kernel=5,
        stride=(1, 2, 3),
        padding=(2, 1, 0),
        dilation=(1, 1, 2),
        batches=3,
        bias=True,
        extent=(10, 10, 12),
        density=0.01,  # a 5x5x5 window covers everything at higher density
    ),
    Geo(kernel=(3, 1, 2), stride=3, padding=2, batches=2, extent=(10, 9, 11)),
    Geo(kernel=(2, 3, 1), stride=(2, 1, 2), dilation=2, batches=1, bias=True),
    Geo(
        kernel=3,
        stride=2,
        padding=(0, 2, 1),
        dilation=(2, 1, 1),
        batches=2,
        in_stride=(1, 2, 2),
        bias=True,
        density=0.03,  # the output grid is small (2x5x4); keep part of it unreached
    ),
]


def make_target(
    seed: int, support: torch.Tensor, batches: int, r_out: Sequence[int]
) -> torch.Tensor:
    """Shuffled target: about half generated-support rows, half rows nobody reaches."""
    gen = torch.Generator().manual_seed(seed)
    reached = {tuple(r) for r in support.tolist()}
    empty = [
        (b, x, y, z)
        for b in range(batches)
        for x in range(r_out[0])
        for y in range(r_out[1])
        for z in range(r_out[2])
        if (b, x, y, z) not in reached
    ]
    n_hit = max(1, support.shape[0] // 2)
    hit = support[torch.randperm(support.shape[0], generator=gen)[:n_hit]]
    n_miss = max(1, min(len(empty), n_hit))
    miss_idx = torch.randperm(len(empty), generator=gen)[:n_miss]
    miss = torch.tensor([empty[i] for i in miss_idx.tolist()], dtype=torch.int64)
    rows = torch.cat([hit.long(), miss.reshape(-1, 4)])
    rows = rows[torch.randperm(rows.shape[0], generator=gen)]
    if oracle.is_sorted(rows):
        rows = rows.flip(0)
    return rows.to(torch.int32)


@pytest.mark.parametrize("target_kind", ["sparse_tensor", "coords", "coords64"])
@pytest.mark.parametrize("geo", TARGET_CASES, ids=ch.geo_id)
def test_conv_target_matches_dense_oracle(geo: Geo, target_kind: str) -> None:
    cin, cout = 2, 3
    seed = ch.seed_of(geo, target_kind)
    feats, coords = oracle.random_geometry(seed, geo.batches, geo.extent, geo.density, cin)
    sr = (geo.batches, *geo.extent)
    r_out = oracle.output_range(geo.extent, geo.kernel, geo.stride, geo.padding, geo.dilation)
    support = oracle.expected_conv_support(
        coords, geo.kernel, geo.stride, geo.padding, geo.dilation, sr
    )
    target_coords = make_target(seed, support, geo.batches, r_out)
    reached = {tuple(r) for r in support.tolist()}
    unreached = torch.tensor(
        [tuple(r) not in reached for r in target_coords.tolist()], dtype=torch.bool
    )
    assert unreached.any() and not unreached.all(), "target must mix both kinds"

    out_stride = ch.mul3(geo.in_stride, geo.stride)
    target: tl.SparseTensor | torch.Tensor
    if target_kind == "sparse_tensor":
        target = tl.SparseTensor(
            torch.zeros(target_coords.shape[0], 1, dtype=F64),
            target_coords,
            stride=out_stride,
        )
    else:
        # A bare (M, 4) int tensor is also accepted; its stride is x.stride * s.
        dtype = torch.int64 if target_kind == "coords64" else torch.int32
        target = target_coords.to(dtype)

    conv = ch.make_conv(tl.nn.Conv3d, cin, cout, seed, bias=geo.bias, **ch.strided_kwargs(geo))
    leaf, x = ch.sparse_input(feats, coords, geo.in_stride, sr)
    y = conv(x, coordinates=target)

    ch.assert_coords_equal(y.coords, target_coords)
    assert tuple(y.stride) == out_stride

    ref = ch.compare_with_oracle(
        conv,
        leaf,
        y.feats,
        lambda f, w, b: oracle.dense_conv_at(
            f,
            coords,
            w,
            b,
            target_coords,
            geo.kernel,
            geo.stride,
            geo.padding,
            geo.dilation,
        ),
        grad_seed=1000 + seed,
    )
    # Rows nobody reaches hold exactly the bias (zero without bias).
    expect_empty = conv.bias.detach() if conv.bias is not None else torch.zeros(cout, dtype=F64)
    got = y.feats.detach()[unreached]
    assert torch.equal(got, expect_empty.expand_as(got))
    assert torch.equal(ref[unreached], expect_empty.expand_as(got))


def test_empty_target() -> None:
    feats, coords = oracle.random_geometry(8, 1, (6, 6, 6), 0.2, 2)
    conv = ch.make_conv(tl.nn.Conv3d, 2, 3, 8, kernel_size=2, stride=2, bias=True)
    leaf, x = ch.sparse_input(feats, coords, 1, (1, 6, 6, 6))
    empty = torch.zeros(0, 4, dtype=torch.int32)
    target = tl.SparseTensor(torch.zeros(0, 1, dtype=F64), empty, stride=2)
    y = conv(x, coordinates=target)
    assert y.feats.shape == (0, 3) and y.coords.shape == (0, 4)
    y.feats.sum().backward()
    assert leaf.grad is None or not leaf.grad.any()


def test_target_equals_generated_on_generated_support() -> None:
    """Target = generated support must reproduce the generated call row for row."""
    feats, coords = oracle.random_geometry(7, 2, (9, 8, 10), 0.15, 3)
    conv = ch.make_conv(tl.nn.Conv3d, 3, 2, 7, kernel_size=3, stride=2, padding=1, bias=True)
    x = tl.SparseTensor(feats, coords, spatial_range=(2, 9, 8, 10))
    generated = conv(x)
    # Reverse the rows so that the target order differs from the generated order.
    tgt_coords = generated.coords.flip(0)
    target = tl.SparseTensor(torch.zeros(tgt_coords.shape[0], 1, dtype=F64), tgt_coords, stride=2)
    y = conv(x, coordinates=target)
    ch.assert_coords_equal(y.coords, tgt_coords)
    torch.testing.assert_close(y.feats, generated.feats.flip(0), rtol=1e-12, atol=1e-12)


# --------------------------------------------------------------------------------------
# Pointwise
# --------------------------------------------------------------------------------------


@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("with_range", [True, False], ids=["range", "norange"])
def test_pointwise_conv_keeps_order_and_is_matmul(bias: bool, with_range: bool) -> None:
    feats, coords = oracle.random_geometry(11 + int(bias), 3, (7, 8, 6), 0.2, 4)
    sr = (3, 7, 8, 6) if with_range else None
    conv = ch.make_conv(tl.nn.Conv3d, 4, 3, 11, kernel_size=1, stride=1, padding=0, bias=bias)
    leaf, x = ch.sparse_input(feats, coords, 1, sr)
    y = conv(x)

    # Pointwise output support is the input support in input (unsorted) order.
    ch.assert_coords_equal(y.coords, coords)
    assert tuple(y.stride) == (1, 1, 1)
    if with_range:
        assert tuple(y.spatial_range) == sr
    expected = feats @ conv.weight.detach()[0]
    if bias:
        expected = expected + conv.bias.detach()
    torch.testing.assert_close(y.feats.detach(), expected, rtol=1e-10, atol=1e-12)
    ch.compare_with_oracle(
        conv,
        leaf,
        y.feats,
        lambda f, w, b: oracle.dense_conv_at(f, coords, w, b, coords, 1),
        grad_seed=1000,
    )


# --------------------------------------------------------------------------------------
# Edge cases: empty input, non-contiguous feats, float32, input stride
# --------------------------------------------------------------------------------------

MODULES = {
    "subm": lambda cin, cout: tl.nn.SubmConv3d(cin, cout, kernel_size=3, bias=True),
    "conv": lambda cin, cout: tl.nn.Conv3d(
        cin, cout, kernel_size=3, stride=2, padding=1, bias=True
    ),
}


@pytest.mark.parametrize("with_range", [True, False], ids=["range", "norange"])
@pytest.mark.parametrize("kind", sorted(MODULES))
def test_empty_input(kind: str, with_range: bool) -> None:
    torch.manual_seed(0)
    conv = MODULES[kind](3, 5).to(F64)
    leaf = torch.zeros(0, 3, dtype=F64, requires_grad=True)
    coords = torch.zeros(0, 4, dtype=torch.int32)
    sr = (2, 8, 8, 8) if with_range else None
    y = conv(tl.SparseTensor(leaf, coords, spatial_range=sr))
    assert y.feats.shape == (0, 5)
    assert y.coords.shape == (0, 4) and y.coords.dtype == torch.int32
    if kind == "conv":
        assert tuple(y.stride) == (2, 2, 2)
    # Backward must run (the output stays in the graph); an empty input has no
    # gradient values, so None and an empty (0, 3) tensor are both acceptable.
    assert y.feats.requires_grad
    y.feats.sum().backward()
    assert leaf.grad is None or leaf.grad.shape == (0, 3)
    # No rows: any parameter gradient that is produced must be zero.
    for p in (conv.weight, conv.bias):
        assert p.grad is None or not p.grad.any()


@pytest.mark.parametrize("layout", ["transposed", "sliced"])
@pytest.mark.parametrize("kind", sorted(MODULES))
def test_noncontiguous_feats(kind: str, layout: str) -> None:
    feats, coords = oracle.random_geometry(21, 2, (8, 8, 8), 0.2, 3)
    torch.manual_seed(21)
    conv = MODULES[kind](3, 2).to(F64)
    if layout == "transposed":
        base = feats.t().contiguous().requires_grad_(True)
        view = base.t()
    else:
        wide = torch.zeros(feats.shape[0], 6, dtype=F64)
        wide[:, 1::2] = feats
        base = wide.requires_grad_(True)
        view = base[:, 1::2]
    assert not view.is_contiguous()
    y = conv(tl.SparseTensor(view, coords, spatial_range=(2, 8, 8, 8)))
    leaf, xc = ch.sparse_input(feats, coords, 1, (2, 8, 8, 8))
    yc = conv(xc)
    assert torch.equal(y.coords, yc.coords)
    torch.testing.assert_close(y.feats, yc.feats, rtol=1e-12, atol=1e-12)

    grad = torch.randn(y.feats.shape, generator=torch.Generator().manual_seed(3), dtype=F64)
    (y.feats * grad).sum().backward()
    grad_w = conv.weight.grad.clone()
    grad_view = base.grad.t() if layout == "transposed" else base.grad[:, 1::2]
    conv.zero_grad()
    (yc.feats * grad).sum().backward()
    torch.testing.assert_close(grad_view, leaf.grad, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(grad_w, conv.weight.grad, rtol=1e-12, atol=1e-12)


FLOAT32_CASES = [
    ("subm", Geo(kernel=3, batches=2, bias=True)),
    ("subm", Geo(kernel=(3, 1, 5), dilation=2, batches=1, bias=True)),
    ("conv", Geo(kernel=2, stride=2, batches=2, bias=True)),
    ("conv", Geo(kernel=3, stride=(1, 2, 3), padding=1, dilation=(1, 1, 2), batches=1)),
]


@pytest.mark.parametrize(
    ("kind", "geo"), FLOAT32_CASES, ids=[f"{k}-{ch.geo_id(g)}" for k, g in FLOAT32_CASES]
)
def test_float32_matches_float64_oracle(kind: str, geo: Geo) -> None:
    seed = ch.seed_of(geo, kind)
    feats, coords = oracle.random_geometry(seed, geo.batches, geo.extent, 0.2, 3)
    sr = (geo.batches, *geo.extent)
    if kind == "subm":
        conv = ch.make_conv(tl.nn.SubmConv3d, 3, 4, seed, **_subm_kwargs(geo))
        out_coords = coords.long()
    else:
        conv = ch.make_conv(tl.nn.Conv3d, 3, 4, seed, bias=geo.bias, **ch.strided_kwargs(geo))
        out_coords = oracle.expected_conv_support(
            coords, geo.kernel, geo.stride, geo.padding, geo.dilation, sr
        )
    conv = conv.float()
    assert conv.weight.dtype == torch.float32
    leaf, x = ch.sparse_input(feats.float(), coords, 1, sr)
    y = conv(x)
    assert y.feats.dtype == torch.float32
    ch.assert_coords_equal(y.coords, out_coords)
    # Both families are a dense conv read at the output rows; subm pads d*(K-1)/2.
    k, d = oracle.triple(geo.kernel), oracle.triple(geo.dilation)
    pad = tuple(d[a] * (k[a] - 1) // 2 for a in range(3)) if kind == "subm" else geo.padding
    stride = 1 if kind == "subm" else geo.stride

    def ref_fn(f: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None) -> torch.Tensor:
        return oracle.dense_conv_at(f, coords, w, b, out_coords, k, stride, pad, d)

    ch.compare_with_oracle(conv, leaf, y.feats, ref_fn, rtol=1e-4, atol=1e-5, grad_seed=1000 + seed)


@pytest.mark.parametrize("in_stride", [2, (1, 2, 4)])
@pytest.mark.parametrize("kind", sorted(MODULES))
def test_input_stride_only_multiplies(kind: str, in_stride: ch.IntOrTriple) -> None:
    """Coordinates are logical: a stride-2 input computes like a stride-1 one."""
    feats, coords = oracle.random_geometry(31, 2, (8, 9, 7), 0.2, 3)
    torch.manual_seed(31)
    conv = MODULES[kind](3, 2).to(F64)
    sr = (2, 8, 9, 7)
    y1 = conv(tl.SparseTensor(feats, coords, stride=1, spatial_range=sr))
    y2 = conv(tl.SparseTensor(feats, coords, stride=in_stride, spatial_range=sr))
    assert torch.equal(y1.coords, y2.coords)
    torch.testing.assert_close(y2.feats, y1.feats, rtol=1e-12, atol=1e-12)
    s = 1 if kind == "subm" else 2
    assert tuple(y2.stride) == ch.mul3(in_stride, s)
    assert y2.spatial_range == y1.spatial_range


@pytest.mark.parametrize("kind", sorted(MODULES))
def test_noncontiguous_coords(kind: str) -> None:
    """Coordinates given as a strided view must give the contiguous result."""
    feats, coords = oracle.random_geometry(22, 2, (7, 8, 6), 0.2, 3)
    view = coords.t().contiguous().t()  # same values, column-major strides
    assert not view.is_contiguous()
    torch.manual_seed(22)
    conv = MODULES[kind](3, 2).to(F64)
    sr = (2, 7, 8, 6)
    y = conv(tl.SparseTensor(feats, view, spatial_range=sr))
    yc = conv(tl.SparseTensor(feats, coords, spatial_range=sr))
    assert torch.equal(y.coords, yc.coords)
    torch.testing.assert_close(y.feats, yc.feats, rtol=1e-12, atol=1e-12)
