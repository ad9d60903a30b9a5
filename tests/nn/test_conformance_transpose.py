"""Float64 dense-oracle conformance for the transposed convolutions (API.md).

``ConvTranspose3d`` and ``GenerativeConvTranspose3d`` compute
``y[t] = b + sum over (n, i) with src[i]*s + r_n*d - p == t of W_n^T x[i]``. The oracle
scatters the coarse source into a dense grid, runs ``torch.nn.functional.conv_transpose3d``
with ``w[i, o, rx, ry, rz] = weight[(rx*Ky + ry)*Kz + rz, i, o]`` and reads the result at
the output rows. Forward values and gradients wrt source features, weight and bias match to
1e-10 relative in float64. Supports are checked exactly:

- ``up(src, target)``: target rows in target order, stride ``src.stride / s``.
- ``up(src)``: the input support of the matching Conv3d (coords, order, stride, range),
  built from the encoder's cached kernel map (no new build).
- ``gen(src)``: ``unique{src*s + r}`` sorted by (b, x, y, z), never clipped.
"""

from __future__ import annotations

import pytest
import torch

import torch_lattice as tl
from torch_lattice.nn import functional as TF

try:
    import conformance_helpers as ch
    import dense_oracle as oracle
except ImportError:  # tests/ may become a package; then they are imported through it
    from tests import conformance_helpers as ch
    from tests import dense_oracle as oracle

F64 = torch.float64
I32 = torch.int32
Geo = ch.Geo


# --------------------------------------------------------------------------------------
# The worked example of the issue
# --------------------------------------------------------------------------------------


@pytest.mark.parametrize("target_kind", ["sparse_tensor", "coords"])
def test_worked_example(target_kind: str) -> None:
    """x = 0, 1, 2 with features 1, 2, 3; k3 s2 p1 along x, weights 1, 2, 3."""
    src_coords = torch.tensor([[0, 0, 0, 0], [0, 1, 0, 0], [0, 2, 0, 0]], dtype=I32)
    src = tl.SparseTensor(torch.tensor([[1.0], [2.0], [3.0]], dtype=F64), src_coords, (2, 1, 1))
    up = tl.nn.ConvTranspose3d(1, 1, kernel_size=(3, 1, 1), stride=(2, 1, 1), padding=(1, 0, 0))
    up = up.to(F64)
    assert up.weight.shape == (3, 1, 1)
    with torch.no_grad():
        up.weight.copy_(torch.tensor([1.0, 2.0, 3.0], dtype=F64).view(3, 1, 1))
    tgt_coords = torch.tensor([[0, x, 0, 0] for x in range(5)], dtype=I32)
    target: tl.SparseTensor | torch.Tensor = tgt_coords
    if target_kind == "sparse_tensor":
        target = tl.SparseTensor(torch.zeros(5, 1, dtype=F64), tgt_coords, stride=1)
    y = up(src, target)
    ch.assert_coords_equal(y.coords, tgt_coords)
    assert tuple(y.stride) == (1, 1, 1)
    assert torch.equal(y.feats.detach().flatten(), torch.tensor([2, 5, 4, 9, 6], dtype=F64))
    # The dense oracle agrees with the hand computation.
    ref = oracle.dense_conv_transpose_at(
        src.feats, src_coords, up.weight, None, tgt_coords, (3, 1, 1), (2, 1, 1), (1, 0, 0)
    )
    assert torch.equal(ref.detach().flatten(), torch.tensor([2, 5, 4, 9, 6], dtype=F64))


# --------------------------------------------------------------------------------------
# ConvTranspose3d(src, target)
# --------------------------------------------------------------------------------------

