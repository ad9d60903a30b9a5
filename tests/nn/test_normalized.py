"""Weight-normalized convolutions (API.md, "Weight-normalized family").

For kernels with K > 1: ``y = conv(x, W) / sqrt(conv(1, W*W) + eps) + b``, where both
convolutions run the base module's relation without bias. The reference computes the
numerator and the denominator with the dense oracle (``conv3d`` for the submanifold base,
``conv_transpose3d`` for the transposes) in float64; forward and gradients match to 1e-10
relative. Pointwise kernels skip normalization; ``eps <= 0`` raises; both passes share one
cached kernel map.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator

import pytest
import torch

import torch_lattice as tl
from torch_lattice.nn import functional as TF

try:
    import conformance_helpers as ch
    import dense_oracle as oracle
    import test_conformance_transpose as tt
except ImportError:  # tests/ may become a package; then they are imported through it
    from tests import conformance_helpers as ch
    from tests import dense_oracle as oracle
    from tests.nn import test_conformance_transpose as tt

F64 = torch.float64
I32 = torch.int32
Geo = ch.Geo
Dense = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]  # (feats, weight) -> rows

NORMALIZED = (
    tl.nn.NormalizedSubmConv3d,
    tl.nn.NormalizedConvTranspose3d,
    tl.nn.NormalizedGenerativeConvTranspose3d,
)


def normalized_ref(dense: Dense, eps: float) -> ch.RefFn:
    """The documented formula, numerator and denominator both from the dense oracle."""

    def ref(f: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None) -> torch.Tensor:
        y = dense(f, w) / torch.sqrt(dense(torch.ones_like(f), w * w) + eps)
        return y if b is None else y + b

    return ref


# --------------------------------------------------------------------------------------
# Formula against the dense oracle
# --------------------------------------------------------------------------------------

SUBM_CASES = [
    ch.coarse_geo(kernel=3, batches=2, bias=True, extent=(6, 6, 6)),
    ch.coarse_geo(kernel=(3, 1, 5), dilation=(1, 2, 1), batches=1, extent=(6, 7, 8)),
    ch.coarse_geo(kernel=5, batches=1, bias=True, in_stride=2, extent=(7, 7, 7), density=0.1),
]


@pytest.mark.parametrize("eps", [1e-8, 0.5])
@pytest.mark.parametrize("geo", SUBM_CASES, ids=ch.geo_id)
def test_normalized_subm_matches_formula(geo: Geo, eps: float) -> None:
    seed = ch.seed_of(geo, f"nsubm{eps}")
    feats, coords = oracle.random_geometry(seed, geo.batches, geo.extent, geo.density, 3)
    conv = ch.make_conv(
        tl.nn.NormalizedSubmConv3d,
        3,
        2,
        seed,
        kernel_size=geo.kernel,
        dilation=geo.dilation,
        bias=geo.bias,
        eps=eps,
    )
    leaf, x = ch.sparse_input(feats, coords, geo.in_stride, (geo.batches, *geo.extent))
    y = conv(x)
    ch.assert_coords_equal(y.coords, coords)
    assert y.stride == x.stride and y.spatial_range == x.spatial_range

    def dense(f: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        return oracle.dense_subm(f, coords, w, None, geo.kernel, geo.dilation)

    ch.compare_with_oracle(conv, leaf, y.feats, normalized_ref(dense, eps), grad_seed=seed + 1)


TRANSPOSE_CASES = [
    ch.coarse_geo(kernel=3, stride=2, padding=1, batches=2, bias=True, in_stride=2),
    ch.coarse_geo(kernel=2, stride=2, batches=1, in_stride=4),
    ch.coarse_geo(
        kernel=(2, 3, 1),
        stride=(2, 1, 3),
        padding=(0, 1, 0),
        dilation=(1, 2, 1),
        batches=2,
        bias=True,
        in_stride=(2, 2, 3),
    ),
]


@pytest.mark.parametrize("eps", [1e-8, 0.5])
@pytest.mark.parametrize("geo", TRANSPOSE_CASES, ids=ch.geo_id)
def test_normalized_transpose_target_matches_formula(geo: Geo, eps: float) -> None:
    seed = ch.seed_of(geo, f"ntarget{eps}")
    feats, coords = oracle.random_geometry(seed, geo.batches, geo.extent, geo.density, 3)
    target, reach = ch.transpose_target(seed, coords, geo)
    conv = ch.make_conv(
        tl.nn.NormalizedConvTranspose3d,
        3,
        2,
        seed,
        bias=geo.bias,
        eps=eps,
        **ch.strided_kwargs(geo),
    )
    leaf, src = ch.sparse_input(feats, coords, geo.in_stride)
    y = conv(src, target)
    ch.assert_coords_equal(y.coords, target)
    assert y.stride == ch.div3(geo.in_stride, geo.stride)

    def dense(f: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        return oracle.dense_conv_transpose_at(
            f, coords, w, None, target, geo.kernel, geo.stride, geo.padding, geo.dilation
        )

    ch.compare_with_oracle(conv, leaf, y.feats, normalized_ref(dense, eps), grad_seed=seed + 1)
    # Unreached rows: 0 / sqrt(0 + eps) + b, i.e. exactly the bias.
    unreached = torch.tensor([tuple(r) not in reach for r in target.tolist()])
    assert unreached.any()
    empty = conv.bias.detach() if conv.bias is not None else torch.zeros(2, dtype=F64)
    got = y.feats.detach()[unreached]
    assert torch.equal(got, empty.expand_as(got))


@pytest.mark.parametrize("geo", tt.INVERSE_CASES[:2] + tt.INVERSE_CASES[7:8], ids=ch.geo_id)
def test_normalized_inverse_matches_formula_without_new_maps(geo: Geo) -> None:
    seed = ch.seed_of(geo, "ninverse")
    feats, coords = oracle.random_geometry(seed, geo.batches, geo.extent, geo.density, 2)
    x = tl.SparseTensor(feats, coords, spatial_range=(geo.batches, *geo.extent))
    kw = ch.strided_kwargs(geo)
    y = ch.make_conv(tl.nn.Conv3d, 2, 3, seed, **kw)(x)
    builds = x.coordinate_manager.builds
    conv = ch.make_conv(tl.nn.NormalizedConvTranspose3d, 3, 2, seed + 1, bias=geo.bias, **kw)
    leaf = y.feats.detach().clone().requires_grad_(True)
    z = conv(y.replace(leaf))
    assert x.coordinate_manager.builds == builds  # both passes reuse the encoder's map
    ch.assert_coords_equal(z.coords, coords)
    assert z.stride == x.stride and z.spatial_range == x.spatial_range

    def dense(f: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        return oracle.dense_conv_transpose_at(
            f, y.coords, w, None, coords, geo.kernel, geo.stride, geo.padding, geo.dilation
        )

    ch.compare_with_oracle(conv, leaf, z.feats, normalized_ref(dense, 1e-8), grad_seed=seed + 1)


@pytest.mark.parametrize("with_range", [True, False], ids=["range", "norange"])
@pytest.mark.parametrize("geo", [tt.GEN_CASES[0], tt.GEN_CASES[2], tt.GEN_CASES[6]], ids=ch.geo_id)
def test_normalized_generative_matches_formula(geo: Geo, with_range: bool) -> None:
    seed = ch.seed_of(geo, f"ngen{with_range}")
    feats, coords = oracle.random_geometry(seed, geo.batches, geo.extent, geo.density, 3)
    srange = (geo.batches, *geo.extent) if with_range else None
    conv = ch.make_conv(
        tl.nn.NormalizedGenerativeConvTranspose3d,
        3,
        2,
        seed,
        kernel_size=geo.kernel,
        stride=geo.stride,
        bias=geo.bias,
    )
    base = tl.nn.GenerativeConvTranspose3d(
        3, 2, kernel_size=geo.kernel, stride=geo.stride, bias=geo.bias
    ).to(F64)
    base.load_state_dict(conv.state_dict())
    leaf, src = ch.sparse_input(feats, coords, geo.in_stride, srange)
    y = conv(src)
    # Same support, stride and range as the base module.
    expected = base(src.detach())
    assert torch.equal(y.coords, expected.coords)
    assert y.stride == expected.stride and y.spatial_range == expected.spatial_range
    out = oracle.expected_generative_support(coords, geo.kernel, geo.stride)
    ch.assert_coords_equal(y.coords, out)

    def dense(f: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        return oracle.dense_conv_transpose_at(f, coords, w, None, out, geo.kernel, geo.stride)

    ch.compare_with_oracle(conv, leaf, y.feats, normalized_ref(dense, 1e-8), grad_seed=seed + 1)
    # Generated and explicit-target results are bitwise equal for the same dataflow
    # (target transposes run gather-scatter).
    again = conv(src, y.coords.clone())
    with TF.conv_config(dataflow=TF.Dataflow.GatherScatter):
        generated = conv(src)
    assert torch.equal(again.feats, generated.feats)
    torch.testing.assert_close(again.feats, y.feats, rtol=1e-12, atol=1e-12)


def test_normalization_changes_the_result() -> None:
    """Guards the formula tests: a normalized layer differs from its plain base."""
    feats, coords = oracle.random_geometry(5, 1, (5, 5, 5), 0.3, 2)
    conv = ch.make_conv(tl.nn.NormalizedSubmConv3d, 2, 2, 5, kernel_size=3)
    base = ch.make_conv(tl.nn.SubmConv3d, 2, 2, 5, kernel_size=3)
    x = tl.SparseTensor(feats, coords)
    assert not torch.allclose(conv(x).feats, base(x).feats)


# --------------------------------------------------------------------------------------
# Pointwise kernels skip normalization
# --------------------------------------------------------------------------------------


def test_pointwise_bypass_subm() -> None:
    feats, coords = oracle.random_geometry(7, 2, (5, 5, 5), 0.3, 3)
    conv = ch.make_conv(tl.nn.NormalizedSubmConv3d, 3, 4, 7, kernel_size=1, bias=True)
    base = tl.nn.SubmConv3d(3, 4, kernel_size=1, bias=True).to(F64)
    base.load_state_dict(conv.state_dict())
    x = tl.SparseTensor(feats, coords)
    y = conv(x)
    ch.assert_coords_equal(y.coords, coords)
    assert torch.equal(y.feats, base(x).feats)
    expected = feats @ conv.weight.detach()[0] + conv.bias.detach()
    torch.testing.assert_close(y.feats.detach(), expected, rtol=1e-12, atol=1e-12)


def test_pointwise_bypass_transposes() -> None:
    feats, coords = oracle.random_geometry(8, 2, (5, 5, 5), 0.3, 3)
    src = tl.SparseTensor(feats, coords, stride=2)
    scale = torch.tensor([1, 2, 2, 2])
    target = (coords.long() * scale).to(I32).flip(0)  # t = 2c: hit by c only
    pairs = [
        (tl.nn.NormalizedConvTranspose3d, tl.nn.ConvTranspose3d, (src, target)),
        (tl.nn.NormalizedGenerativeConvTranspose3d, tl.nn.GenerativeConvTranspose3d, (src,)),
    ]
    for norm_cls, base_cls, args in pairs:
        conv = ch.make_conv(norm_cls, 3, 4, 8, kernel_size=1, stride=2, bias=True)
        base = base_cls(3, 4, kernel_size=1, stride=2, bias=True).to(F64)
        base.load_state_dict(conv.state_dict())
        y = conv(*args)
        assert torch.equal(y.coords, base(*args).coords)
        assert torch.equal(y.feats, base(*args).feats)
        # Every fine row 2*c is hit by exactly one source row c: y = x @ W_0 + b.
        by_row = {tuple(c): f for c, f in zip(coords.tolist(), feats, strict=True)}
        fine = y.coords.tolist()
        x_rows = torch.stack([by_row[(b, i // 2, j // 2, k // 2)] for b, i, j, k in fine])
        expected = x_rows @ conv.weight.detach()[0] + conv.bias.detach()
        torch.testing.assert_close(y.feats.detach(), expected, rtol=1e-12, atol=1e-12)


# --------------------------------------------------------------------------------------
# eps
# --------------------------------------------------------------------------------------


@pytest.mark.parametrize("eps", [0, 0.0, -1e-8, -1.0, math.nan])
@pytest.mark.parametrize("cls", NORMALIZED, ids=lambda c: c.__name__)
def test_eps_must_be_positive(cls: type[torch.nn.Module], eps: float) -> None:
    kwargs = dict(kernel_size=3) if cls is tl.nn.NormalizedSubmConv3d else {}
    with pytest.raises(ValueError, match="eps"):
        cls(2, 2, eps=eps, **kwargs)


@pytest.mark.parametrize("cls", NORMALIZED, ids=lambda c: c.__name__)
def test_eps_default_and_stored(cls: type[torch.nn.Module]) -> None:
    assert cls(2, 2).eps == 1e-8
    assert cls(2, 2, eps=0.25).eps == 0.25


# --------------------------------------------------------------------------------------
# One kernel map per normalized forward
# --------------------------------------------------------------------------------------


def test_subm_builds_one_map() -> None:
    feats, coords = oracle.random_geometry(9, 2, (6, 6, 6), 0.2, 2)
    x = tl.SparseTensor(feats, coords)
    assert x.coordinate_manager.builds == 0
    ch.make_conv(tl.nn.NormalizedSubmConv3d, 2, 3, 9, kernel_size=3)(x)
    assert x.coordinate_manager.builds == 1
    # Another layer with the same geometry reuses it.
    ch.make_conv(tl.nn.NormalizedSubmConv3d, 2, 2, 10, kernel_size=3, bias=True)(x)
    assert x.coordinate_manager.builds == 1


@pytest.mark.parametrize("target_kind", ["sparse_tensor", "coords"])
def test_transpose_target_builds_one_map(target_kind: str) -> None:
    geo = TRANSPOSE_CASES[0]
    feats, coords = oracle.random_geometry(12, geo.batches, geo.extent, geo.density, 2)
    rows, _ = ch.transpose_target(12, coords, geo)
    src = tl.SparseTensor(feats, coords, stride=geo.in_stride)
    target: tl.SparseTensor | torch.Tensor = rows
    tensors = [src]
    if target_kind == "sparse_tensor":
        target = tl.SparseTensor(torch.zeros(rows.shape[0], 1, dtype=F64), rows, stride=1)
        tensors.append(target)
    assert ch.total_builds(*tensors) == 0
    conv = ch.make_conv(
        tl.nn.NormalizedConvTranspose3d,
        2,
        3,
        12,
        kernel_size=geo.kernel,
        stride=geo.stride,
        padding=geo.padding,
    )
    y = conv(src, target)
    assert ch.total_builds(*tensors, y) == 1


def test_generative_builds_one_map() -> None:
    feats, coords = oracle.random_geometry(13, 2, (5, 5, 5), 0.3, 2)
    src = tl.SparseTensor(feats, coords, stride=2)
    conv = ch.make_conv(tl.nn.NormalizedGenerativeConvTranspose3d, 2, 3, 13, kernel_size=3)
    y = conv(src)
    assert ch.total_builds(src, y) == 1


# --------------------------------------------------------------------------------------
# gradcheck through the denominator
# --------------------------------------------------------------------------------------


@pytest.fixture
def one_thread() -> Iterator[None]:
    """gradcheck makes hundreds of tiny calls; one thread keeps them cheap on a busy CI box."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def tiny(seed: int, stride: int = 1) -> tl.SparseTensor:
    feats, coords = oracle.random_geometry(seed, 1, (3, 3, 3), 0.25, 2)
    return tl.SparseTensor(feats, coords, stride=stride)


