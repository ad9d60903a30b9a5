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

Tolerances (``rtol = tol``, ``atol = tol * max|ref|``) are those of tests/test_cuda.py:
fp32 1e-4, fp16 2e-3, bf16 1.6e-2 (one final rounding of an fp32 sum), TF32 1e-2.
The neighbour tables are synthetic (random entries, chosen density per kernel row), so
empty kernel rows, rows of exactly one tile and rows of one pair more than a tile occur
by construction. Needs a GPU; skipped without one.
"""

from __future__ import annotations

import pytest
import torch

import torch_lattice.ops  # noqa: F401  (registers the lattice ops)
from torch_lattice.ops import _cuda

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


def _reference(x: torch.Tensor, w: torch.Tensor, dy: torch.Tensor, nbr: torch.Tensor):
    """float64 forward and weight gradient from nbr (inputs already storage-rounded)."""
    x, w, dy = x.double(), w.double(), dy.double()
    y = torch.zeros(nbr.shape[0], w.shape[2], dtype=torch.float64)
    dw = torch.zeros_like(w)
    for n in range(nbr.shape[1]):
        rows = torch.nonzero(nbr[:, n] >= 0).flatten()
        if rows.numel() == 0:
            continue
        xi = x[nbr[rows, n].long()]
        y[rows] += xi @ w[n]
        dw[n] = xi.T @ dy[rows]
    return y, dw


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
    y_ref, dw_ref = _reference(x, w, dy, nbr)
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
    maps = {"nbr": gnbr} if dataflow == "implicit_gemm" else {"pairs": _cuda.kernel_pairs(gnbr)}
    y = _cuda.conv_forward(dataflow, xg, w.cuda(), n_out=nbr.shape[0], allow_tf32=tf32, **maps)
    assert y.dtype == dtype and y.shape == (nbr.shape[0], cout)
    _assert_close(y, y_ref, tol, f"{dataflow} {precision} forward")
    dw = _cuda.conv_weight_grad(dataflow, xg, dyg, allow_tf32=tf32, **maps)
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
