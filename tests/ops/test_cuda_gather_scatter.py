"""Gather-scatter through cuBLAS, coalesced pair lists, lazy pair lists and CUDA errors.

GPU tests compare with a float64 CPU reference (``lattice::sparse_conv`` and
``lattice::sparse_conv_weight_grad`` in float64) and are skipped without a GPU:

- float32: ``rtol = 1e-4``, ``atol = 1e-4 * max|ref|``;
- TF32 (``allow_tf32=True``): ``1e-2``;
- float16 / bfloat16: the inputs are rounded to the storage type first, and each kernel
  row's product is rounded once more before the fp32 scatter-add, so
  ``5e-3`` (fp16) and ``4e-2`` (bf16) relative to ``max|ref|``.

Pair lists must equal the CPU's ``kernel_pairs`` exactly, order included:
``pair_out`` ascending within each kernel row, ``pair_in[p] == nbr[pair_out[p], n]``.

CPU tests: lazy pair lists (one direction built per kernel map, forward and backward) and
the wording of the unsupported-architecture message.
"""

from __future__ import annotations

import pytest
import torch

import torch_lattice.ops.kmap
from torch_lattice.geometry import ConvGeometry
from torch_lattice.nn.functional.config import ConvConfig, Dataflow
from torch_lattice.nn.functional.relation import apply_kernel_map
from torch_lattice.ops import _runtime, conv_cuda, kmap_cuda
from torch_lattice.ops._runtime import _C
from torch_lattice.ops.kmap import build_kernel_map

try:
    from cuda_helpers import cpu_support as _support
    from cuda_helpers import geometry_lists as _lists
    from cuda_helpers import random_coords as _coords
except ImportError:  # tests/ may become a package; then it is imported through it
    from tests.cuda_helpers import cpu_support as _support
    from tests.cuda_helpers import geometry_lists as _lists
    from tests.cuda_helpers import random_coords as _coords

# Every test here is marked cuda, the host-only ones too: the device check runs -m cuda.
pytestmark = pytest.mark.cuda
_skip_without_gpu = pytest.mark.skipif(
    not (torch.cuda.is_available() and _C.cuda_compiled()), reason="needs a CUDA GPU"
)


def needs_gpu(test):
    """Skips ``test`` without a GPU."""
    return _skip_without_gpu(test)


GEOMETRIES = [
    ConvGeometry.submanifold((3, 3, 3), (1, 1, 1)),
    ConvGeometry((2, 2, 2), (2, 2, 2)),
    ConvGeometry((3, 3, 3), (2, 2, 2), (1, 1, 1)),
    ConvGeometry((3, 1, 2), (2, 1, 3), (1, 0, 1), (1, 2, 1)),
    ConvGeometry.submanifold((5, 5, 5), (1, 1, 1)),
]
TOLERANCE = {torch.float32: 1e-4, torch.float16: 5e-3, torch.bfloat16: 4e-2}


def _nbr(geometry: ConvGeometry, n: int = 2500, side: int = 16, seed: int = 3):
    coords = _coords(n, side, seed)
    out = _support(coords, geometry, side)
    nbr, rev = torch.ops.lattice.kernel_map(coords, out, *_lists(geometry))
    return coords, out, nbr, rev


def _assert_close(actual: torch.Tensor, expected: torch.Tensor, tol: float) -> None:
    expected = expected.double()
    scale = max(expected.abs().max().item(), 1.0) if expected.numel() else 1.0
    torch.testing.assert_close(actual.cpu().double(), expected, rtol=tol, atol=tol * scale)


# ---- gather-scatter through cuBLAS -------------------------------------------------


def _reference(feats, weight, grad, nbr, rev):
    """float64 CPU forward and weight gradient of the storage-rounded inputs."""
    f, w, g = feats.double(), weight.double(), grad.double()
    y = torch.ops.lattice.sparse_conv(f, w, nbr, rev)
    dw = torch.ops.lattice.sparse_conv_weight_grad(f, g, nbr)
    return y, dw