@pytest.mark.usefixtures("one_thread")
def test_gradcheck_normalized_subm() -> None:
    conv = ch.make_conv(
        tl.nn.NormalizedSubmConv3d, 2, 2, 21, kernel_size=(3, 3, 1), bias=True, eps=1e-3
    )
    ch.gradcheck_module(conv, tiny(21))


@pytest.mark.usefixtures("one_thread")
def test_gradcheck_normalized_transpose_target_and_inverse() -> None:
    x = tiny(22, stride=2)
    kw = dict(kernel_size=(3, 1, 2), stride=(2, 1, 2), padding=(1, 0, 0), bias=True, eps=1e-3)
    conv = ch.make_conv(tl.nn.NormalizedConvTranspose3d, 2, 2, 22, **kw)
    rows = torch.tensor([[0, 0, 0, 0], [0, 1, 2, 3], [0, 4, 1, 0], [0, 2, 2, 2]], dtype=I32)
    target = tl.SparseTensor(torch.zeros(4, 1, dtype=F64), rows, stride=(1, 2, 1))
    ch.gradcheck_module(conv, x, target)

    fine = tiny(23)
    down = ch.make_conv(
        tl.nn.Conv3d, 2, 2, 23, kernel_size=(3, 1, 2), stride=(2, 1, 2), padding=(1, 0, 0)
    )
    ch.gradcheck_module(conv, down(fine).detach())


