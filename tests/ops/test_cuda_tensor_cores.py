"""Tensor-core and launch-shape coverage of the CUDA implicit-GEMM and fetch-on-demand kernels.

The tile core (csrc/cuda/tl_cuda_gemm.cuh) runs fp16 / bf16 on tensor cores (WMMA
m16n16k16, fp32 accumulation), fp32 with ``allow_tf32`` on TF32 tensor cores, and plain
fp32 on FMA. Rows are read 16 bytes at a time when the channel count and base pointer
allow it, with masked scalar loads otherwise. Fetch-on-demand launches one flat grid over
the real tiles of all kernel rows. Every case here is checked against a float64 CPU
reference computed from the same neighbour table, on the storage-rounded inputs
(``x.to(dtype).double()``):

    y[o]  = sum_n  x[nbr[o, n]] @ w[n]            over nbr[o, n] >= 0
    dw[n] = sum_o  x[nbr[o, n]]^T dy[o]           over nbr[o, n] >= 0

Tolerances (``rtol = tol``, ``atol = tol * max|ref|``) are those of test_cuda_kernel_map_conv.py:
fp32 1e-4, fp16 2e-3, bf16 1.6e-2 (one final rounding of an fp32 sum), TF32 1e-2.
The neighbour tables are synthetic (random entries, chosen density per kernel row), so
empty kernel rows, rows of exactly one tile and rows of one pair more than a tile occur
by construction. Needs a GPU; skipped without one.
"""

from __future__ import annotations

import pytest
import torch

import torch_lattice.ops  # noqa: F401  (registers the lattice ops)
from torch_lattice.ops import conv_cuda, kmap_cuda
from torch_lattice.ops._runtime import _C, DTYPE_CODES

try:
    from cuda_helpers import patterned_nbr, pending_without, table_reference, workspace_request
except ImportError:  # tests/ may become a package; then it is imported through it
    from tests.cuda_helpers import (
        patterned_nbr,
        pending_without,
        table_reference,
        workspace_request,
    )

pytestmark = pytest.mark.cuda
needs_gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")

DATAFLOWS = ["implicit_gemm", "fetch_on_demand"]
# name -> (storage dtype, allow_tf32, tol)
PRECISIONS = {
    "fp16": (torch.float16, False, 2e-3),
    "bf16": (torch.bfloat16, False, 1.6e-2),
    "fp32": (torch.float32, False, 1e-4),
    "tf32": (torch.float32, True, 1e-2),
}
CHANNELS = [1, 3, 8, 17, 64, 96, 130]
K = 27


def _nbr(n_in: int, n_out: int, density: list[float], seed: int) -> torch.Tensor:
    """(n_out, K) int32 table: column n has about density[n] * n_out entries in [0, n_in)."""
    g = torch.Generator().manual_seed(seed)
    nbr = torch.randint(0, max(n_in, 1), (n_out, len(density)), generator=g, dtype=torch.int32)
    keep = torch.rand(n_out, len(density), generator=g) < torch.tensor(density)
    return torch.where(keep, nbr, torch.full_like(nbr, -1))


def _assert_close(actual: torch.Tensor, expected: torch.Tensor, tol: float, what: str) -> None:
    scale = max(expected.abs().max().item(), 1.0) if expected.numel() else 1.0
    torch.testing.assert_close(
        actual.cpu().double(), expected, rtol=tol, atol=tol * scale, msg=lambda m: f"{what}: {m}"
    )


