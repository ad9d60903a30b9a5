"""torch.library registration of the lattice ops: opcheck on each op.

opcheck exercises the schema, the fake (meta) implementation, autograd
registration and AOT dispatch with dynamic shapes.
"""

from __future__ import annotations

import pytest
import torch

import torch_lattice as tl
from torch_lattice.geometry import ConvGeometry
from torch_lattice.nn.functional.supports import generated_support
from torch_lattice.ops import build_kernel_map


def _coords(n: int, side: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    c = torch.randint(0, side, (n, 4), generator=g)
    c[:, 0] %= 2
    c = torch.unique(c, dim=0)
    return c[torch.randperm(c.shape[0], generator=g)].to(torch.int32)


GEOMETRIES = [
    ConvGeometry.submanifold((3, 3, 3), (1, 1, 1)),
    ConvGeometry((2, 2, 2), (2, 2, 2)),
    ConvGeometry((3, 1, 2), (2, 1, 3), (1, 0, 1), (1, 2, 1)),
]


@pytest.mark.parametrize("geometry", GEOMETRIES)
def test_opcheck_generate_support(geometry: ConvGeometry) -> None:
    coords = _coords(60, 7, 0)
    ks, s, p, d = (list(v) for v in geometry.as_c())
    rng = list(geometry.output_range((7, 7, 7)))
    torch.library.opcheck(torch.ops.lattice.generate_support.default, (coords, ks, s, p, d, rng, 2))


@pytest.mark.parametrize("geometry", GEOMETRIES)
def test_opcheck_kernel_map(geometry: ConvGeometry) -> None:
    coords = _coords(60, 7, 1)
    ks, s, p, d = (list(v) for v in geometry.as_c())
    torch.library.opcheck(torch.ops.lattice.kernel_map.default, (coords, coords, ks, s, p, d))


@pytest.mark.parametrize("geometry", GEOMETRIES)
def test_opcheck_neighbour_table(geometry: ConvGeometry) -> None:
    """The nbr-only op equals kernel_map's nbr."""
    coords = _coords(60, 7, 2)
    ks, s, p, d = (list(v) for v in geometry.as_c())
    args = (coords, coords, ks, s, p, d)
    torch.library.opcheck(torch.ops.lattice.neighbour_table.default, args)
    assert torch.equal(torch.ops.lattice.neighbour_table(*args),
                       torch.ops.lattice.kernel_map(*args)[0])


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("geometry", GEOMETRIES)
def test_opcheck_sparse_conv(geometry: ConvGeometry, dtype: torch.dtype) -> None:
    coords = _coords(60, 7, 2)
    x = tl.SparseTensor(torch.zeros(coords.shape[0], 1), coords)
    if geometry.stride == (1, 1, 1):
        target = x.support
    else:
        target = generated_support(x.support, geometry)
    kmap = build_kernel_map(coords, target.coords, geometry)
    feats = torch.randn(coords.shape[0], 3, dtype=dtype, requires_grad=True)
    weight = torch.randn(geometry.volume, 3, 5, dtype=dtype, requires_grad=True)
    torch.library.opcheck(
        torch.ops.lattice.sparse_conv.default, (feats, weight, kmap.nbr, kmap.rev)
    )
    grad = torch.randn(target.num_rows, 5, dtype=dtype)
    torch.library.opcheck(
        torch.ops.lattice.sparse_conv_weight_grad.default, (feats.detach(), grad, kmap.nbr)
    )
    # With gradients on its operands (what a gradient penalty differentiates): its own
    # backward builds the reversed table, which must trace with fake tensors (it read the
    # table's data pointer, so AOT dispatch failed: "Cannot access data pointer of Tensor").
    torch.library.opcheck(
        torch.ops.lattice.sparse_conv_weight_grad.default,
        (feats, grad.requires_grad_(), kmap.nbr),
    )
    n_in = coords.shape[0]
    torch.library.opcheck(torch.ops.lattice.reverse_table.default, (kmap.nbr, n_in))
    assert torch.equal(torch.ops.lattice.reverse_table(kmap.nbr, n_in), kmap.rev)


def test_sparse_conv_rejects_out_of_range_map() -> None:
    """A corrupt neighbour table raises instead of reading out of bounds."""
    feats = torch.randn(4, 2, dtype=torch.float64)
    weight = torch.randn(1, 2, 3, dtype=torch.float64)
    nbr = torch.tensor([[0], [7]], dtype=torch.int32)
    rev = torch.full((4, 1), -1, dtype=torch.int32)
    with pytest.raises(ValueError, match="invalid argument"):
        torch.ops.lattice.sparse_conv(feats, weight, nbr, rev)


@pytest.mark.parametrize("bad", [-2, -(2**31), 300, 2**31 - 1])
@pytest.mark.parametrize("cout", [0, 70])
def test_sparse_conv_rejects_bad_entry_anywhere(bad: int, cout: int) -> None:
    """The forward checks entries while it lists them: one bad entry deep in a
    large table, in any tile, still raises (and with no output columns too)."""
    g = torch.Generator().manual_seed(0)
    feats = torch.randn(300, 16, generator=g)
    weight = torch.randn(27, 16, cout, generator=g)
    nbr = torch.randint(-1, 300, (5000, 27), generator=g, dtype=torch.int32)
    nbr[4321, 17] = bad
    rev = torch.full((300, 27), -1, dtype=torch.int32)
    with pytest.raises(ValueError, match="invalid argument"):
        torch.ops.lattice.sparse_conv(feats, weight, nbr, rev)


@pytest.mark.parametrize("bad", [-2, -(2**31), 300, 2**31 - 1])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16], ids=str)
@pytest.mark.parametrize(
    ("rows", "c", "k"), [(40000, 16, 27), (40000, 130, 27), (5000, 16, 27), (3000, 8, 343)]
)
@pytest.mark.parametrize("column", [0, 17])
def test_sparse_conv_weight_grad_rejects_bad_entry_anywhere(
    bad: int, dtype: torch.dtype, rows: int, c: int, k: int, column: int
) -> None:
    """The weight gradient refuses one bad entry deep in a large table, checked as the
    table is read: 3x3x3 maps are listed a block of rows at a time for every kernel row,
    whatever share of the kernel rows a task takes (all of them at C = 16 and 40000
    rows, a few otherwise); a 7x7x7 map's lists would not fit, so each task reads a
    kernel row's column at a time: column 0 is a task's first kernel row, 17 one read
    ahead while the kernel row before it runs."""
    g = torch.Generator().manual_seed(1)
    feats = torch.randn(300, c, generator=g).to(dtype)
    grad = torch.randn(rows, c, generator=g).to(dtype)
    nbr = torch.randint(-1, 300, (rows, k), generator=g, dtype=torch.int32)
    nbr[rows - 679, column] = bad
    with pytest.raises(ValueError, match="invalid argument"):
        torch.ops.lattice.sparse_conv_weight_grad(feats, grad, nbr)