@needs_gpu
@pytest.mark.parametrize(
    ("dtype", "tf32"),
    [
        (torch.float32, False),
        (torch.float32, True),
        (torch.float16, False),
        (torch.bfloat16, False),
    ],
)
@pytest.mark.parametrize(
    ("geometry", "cin", "cout"),
    [
        (GEOMETRIES[0], 5, 7),  # odd channels: 20- and 28-byte fp32 rows, 2-byte units in fp16
        (GEOMETRIES[1], 64, 32),  # 16-byte units
        (GEOMETRIES[2], 3, 1),
        (GEOMETRIES[3], 33, 17),
    ],
)
def test_gather_scatter_matches_cpu_float64(
    dtype: torch.dtype, tf32: bool, geometry: ConvGeometry, cin: int, cout: int
) -> None:
    _, out, nbr, rev = _nbr(geometry)
    g = torch.Generator().manual_seed(cin * 100 + cout)
    feats = torch.randn(rev.shape[0], cin, generator=g).to(dtype)
    weight = torch.randn(nbr.shape[1], cin, cout, generator=g).to(dtype)
    grad = torch.randn(out.shape[0], cout, generator=g).to(dtype)
    y_ref, dw_ref = _reference(feats, weight, grad, nbr, rev)
    pairs = kmap_cuda.kernel_pairs(nbr.cuda())
    y = conv_cuda.conv_forward(
        "gather_scatter",
        feats.cuda(),
        weight.cuda(),
        pairs=pairs,
        n_out=nbr.shape[0],
        allow_tf32=tf32,
    )
    dw = conv_cuda.conv_weight_grad(
        "gather_scatter", feats.cuda(), grad.cuda(), pairs=pairs, allow_tf32=tf32
    )
    tol = 1e-2 if tf32 else TOLERANCE[dtype]
    assert y.dtype == dtype and y.shape == y_ref.shape
    assert dw.dtype == dtype and dw.shape == dw_ref.shape
    _assert_close(y, y_ref, tol)
    _assert_close(dw, dw_ref, tol)
    # input gradient: the forward over the swapped pairs with W^T
    offsets, pin, pout = pairs
    dx = conv_cuda.conv_forward(
        "gather_scatter",
        grad.cuda(),
        weight.transpose(1, 2).contiguous().cuda(),
        pairs=(offsets, pout, pin),
        n_out=feats.shape[0],
        allow_tf32=tf32,
    )
    wt = weight.double().transpose(1, 2).contiguous()
    _assert_close(dx, torch.ops.lattice.sparse_conv(grad.double(), wt, rev, nbr), tol)


@needs_gpu
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_products_reach_the_scatter_in_fp32(dtype: torch.dtype) -> None:
    """Where torch has ``mm(..., out_dtype=float32)``, half outputs are rounded once:
    within one unit in the last place of the float64 reference (2**-10 fp16, 2**-7 bf16,
    relative to each value, plus a little for fp32 summation order)."""
    if not conv_cuda._fp32_products(torch.cuda.current_device(), dtype):
        pytest.skip("this torch has no fp32-output mm for half inputs")
    _, out, nbr, rev = _nbr(GEOMETRIES[0])
    g = torch.Generator().manual_seed(11)
    feats = torch.randn(rev.shape[0], 24, generator=g).to(dtype)
    weight = torch.randn(27, 24, 40, generator=g).to(dtype)
    y_ref = torch.ops.lattice.sparse_conv(feats.double(), weight.double(), nbr, rev)
    y = conv_cuda.conv_forward(
        "gather_scatter",
        feats.cuda(),
        weight.cuda(),
        pairs=kmap_cuda.kernel_pairs(nbr.cuda()),
        n_out=out.shape[0],
    )
    ulp = 2.0**-10 if dtype == torch.float16 else 2.0**-7
    scale = y_ref.abs().max().item()
    torch.testing.assert_close(y.cpu().double(), y_ref, rtol=ulp, atol=1e-5 * scale)