TARGET_CASES = [
    ch.coarse_geo(kernel=1, stride=1, batches=1, bias=True),
    ch.coarse_geo(kernel=1, stride=2, batches=2, in_stride=2),
    ch.coarse_geo(kernel=2, stride=2, batches=2, bias=True, in_stride=2),
    ch.coarse_geo(kernel=2, stride=2, padding=1, batches=1, in_stride=4),
    ch.coarse_geo(kernel=2, stride=1, padding=1, dilation=2, batches=2, bias=True),
    ch.coarse_geo(kernel=3, stride=1, padding=1, batches=1, bias=True),
    ch.coarse_geo(kernel=3, stride=2, padding=1, batches=3, in_stride=2),
    ch.coarse_geo(kernel=3, stride=2, dilation=2, batches=1, bias=True, in_stride=2),
    ch.coarse_geo(kernel=3, stride=3, padding=2, batches=2, in_stride=3),
    ch.coarse_geo(kernel=4, stride=2, padding=1, batches=1, bias=True, in_stride=2),
    ch.coarse_geo(kernel=5, stride=2, padding=2, batches=2, in_stride=2, extent=(4, 4, 4)),
    ch.coarse_geo(
        kernel=(3, 1, 2),
        stride=(2, 1, 3),
        padding=(1, 0, 2),
        dilation=(1, 2, 1),
        batches=2,
        bias=True,
        in_stride=(4, 2, 6),
    ),
    ch.coarse_geo(
        kernel=(2, 3, 1),
        stride=(2, 2, 1),
        padding=(0, 1, 0),
        dilation=(2, 1, 1),
        batches=1,
        in_stride=(2, 2, 1),
        extent=(4, 6, 5),
    ),
    ch.coarse_geo(
        kernel=(1, 5, 3),
        stride=(3, 1, 2),
        padding=(2, 2, 0),
        batches=2,
        bias=True,
        in_stride=(3, 1, 2),
        extent=(5, 4, 6),
    ),
]


@pytest.mark.parametrize("target_kind", ["sparse_tensor", "coords", "coords64"])
@pytest.mark.parametrize("geo", TARGET_CASES, ids=ch.geo_id)
def test_target_transpose_matches_dense_oracle(geo: Geo, target_kind: str) -> None:
    cin, cout = 3, 2
    seed = ch.seed_of(geo, target_kind)
    feats, coords = oracle.random_geometry(seed, geo.batches, geo.extent, geo.density, cin)
    target_coords, reach = ch.transpose_target(seed, coords, geo)
    unreached = torch.tensor([tuple(r) not in reach for r in target_coords.tolist()])
    assert unreached.any() and not unreached.all(), "target must mix both kinds"

    out_stride = ch.div3(geo.in_stride, geo.stride)
    target: tl.SparseTensor | torch.Tensor
    if target_kind == "sparse_tensor":
        target = tl.SparseTensor(
            torch.zeros(target_coords.shape[0], 1, dtype=F64), target_coords, stride=out_stride
        )
    else:
        target = target_coords.to(torch.int64 if target_kind == "coords64" else I32)
    up = ch.make_conv(
        tl.nn.ConvTranspose3d, cin, cout, seed, bias=geo.bias, **ch.strided_kwargs(geo)
    )
    feats_before, coords_before, target_before = (
        feats.clone(),
        coords.clone(),
        target_coords.clone(),
    )
    leaf, src = ch.sparse_input(feats, coords, geo.in_stride)
    y = up(src, target)

    ch.assert_coords_equal(y.coords, target_coords)
    assert tuple(y.stride) == out_stride
    ref = ch.compare_with_oracle(
        up,
        leaf,
        y.feats,
        lambda f, w, b: oracle.dense_conv_transpose_at(
            f, coords, w, b, target_coords, geo.kernel, geo.stride, geo.padding, geo.dilation
        ),
        grad_seed=seed + 1,
    )
    # Rows nobody reaches hold exactly the bias (zero without one).
    empty = up.bias.detach() if up.bias is not None else torch.zeros(cout, dtype=F64)
    got = y.feats.detach()[unreached]
    assert torch.equal(got, empty.expand_as(got))
    assert torch.equal(ref[unreached], empty.expand_as(got))
    # Inputs are left untouched.
    assert torch.equal(feats, feats_before) and torch.equal(coords, coords_before)
    assert torch.equal(target_coords, target_before)


