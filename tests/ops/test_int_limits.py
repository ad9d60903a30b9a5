"""Integer limits at the C boundary and through the public API (issue 21).

Every size product or coordinate sum that would leave its integer type is refused,
by the C core with ``TL_ERR_OVERFLOW`` (raised as ``torch_lattice._C.OutOfRangeError``,
a ``ValueError`` and an ``OverflowError``, naming the rule) or by the Python layer
before the core is reached; the rows just inside the limit give exact results.
"""

from __future__ import annotations

import pytest
import torch

import torch_lattice as tl
from torch_lattice import _C
from torch_lattice import nn as tnn
from torch_lattice.nn import functional as F

H = 2**31 - 1


def _tensor(rows: list[list[int]], stride: int = 1, channels: int = 2) -> tl.SparseTensor:
    g = torch.Generator().manual_seed(len(rows))
    feats = torch.randn(len(rows), channels, dtype=torch.float64, generator=g)
    return tl.SparseTensor(feats, torch.tensor(rows, dtype=torch.int32), stride=stride)


def test_out_of_range_error_is_value_and_overflow_error():
    assert issubclass(_C.OutOfRangeError, ValueError)
    assert issubclass(_C.OutOfRangeError, OverflowError)


def _buffers():
    nbr = torch.zeros(4, dtype=torch.int32)
    f = torch.zeros(4, dtype=torch.float32)
    return nbr, f


@pytest.mark.parametrize(
    "fn,args,rule",
    [
        # 2^40 kernel rows: rows x k would leave int64 for 2^31 rows
        ("kmap_reverse", lambda n, f: (n.data_ptr(), 1, 2**40, 1, n.data_ptr(), 1),
         r"k must be <= 2\^31 - 1"),
        ("pairs_count", lambda n, f: (n.data_ptr(), 2**31, 1, n.data_ptr(), 1),
         r"n_out and k must be <= 2\^31 - 1"),
        ("pool_sum", lambda n, f: (0, 1, 1, 2**40, 1, f.data_ptr(), n.data_ptr(), 0,
                                   f.data_ptr(), 0, 1), r"k must be <= 2\^31 - 1"),
        # rows x channels beyond int64
        ("pool_max", lambda n, f: (0, 2**20, 1, 1, 2**50, f.data_ptr(), n.data_ptr(), 0,
                                   f.data_ptr(), n.data_ptr(), 1), r"rows x channels"),
        ("voxel_gather", lambda n, f: (0, f.data_ptr(), 1, 2**40, n.data_ptr(), f.data_ptr(),
                                       2**40, 1, f.data_ptr(), 1), r"times channels"),
        ("conv_forward", lambda n, f: (0, 1, 1, 1, 2**40, 2**40, f.data_ptr(), f.data_ptr(),
                                       n.data_ptr(), f.data_ptr(), 1), r"k x c_in x c_out"),
    ],
)
def test_c_sizes_beyond_their_type_raise_value_error_with_rule(fn, args, rule):
    """Sizes are checked before any buffer is read, so small buffers suffice."""
    nbr, f = _buffers()
    with pytest.raises(ValueError, match=rf"torch_lattice\._C\.{fn}: .*overflows.*{rule}") as info:
        getattr(_C, fn)(*args(nbr, f))
    assert isinstance(info.value, OverflowError)


def test_c_generative_row_past_int32_raises_value_error():
    """c * s + K - 1 is formed in int64: 2^30 * 2 + 1 is refused, not wrapped negative."""
    rows = torch.tensor([[0, 2**30, 0, 0]], dtype=torch.int32)
    out = torch.empty((8, 4), dtype=torch.int32)
    geom = ((2, 2, 2), (2, 2, 2), (0, 0, 0), (1, 1, 1))
    with pytest.raises(ValueError, match=r"coords \* stride \+ kernel_size - 1 must fit int32"):
        _C.generative(rows.data_ptr(), 1, geom, out.data_ptr(), 8)


