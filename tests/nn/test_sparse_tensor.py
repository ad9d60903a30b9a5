"""``tl.SparseTensor`` construction, validation and conversions (API.md).

feats: (N, C) floating; coords: (N, 4) integer [b, x, y, z], stored int32, rows unique
and non-negative; stride: int or 3-tuple -> 3-tuple of positive ints; spatial_range:
None or (B, X, Y, Z) (an int is broadcast) containing every coordinate.
"""

from __future__ import annotations

import pytest
import torch

import torch_lattice as tl

F32, F64 = torch.float32, torch.float64


def sample(n_channels: int = 3) -> tuple[torch.Tensor, torch.Tensor]:
    """Small fixed, unsorted support over two batches with random features."""
    coords = torch.tensor(
        [[1, 0, 2, 1], [0, 3, 1, 0], [0, 0, 0, 0], [1, 4, 4, 5], [0, 3, 1, 2]],
        dtype=torch.int64,
    )
    gen = torch.Generator().manual_seed(0)
    feats = torch.randn(coords.shape[0], n_channels, generator=gen, dtype=F64)
    return feats, coords


# --------------------------------------------------------------------------------------
# Accepted input and properties
# --------------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [torch.int64, torch.int32])
def test_coords_stored_as_int32(dtype: torch.dtype) -> None:
    feats, coords = sample()
    coords_in = coords.to(dtype)
    before = coords_in.clone()
    x = tl.SparseTensor(feats, coords_in)
    assert x.coords.dtype == torch.int32
    assert torch.equal(x.coords.long(), coords)  # same rows, same order
    assert x.feats is feats or torch.equal(x.feats, feats)
    assert torch.equal(coords_in, before)  # the input is not modified


def test_properties_and_defaults() -> None:
    feats, coords = sample()
    x = tl.SparseTensor(feats, coords)
    assert x.stride == (1, 1, 1)
    assert x.spatial_range is None
    assert x.feats.shape == (5, 3) and x.feats.dtype == F64
    assert x.coords.shape == (5, 4)


@pytest.mark.parametrize(
    ("stride", "expected"), [(2, (2, 2, 2)), ((1, 2, 4), (1, 2, 4)), (1, (1, 1, 1))]
)
def test_stride_normalized_to_triple(
    stride: int | tuple[int, int, int], expected: tuple[int, int, int]
) -> None:
    feats, coords = sample()
    x = tl.SparseTensor(feats, coords, stride=stride)
    assert tuple(x.stride) == expected
    assert all(isinstance(s, int) for s in x.stride)


def test_spatial_range_tuple_and_int_broadcast() -> None:
    feats, coords = sample()
    x = tl.SparseTensor(feats, coords, spatial_range=(2, 5, 5, 6))
    assert tuple(x.spatial_range) == (2, 5, 5, 6)
    # An int is broadcast to all four entries (B, X, Y, Z).
    y = tl.SparseTensor(feats, coords, spatial_range=6)
    assert tuple(y.spatial_range) == (6, 6, 6, 6)


def test_same_xyz_in_different_batches_is_not_duplicate() -> None:
    coords = torch.tensor([[0, 1, 1, 1], [1, 1, 1, 1]])
    x = tl.SparseTensor(torch.ones(2, 1), coords)
    assert x.coords.shape == (2, 4)


def test_empty_tensor_is_valid() -> None:
    x = tl.SparseTensor(torch.zeros(0, 2), torch.zeros(0, 4, dtype=torch.int64))
    assert x.feats.shape == (0, 2)
    assert x.coords.shape == (0, 4) and x.coords.dtype == torch.int32


# --------------------------------------------------------------------------------------
# Validation
# --------------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.complex64])
def test_non_integer_coords_rejected(dtype: torch.dtype) -> None:
    feats, coords = sample()
    with pytest.raises((TypeError, ValueError), match="coords"):
        tl.SparseTensor(feats, coords.to(dtype))


@pytest.mark.parametrize("shape", [(5, 3), (5, 5), (5,), (5, 4, 1), (20,)], ids=str)
def test_coords_shape_rejected(shape: tuple[int, ...]) -> None:
    feats, _ = sample()
    coords = torch.zeros(shape, dtype=torch.int64)
    with pytest.raises(ValueError, match="coords"):
        tl.SparseTensor(feats, coords)


@pytest.mark.parametrize("column", [0, 1, 2, 3])
def test_negative_coordinate_rejected(column: int) -> None:
    feats, coords = sample()
    coords[2, column] = -1
    with pytest.raises(ValueError, match="coords") as err:
        tl.SparseTensor(feats, coords)
    assert "negative" in str(err.value)


def test_duplicate_rows_rejected() -> None:
    feats, coords = sample()
    coords[4] = coords[1]
    with pytest.raises(ValueError, match=r"(?i)unique|duplicate"):
        tl.SparseTensor(feats, coords)


def _first_repeat(coords: torch.Tensor) -> int:
    """The index the duplicate check names: the first row equal to an earlier one."""
    seen: set[tuple[int, ...]] = set()
    for i, row in enumerate(coords.tolist()):
        if tuple(row) in seen:
            return i
        seen.add(tuple(row))
    return -1