@pytest.mark.usefixtures("one_thread")
def test_gradcheck_normalized_generative() -> None:
    conv = ch.make_conv(
        tl.nn.NormalizedGenerativeConvTranspose3d,
        2,
        2,
        24,
        kernel_size=(2, 1, 2),
        stride=(2, 1, 2),
        bias=True,
    )
    x = tiny(24, stride=2)
    ch.gradcheck_module(conv, x)
    ch.gradcheck_module(conv, x, conv(x).coords.flip(0))


@pytest.mark.parametrize("scale", [0.0, 1e-4, 1.0])
def test_float16_models_sum_the_denominator_in_float32(scale: float) -> None:
    """A model moved to float16 (no autocast): conv(1, W^2) + eps is summed in float32,
    where in float16 squared weights below 6e-8 vanished (inf) and eps = 1e-8 rounded to 0
    (NaN on a row nothing reaches); the output stays float16 and near float32's, the bias
    on the unreached row, and the gradients finite."""
    src = tl.SparseTensor(torch.ones(1, 2), torch.tensor([[0, 0, 0, 0]]), stride=2)
    tgt = tl.SparseTensor(torch.zeros(2, 2), torch.tensor([[0, 0, 0, 0], [0, 5, 5, 5]]))
    sub_in = tl.SparseTensor(torch.ones(2, 2), torch.tensor([[0, 0, 0, 0], [0, 4, 4, 4]]))
    layers = [
        (tl.nn.NormalizedConvTranspose3d(2, 2, kernel_size=2, stride=2, bias=True), (src, tgt)),
        (tl.nn.NormalizedSubmConv3d(2, 2, kernel_size=3, bias=True), (sub_in,)),
        (tl.nn.NormalizedGenerativeConvTranspose3d(2, 2, kernel_size=2, stride=2, bias=True),
         (src,)),
    ]
    for layer, inputs in layers:
        with torch.no_grad():
            layer.weight.fill_(scale)
            layer.bias.fill_(0.25)
        want = layer(*inputs).feats.detach()
        half = layer.half()
        got = half(*(t.half() for t in inputs))
        assert got.feats.dtype == torch.float16
        assert torch.isfinite(got.feats).all(), type(layer).__name__
        torch.testing.assert_close(got.feats.float(), want, rtol=2e-3, atol=2e-3)
        got.feats.sum().backward()
        assert torch.isfinite(half.weight.grad).all() and torch.isfinite(half.bias.grad).all()