def test_generative_just_inside_int32_is_exact():
    """A row at 2^30 - 1 with stride 2, kernel 2 reaches exactly 2^31 - 1; one more raises."""
    up = tnn.GenerativeConvTranspose3d(2, 1, kernel_size=2, stride=2).double()
    y = up(_tensor([[0, 2**30 - 1, 5, 7]], stride=2))
    assert int(y.coords[:, 1].max()) == H and int(y.coords[:, 1].min()) == H - 1
    low = up(_tensor([[0, 3, 5, 7]], stride=2))
    assert torch.equal(y.feats, low.feats)  # translation-equivariant: same values
    with pytest.raises(ValueError, match=r"maps coordinate 1073741824 on axis x to 2147483649"):
        up(_tensor([[0, 2**30, 5, 7]], stride=2))


def test_huge_transpose_stride_names_the_limit():
    """stride 2^31 - 1 on coordinate 2: the product 2^32 - 2 is refused, not wrapped."""
    up = tnn.GenerativeConvTranspose3d(1, 1, kernel_size=1, stride=(H, 1, 1)).double()
    with pytest.raises(ValueError, match=r"to 4294967294, beyond the int32 limit"):
        up(_tensor([[0, 2, 0, 0]], stride=(H, 1, 1), channels=1))


def test_total_stride_beyond_int32_is_refused():
    conv = tnn.Conv3d(1, 1, kernel_size=1, stride=2**16).double()
    x = _tensor([[0, 0, 0, 0]], stride=2**16, channels=1)
    with pytest.raises(ValueError, match=r"total stride \(4294967296, .*beyond the int32 limit"):
        conv(x)


def test_kernel_volume_beyond_int32_is_refused():
    with pytest.raises(ValueError, match=r"kernel_size \(65536, 65536, 1\) has 4294967296 rows"):
        tnn.Conv3d(1, 1, kernel_size=(2**16, 2**16, 1))


def test_pool_transpose_past_int32_is_refused_and_inside_is_exact():
    """pool_transpose3d without a target: 2^30 * 2 + 1 passes int32 by 2, 2^30 - 1 fits."""
    with pytest.raises(ValueError, match=r"generates coordinate 2147483649, beyond the int32"):
        F.pool_transpose3d(_tensor([[0, 2**30, 0, 0]], stride=2), 2, 2)
    y = F.pool_transpose3d(_tensor([[0, 2**30 - 1, 0, 0]], stride=2), 2, 2)
    assert int(y.coords[:, 1].max()) == H
    assert torch.equal(y.feats, F.pool_transpose3d(_tensor([[0, 3, 0, 0]], stride=2), 2, 2).feats)


@pytest.mark.parametrize("op", ["pool_transpose3d", "trilinear_upsample3d"])
def test_generated_range_past_2_31_is_refused_naming_spatial_range(op):
    """Without a target, a range of 2^30 + 1 at stride 2 generated a range of 2^31 + 2: a
    SparseTensor that could not be rebuilt or unpickled. Now a ValueError naming
    spatial_range; a range of 2^30 (a generated range of 2^31) still works."""
    def up(x: tl.SparseTensor) -> tl.SparseTensor:
        if op == "pool_transpose3d":
            return F.pool_transpose3d(x, 2, 2)
        return F.trilinear_upsample3d(x, 2)

    def rows(extent: int) -> tl.SparseTensor:
        g = torch.ones(1, 1, dtype=torch.float64)
        return tl.SparseTensor(g, torch.tensor([[0, 5, 5, 5]], dtype=torch.int32), stride=2,
                               spatial_range=(1, extent, 6, 6))

    with pytest.raises(ValueError, match=r"spatial_range \(1, 1073741825, 6, 6\).*axis x "
                                         r"exceeds 2\^31"):
        up(rows(2**30 + 1))
    y = up(rows(2**30))
    assert y.spatial_range[1] <= 2**31
    assert tl.SparseTensor(y.feats, y.coords, spatial_range=y.spatial_range).spatial_range == (
        y.spatial_range)