@pytest.mark.parametrize("order", ["ascending", "shuffled"])
@pytest.mark.parametrize("top", [50, 2**31 - 1], ids=["packed", "wider-than-64-bits"])
@pytest.mark.parametrize("repeat", [None, (0, 1), (7, 300), (299, 3)])
def test_duplicate_check_every_path(order: str, top: int, repeat: tuple[int, int] | None) -> None:
    """Rows in ascending order are checked in one pass, other orders by sorting packed
    keys, and coordinates too wide to pack (4 x 31 bits) by the hash table; each path
    accepts unique rows and names the same repeated row as a plain scan."""
    g = torch.Generator().manual_seed(top + len(order))
    coords = torch.unique(torch.randint(0, top, (400, 4), generator=g), dim=0)[:300]
    coords[:, 0] = coords[:, 0] % 3
    coords = torch.unique(coords, dim=0)
    if order == "shuffled":
        coords = coords[torch.randperm(coords.shape[0], generator=g)]
    if repeat is not None:
        dst, src = repeat
        coords[min(dst, coords.shape[0] - 1)] = coords[min(src, coords.shape[0] - 1)]
    feats = torch.zeros(coords.shape[0], 2)
    want = _first_repeat(coords)
    if want < 0:
        assert tl.SparseTensor(feats, coords).coords.shape[0] == coords.shape[0]
        return
    with pytest.raises(ValueError, match=rf"unique, row {want} repeats"):
        tl.SparseTensor(feats, coords)


@pytest.mark.parametrize("value", [2**31, 2**40, -(2**31) - 1])
def test_int64_coords_beyond_int32_rejected(value: int) -> None:
    feats, coords = sample()
    coords[0, 1] = value
    with pytest.raises(ValueError, match="coords"):
        tl.SparseTensor(feats, coords)


@pytest.mark.parametrize(
    "bad_feats",
    [torch.zeros(5), torch.zeros(5, 3, 1), torch.zeros(4, 3), torch.zeros(6, 3)],
    ids=["1d", "3d", "fewer_rows", "more_rows"],
)
def test_bad_feats_shape_rejected(bad_feats: torch.Tensor) -> None:
    _, coords = sample()
    with pytest.raises(ValueError, match="feats"):
        tl.SparseTensor(bad_feats, coords)


@pytest.mark.parametrize("dtype", [torch.int64, torch.int32, torch.bool])
def test_integer_feats_rejected(dtype: torch.dtype) -> None:
    _, coords = sample()
    with pytest.raises((TypeError, ValueError), match="feats"):
        tl.SparseTensor(torch.zeros(5, 3, dtype=dtype), coords)


@pytest.mark.parametrize(
    "spatial_range",
    [(2, 5, 5, 5), (2, 4, 5, 6), (1, 5, 5, 6), 5],
    ids=["z_out", "x_out", "batch_out", "int"],
)
def test_coordinate_outside_spatial_range_rejected(
    spatial_range: int | tuple[int, int, int, int],
) -> None:
    # The sample's maxima are b=1, x=4, y=4, z=5, so each range misses one axis.
    feats, coords = sample()
    with pytest.raises(ValueError, match="spatial_range"):
        tl.SparseTensor(feats, coords, spatial_range=spatial_range)


@pytest.mark.parametrize("stride", [0, -1, (1, 0, 1), (2, 2, -2)], ids=str)
def test_bad_stride_rejected(stride: int | tuple[int, int, int]) -> None:
    feats, coords = sample()
    with pytest.raises(ValueError, match="stride"):
        tl.SparseTensor(feats, coords, stride=stride)


# --------------------------------------------------------------------------------------
# Methods
# --------------------------------------------------------------------------------------


def test_replace_keeps_support() -> None:
    feats, coords = sample()
    x = tl.SparseTensor(feats, coords, stride=(1, 2, 2), spatial_range=(2, 5, 5, 6))
    new_feats = torch.arange(10, dtype=F32).reshape(5, 2)
    y = x.replace(feats=new_feats)
    assert torch.equal(y.feats, new_feats)
    assert torch.equal(y.coords, x.coords)
    assert tuple(y.stride) == (1, 2, 2)
    assert tuple(y.spatial_range) == (2, 5, 5, 6)
    with pytest.raises(ValueError, match="feats"):
        x.replace(feats=torch.zeros(4, 2))


def test_dense_values() -> None:
    feats, coords = sample()
    x = tl.SparseTensor(feats, coords, spatial_range=(2, 5, 6, 7))
    dense = x.dense()
    assert tuple(dense.shape) == (2, 3, 5, 6, 7)
    assert dense.dtype == F64
    expected = torch.zeros(2, 3, 5, 6, 7, dtype=F64)
    for (b, cx, cy, cz), row in zip(coords.tolist(), feats, strict=True):
        expected[b, :, cx, cy, cz] = row
    assert torch.equal(dense, expected)