def test_target_keyword_and_empty_source() -> None:
    """``target=`` works as a keyword; an empty source gives the bias on every row."""
    up = ch.make_conv(tl.nn.ConvTranspose3d, 2, 3, 5, kernel_size=3, stride=2, bias=True)
    tgt = torch.tensor([[0, 3, 1, 2], [1, 0, 0, 0]], dtype=I32)
    src = tl.SparseTensor(torch.zeros(0, 2, dtype=F64), torch.zeros(0, 4, dtype=I32), 2)
    y = up(src, target=tgt)
    ch.assert_coords_equal(y.coords, tgt)
    assert torch.equal(y.feats.detach(), up.bias.detach().expand(2, 3))


# --------------------------------------------------------------------------------------
# ConvTranspose3d(src): the inverse of a Conv3d
# --------------------------------------------------------------------------------------

INVERSE_CASES = [
    ch.coarse_geo(kernel=2, stride=2, batches=2, bias=True, extent=(8, 8, 8)),
    ch.coarse_geo(kernel=3, stride=2, padding=1, batches=2, extent=(8, 8, 8)),
    ch.coarse_geo(kernel=2, stride=2, batches=1, in_stride=2, extent=(7, 9, 6)),
    ch.coarse_geo(
        kernel=3, stride=2, padding=1, batches=3, bias=True, in_stride=(1, 2, 4), extent=(9, 8, 7)
    ),
    ch.coarse_geo(kernel=3, stride=2, batches=1, extent=(9, 9, 9)),
    ch.coarse_geo(kernel=3, stride=1, padding=1, batches=1, bias=True, extent=(6, 6, 6)),
    ch.coarse_geo(kernel=4, stride=2, padding=1, batches=2, extent=(8, 7, 9)),
    ch.coarse_geo(kernel=(2, 3, 1), stride=(2, 3, 1), padding=(0, 1, 0), batches=2, bias=True),
    ch.coarse_geo(
        kernel=3,
        stride=(1, 2, 3),
        padding=(0, 1, 2),
        dilation=(1, 1, 2),
        batches=1,
        extent=(7, 8, 10),
    ),
    ch.coarse_geo(kernel=(3, 1, 2), stride=2, padding=(1, 0, 0), dilation=(2, 1, 1), batches=2),
]


@pytest.mark.parametrize("with_range", [True, False], ids=["range", "norange"])
@pytest.mark.parametrize("geo", INVERSE_CASES, ids=ch.geo_id)
def test_inverse_after_conv3d(geo: Geo, with_range: bool) -> None:
    cin, mid, cout = 2, 3, 2
    seed = ch.seed_of(geo, str(with_range))
    feats, coords = oracle.random_geometry(seed, geo.batches, geo.extent, geo.density, cin)
    srange = (geo.batches, *geo.extent) if with_range else None
    x = tl.SparseTensor(feats, coords, stride=geo.in_stride, spatial_range=srange)
    kw = ch.strided_kwargs(geo)
    down = ch.make_conv(tl.nn.Conv3d, cin, mid, seed, **kw)
    y = down(x)
    assert y.coords.shape[0] > 0
    builds = x.coordinate_manager.builds

    up = ch.make_conv(tl.nn.ConvTranspose3d, mid, cout, seed + 7, bias=geo.bias, **kw)
    # Same support (and history) as y, fresh leaf features for the gradient check.
    leaf = y.feats.detach().clone().requires_grad_(True)
    src = y.replace(leaf)
    z = up(src)

    # Output support: exactly x's coordinates (unsorted order kept), stride and range.
    ch.assert_coords_equal(z.coords, coords)
    assert tuple(z.stride) == tuple(x.stride)
    assert z.spatial_range == x.spatial_range
    # The decoder reuses the encoder's kernel map.
    assert x.coordinate_manager.builds == builds
    assert z.coordinate_manager.builds == builds

    ch.compare_with_oracle(
        up,
        leaf,
        z.feats,
        lambda f, w, b: oracle.dense_conv_transpose_at(
            f, y.coords, w, b, coords, geo.kernel, geo.stride, geo.padding, geo.dilation
        ),
        grad_seed=seed + 1,
    )
    # A second decoder with the same geometry builds nothing either.
    up2 = tl.nn.ConvTranspose3d(mid, 1, **kw).to(F64)
    ch.assert_coords_equal(up2(y).coords, coords)
    assert x.coordinate_manager.builds == builds


