"""CUDA-versus-CPU parity of the kernels in csrc/cuda (torch_lattice.ops.conv_cuda, kmap_cuda).

Kernel maps, generated supports and pair lists must equal the CPU ones exactly. The
dataflows must agree with the CPU implicit GEMM (``lattice::sparse_conv`` and
``lattice::sparse_conv_weight_grad``) up to summation order:

- float32: ``rtol = 1e-4``, ``atol = 1e-4 * max|ref|``;
- float16 / bfloat16: both sides accumulate in fp32 and round once, so they differ by at
  most a rounding step of the storage type: ``rtol = atol / max|ref| = 2e-3`` (fp16) and
  ``1.6e-2`` (bf16), two units in the last place;
- TF32 (only with ``allow_tf32=True``, i.e. ``ConvConfig(allow_tf32=True)``): ``rtol = 1e-2``.

Every parity test needs a GPU and is skipped without one (they run on the GPU machine
through scripts/device-check.sh); the last test checks the error raised where CUDA kernels
cannot run.
"""

from __future__ import annotations

import os
import shutil
import subprocess

import pytest
import torch

import torch_lattice.ops  # noqa: F401  (registers the lattice ops used as references)
from torch_lattice.geometry import ConvGeometry
from torch_lattice.ops import conv_cuda, kmap_cuda
from torch_lattice.ops._runtime import _C

try:
    from cuda_helpers import cpu_support as _support
    from cuda_helpers import geometry_lists as _lists
    from cuda_helpers import random_coords as _coords
except ImportError:  # tests/ may become a package; then it is imported through it
    from tests.cuda_helpers import cpu_support as _support
    from tests.cuda_helpers import geometry_lists as _lists
    from tests.cuda_helpers import random_coords as _coords

pytestmark = pytest.mark.cuda
needs_gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")

GEOMETRIES = [
    ConvGeometry.submanifold((3, 3, 3), (1, 1, 1)),
    ConvGeometry.submanifold((3, 3, 3), (2, 2, 2)),
    ConvGeometry((2, 2, 2), (2, 2, 2)),
    ConvGeometry((3, 3, 3), (2, 2, 2), (1, 1, 1)),
    ConvGeometry((3, 1, 2), (2, 1, 3), (1, 0, 1), (1, 2, 1)),
]
DATAFLOWS = ["implicit_gemm", "fetch_on_demand", "gather_scatter"]
# (rtol, atol relative to max|ref|) per dtype, see the module docstring.
TOLERANCE = {torch.float32: 1e-4, torch.float16: 2e-3, torch.bfloat16: 1.6e-2}