def _run_case(
    dataflow: str,
    precision: str,
    nbr: torch.Tensor,
    n_in: int,
    cin: int,
    cout: int,
    seed: int,
    misalign: bool = False,
) -> None:
    dtype, tf32, tol = PRECISIONS[precision]
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n_in, cin, generator=g).to(dtype)
    w = (torch.randn(nbr.shape[1], cin, cout, generator=g) / max(cin, 1) ** 0.5).to(dtype)
    dy = torch.randn(nbr.shape[0], cout, generator=g).to(dtype)
    y_ref, dw_ref = table_reference(x, w, dy, nbr)
    xg, dyg = x.cuda(), dy.cuda()
    if misalign:
        # Same values, base pointer one element past a 16-byte boundary: the kernels
        # must fall back to scalar loads.
        xg = torch.empty(x.numel() + 1, dtype=dtype, device="cuda")[1:].view_as(x)
        xg.copy_(x.cuda())
        dyg = torch.empty(dy.numel() + 1, dtype=dtype, device="cuda")[1:].view_as(dy)
        dyg.copy_(dy.cuda())
        assert xg.data_ptr() % 16 != 0 and xg.is_contiguous()
    gnbr = nbr.cuda()
    maps = {"nbr": gnbr} if dataflow == "implicit_gemm" else {"pairs": kmap_cuda.kernel_pairs(gnbr)}
    y = conv_cuda.conv_forward(dataflow, xg, w.cuda(), n_out=nbr.shape[0], allow_tf32=tf32, **maps)
    assert y.dtype == dtype and y.shape == (nbr.shape[0], cout)
    _assert_close(y, y_ref, tol, f"{dataflow} {precision} forward")
    dw = conv_cuda.conv_weight_grad(dataflow, xg, dyg, allow_tf32=tf32, **maps)
    assert dw.dtype == dtype and dw.shape == w.shape
    _assert_close(dw, dw_ref, tol, f"{dataflow} {precision} weight grad")


@needs_gpu
@pytest.mark.parametrize("precision", list(PRECISIONS))
@pytest.mark.parametrize("dataflow", DATAFLOWS)
@pytest.mark.parametrize(("cin", "cout"), list(zip(CHANNELS, reversed(CHANNELS), strict=True)))
def test_channels(dataflow: str, precision: str, cin: int, cout: int) -> None:
    """Every channel count as C_in and as C_out: vector and masked scalar paths."""
    density = [0.3 + 0.6 * ((n * 7) % K) / K for n in range(K)]
    nbr = _nbr(700, 650, density, cin * 131 + cout)
    _run_case(dataflow, precision, nbr, 700, cin, cout, cin + cout)


@needs_gpu
@pytest.mark.parametrize("precision", list(PRECISIONS))
@pytest.mark.parametrize("dataflow", DATAFLOWS)
@pytest.mark.parametrize(("cin", "cout"), [(64, 64), (96, 130), (128, 256)])
def test_wide_channels_many_rows(dataflow: str, precision: str, cin: int, cout: int) -> None:
    """Several row tiles, column tiles and weight-gradient chunks per kernel row."""
    density = [0.05 + 0.9 * ((n * 5) % K) / K for n in range(K)]
    nbr = _nbr(4000, 3000, density, 11 + cin)
    _run_case(dataflow, precision, nbr, 4000, cin, cout, 12 + cout)


@needs_gpu
@pytest.mark.parametrize("precision", ["fp16", "bf16", "fp32"])
@pytest.mark.parametrize("dataflow", DATAFLOWS)
def test_misaligned_base_uses_scalar_loads(dataflow: str, precision: str) -> None:
    nbr = _nbr(500, 400, [0.5] * K, 3)
    _run_case(dataflow, precision, nbr, 500, 64, 72, 4, misalign=True)


@needs_gpu
@pytest.mark.parametrize("precision", list(PRECISIONS))
@pytest.mark.parametrize("dataflow", DATAFLOWS)
def test_many_empty_kernel_rows(dataflow: str, precision: str) -> None:
    """Only kernel rows 0, 5 (64 pairs: one full tile), 13 (65 pairs) and 26 (1 pair)."""
    n_in, n_out = 300, 200
    g = torch.Generator().manual_seed(9)
    nbr = torch.full((n_out, K), -1, dtype=torch.int32)
    for n, count in ((0, 150), (5, 64), (13, 65), (26, 1)):
        rows = torch.randperm(n_out, generator=g)[:count]
        nbr[rows, n] = torch.randint(0, n_in, (count,), generator=g, dtype=torch.int32)
    _run_case(dataflow, precision, nbr, n_in, 24, 40, 10)


@needs_gpu
@pytest.mark.parametrize("precision", ["fp16", "bf16", "fp32"])
@pytest.mark.parametrize("dataflow", DATAFLOWS)
def test_no_pairs(dataflow: str, precision: str) -> None:
    """P = 0 with rows present: y and dw are zeros."""
    nbr = torch.full((50, K), -1, dtype=torch.int32)
    _run_case(dataflow, precision, nbr, 40, 16, 8, 1)