def test_two_level_unet_reuses_every_map() -> None:
    """Encoder k2s2 then k3s2p1; the decoder climbs back with no new kernel map."""
    feats, coords = oracle.random_geometry(41, 2, (10, 9, 11), 0.15, 2)
    x = tl.SparseTensor(feats, coords, spatial_range=(2, 10, 9, 11))
    torch.manual_seed(41)
    d1 = tl.nn.Conv3d(2, 4, kernel_size=2, stride=2).to(F64)
    d2 = tl.nn.Conv3d(4, 4, kernel_size=3, stride=2, padding=1).to(F64)
    u2 = tl.nn.ConvTranspose3d(4, 4, kernel_size=3, stride=2, padding=1).to(F64)
    u1 = tl.nn.ConvTranspose3d(4, 2, kernel_size=2, stride=2).to(F64)
    y1 = d1(x)
    y2 = d2(y1)
    builds = x.coordinate_manager.builds
    assert builds == 2
    z1 = u2(y2)
    ch.assert_coords_equal(z1.coords, y1.coords)
    assert z1.spatial_range == y1.spatial_range and z1.stride == y1.stride
    z0 = u1(z1)
    ch.assert_coords_equal(z0.coords, coords)
    assert z0.stride == (1, 1, 1) and z0.spatial_range == (2, 10, 9, 11)
    assert x.coordinate_manager.builds == builds
    # Going up from the wrong level is refused: y2 was not made by a k2s2 Conv3d.
    with pytest.raises(ValueError):
        u1(y2.replace(torch.zeros(y2.coords.shape[0], 4, dtype=F64)))


def test_inverse_after_target_conv3d() -> None:
    """A Conv3d with explicit output coordinates is inverted onto its input support."""
    feats, coords = oracle.random_geometry(43, 2, (8, 8, 8), 0.2, 2)
    x = tl.SparseTensor(feats, coords, spatial_range=(2, 8, 8, 8))
    kw = dict(kernel_size=3, stride=2, padding=1)
    down = ch.make_conv(tl.nn.Conv3d, 2, 3, 43, **kw)
    support = oracle.expected_conv_support(coords, 3, 2, 1, 1, (2, 8, 8, 8))
    tgt = support.flip(0).to(I32)
    y = down(x, coordinates=tgt)
    builds = ch.total_builds(x, y)
    up = ch.make_conv(tl.nn.ConvTranspose3d, 3, 2, 44, bias=True, **kw)
    z = up(y)
    ch.assert_coords_equal(z.coords, coords)
    assert z.stride == (1, 1, 1)
    assert ch.total_builds(x, y, z) == builds
    ref = oracle.dense_conv_transpose_at(
        y.feats.detach(), tgt, up.weight.detach(), up.bias.detach(), coords, 3, 2, 1
    )
    ch.assert_close_scaled(z.feats, ref, "forward")


# --------------------------------------------------------------------------------------
# GenerativeConvTranspose3d
# --------------------------------------------------------------------------------------

GEN_CASES = [
    ch.coarse_geo(kernel=2, stride=2, batches=2, bias=True, in_stride=2),
    ch.coarse_geo(kernel=2, stride=2, batches=1, in_stride=(2, 4, 2)),
    ch.coarse_geo(kernel=3, stride=2, batches=2, in_stride=2),
    ch.coarse_geo(kernel=1, stride=2, batches=1, bias=True, in_stride=2),
    ch.coarse_geo(kernel=3, stride=1, batches=2, bias=True, in_stride=1, extent=(4, 5, 4)),
    ch.coarse_geo(kernel=4, stride=2, batches=1, in_stride=4, extent=(4, 4, 4)),
    ch.coarse_geo(kernel=(2, 3, 1), stride=(2, 1, 3), batches=3, in_stride=(2, 2, 3)),
    ch.coarse_geo(kernel=(3, 1, 2), stride=(1, 2, 2), batches=1, bias=True, in_stride=(2, 2, 2)),
    ch.coarse_geo(kernel=5, stride=3, batches=1, in_stride=3, extent=(4, 4, 4)),
]


def _generative_kwargs(geo: Geo) -> dict[str, object]:
    """GenerativeConvTranspose3d arguments of a case: kernel_size, stride and bias."""
    return dict(kernel_size=geo.kernel, stride=geo.stride, bias=geo.bias)