@needs_gpu
def test_gather_scatter_leaves_tf32_setting_alone() -> None:
    """Both TF32 APIs read back as before, and reading the legacy flag (as tests, inductor
    and user code do) does not raise: torch >= 2.9 raises when the two disagree."""
    _, out, nbr, rev = _nbr(GEOMETRIES[0], 500)
    m = torch.backends.cuda.matmul
    feats = torch.randn(rev.shape[0], 8, device="cuda")
    weight = torch.randn(27, 8, 8, device="cuda")
    x = torch.randn(16, 8, device="cuda")
    saved = (m.allow_tf32, getattr(m, "fp32_precision", None))
    try:
        for legacy in (False, True):
            m.allow_tf32 = legacy
            before = (m.allow_tf32, m.fp32_precision if hasattr(m, "fp32_precision") else None)
            for allow in (False, True):
                conv_cuda.conv_forward(
                    "gather_scatter",
                    feats,
                    weight,
                    pairs=kmap_cuda.kernel_pairs(nbr.cuda()),
                    n_out=out.shape[0],
                    allow_tf32=allow,
                )
                after = (m.allow_tf32, m.fp32_precision if hasattr(m, "fp32_precision") else None)
                assert after == before
                torch.mm(x, x.t())  # a float32 cuBLAS GEMM still runs
    finally:
        m.allow_tf32 = saved[0]
        if saved[1] is not None:
            m.fp32_precision = saved[1]


@needs_gpu
def test_gather_rows_zero_rows_for_bad_indices() -> None:
    """Indices outside [0, n_src) give zero rows; rows of odd byte size use small units."""
    for dtype, c in ((torch.float16, 3), (torch.float32, 4), (torch.bfloat16, 8)):
        src = torch.randn(10, c, device="cuda").to(dtype)
        idx = torch.tensor([3, -1, 9, 10, 0], dtype=torch.int32, device="cuda")
        got = conv_cuda._gather(src, idx)
        expected = torch.zeros(5, c, dtype=dtype, device="cuda")
        expected[[0, 2, 4]] = src[[3, 9, 0]]
        assert torch.equal(got, expected)


# ---- pair lists ---------------------------------------------------------------------


@needs_gpu
@pytest.mark.parametrize("geometry", GEOMETRIES)
def test_pairs_equal_cpu_order_included(geometry: ConvGeometry) -> None:
    _, _, nbr, rev = _nbr(geometry, 4000, 18, 9)
    for table in (nbr, rev):
        expected = torch.ops.lattice.kernel_pairs(table)
        got = torch.ops.lattice.kernel_pairs(table.cuda())
        for a, b in zip(got, expected, strict=True):
            assert a.device.type == "cuda"
            assert torch.equal(a.cpu(), b)


@needs_gpu
@pytest.mark.parametrize("k", [1, 8, 27, 125, 343, 400, 729])
def test_pairs_with_empty_columns_and_wide_tables(k: int) -> None:
    """Random tables, every third column empty; K above 384 walks global memory."""
    g = torch.Generator().manual_seed(k)
    n_out = 1000 if k < 300 else 300
    nbr = torch.randint(-1, 50, (n_out, k), generator=g, dtype=torch.int32)
    nbr[torch.rand(n_out, k, generator=g) < 0.5] = -1
    nbr[:, ::3] = -1
    expected = torch.ops.lattice.kernel_pairs(nbr)
    got = torch.ops.lattice.kernel_pairs(nbr.cuda())
    for a, b in zip(got, expected, strict=True):
        assert torch.equal(a.cpu(), b)


@needs_gpu
def test_pairs_of_an_all_empty_table() -> None:
    nbr = torch.full((777, 27), -1, dtype=torch.int32, device="cuda")
    offsets, pin, pout = torch.ops.lattice.kernel_pairs(nbr)
    assert torch.equal(offsets.cpu(), torch.zeros(28, dtype=torch.int64))
    assert pin.numel() == 0 and pout.numel() == 0


# ---- lazy pair lists ------------------------------------------------------------------