def test_sparse_conv_dtype_mismatch() -> None:
    nbr = torch.zeros((2, 1), dtype=torch.int32)
    with pytest.raises(TypeError, match="same dtype"):
        torch.ops.lattice.sparse_conv(
            torch.randn(2, 2), torch.randn(1, 2, 3, dtype=torch.float64), nbr, nbr
        )


@pytest.mark.parametrize("geometry", GEOMETRIES)
def test_opcheck_pair_ops(geometry: ConvGeometry) -> None:
    coords = _coords(60, 7, 3)
    kmap = build_kernel_map(coords, coords, ConvGeometry.submanifold((3, 3, 3), (1, 1, 1)))
    if geometry.stride != (1, 1, 1):
        x = tl.SparseTensor(torch.zeros(coords.shape[0], 1), coords)
        target = generated_support(x.support, geometry)
        kmap = build_kernel_map(coords, target.coords, geometry)
    torch.library.opcheck(torch.ops.lattice.kernel_pairs.default, (kmap.nbr,))
    fwd, bwd = kmap.pairs(False), kmap.pairs(True)
    feats = torch.randn(coords.shape[0], 3, dtype=torch.float64, requires_grad=True)
    weight = torch.randn(kmap.nbr.shape[1], 3, 4, dtype=torch.float64, requires_grad=True)
    for gather in (False, True):
        args = (feats, weight, *fwd, *bwd, kmap.nbr.shape[0], gather)
        torch.library.opcheck(torch.ops.lattice.pair_conv.default, args)
        grad = torch.randn(kmap.nbr.shape[0], 4, dtype=torch.float64)
        torch.library.opcheck(
            torch.ops.lattice.pair_conv_weight_grad.default, (feats.detach(), grad, *fwd, gather)
        )