@pytest.mark.parametrize("with_range", [True, False], ids=["range", "norange"])
@pytest.mark.parametrize("geo", GEN_CASES, ids=ch.geo_id)
def test_generative_matches_dense_oracle(geo: Geo, with_range: bool) -> None:
    cin, cout = 3, 2
    seed = ch.seed_of(geo, str(with_range))
    feats, coords = oracle.random_geometry(seed, geo.batches, geo.extent, geo.density, cin)
    srange = (geo.batches, *geo.extent) if with_range else None
    gen = ch.make_conv(tl.nn.GenerativeConvTranspose3d, cin, cout, seed, **_generative_kwargs(geo))
    leaf, src = ch.sparse_input(feats, coords, geo.in_stride, srange)
    y = gen(src)

    expected = oracle.expected_generative_support(coords, geo.kernel, geo.stride)
    ch.assert_coords_equal(y.coords, expected)
    assert tuple(y.stride) == ch.div3(geo.in_stride, geo.stride)
    if with_range:
        k, s = oracle.triple(geo.kernel), oracle.triple(geo.stride)
        ext = tuple((geo.extent[a] - 1) * s[a] + k[a] for a in range(3))
        assert y.spatial_range == (geo.batches, *ext)
    else:
        assert y.spatial_range is None

    ch.compare_with_oracle(
        gen,
        leaf,
        y.feats,
        lambda f, w, b: oracle.dense_conv_transpose_at(
            f, coords, w, b, expected, geo.kernel, geo.stride
        ),
        grad_seed=seed + 1,
    )


@pytest.mark.parametrize("geo", GEN_CASES[:3] + GEN_CASES[6:8], ids=ch.geo_id)
def test_generated_equals_explicit_target_bitwise(geo: Geo) -> None:
    """gen(src), gen(src, its support) and ConvTranspose3d(src, its support) agree bitwise.

    Target transposes run gather-scatter, so the generated call runs it too (same
    weights, same dataflow); under the default dataflow they agree to rounding.
    """
    cin, cout = 4, 3
    seed = ch.seed_of(geo, "bitwise")
    feats, coords = oracle.random_geometry(seed, geo.batches, geo.extent, 0.3, cin)
    src = tl.SparseTensor(feats, coords, stride=geo.in_stride)
    gen = ch.make_conv(tl.nn.GenerativeConvTranspose3d, cin, cout, seed, **_generative_kwargs(geo))
    up = tl.nn.ConvTranspose3d(cin, cout, **_generative_kwargs(geo)).to(F64)
    up.load_state_dict(gen.state_dict())
    y_default = gen(src)
    with TF.conv_config(dataflow=TF.Dataflow.GatherScatter):
        y = gen(src)
    assert torch.equal(y_default.coords, y.coords)
    torch.testing.assert_close(y_default.feats, y.feats, rtol=1e-12, atol=1e-12)
    out_stride = ch.div3(geo.in_stride, geo.stride)
    as_tensor = tl.SparseTensor(torch.zeros(y.coords.shape[0], 1, dtype=F64), y.coords, out_stride)
    for target in (y.coords.clone(), as_tensor):
        fresh = tl.SparseTensor(feats, coords, stride=geo.in_stride)  # no shared caches
        for module, inp in ((gen, src), (gen, fresh), (up, src), (up, fresh)):
            yt = module(inp, target)
            assert torch.equal(yt.coords, y.coords)
            assert torch.equal(yt.feats, y.feats)
    # A permuted target gives the permuted rows.
    perm = torch.randperm(y.coords.shape[0], generator=torch.Generator().manual_seed(seed))
    yp = gen(src, y.coords[perm])
    assert torch.equal(yp.coords, y.coords[perm])
    torch.testing.assert_close(yp.feats, y.feats[perm], rtol=1e-13, atol=1e-13)
    # The module-level config gives the same bits as the scope.
    gs = TF.ConvConfig(dataflow=TF.Dataflow.GatherScatter)
    gen_gs = tl.nn.GenerativeConvTranspose3d(
        cin, cout, kernel_size=geo.kernel, stride=geo.stride, bias=geo.bias, config=gs
    ).to(F64)
    gen_gs.load_state_dict(gen.state_dict())
    assert torch.equal(gen_gs(src).feats, y.feats)