def _conv_through_pairs(device: str, dataflow: Dataflow, transposed: bool, grad: bool):
    geometry = GEOMETRIES[2]
    coords, out, _, _ = _nbr(geometry, 800, 12, 4)
    kmap = build_kernel_map(coords.to(device), out.to(device), geometry)
    n_src = out.shape[0] if transposed else coords.shape[0]
    feats = torch.randn(n_src, 4, dtype=torch.float64 if device == "cpu" else torch.float32)
    feats = feats.to(device).requires_grad_(grad)
    weight = torch.randn(geometry.volume, 4, 5, dtype=feats.dtype, device=device)
    weight.requires_grad_(grad)
    config = ConvConfig(dataflow=dataflow, allow_tf32=False)
    y = apply_kernel_map(feats, weight, kmap, config, transposed=transposed)
    return kmap, feats, weight, y


def _devices() -> list[str]:
    cuda = torch.cuda.is_available() and _C.cuda_compiled()
    return ["cpu", "cuda"] if cuda else ["cpu"]


@pytest.mark.parametrize("device", _devices())
@pytest.mark.parametrize("dataflow", [Dataflow.GatherScatter, Dataflow.FetchOnDemand])
@pytest.mark.parametrize("transposed", [False, True])
def test_forward_without_grad_builds_one_direction(
    device: str, dataflow: Dataflow, transposed: bool
) -> None:
    with torch.no_grad():
        kmap, _, _, _ = _conv_through_pairs(device, dataflow, transposed, grad=False)
    assert set(kmap._pairs) == {transposed}


@pytest.mark.parametrize("device", _devices())
@pytest.mark.parametrize("dataflow", [Dataflow.GatherScatter, Dataflow.FetchOnDemand])
@pytest.mark.parametrize("transposed", [False, True])
def test_backward_uses_the_same_pair_list(
    device: str, dataflow: Dataflow, transposed: bool
) -> None:
    """On CUDA backward swaps pair_in and pair_out: still one direction built. On the CPU
    the reversed lists are an argsort, built once and kept with the map. Same gradients."""
    kmap, feats, weight, y = _conv_through_pairs(device, dataflow, transposed, grad=True)
    gy = torch.randn_like(y)
    (y * gy).sum().backward()
    assert set(kmap._pairs) == ({transposed} if device == "cuda" else {False, True})
    # reference: implicit GEMM in float64 on the CPU
    nbr, rev = (kmap.rev, kmap.nbr) if transposed else (kmap.nbr, kmap.rev)
    f = feats.detach().double().cpu().requires_grad_(True)
    w = weight.detach().double().cpu().requires_grad_(True)
    ref = torch.ops.lattice.sparse_conv(f, w, nbr.cpu(), rev.cpu())
    (ref * gy.double().cpu()).sum().backward()
    tol = 1e-9 if device == "cpu" else 1e-4
    _assert_close(y.detach(), ref.detach(), tol)
    _assert_close(feats.grad, f.grad, tol)
    _assert_close(weight.grad, w.grad, tol)


def test_cpu_relation_pairs_are_each_tables_pairs() -> None:
    """On the CPU each direction's lists come from its own table (kernel_pairs, faster than
    sorting the other direction's), are cached, and equal the other direction reversed."""
    geometry = GEOMETRIES[2]
    coords, out, _, rev = _nbr(geometry, 500, 10, 5)
    kmap = build_kernel_map(coords, out, geometry)
    fwd = kmap.relation_pairs(False)
    back = kmap.relation_pairs(True)
    reversed_fwd = torch_lattice.ops.kmap.reverse_pairs(*fwd)
    for a, b, c in zip(back, torch.ops.lattice.kernel_pairs(rev), reversed_fwd, strict=True):
        assert torch.equal(a, b) and torch.equal(a, c)
    assert kmap.pairs(True) is back and kmap.relation_pairs(True) is back


@needs_gpu
def test_relation_pairs_on_cuda_swaps() -> None:
    geometry = GEOMETRIES[2]
    coords, out, _, _ = _nbr(geometry, 500, 10, 5)
    kmap = build_kernel_map(coords.cuda(), out.cuda(), geometry)
    fwd = kmap.relation_pairs(False)
    back = kmap.relation_pairs(True)
    assert set(kmap._pairs) == {False}
    assert back.offsets is fwd.offsets
    assert back.pair_in is fwd.pair_out and back.pair_out is fwd.pair_in