def _pairs_reference(nbr: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Column n's non-negative entries of nbr in row order (docs/kernel-maps.md)."""
    ins, outs, counts = [], [], []
    for n in range(nbr.shape[1]):
        rows = torch.nonzero(nbr[:, n] >= 0).flatten()
        outs.append(rows.to(torch.int32))
        ins.append(nbr[rows, n])
        counts.append(rows.numel())
    offsets = torch.zeros(nbr.shape[1] + 1, dtype=torch.int64)
    offsets[1:] = torch.cumsum(torch.tensor(counts, dtype=torch.int64), 0)
    return offsets, torch.cat(ins), torch.cat(outs)


def _assert_close(actual: torch.Tensor, expected: torch.Tensor, tol: float) -> None:
    expected = expected.float()
    scale = max(expected.abs().max().item(), 1.0) if expected.numel() else 1.0
    torch.testing.assert_close(actual.cpu().float(), expected, rtol=tol, atol=tol * scale)


@needs_gpu
@pytest.mark.parametrize("geometry", GEOMETRIES)
def test_kernel_map_matches_cpu(geometry: ConvGeometry) -> None:
    coords = _coords(900, 12, 0)
    out = _support(coords, geometry, 12)
    nbr, rev = torch.ops.lattice.kernel_map(coords, out, *_lists(geometry))
    gnbr, grev = kmap_cuda.kernel_map(coords.cuda(), out.cuda(), geometry.as_c())
    assert torch.equal(gnbr.cpu(), nbr)
    assert torch.equal(grev.cpu(), rev)


@needs_gpu
@pytest.mark.parametrize("geometry", GEOMETRIES)
def test_generate_support_matches_cpu(geometry: ConvGeometry) -> None:
    coords = _coords(900, 12, 1)
    ks, s, p, d = _lists(geometry)
    rng = list(geometry.output_range((12, 12, 12)))
    expected = torch.ops.lattice.generate_support(coords, ks, s, p, d, rng, 2)
    got = kmap_cuda.generate_support(coords.cuda(), geometry.as_c(), tuple(rng), 2)
    assert torch.equal(got.cpu(), expected)


@needs_gpu
def test_generate_support_wide_coordinates() -> None:
    """Coordinates near INT32_MAX: 4 x 31 bits do not pack into one 64-bit key."""
    g = torch.Generator().manual_seed(2)
    c = torch.randint(0, 2**31 - 2, (500, 4), generator=g)
    c[:, 0] %= 3
    c = torch.unique(c, dim=0).to(torch.int32)
    geometry = ConvGeometry((2, 2, 2), (1, 1, 1))
    rng = [2**31 - 1] * 3
    expected = torch.ops.lattice.generate_support(c, *_lists(geometry), rng, 3)
    got = kmap_cuda.generate_support(c.cuda(), geometry.as_c(), tuple(rng), 3)
    assert torch.equal(got.cpu(), expected)
    nbr, _ = torch.ops.lattice.kernel_map(c, expected, *_lists(geometry))
    gnbr, _ = kmap_cuda.kernel_map(c.cuda(), got, geometry.as_c())
    assert torch.equal(gnbr.cpu(), nbr)


@needs_gpu
def test_large_scene_multilevel_scans() -> None:
    """Over a million candidates: three-level scans and many radix-sort blocks."""
    coords = _coords(160_000, 90, 3)
    geometry = ConvGeometry((3, 3, 3), (2, 2, 2), (1, 1, 1))
    out = _support(coords, geometry, 90)
    got = kmap_cuda.generate_support(
        coords.cuda(), geometry.as_c(), geometry.output_range((90,) * 3), 2
    )
    assert torch.equal(got.cpu(), out)
    nbr, _ = torch.ops.lattice.kernel_map(coords, out, *_lists(geometry))
    gnbr, _ = kmap_cuda.kernel_map(coords.cuda(), got, geometry.as_c())
    assert torch.equal(gnbr.cpu(), nbr)
    offsets, pin, pout = kmap_cuda.kernel_pairs(gnbr)
    ref = _pairs_reference(nbr)
    for a, b in zip((offsets, pin, pout), ref, strict=True):
        assert torch.equal(a.cpu(), b)


@needs_gpu
@pytest.mark.parametrize("geometry", GEOMETRIES[:3])
def test_pairs_match_reference(geometry: ConvGeometry) -> None:
    coords = _coords(3000, 20, 4)
    out = _support(coords, geometry, 20)
    nbr, _ = torch.ops.lattice.kernel_map(coords, out, *_lists(geometry))
    got = kmap_cuda.kernel_pairs(nbr.cuda())
    for a, b in zip(got, _pairs_reference(nbr), strict=True):
        assert torch.equal(a.cpu(), b)


def _problem(geometry: ConvGeometry, cin: int, cout: int, dtype: torch.dtype, seed: int):
    coords = _coords(2500, 16, seed)
    out = _support(coords, geometry, 16)
    nbr, rev = torch.ops.lattice.kernel_map(coords, out, *_lists(geometry))
    g = torch.Generator().manual_seed(seed)
    feats = torch.randn(coords.shape[0], cin, generator=g).to(dtype)
    weight = torch.randn(geometry.volume, cin, cout, generator=g).to(dtype)
    grad = torch.randn(out.shape[0], cout, generator=g).to(dtype)
    return feats, weight, grad, nbr, rev


def _maps(dataflow: str, nbr: torch.Tensor):
    """(nbr, pairs) arguments of the CUDA wrappers for one dataflow."""
    if dataflow == "implicit_gemm":
        return nbr.cuda(), None
    return None, kmap_cuda.kernel_pairs(nbr.cuda())


@needs_gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("dataflow", DATAFLOWS)
@pytest.mark.parametrize(
    ("geometry", "cin", "cout"),
    [
        (GEOMETRIES[0], 5, 7),
        (GEOMETRIES[2], 70, 33),
        (GEOMETRIES[4], 16, 80),
    ],
)
def test_forward_and_weight_grad_match_cpu(
    dataflow: str, dtype: torch.dtype, geometry: ConvGeometry, cin: int, cout: int
) -> None:
    feats, weight, grad, nbr, rev = _problem(geometry, cin, cout, dtype, 5)
    tol = TOLERANCE[dtype]
    gnbr, pairs = _maps(dataflow, nbr)
    y = conv_cuda.conv_forward(
        dataflow, feats.cuda(), weight.cuda(), nbr=gnbr, pairs=pairs, n_out=nbr.shape[0]
    )
    assert y.dtype == dtype and y.shape == (nbr.shape[0], cout)
    _assert_close(y, torch.ops.lattice.sparse_conv(feats, weight, nbr, rev), tol)
    dw = conv_cuda.conv_weight_grad(dataflow, feats.cuda(), grad.cuda(), nbr=gnbr, pairs=pairs)
    assert dw.dtype == dtype and dw.shape == weight.shape
    _assert_close(dw, torch.ops.lattice.sparse_conv_weight_grad(feats, grad, nbr), tol)


@needs_gpu
@pytest.mark.parametrize("dataflow", DATAFLOWS)
def test_input_grad_on_transposed_relation(dataflow: str) -> None:
    """dx = forward(dy, W^T) on rev (implicit GEMM) or on swapped pairs."""
    geometry = GEOMETRIES[3]
    feats, weight, grad, nbr, rev = _problem(geometry, 6, 9, torch.float32, 6)
    wt = weight.transpose(1, 2).contiguous()
    expected = torch.ops.lattice.sparse_conv(grad, wt, rev, nbr)
    if dataflow == "implicit_gemm":
        dx = conv_cuda.conv_forward(dataflow, grad.cuda(), wt.cuda(), nbr=rev.cuda())
    else:
        offsets, pin, pout = kmap_cuda.kernel_pairs(nbr.cuda())
        dx = conv_cuda.conv_forward(
            dataflow, grad.cuda(), wt.cuda(), pairs=(offsets, pout, pin), n_out=feats.shape[0]
        )
    _assert_close(dx, expected, TOLERANCE[torch.float32])


@needs_gpu
@pytest.mark.parametrize("dataflow", DATAFLOWS)
def test_tf32_only_when_allowed(dataflow: str) -> None:
    feats, weight, grad, nbr, rev = _problem(GEOMETRIES[0], 40, 48, torch.float32, 7)
    gnbr, pairs = _maps(dataflow, nbr)
    expected = torch.ops.lattice.sparse_conv(feats, weight, nbr, rev)
    y = conv_cuda.conv_forward(
        dataflow,
        feats.cuda(),
        weight.cuda(),
        nbr=gnbr,
        pairs=pairs,
        n_out=nbr.shape[0],
        allow_tf32=True,
    )
    dw = conv_cuda.conv_weight_grad(
        dataflow, feats.cuda(), grad.cuda(), nbr=gnbr, pairs=pairs, allow_tf32=True
    )
    _assert_close(y, expected, 1e-2)
    _assert_close(dw, torch.ops.lattice.sparse_conv_weight_grad(feats, grad, nbr), 1e-2)


@needs_gpu
def test_runs_on_the_current_stream() -> None:
    """Work is enqueued on torch's current stream, here a side stream."""
    geometry = GEOMETRIES[0]
    feats, weight, _, nbr, rev = _problem(geometry, 8, 8, torch.float32, 8)
    coords = _coords(2500, 16, 8)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        c = coords.cuda()
        gnbr, _ = kmap_cuda.kernel_map(c, c, geometry.as_c())
        pairs = kmap_cuda.kernel_pairs(gnbr)
        y = conv_cuda.conv_forward(
            "fetch_on_demand", feats.cuda(), weight.cuda(), pairs=pairs, n_out=nbr.shape[0]
        )
    side.synchronize()
    assert torch.equal(gnbr.cpu(), nbr)
    _assert_close(y, torch.ops.lattice.sparse_conv(feats, weight, nbr, rev), 1e-4)


@needs_gpu
def test_empty_inputs() -> None:
    geometry = GEOMETRIES[0]
    empty = torch.empty((0, 4), dtype=torch.int32, device="cuda")
    nbr, rev = kmap_cuda.kernel_map(empty, empty, geometry.as_c())
    assert nbr.shape == (0, 27) and rev.shape == (0, 27)
    assert kmap_cuda.generate_support(empty, geometry.as_c(), (4, 4, 4), 1).shape == (0, 4)
    offsets, pin, _ = kmap_cuda.kernel_pairs(nbr)
    assert torch.equal(offsets.cpu(), torch.zeros(28, dtype=torch.int64)) and pin.numel() == 0
    for dataflow in DATAFLOWS:
        gnbr, pairs = _maps(dataflow, nbr.cpu())
        x = torch.empty((0, 3), device="cuda")
        w = torch.randn(27, 3, 5, device="cuda")
        assert conv_cuda.conv_forward(dataflow, x, w, gnbr, pairs, n_out=0).shape == (0, 5)
        dw = conv_cuda.conv_weight_grad(dataflow, x, x.new_empty((0, 5)), gnbr, pairs)
        assert torch.equal(dw, torch.zeros_like(w))


@needs_gpu
def test_duplicate_rows_raise() -> None:
    coords = torch.tensor([[0, 1, 1, 1], [0, 2, 2, 2], [0, 1, 1, 1]], dtype=torch.int32)
    geometry = GEOMETRIES[0]
    with pytest.raises(ValueError, match="duplicate"):
        kmap_cuda.kernel_map(coords.cuda(), coords.cuda(), geometry.as_c())


@needs_gpu
def test_float64_is_rejected() -> None:
    nbr = torch.zeros((2, 1), dtype=torch.int32, device="cuda")
    x = torch.zeros((1, 2), dtype=torch.float64, device="cuda")
    with pytest.raises(TypeError, match="float32, float16 and bfloat16"):
        conv_cuda.conv_forward(
            "implicit_gemm", x, torch.zeros((1, 2, 2), dtype=x.dtype, device="cuda"), nbr=nbr
        )


@pytest.mark.skipif(
    torch.cuda.is_available() and _C.cuda_compiled(), reason="CUDA kernels can run here"
)
def test_clear_error_without_cuda() -> None:
    coords = torch.zeros((1, 4), dtype=torch.int32)
    with pytest.raises(RuntimeError, match="CUDA"):
        kmap_cuda.kernel_map(coords, coords, GEOMETRIES[0].as_c())


def _cuobjdump() -> str | None:
    found = shutil.which("cuobjdump")
    candidate = os.path.join(os.environ.get("CUDA_HOME", "/usr/local/cuda"), "bin", "cuobjdump")
    return found or (candidate if os.path.isfile(candidate) else None)


@pytest.mark.skipif(
    not _C.cuda_compiled() or _cuobjdump() is None, reason="needs a CUDA build and cuobjdump"
)
def test_cuda_build_holds_sm90_machine_code() -> None:
    """Hopper GPUs run machine code built for them, not PTX compiled at load time."""
    out = subprocess.run(
        [str(_cuobjdump()), "--list-elf", _C.__file__], capture_output=True, text=True, check=True
    ).stdout
    assert "sm_90" in out, out