@pytest.mark.parametrize("dataflow", list(TF.Dataflow), ids=lambda d: d.value)
def test_every_dataflow_matches_dense_oracle(dataflow: TF.Dataflow) -> None:
    """Inverse and generative transposes are dataflow-independent (to rounding)."""
    feats, coords = oracle.random_geometry(71, 2, (7, 6, 8), 0.2, 3)
    x = tl.SparseTensor(feats, coords, spatial_range=(2, 7, 6, 8))
    kw = dict(kernel_size=3, stride=2, padding=1)
    y = ch.make_conv(tl.nn.Conv3d, 3, 2, 71, **kw)(x)
    cfg = TF.ConvConfig(dataflow=dataflow)
    up = ch.make_conv(tl.nn.ConvTranspose3d, 2, 3, 72, bias=True, **kw)
    gen = ch.make_conv(tl.nn.GenerativeConvTranspose3d, 2, 3, 73, kernel_size=(2, 3, 2), bias=True)
    with TF.conv_config(cfg):
        for module, src, out in ((up, y, coords), (gen, y, None)):
            leaf = y.feats.detach().clone().requires_grad_(True)
            z = module(src.replace(leaf))
            k, s, p = (module.kernel_size, module.stride, module.padding)
            if out is None:
                out = oracle.expected_generative_support(y.coords, k, s)
            ch.assert_coords_equal(z.coords, out)
            ch.compare_with_oracle(
                module,
                leaf,
                z.feats,
                lambda f, w, b, out=out, k=k, s=s, p=p: oracle.dense_conv_transpose_at(
                    f, y.coords, w, b, out, k, s, p
                ),
                grad_seed=72,
            )


def test_generative_support_is_cached() -> None:
    feats, coords = oracle.random_geometry(51, 2, (5, 5, 5), 0.3, 2)
    src = tl.SparseTensor(feats, coords, stride=2)
    torch.manual_seed(51)
    a = tl.nn.GenerativeConvTranspose3d(2, 3, kernel_size=3, stride=2).to(F64)
    b = tl.nn.GenerativeConvTranspose3d(2, 5, kernel_size=3, stride=2).to(F64)
    ya = a(src)
    builds = src.coordinate_manager.builds
    assert builds == 1
    yb = b(src)
    assert torch.equal(ya.coords, yb.coords)
    assert src.coordinate_manager.builds == builds


def test_generative_never_clips_and_overflow_raises() -> None:
    """Rows up to int32 max are produced exactly; one past it is an error, not a clip."""
    top = 2**30 - 1  # k2 s2: 2*top + 1 == 2**31 - 1 fits int32
    coords = torch.tensor([[0, top, 0, 5], [1, 0, top, 0]], dtype=I32)
    feats = torch.tensor([[1.0], [2.0]], dtype=F64)
    gen = ch.make_conv(tl.nn.GenerativeConvTranspose3d, 1, 1, 3, kernel_size=2, stride=2)
    y = gen(tl.SparseTensor(feats, coords, stride=2))
    expected = oracle.expected_generative_support(coords, 2, 2)
    ch.assert_coords_equal(y.coords, expected)
    assert int(y.coords.max()) == 2**31 - 1
    w = gen.weight.detach().flatten()
    assert torch.equal(y.feats.detach().flatten(), torch.cat([w * 1.0, w * 2.0]))

    over = torch.tensor([[0, 2**30, 0, 0]], dtype=I32)
    with pytest.raises((ValueError, OverflowError)):
        gen(tl.SparseTensor(torch.ones(1, 1, dtype=F64), over, stride=2))


def test_generative_empty_source() -> None:
    gen = ch.make_conv(tl.nn.GenerativeConvTranspose3d, 2, 3, 4, kernel_size=2, stride=2, bias=True)
    y = gen(tl.SparseTensor(torch.zeros(0, 2, dtype=F64), torch.zeros(0, 4, dtype=I32), 2))
    assert y.coords.shape == (0, 4) and y.feats.shape == (0, 3)
    assert y.stride == (1, 1, 1)