def test_gather_scatter_row_ranges_are_read_once_per_pair_list() -> None:
    """The CUDA gather-scatter's kernel-row ranges: read from the offsets once, kept on the
    tensor, read again after an in-place change (the helper is device-agnostic)."""
    from torch_lattice.ops.conv_cuda import _row_ranges

    offsets = torch.tensor([0, 2, 2, 5], dtype=torch.int32)
    assert _row_ranges(offsets) == [(0, 0, 2), (2, 2, 5)]
    version, ranges = offsets._tl_row_ranges
    assert version == offsets._version and _row_ranges(offsets) is ranges  # no second read
    offsets[1] = 1
    assert _row_ranges(offsets) == [(0, 0, 1), (1, 1, 2), (2, 2, 5)]


def test_a_meta_tensor_beside_cpu_tensors_is_refused() -> None:
    """One meta tensor among CPU ones sends a call to the op's fake kernel, which returned
    an uninitialized CPU tensor: every fake kernel now checks the devices as the real
    kernels do. All-meta calls still give shapes (torch.compile's fake tensors too)."""
    L = torch.ops.lattice
    c = torch.tensor([[0, 0, 0, 0], [0, 1, 0, 0]], dtype=torch.int32)
    nbr, rev = L.kernel_map(c, c, [3, 3, 3], [1, 1, 1], [1, 1, 1], [1, 1, 1])
    x, w = torch.randn(2, 3), torch.randn(27, 3, 2)
    calls = {
        "kernel_map": lambda m: L.kernel_map(c, m(c), [3, 3, 3], [1] * 3, [1] * 3, [1] * 3),
        "sparse_conv": lambda m: L.sparse_conv(x, m(w), nbr, rev),
        "sparse_conv_weight_grad": lambda m: L.sparse_conv_weight_grad(x, m(x), nbr),
        "pool_max": lambda m: L.pool_max(m(x), nbr, rev),
        "devoxel_gather": lambda m: L.devoxel_gather(
            x, m(torch.zeros(2, 1, dtype=torch.int64)), torch.ones(2, 1, dtype=torch.float64)),
    }
    for name, call in calls.items():
        with pytest.raises(ValueError, match=rf"lattice::{name}: all tensors must be on one"):
            call(lambda t: t.to("meta"))
    meta = L.sparse_conv(x.to("meta"), w.to("meta"), nbr.to("meta"), rev.to("meta"))
    assert meta.shape == (2, 2) and meta.device.type == "meta"


def _i32(*shape: int) -> torch.Tensor:
    return torch.zeros(shape, dtype=torch.int32)


def _i64(*shape: int) -> torch.Tensor:
    return torch.zeros(shape, dtype=torch.int64)


_G1 = ([1, 1, 1], [1, 1, 1], [0, 0, 0], [1, 1, 1])
_PAIRS = (torch.tensor([0, 1]), _i32(1), _i32(1))
_X, _PT = torch.randn(4, 3), torch.rand(8, 3)