def test_dense_is_differentiable() -> None:
    feats, coords = sample()
    leaf = feats.clone().requires_grad_(True)
    dense = tl.SparseTensor(leaf, coords, spatial_range=(2, 5, 5, 6)).dense()
    weights = torch.arange(dense.numel(), dtype=F64).reshape(dense.shape)
    (dense * weights).sum().backward()
    expected = weights.permute(0, 2, 3, 4, 1)[
        coords[:, 0], coords[:, 1], coords[:, 2], coords[:, 3]
    ]
    assert torch.equal(leaf.grad, expected)


def test_dense_needs_spatial_range() -> None:
    feats, coords = sample()
    with pytest.raises((ValueError, RuntimeError), match="spatial_range"):
        tl.SparseTensor(feats, coords).dense()


def test_detach() -> None:
    feats, coords = sample()
    leaf = feats.clone().requires_grad_(True)
    x = tl.SparseTensor(leaf * 2, coords, stride=2, spatial_range=(2, 5, 5, 6))
    d = x.detach()
    assert x.feats.requires_grad and not d.feats.requires_grad
    assert torch.equal(d.feats, x.feats.detach())
    assert torch.equal(d.coords, x.coords)
    assert tuple(d.stride) == (2, 2, 2)
    assert tuple(d.spatial_range) == (2, 5, 5, 6)


@pytest.mark.parametrize(
    ("method", "dtype"),
    [("float", F32), ("double", F64), ("half", torch.float16), ("bfloat16", torch.bfloat16)],
)
def test_dtype_conversions_touch_features_only(method: str, dtype: torch.dtype) -> None:
    feats, coords = sample()
    x = tl.SparseTensor(feats.float() if dtype == F64 else feats, coords, stride=2)
    y = getattr(x, method)()
    assert y.feats.dtype == dtype
    assert y.coords.dtype == torch.int32
    assert torch.equal(y.coords, x.coords)
    assert tuple(y.stride) == (2, 2, 2)
    torch.testing.assert_close(y.feats.double(), x.feats.to(dtype).double())


def test_to_dtype_and_cpu() -> None:
    feats, coords = sample()
    x = tl.SparseTensor(feats.float(), coords, spatial_range=(2, 5, 5, 6))
    y = x.to(F64)
    assert y.feats.dtype == F64
    assert y.coords.dtype == torch.int32  # .to(dtype) must not cast the coordinates
    assert torch.equal(y.coords, x.coords)
    assert tuple(y.spatial_range) == (2, 5, 5, 6)
    z = x.cpu()
    assert z.feats.device.type == "cpu" and torch.equal(z.coords, x.coords)


# --------------------------------------------------------------------------------------
# Coordinate manager: kernel maps are built once per (support, geometry)
# --------------------------------------------------------------------------------------
# API.md: "kernel maps and coordinate sets derived from the same support are built once
# and reused (by any layer with the same geometry)". Observed through the public
# ``SparseTensor.coordinate_manager`` and its ``builds`` counter (maps built, not served
# from the cache).


def _support_tensor() -> tl.SparseTensor:
    gen = torch.Generator().manual_seed(4)
    flat = torch.randperm(6 * 6 * 6, generator=gen)[:40]
    coords = torch.stack([flat % 2, flat // 36, (flat // 6) % 6, flat % 6], dim=1)
    coords = torch.unique(coords, dim=0)
    feats = torch.randn(coords.shape[0], 3, generator=gen, dtype=F64)
    return tl.SparseTensor(feats, coords, spatial_range=(2, 6, 6, 6))


def test_subm_kernel_map_reused_across_layers_and_outputs() -> None:
    x = _support_tensor()
    manager = x.coordinate_manager
    first = tl.nn.SubmConv3d(3, 4, kernel_size=3).to(F64)
    second = tl.nn.SubmConv3d(4, 4, kernel_size=3, bias=True).to(F64)
    start = manager.builds
    y = first(x)
    after_first = manager.builds
    assert after_first > start  # the first call had to build its map
    # y shares x's support, so a second layer of the same geometry builds nothing.
    assert y.coordinate_manager is manager
    z = second(y)
    assert manager.builds == after_first
    # Re-applying either layer to x is served from the cache too.
    first(x)
    assert manager.builds == after_first
    # A different geometry needs a new map; the cache must not confuse them.
    tl.nn.SubmConv3d(3, 4, kernel_size=3, dilation=2).to(F64)(x)
    assert manager.builds > after_first
    # Caching must not change results: a fresh tensor (fresh manager) agrees.
    fresh = tl.SparseTensor(x.feats, x.coords, spatial_range=(2, 6, 6, 6))
    z_fresh = second(first(fresh))
    assert fresh.coordinate_manager is not manager
    torch.testing.assert_close(z.feats, z_fresh.feats, rtol=1e-12, atol=1e-12)


def test_generated_support_reused_by_same_geometry() -> None:
    x = _support_tensor()
    manager = x.coordinate_manager
    down_a = tl.nn.Conv3d(3, 2, kernel_size=2, stride=2).to(F64)
    down_b = tl.nn.Conv3d(3, 5, kernel_size=2, stride=2, bias=True).to(F64)
    ya = down_a(x)
    builds = manager.builds
    yb = down_b(x)
    assert manager.builds == builds
    assert torch.equal(ya.coords, yb.coords)