# --------------------------------------------------------------------------------------
# Errors
# --------------------------------------------------------------------------------------


def small_source(stride: ch.IntOrTriple = 2, channels: int = 2) -> tl.SparseTensor:
    coords = torch.tensor([[0, 1, 2, 0], [0, 0, 0, 1], [1, 2, 1, 1]], dtype=I32)
    return tl.SparseTensor(torch.randn(3, channels, dtype=F64), coords, stride=stride)


def test_inverse_without_conv3d_in_history_raises() -> None:
    up = tl.nn.ConvTranspose3d(2, 2, kernel_size=2, stride=2).to(F64)
    with pytest.raises(ValueError, match="Conv3d"):
        up(small_source())


def test_inverse_of_a_support_two_sources_reached_is_ambiguous() -> None:
    """A support that Conv3d layers of one geometry reached from two inputs (it was
    also their target) has no single inverse: an error, never the other input's rows."""
    down = tl.nn.Conv3d(1, 1, kernel_size=2, stride=2).to(F64)
    up = tl.nn.ConvTranspose3d(1, 1, kernel_size=2, stride=2).to(F64)
    x0 = tl.SparseTensor(torch.ones(2, 1, dtype=F64),
                         torch.tensor([[0, 0, 0, 0], [0, 3, 3, 3]], dtype=I32))
    x1 = tl.SparseTensor(torch.ones(1, 1, dtype=F64), torch.tensor([[0, 1, 1, 1]], dtype=I32))
    a = down(x0)
    ch.assert_coords_equal(up(a).coords, x0.coords)  # one source: its rows
    down(x0, coordinates=a)  # the same source again is no ambiguity
    ch.assert_coords_equal(up(a).coords, x0.coords)
    down(x1, coordinates=a)
    with pytest.raises(ValueError, match="ambiguous; pass the target"):
        up(a)
    ch.assert_coords_equal(up(a, x0).coords, x0.coords)  # with the target named: fine


def test_inverse_with_other_geometry_raises() -> None:
    feats, coords = oracle.random_geometry(61, 1, (6, 6, 6), 0.3, 2)
    x = tl.SparseTensor(feats, coords)
    y = tl.nn.Conv3d(2, 2, kernel_size=2, stride=2).to(F64)(x)
    # Control: the same geometry spelled as tuples is the same geometry.
    same = tl.nn.ConvTranspose3d(2, 2, kernel_size=(2, 2, 2), stride=(2, 2, 2), padding=(0, 0, 0))
    ch.assert_coords_equal(same.to(F64)(y).coords, coords)
    for kw in (
        dict(kernel_size=3, stride=2, padding=1),
        dict(kernel_size=2, stride=2, padding=1),
        dict(kernel_size=2, stride=2, dilation=2),
        dict(kernel_size=(2, 2, 1), stride=2),
    ):
        with pytest.raises(ValueError):
            tl.nn.ConvTranspose3d(2, 2, **kw).to(F64)(y)


def test_wrong_target_stride_raises() -> None:
    src = small_source(stride=2)
    up = tl.nn.ConvTranspose3d(2, 2, kernel_size=2, stride=2).to(F64)
    gen = tl.nn.GenerativeConvTranspose3d(2, 2, kernel_size=2, stride=2).to(F64)
    coords = torch.tensor([[0, 0, 0, 0], [0, 2, 4, 1]], dtype=I32)
    for stride in (2, (1, 1, 2), 4):
        target = tl.SparseTensor(torch.zeros(2, 1, dtype=F64), coords, stride=stride)
        for module in (up, gen):
            with pytest.raises(ValueError, match="stride"):
                module(src, target)


@pytest.mark.parametrize(
    ("src_stride", "stride"), [(1, 2), (2, 3), ((2, 2, 2), (2, 4, 2)), ((4, 3, 2), 2)]
)
def test_non_divisible_stride_raises(src_stride: ch.IntOrTriple, stride: ch.IntOrTriple) -> None:
    src = small_source(stride=src_stride)
    tgt = torch.tensor([[0, 0, 0, 0]], dtype=I32)
    up = tl.nn.ConvTranspose3d(2, 2, kernel_size=2, stride=stride).to(F64)
    gen = tl.nn.GenerativeConvTranspose3d(2, 2, kernel_size=2, stride=stride).to(F64)
    with pytest.raises(ValueError, match="stride"):
        up(src, tgt)
    with pytest.raises(ValueError, match="stride"):
        gen(src)
    with pytest.raises(ValueError, match="stride"):
        gen(src, tgt)