# A bad argument of each op, as (op, arguments); its fake kernel (what torch.compile and
# meta tensors run) must refuse it as the real kernel does.
_BAD_CALLS = {
    "sparse_conv int64 nbr": ("sparse_conv", (_X, torch.randn(1, 3, 2), _i64(4, 1), _i32(4, 1))),
    "sparse_conv float64 weight": (
        "sparse_conv", (_X, torch.randn(1, 3, 2).double(), _i32(4, 1), _i32(4, 1))),
    "sparse_conv C_in": ("sparse_conv", (_X, torch.randn(1, 2, 2), _i32(4, 1), _i32(4, 1))),
    "sparse_conv_weight_grad int64 nbr": (
        "sparse_conv_weight_grad", (_X, torch.randn(4, 2), _i64(4, 1))),
    "sparse_conv_weight_grad complex grad_out": (
        "sparse_conv_weight_grad", (_X, torch.ones(4, 2, dtype=torch.complex64), _i32(4, 1))),
    "sparse_conv_weight_grad rows": (
        "sparse_conv_weight_grad", (_X, torch.randn(3, 2), _i32(4, 1))),
    "pair_conv int32 offsets": (
        "pair_conv", (_X, torch.randn(1, 3, 2), _PAIRS[0].int(), *_PAIRS[1:], None, None, None,
                      4, False)),
    "pair_conv negative n_out": (
        "pair_conv", (_X, torch.randn(1, 3, 2), *_PAIRS, None, None, None, -1, False)),
    "pair_conv_weight_grad float64 grad_out": (
        "pair_conv_weight_grad", (_X, torch.randn(4, 2).double(), *_PAIRS, True)),
    "pool_sum int64 nbr": ("pool_sum", (_X, _i64(4, 1), _i32(4, 1))),
    "pool_avg 1-D nbr": ("pool_avg", (_X, _i32(4), _i32(4, 1))),
    "pool_max short rev": ("pool_max", (_X, _i32(4, 1), _i32(3, 1))),
    "pool_max int feats": ("pool_max", (_i64(4, 3), _i32(4, 1), _i32(4, 1))),
    "pool_max_backward short argmax": ("pool_max_backward", (_X, _i32(4, 1), _i32(3, 3))),
    "kernel_map int64 coords": ("kernel_map", (_i64(4, 4), _i32(4, 4), *_G1)),
    "neighbour_table even stride list": ("neighbour_table", (_i32(4, 4), _i32(4, 4), [1, 1],
                                                             *_G1[1:])),
    "kernel_pairs int64 nbr": ("kernel_pairs", (_i64(4, 2),)),
    "generate_support int64 coords": (
        "generate_support", (_i64(4, 4), [2] * 3, [2] * 3, [0] * 3, [1] * 3, [4] * 3, 1)),
    "generative_support 1-D coords": ("generative_support", (_i32(16), [2] * 3, [2] * 3)),
    "voxelize_coords zero voxel_size": ("voxelize_coords", (_PT, None, [0.0] * 3, [0.0] * 3)),
    "devoxel_map int32 batch": (
        "devoxel_map", (_PT, _i32(8), [1.0] * 3, [0.0] * 3, _i32(1, 4), False)),
    "devoxel_map NaN origin": (
        "devoxel_map", (_PT, None, [1.0] * 3, [float("nan")] * 3, _i32(1, 4), True)),
    "voxel_reduce int32 inverse": ("voxel_reduce", (torch.randn(8, 2), _i32(8), 3, "sum")),
    "voxel_reduce negative num_voxels": ("voxel_reduce", (torch.randn(8, 2), _i64(8), -1, "max")),
    "devoxel_gather float32 weight": (
        "devoxel_gather", (torch.randn(3, 2), _i64(8, 1), torch.ones(8, 1))),
    "batch_norm_stats no rows": ("batch_norm_stats", (torch.randn(0, 3),)),
    "batch_norm_apply scale shape": (
        "batch_norm_apply", (_X, torch.ones(2), torch.zeros(3), False)),
    "batch_norm_backward_reduce mean dtype": (
        "batch_norm_backward_reduce", (_X, _X, torch.ones(3), torch.zeros(3), _i64(3), True)),
    "batch_norm_backward_apply b without k": (
        "batch_norm_backward_apply", (_X, _X, torch.ones(3), torch.zeros(3), torch.ones(3),
                                      torch.ones(3), None, False)),
}  # fmt: skip


@pytest.mark.parametrize("case", sorted(_BAD_CALLS))
def test_fake_kernels_refuse_what_the_real_kernels_refuse(case: str) -> None:
    """The fake kernels asserted a few sizes with bare ``torch._check`` ("Expected cond to be
    True") and took an int64 table the real kernels refuse: each now runs its op's own
    argument check, so a meta call raises the real call's exception and message."""
    op, args = _BAD_CALLS[case]
    fn = getattr(torch.ops.lattice, op)
    with pytest.raises((TypeError, ValueError)) as real:
        fn(*args)
    meta = [a.to("meta") if isinstance(a, torch.Tensor) else a for a in args]
    with pytest.raises(type(real.value)) as fake:
        fn(*meta)
    assert str(fake.value) == str(real.value)
