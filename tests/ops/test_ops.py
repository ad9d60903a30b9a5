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