def test_reverse_pairs_equals_kernel_pairs_of_rev_on_cpu() -> None:
    for geometry in GEOMETRIES:
        _, _, nbr, rev = _nbr(geometry, 600, 10, 7)
        got = torch_lattice.ops.kmap.reverse_pairs(*torch.ops.lattice.kernel_pairs(nbr))
        for a, b in zip(got, torch.ops.lattice.kernel_pairs(rev), strict=True):
            assert torch.equal(a, b)


# ---- errors -------------------------------------------------------------------------


def test_arch_error_names_capability_and_built_archs() -> None:
    msg = _runtime.arch_error("kernel_map", 1, (7, 5), "80;86;89;90")
    assert msg is not None
    assert "kernel_map" in msg and "device 1" in msg
    assert "7.5" in msg and "sm_75" in msg
    assert "sm_80, sm_86, sm_89, sm_90" in msg
    assert "sm_80 or newer" in msg


@pytest.mark.parametrize(
    ("capability", "archs", "runs"),
    [
        ((8, 0), "80;86;89;90", True),
        ((8, 6), "80", True),  # sm_80 SASS runs on 8.6
        ((9, 0), "80;86;89;90", True),
        ((10, 0), "80;86;89;90", True),  # PTX of sm_90
        ((12, 0), "90", True),
        ((8, 0), "90", False),  # nothing built it can run
        ((8, 9), "90", False),
        ((6, 1), "80;86;89;90", False),
        ((7, 0), "60;70", False),  # below sm_80 even if listed
    ],
)
def test_arch_error_rules(capability: tuple[int, int], archs: str, runs: bool) -> None:
    msg = _runtime.arch_error("op", 0, capability, archs)
    assert (msg is None) == runs
    if msg is not None:
        assert f"{capability[0]}.{capability[1]}" in msg


def test_cuda_archs_is_a_string_in_every_build() -> None:
    archs = _C.cuda_archs()
    assert isinstance(archs, str)
    assert (archs != "") == bool(_C.cuda_compiled())


@needs_gpu
def test_device_capability_matches_torch() -> None:
    for index in range(torch.cuda.device_count()):
        assert _C.cuda_device_capability(index) == torch.cuda.get_device_capability(index)
    with pytest.raises(ValueError, match="no CUDA device"):
        _C.cuda_device_capability(torch.cuda.device_count())


@needs_gpu
def test_cuda_error_names_the_runtime_error_and_call_site() -> None:
    """A device index the runtime rejects: the message names the entry point, the failing
    call with its file and line, and the runtime's error name and string."""
    nbr = torch.zeros((64, 27), dtype=torch.int32, device="cuda")
    bad = torch.cuda.device_count()
    stream = torch.cuda.current_stream().cuda_stream
    pattern = (
        r"CUDA error in tl_cuda_pairs_count: csrc/cuda/tl_cuda_common\.cuh:\d+: "
        r"cudaSetDevice\(ctx->device\): cudaErrorInvalidDevice \(.+\)"
    )
    with pytest.raises(RuntimeError, match=pattern):
        alloc = _runtime.workspace_alloc(nbr.device)
        _C.cuda_pairs_count(bad, stream, nbr.data_ptr(), 64, 27, alloc)
    # the error was cleared: the next call works
    assert torch.ops.lattice.kernel_pairs(nbr)[1].numel() == 64 * 27


@pytest.mark.parametrize("gather", [False, True])
def test_opcheck_pair_conv_without_reversed_pairs(gather: bool) -> None:
    """``rev_* = None``: backward derives the reversed pairs (float64 gradcheck on CPU)."""
    geometry = GEOMETRIES[3]
    coords, out, nbr, _ = _nbr(geometry, 120, 6, 8)
    fwd = torch.ops.lattice.kernel_pairs(nbr)
    g = torch.Generator().manual_seed(2)
    feats = torch.randn(coords.shape[0], 3, generator=g, dtype=torch.float64)
    weight = torch.randn(nbr.shape[1], 3, 2, generator=g, dtype=torch.float64)
    args = (feats.requires_grad_(), weight.requires_grad_(), *fwd, None, None, None)
    torch.library.opcheck(torch.ops.lattice.pair_conv.default, (*args, out.shape[0], gather))