def test_bad_target_rows_raise() -> None:
    src = small_source(stride=2)
    up = tl.nn.ConvTranspose3d(2, 2, kernel_size=2, stride=2).to(F64)
    gen = tl.nn.GenerativeConvTranspose3d(2, 2, kernel_size=2, stride=2).to(F64)
    dup = torch.tensor([[0, 1, 2, 3], [0, 0, 0, 0], [0, 1, 2, 3]], dtype=I32)
    negative = torch.tensor([[0, -1, 0, 0]], dtype=I32)
    for module in (up, gen):
        with pytest.raises(ValueError, match="unique"):
            module(src, dup)
        with pytest.raises(ValueError, match="negative"):
            module(src, negative)
        with pytest.raises(ValueError):
            module(src, torch.zeros(2, 3, dtype=I32))
        with pytest.raises(TypeError):
            module(src, torch.zeros(2, 4, dtype=F64))


@pytest.mark.parametrize(
    "kwargs",
    [
        dict(padding=1),
        dict(padding=(0, 1, 0)),
        dict(dilation=2),
        dict(dilation=(1, 1, 2)),
    ],
)
def test_generative_rejects_padding_and_dilation(kwargs: dict) -> None:
    for cls in (tl.nn.GenerativeConvTranspose3d, tl.nn.NormalizedGenerativeConvTranspose3d):
        with pytest.raises(ValueError, match=r"padding|dilation"):
            cls(2, 2, kernel_size=2, stride=2, **kwargs)


def test_channel_mismatch_raises() -> None:
    src = small_source(stride=2, channels=3)
    tgt = torch.tensor([[0, 0, 0, 0]], dtype=I32)
    up = tl.nn.ConvTranspose3d(2, 2, kernel_size=2, stride=2).to(F64)
    gen = tl.nn.GenerativeConvTranspose3d(2, 2, kernel_size=2, stride=2).to(F64)
    with pytest.raises(ValueError, match="channels"):
        up(src, tgt)
    with pytest.raises(ValueError, match="channels"):
        gen(src)
    with pytest.raises(ValueError, match="channels"):
        gen(src, tgt)
    # Inverse: the channel check comes before any support lookup.
    feats, coords = oracle.random_geometry(62, 1, (6, 6, 6), 0.3, 2)
    y = tl.nn.Conv3d(2, 3, kernel_size=2, stride=2).to(F64)(tl.SparseTensor(feats, coords))
    with pytest.raises(ValueError, match="channels"):
        up(y)


def test_dtype_and_type_mismatch_raise() -> None:
    src = small_source(stride=2)
    up = tl.nn.ConvTranspose3d(2, 2, kernel_size=2, stride=2)  # float32 weights
    with pytest.raises(TypeError):
        up(src, torch.zeros(1, 4, dtype=I32))
    with pytest.raises(TypeError):
        up(src.feats, torch.zeros(1, 4, dtype=I32))


def test_pointwise_transpose_keeps_support() -> None:
    """1x1x1 stride 1: output support = input support, y = x @ W_0 + b, no history needed."""
    feats, coords = oracle.random_geometry(81, 2, (5, 5, 5), 0.3, 3)
    up = ch.make_conv(tl.nn.ConvTranspose3d, 3, 2, 81, kernel_size=1, bias=True)
    y = up(tl.SparseTensor(feats, coords, stride=2, spatial_range=(2, 5, 5, 5)))
    ch.assert_coords_equal(y.coords, coords)
    assert y.stride == (2, 2, 2) and y.spatial_range == (2, 5, 5, 5)
    expected = feats @ up.weight.detach()[0] + up.bias.detach()
    torch.testing.assert_close(y.feats.detach(), expected, rtol=1e-12, atol=1e-12)
