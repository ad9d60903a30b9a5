"""Plain float32 (no TF32) through the pipelined tiles, multiplied on the CUDA cores
(csrc/cuda/tl_cuda_pipe_tile.cuh ``tl_pipe_fma_multiply``, tl_cuda_fod_pipelined.cu
``tl_fodp_multiply``), pending ``pipelined_fp32``: the sorted implicit-GEMM forward, the
fetch-on-demand forward and weight gradient, where C_in and C_out are multiples of 4 and
the tensors 16-byte aligned, on sm_80 and newer; and the fetch-on-demand weight gradient
with TF32 allowed (tensor cores, pending ``pipelined_wgrad``).

Each case is checked against a float64 CPU reference and the previous kernel, and the
kernel that ran is read from torch.profiler, so a case meant for the new tile cannot pass
on the old one. The tensor-core switches (``pipelined_forward``,
``pipelined_fod_forward``) leave plain float32 alone, and ``pipelined_fp32`` leaves the
other types alone.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch

import torch_lattice.ops  # noqa: F401  (registers the lattice ops)
from torch_lattice.ops import conv_cuda, kmap_cuda

try:
    from cuda_helpers import kernel_ran, patterned_nbr, table_reference
except ImportError:  # tests/ may become a package; then it is imported through it
    from tests.cuda_helpers import kernel_ran, patterned_nbr, table_reference

pytestmark = pytest.mark.cuda
needs_gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")

IG_KERNEL = "tl_ig_pipelined_kernel"
FOD_KERNEL = "tl_fod_pipelined_forward_kernel"
WGRAD_KERNEL = "tl_fod_pipelined_wgrad_kernel"
SORT_MIN_ROWS = 4096
# fp32 products summed in fp32 (up to 27 x 256 of them, thousands in a weight gradient),
# in another order than the reference's float64, and fetch-on-demand's atomics add in no
# fixed order: far inside 1e-4 of the largest value. TF32: inputs rounded to 10 mantissa
# bits (test_cuda_pipelined.py's tolerance, twice, as for its weight gradients).
TOL = 1e-4
TF32_TOL = 2e-2


def _check(y: torch.Tensor, ref: torch.Tensor, what: str, tol: float = TOL) -> None:
    assert y.dtype == torch.float32
    err = (y.double().cpu() - ref).abs().max().item()
    scale = max(ref.abs().max().item(), 1e-30)
    assert err <= tol * scale, f"{what}: max error {err:.3g}, allowed {tol * scale:.3g}"


def _against_previous(monkeypatch: pytest.MonkeyPatch,
                      run: Callable[[], tuple[torch.Tensor, bool]], ref: torch.Tensor,
                      off: tuple[str, ...], on: tuple[str, ...],
                      tol: float = TOL) -> list[torch.Tensor]:
    """``run()`` (output, whether the new kernel ran) with each pending setting of ``off``,
    where the previous kernel must run, then twice with each of ``on`` (map-derived data
    computed in the call, then kept), where the new one must: every output against the
    float64 reference, the new ones against the previous one. Returns the new ones."""
    for value in off:
        monkeypatch.setenv(conv_cuda.PENDING_ENV, value)
        before, ran = run()
        assert not ran, value
    _check(before, ref, "previous kernel", tol)
    outs = []
    for value in on:
        monkeypatch.setenv(conv_cuda.PENDING_ENV, value)
        for _ in range(2):
            y, ran = run()
            assert ran, value
            _check(y, ref, f"pipelined, PENDING={value}", tol)
            _check(y, before.double().cpu(), "pipelined against the previous kernel", tol)
            outs.append(y)
    return outs


def _inputs(n_in: int, n_out: int, cin: int, cout: int, k: int, seed: int):
    nbr = patterned_nbr(n_in, n_out, k, seed=seed)
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n_in, cin, generator=g)
    w = torch.randn(k, cin, cout, generator=g) / cin**0.5
    ref = table_reference(x, w, torch.zeros(n_out, cout), nbr)[0]
    return nbr, x, w, ref


def _needs_sm80() -> None:
    if torch.cuda.get_device_capability()[0] < 8:
        pytest.skip("the pipelined tiles need sm_80")


SHAPES = pytest.mark.parametrize(
    ("cin", "cout", "k"),
    [
        (4, 4, 27),  # a slice of 16 channels, mostly zero-filled
        (16, 32, 27),
        (36, 68, 27),  # C_in past one slice, partly used; C_out past 64: the 128-wide tile
        (64, 64, 8),
        (128, 136, 2),  # a second, partial 128-wide column tile
        (256, 256, 27),
    ],
)


@needs_gpu
@SHAPES
def test_implicit_gemm_forward(cin: int, cout: int, k: int,
                               monkeypatch: pytest.MonkeyPatch) -> None:
    _needs_sm80()
    n_in, n_out = 3000, SORT_MIN_ROWS + 101  # a last, partial row tile
    nbr, x, w, ref = _inputs(n_in, n_out, cin, cout, k, seed=cin + 3 * cout + k)
    xc, wc, table = x.cuda(), w.cuda(), nbr.cuda()
    outs = _against_previous(
        monkeypatch,
        lambda: kernel_ran(lambda: conv_cuda.conv_forward("implicit_gemm", xc, wc, nbr=table),
                     IG_KERNEL),
        ref,
        off=("0", "pipelined_forward"),  # the tensor-core switch leaves fp32 alone
        on=("pipelined_fp32", "1"),
    )
    empty = (nbr < 0).all(dim=1).cuda()
    assert all((y[empty] == 0).all() for y in outs), "rows without neighbours are zeros"


@needs_gpu
@SHAPES
def test_fetch_on_demand_forward(cin: int, cout: int, k: int,
                                 monkeypatch: pytest.MonkeyPatch) -> None:
    _needs_sm80()
    n_in, n_out = 2500, 3000
    nbr, x, w, ref = _inputs(n_in, n_out, cin, cout, k, seed=cin + 5 * cout + k)
    xc, wc = x.cuda(), w.cuda()
    pairs = kmap_cuda.kernel_pairs(nbr.cuda())
    _against_previous(
        monkeypatch,
        lambda: kernel_ran(lambda: conv_cuda.conv_forward("fetch_on_demand", xc, wc, pairs=pairs,
                                                    n_out=n_out), FOD_KERNEL),
        ref,
        off=("0", "pipelined_fod_forward"),
        on=("pipelined_fp32", "1"),
    )


@needs_gpu
@pytest.mark.parametrize(
    ("tf32", "change", "tol"),
    [(False, "pipelined_fp32", TOL), (True, "pipelined_wgrad", TF32_TOL)],
    ids=["fp32", "tf32"],
)
@pytest.mark.parametrize(
    ("cin", "cout", "k", "n_out"),
    [
        (4, 4, 27, 3000),
        (16, 24, 27, 5000),
        (32, 32, 8, 20000),  # long kernel rows: chunks of many 16-pair slices
        (36, 68, 27, 3000),  # partial 64-channel tiles on both sides
        (128, 96, 2, 4000),
        (8, 200, 27, 300),  # kernel rows of a few pairs, some empty
    ],
)
def test_fetch_on_demand_weight_grad(
    tf32: bool, change: str, tol: float, cin: int, cout: int, k: int, n_out: int,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The pipelined weight gradient in float32: plain (FMA, ``pipelined_fp32``) and with
    TF32 allowed (tensor cores, ``pipelined_wgrad``); each switch leaves the other's calls
    to the previous kernel."""
    _needs_sm80()
    n_in = 2500
    nbr = patterned_nbr(n_in, n_out, k, seed=cin * 7 + cout + k)
    g = torch.Generator().manual_seed(cin + 3 * cout)
    x = torch.randn(n_in, cin, generator=g)
    dy = torch.randn(n_out, cout, generator=g)
    ref = table_reference(x, torch.zeros(k, cin, cout), dy, nbr)[1]
    xc, dyc = x.cuda(), dy.cuda()
    pairs = kmap_cuda.kernel_pairs(nbr.cuda())
    other = "pipelined_wgrad" if change == "pipelined_fp32" else "pipelined_fp32"
    outs = _against_previous(
        monkeypatch,
        lambda: kernel_ran(lambda: conv_cuda.conv_weight_grad("fetch_on_demand", xc, dyc,
                                                        pairs=pairs, allow_tf32=tf32),
                     WGRAD_KERNEL),
        ref,
        off=("0", other),
        on=(change, "1"),
        tol=tol,
    )
    assert all(dw.shape == (k, cin, cout) for dw in outs)