@needs_gpu
@pytest.mark.parametrize("precision", ["fp16", "bf16", "fp32"])
@pytest.mark.parametrize("dataflow", DATAFLOWS)
def test_no_output_rows(dataflow: str, precision: str) -> None:
    """n_out = 0: an empty y, a zero dw."""
    nbr = torch.empty((0, K), dtype=torch.int32)
    _run_case(dataflow, precision, nbr, 30, 16, 8, 2)


# ---- implicit-GEMM forward with output rows reordered by neighbour mask ----
# From n_out >= 4096 with 1 < K <= 32, tl_cuda_implicit_gemm_forward sorts the output rows
# by their neighbour bitmask on the device and each 64-row tile covers rows perm[64 t ..];
# smaller tables, K = 1 and K > 32 keep the output-row order. Each output row must still
# be written exactly once, with rows that have no neighbour at all written as zeros.

SORT_MIN_ROWS = 4096
needs_cuda_build = pytest.mark.skipif(
    not _C.cuda_compiled(), reason="needs torch_lattice built with CUDA"
)


def _forward_only(precision: str, nbr: torch.Tensor, n_in: int, cin: int, cout: int, seed: int):
    dtype, tf32, tol = PRECISIONS[precision]
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n_in, cin, generator=g).to(dtype)
    w = (torch.randn(nbr.shape[1], cin, cout, generator=g) / max(cin, 1) ** 0.5).to(dtype)
    y_ref, _ = table_reference(x, w, torch.zeros(nbr.shape[0], cout, dtype=dtype), nbr)
    y = conv_cuda.conv_forward(
        "implicit_gemm",
        x.cuda(),
        w.cuda(),
        nbr=nbr.cuda(),
        n_out=nbr.shape[0],
        allow_tf32=tf32,
    )
    assert y.dtype == dtype and y.shape == (nbr.shape[0], cout)
    _assert_close(y, y_ref, tol, f"implicit_gemm {precision} sorted forward")
    empty = (nbr < 0).all(dim=1).cuda()
    assert (y[empty] == 0).all(), "rows without neighbours must be written as zeros"
    return y


def _ws_bytes(count: int, elem: int) -> int:
    """One workspace sub-buffer: rounded up to the 256-byte alignment."""
    return (count * elem + 255) // 256 * 256


def _scan_scratch(n: int) -> int:
    """tl_cuda_scan_scratch: one partial sum per 1024-value tile, recursively."""
    total = 0
    while n > 0:
        tiles = (n + 1023) // 1024
        total += tiles
        if tiles == 1:
            break
        n = tiles
    return total


def _conv_workspace(
    dataflow: int, weight_grad: int, code: int, n_out: int, k: int, derived: int = 0
) -> int:
    """Workspace bytes cuda_conv asks for: 1000 input rows, 64 channels in and out;
    ``derived``: the pointer passed for the map-derived data."""
    sizes = (1000, n_out, k, 64, 64)
    return workspace_request(
        lambda alloc: _C.cuda_conv(
            0, 0, dataflow, weight_grad, code, *sizes, 0, 0, 0, 0, 0, 0, 0, 0, derived,
            alloc, 0,
        )
    )


