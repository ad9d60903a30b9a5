"""The CPU kernels on tables large enough for their largest work units.

Narrow layers get forward tiles of up to 1024 output rows and, from 32 * 1024 output
rows, a weight gradient split into 32 parts that list each block for every kernel row
(wider ones: 8 parts, each cut into groups of kernel rows; tiles.h says where);
kernels of many offsets get fewer rows per tile and per listed block, so that the lists
stay small (csrc/core/tl_dataflow_implicit_gemm_tiles.h). The small scenes of the other
tests reach none of these. Checked against a float64 gather-matmul reference, at 1 and 2
threads.
"""

from __future__ import annotations

import pytest
import torch

import torch_lattice  # noqa: F401  (registers the lattice:: ops)

ROWS = 40000
TOL = {torch.float32: 1e-5, torch.float64: 1e-12, torch.bfloat16: 1e-2, torch.float16: 1e-2}


def _table(rows: int, n_in: int, fill: float, seed: int, k: int = 27) -> torch.Tensor:
    """(rows, k) neighbour table, each entry present with probability ``fill``."""
    g = torch.Generator().manual_seed(seed)
    nbr = torch.randint(0, n_in, (rows, k), generator=g, dtype=torch.int32)
    nbr[torch.rand(rows, k, generator=g) >= fill] = -1
    return nbr


def _reference(
    x: torch.Tensor, w: torch.Tensor, dy: torch.Tensor, nbr: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    x, w, dy = x.double(), w.double(), dy.double()
    y = torch.zeros(nbr.shape[0], w.shape[2], dtype=torch.float64)
    dw = torch.zeros_like(w)
    for n in range(nbr.shape[1]):
        rows = (nbr[:, n] >= 0).nonzero().squeeze(1)
        xs = x[nbr[rows, n].long()]
        y[rows] += xs @ w[n]
        dw[n] = xs.T @ dy[rows]
    return y, dw


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("dtype", list(TOL), ids=str)
@pytest.mark.parametrize(
    ("cin", "cout", "fill"),
    # (64, 72): 32 listed parts through the packed x rows (c_in >= 64; 72 columns leave a
    # partial vector). (72, 72), (46, 108) and (36, 140): weight gradients split into groups
    # of kernel rows (each kernel row's column read from the table), through packed x rows
    # (c_in >= 64, and c_in >= 40 with c_out > 32; 46 values pad to 48) and through x rows
    # read in place. (15, 20) and (40, 20): the weight gradient's 8-channel passes (c_out
    # <= 32, read in place) between a first 4-channel one and single channels.
    [
        (16, 16, 0.2),
        (32, 32, 0.05),
        (16, 24, 0.9),
        (15, 20, 0.3),
        (40, 20, 0.3),
        (64, 72, 0.2),
        (72, 72, 0.2),
        (46, 108, 0.3),
        (36, 140, 0.3),
    ],
)
def test_large_table_matches_reference(
    threads: int, dtype: torch.dtype, cin: int, cout: int, fill: float
) -> None:
    nbr = _table(ROWS, 3000, fill, seed=cin + cout)
    g = torch.Generator().manual_seed(7)
    x = torch.randn(3000, cin, generator=g).to(dtype)
    w = torch.randn(27, cin, cout, generator=g).to(dtype)
    dy = torch.randn(ROWS, cout, generator=g).to(dtype)
    rev = torch.full((3000, 27), -1, dtype=torch.int32)
    want_y, want_dw = _reference(x, w, dy, nbr)
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        y = torch.ops.lattice.sparse_conv(x, w, nbr, rev)
        dw = torch.ops.lattice.sparse_conv_weight_grad(x, dy, nbr)
    finally:
        torch.set_num_threads(before)
    tol = TOL[dtype]
    torch.testing.assert_close(y.double(), want_y, rtol=0, atol=tol * want_y.abs().max())
    torch.testing.assert_close(dw.double(), want_dw, rtol=0, atol=tol * want_dw.abs().max())


@pytest.mark.parametrize("threads", [1, 2])
def test_many_kernel_offsets_match_reference(threads: int) -> None:
    """A 7x7x7 kernel (343 offsets): tiles of fewer rows, the weight gradient unlisted."""
    nbr = _table(16000, 3000, 0.01, seed=3, k=343)
    g = torch.Generator().manual_seed(8)
    x = torch.randn(3000, 8, generator=g)
    w = torch.randn(343, 8, 12, generator=g)
    dy = torch.randn(16000, 12, generator=g)
    want_y, want_dw = _reference(x, w, dy, nbr)
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        y = torch.ops.lattice.sparse_conv(x, w, nbr, torch.full((3000, 343), -1, dtype=torch.int32))
        dw = torch.ops.lattice.sparse_conv_weight_grad(x, dy, nbr)
    finally:
        torch.set_num_threads(before)
    torch.testing.assert_close(y.double(), want_y, rtol=0, atol=1e-5 * want_y.abs().max())
    torch.testing.assert_close(dw.double(), want_dw, rtol=0, atol=1e-5 * want_dw.abs().max())