@needs_gpu
def test_other_calls_keep_the_previous_kernels(monkeypatch: pytest.MonkeyPatch) -> None:
    """With only ``pipelined_fp32`` on: TF32 and half precision keep the previous
    forwards, and so does float32 whose channel rows are not whole 16-byte runs."""
    monkeypatch.setenv(conv_cuda.PENDING_ENV, "pipelined_fp32")
    n_in, n_out = 2000, SORT_MIN_ROWS
    for dtype, tf32, cin, cout in ((torch.float32, True, 32, 32), (torch.float16, False, 32, 32),
                                   (torch.float32, False, 6, 32), (torch.float32, False, 32, 10)):
        nbr, x, w, _ = _inputs(n_in, n_out, cin, cout, 27, seed=cin + cout)
        xc, wc, table = x.to(dtype).cuda(), w.to(dtype).cuda(), nbr.cuda()
        pairs = kmap_cuda.kernel_pairs(table)
        _, ran_ig = kernel_ran(lambda xc=xc, wc=wc, table=table, tf32=tf32: conv_cuda.conv_forward(
            "implicit_gemm", xc, wc, nbr=table, allow_tf32=tf32), IG_KERNEL)
        _, ran_fod = kernel_ran(lambda xc=xc, wc=wc, pairs=pairs, tf32=tf32: conv_cuda.conv_forward(
            "fetch_on_demand", xc, wc, pairs=pairs, n_out=n_out, allow_tf32=tf32), FOD_KERNEL)
        assert not ran_ig and not ran_fod, (dtype, tf32, cin, cout)