@needs_cuda_build
@pytest.mark.parametrize(
    ("n_out", "k", "sorted_"),
    [
        (SORT_MIN_ROWS - 1, 27, False),
        (SORT_MIN_ROWS, 27, True),
        (SORT_MIN_ROWS, 1, False),
        (SORT_MIN_ROWS, 2, True),
        (100_000, 32, True),
        (SORT_MIN_ROWS, 33, False),
    ],
)
def test_sorted_forward_workspace(n_out: int, k: int, sorted_: bool) -> None:
    """The sorted forward reserves exactly its sort buffers (host-only: no GPU needed):
    two buffers of n_out (mask, row) int32 pairs, 256 digit counts per 256 rows and their
    scan scratch. The unsorted forward needs nothing; the weight gradient is unchanged.
    The order a caller may keep instead (cuda_conv_derived_size) is one such buffer."""
    ig = conv_cuda.DATAFLOWS["implicit_gemm"]
    for dtype in (torch.float32, torch.float16):
        code = DTYPE_CODES[dtype]
        fwd = _conv_workspace(ig, 0, code, n_out, k)
        expected = 0
        if sorted_:
            hist = 256 * ((n_out + 255) // 256)
            expected = 2 * _ws_bytes(n_out, 8) + _ws_bytes(hist, 8)
            expected += _ws_bytes(_scan_scratch(hist), 8)
        assert fwd == expected, (dtype, fwd, expected)
        # given the kept order, the forward needs no sort scratch (a fake pointer: the
        # host checks refuse the call before anything runs)
        assert _conv_workspace(ig, 0, code, n_out, k, derived=256) == 0
        derived = _C.cuda_conv_derived_size(ig, 0, code, 1000, n_out, k, 64, 64)
        assert derived == (8 * n_out if sorted_ else 0)
        assert _C.cuda_conv_derived_size(ig, 1, code, 1000, n_out, k, 64, 64) == 0
        wgrad = _conv_workspace(ig, 1, code, n_out, k)
        assert wgrad == (0 if dtype == torch.float32 else _ws_bytes(k * 64 * 64, 4))


@needs_gpu
@pytest.mark.parametrize("precision", list(PRECISIONS))
@pytest.mark.parametrize(("cin", "cout"), [(3, 3), (64, 64), (130, 130), (3, 130), (130, 64)])
def test_sorted_forward_channels(precision: str, cin: int, cout: int) -> None:
    """Sorted rows (n_out >= 4096, K = 27, last tile partial) in every precision, with
    vector and masked scalar loads; the weight gradient of the same table too."""
    n_in, n_out = 3000, 5000
    nbr = patterned_nbr(n_in, n_out, K, cin * 7 + cout)
    _run_case("implicit_gemm", precision, nbr, n_in, cin, cout, cin + 3 * cout)


@needs_gpu
@pytest.mark.parametrize("precision", list(PRECISIONS))
@pytest.mark.parametrize("n_out", [SORT_MIN_ROWS, SORT_MIN_ROWS + 37])
def test_sorted_forward_empty_and_dense_rows(precision: str, n_out: int) -> None:
    """Rows with no neighbour (mask 0, sorted first: whole tiles skip every kernel row)
    and rows with all 27 neighbours (mask 2^27 - 1, sorted last), in blocks and mixed."""
    n_in = 2000
    g = torch.Generator().manual_seed(n_out)
    nbr = torch.randint(0, n_in, (n_out, K), generator=g, dtype=torch.int32)  # all dense
    third = n_out // 3
    nbr[:third] = -1  # a run of empty rows, whole tiles of them after the sort
    mixed = torch.arange(2 * third, n_out)
    nbr[mixed[::2]] = -1  # alternate empty and dense rows in the last third
    assert ((nbr >= 0).all(dim=1) | (nbr < 0).all(dim=1)).all()
    y = _forward_only(precision, nbr, n_in, 64, 72, 5)
    assert y[:third].abs().sum().item() == 0


@needs_gpu
@pytest.mark.parametrize("precision", ["fp16", "fp32"])
@pytest.mark.parametrize("k", [2, 8, 9, 17, 32, 33])
def test_sorted_forward_kernel_sizes(precision: str, k: int) -> None:
    """One radix pass (K <= 8) to four (K = 32, bit 31 in use), and K = 33 unsorted."""
    n_in, n_out = 2500, 4500
    nbr = patterned_nbr(n_in, n_out, k, 100 + k)
    _forward_only(precision, nbr, n_in, 40, 24, k)


@needs_gpu
@pytest.mark.parametrize("precision", ["fp16", "fp32"])
def test_sorted_forward_is_deterministic(precision: str) -> None:
    """Each output row is written once (no atomics): two runs agree bit for bit."""
    n_in, n_out = 3000, 6000
    nbr = patterned_nbr(n_in, n_out, K, 77)
    y1 = _forward_only(precision, nbr, n_in, 64, 64, 3)
    y2 = _forward_only(precision, nbr, n_in, 64, 64, 3)
    assert torch.equal(y1, y2)


def _sphere_surface(radius: int) -> torch.Tensor:
    """(N, 4) int32 voxels of a one-voxel shell, batch 0, in (x, y, z) order: LiDAR-like
    surface density (most rows have far fewer than 27 neighbours)."""
    r = torch.arange(-radius - 1, radius + 2)
    x, y, z = torch.meshgrid(r, r, r, indexing="ij")
    dist = (x * x + y * y + z * z).double().sqrt()
    keep = (dist - radius).abs() < 0.5
    pts = torch.stack([torch.zeros_like(x[keep]), x[keep], y[keep], z[keep]], dim=1)
    pts[:, 1:] += radius + 1
    return pts.to(torch.int32)


@needs_gpu
@pytest.mark.parametrize("precision", list(PRECISIONS))
def test_sorted_forward_on_a_surface(precision: str) -> None:
    """A real SubmConv3d 3x3x3 map (about 5500 surface voxels): the forward on nbr and the
    input gradient on rev (W^T) both take the sorted path; the weight gradient too."""
    from torch_lattice.geometry import ConvGeometry

    coords = _sphere_surface(21)
    assert coords.shape[0] >= SORT_MIN_ROWS
    geometry = ConvGeometry.submanifold((3, 3, 3), (1, 1, 1))
    nbr, rev = torch.ops.lattice.kernel_map(coords, coords, *(list(v) for v in geometry.as_c()))
    assert nbr.shape == (coords.shape[0], K)
    n = coords.shape[0]
    _run_case("implicit_gemm", precision, nbr, n, 64, 96, 21)
    # input gradient: dx (n, 64) = forward(dy (n, 96), W^T) on rev
    dtype, tf32, tol = PRECISIONS[precision]
    g = torch.Generator().manual_seed(22)
    wt = (torch.randn(K, 64, 96, generator=g) / 8).to(dtype).transpose(1, 2).contiguous()
    dy = torch.randn(n, 96, generator=g).to(dtype)
    dx_ref, _ = table_reference(dy, wt, torch.zeros(n, 64, dtype=dtype), rev)
    dx = conv_cuda.conv_forward(
        "implicit_gemm", dy.cuda(), wt.cuda(), nbr=rev.cuda(), n_out=n, allow_tf32=tf32
    )
    assert dx.shape == (n, 64)
    _assert_close(dx, dx_ref, tol, f"implicit_gemm {precision} input gradient on rev")


@needs_cuda_build
@pytest.mark.parametrize("weight_grad", [0, 1])
def test_fetch_on_demand_derived_size(weight_grad: int) -> None:
    """Fetch-on-demand keeps one tile start per kernel row and the total (k + 1 int64),
    whatever the rows; gather-scatter derives nothing through cuda_conv (host-only)."""
    fod = conv_cuda.DATAFLOWS["fetch_on_demand"]
    for k in (1, 8, 27, 343):
        size = _C.cuda_conv_derived_size(fod, weight_grad, 1, 1000, 5000, k, 64, 64)
        assert size == 8 * (k + 1)
    with pytest.raises(ValueError, match="invalid argument"):
        _C.cuda_conv_derived_size(conv_cuda.DATAFLOWS["gather_scatter"], 0, 1, 10, 10, 8, 4, 4)


@needs_gpu
@pytest.mark.parametrize("precision", list(PRECISIONS))
def test_sorted_forward_with_kept_order(precision: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The order kept with the table (TORCH_LATTICE_CUDA_PENDING=1) gives the forward
    that sorts in each call, on its first call and on later ones, bitwise in every
    precision: the baseline turns on every other pending change, so both run the same
    kernel over the same order and write each row once. (The pending pipelined kernels
    run in every precision here and are compared with the previous ones, to the
    precision's tolerance, in test_cuda_pipelined.py and test_cuda_pipelined_fp32.py.)"""
    n_in, n_out = 3000, SORT_MIN_ROWS + 37
    nbr = patterned_nbr(n_in, n_out, K, 11)
    monkeypatch.setenv(conv_cuda.PENDING_ENV, pending_without("kept_map_data"))
    want = _forward_only(precision, nbr, n_in, 48, 40, 5)  # also checked against float64
    monkeypatch.setenv(conv_cuda.PENDING_ENV, "1")
    table = nbr.cuda()
    dtype, tf32, _ = PRECISIONS[precision]
    g = torch.Generator().manual_seed(5)
    x = torch.randn(n_in, 48, generator=g).to(dtype).cuda()
    w = (torch.randn(K, 48, 40, generator=g) / 48**0.5).to(dtype).cuda()
    got = [conv_cuda.conv_forward("implicit_gemm", x, w, nbr=table, allow_tf32=tf32)
           for _ in range(2)]
    assert torch.equal(got[0], got[1])
    assert torch.equal(got[0], want)
    assert any(v is not None for v in table._tl_derived[1].values())
