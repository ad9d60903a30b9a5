"""The pipelined kernels: the implicit-GEMM forward (csrc/cuda/tl_cuda_ig_pipelined.cu:
float16, bfloat16, and float32 with TF32 allowed), the fetch-on-demand forward (the same
types) and weight gradient (float16, bfloat16; csrc/cuda/tl_cuda_fod_pipelined.cu).

The implicit-GEMM forward serves sorted calls (at least 4096 output rows, 2..32 kernel
rows), the fetch-on-demand kernels every call, whose channel rows are whole 16-byte runs
(multiples of 8 halves or 4 floats) and whose pointers are 16-byte aligned, on sm_80 and
newer, where ``TORCH_LATTICE_CUDA_PENDING`` names them (``1``, or a list with
``pipelined_forward``, ``pipelined_fod_forward``, ``pipelined_wgrad``); every other
call runs the previous kernel. Each case is checked against a float64 CPU reference on the
storage-rounded inputs, and the kernel that ran is read from torch.profiler, so a case meant
for a new kernel cannot pass on the old one. The option's parsing is host-only; the rest
needs a GPU.
"""

from __future__ import annotations

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

KERNEL = "tl_ig_pipelined_kernel"
WGRAD_KERNEL = "tl_fod_pipelined_wgrad_kernel"
FOD_KERNEL = "tl_fod_pipelined_forward_kernel"
SORT_MIN_ROWS = 4096
# rtol = atol / max|ref|: one final rounding of an fp32 sum (test_cuda_tensor_cores.py).
TOL = {torch.float16: 2e-3, torch.bfloat16: 1.6e-2}
TF32_TOL = 1e-2  # inputs rounded to 10 mantissa bits
# The pipelined forwards' types: (storage dtype, allow_tf32).
FORWARD_TYPES = pytest.mark.parametrize(
    ("dtype", "tf32"),
    [(torch.float16, False), (torch.bfloat16, False), (torch.float32, True)],
    ids=["fp16", "bf16", "tf32"],
)


def test_pending_names(monkeypatch: pytest.MonkeyPatch) -> None:
    """``1`` turns every pending change on; a comma-separated list only those it names."""
    for value, on in [
        ("1", {"kept_map_data", "pipelined_forward", "pipelined_wgrad",
               "pipelined_fod_forward", "pair_weight_grad", "pipelined_fp32"}),
        ("pipelined_forward", {"pipelined_forward"}),
        ("kept_map_data, pipelined_wgrad", {"kept_map_data", "pipelined_wgrad"}),
        ("kept_map_data", {"kept_map_data"}),
        ("0", set()),
        ("", set()),
        ("pipe", set()),
    ]:
        monkeypatch.setenv(conv_cuda.PENDING_ENV, value)
        assert {c for c in conv_cuda.PENDING_CHANGES if conv_cuda.pending(c)} == on, value
        assert conv_cuda.pending() == (value == "1"), value
    monkeypatch.delenv(conv_cuda.PENDING_ENV)
    assert not any(conv_cuda.pending(c) for c in conv_cuda.PENDING_CHANGES)


def _forward_reference(x: torch.Tensor, w: torch.Tensor, nbr: torch.Tensor) -> torch.Tensor:
    """float64 forward from nbr (table_reference without a weight gradient)."""
    return table_reference(x, w, torch.zeros(nbr.shape[0], w.shape[2]), nbr)[0]


def _wgrad_reference(x: torch.Tensor, dy: torch.Tensor, nbr: torch.Tensor) -> torch.Tensor:
    """float64 weight gradient from nbr (table_reference without a forward)."""
    w = torch.zeros(nbr.shape[1], x.shape[1], dy.shape[1])
    return table_reference(x, w, dy, nbr)[1]


def _run(x: torch.Tensor, w: torch.Tensor, nbr: torch.Tensor,
         tf32: bool = False) -> tuple[torch.Tensor, bool]:
    """The forward on the GPU and whether the pipelined kernel ran."""
    return kernel_ran(lambda: conv_cuda.conv_forward("implicit_gemm", x, w, nbr=nbr,
                                               allow_tf32=tf32), KERNEL)


def _wgrad(x: torch.Tensor, dy: torch.Tensor, pairs) -> tuple[torch.Tensor, bool]:
    """The fetch-on-demand weight gradient and whether the pipelined kernel ran."""
    return kernel_ran(lambda: conv_cuda.conv_weight_grad("fetch_on_demand", x, dy, pairs=pairs),
                WGRAD_KERNEL)


def _misaligned(t: torch.Tensor) -> torch.Tensor:
    """``t`` on the GPU, contiguous, at an address that is not 16-byte aligned."""
    flat = torch.empty(t.numel() + 1, dtype=t.dtype, device="cuda")
    out = flat[1:].view(t.shape)
    out.copy_(t.cuda())
    assert out.data_ptr() % 16 != 0 and out.is_contiguous()
    return out


def _check(y: torch.Tensor, ref: torch.Tensor, dtype: torch.dtype, what: str,
           tol: float | None = None) -> None:
    tol = TOL[dtype] if tol is None else tol
    assert y.dtype == dtype
    err = (y.double().cpu() - ref).abs().max().item()
    scale = max(ref.abs().max().item(), 1e-30)
    assert err <= tol * scale, f"{what}: max error {err:.3g}, allowed {tol * scale:.3g}"


@needs_gpu
@FORWARD_TYPES
@pytest.mark.parametrize(
    ("cin", "cout", "k"),
    [
        (8, 8, 27),
        (16, 24, 27),
        (32, 32, 27),
        (40, 72, 27),  # C_in not a multiple of the 32-wide slice; C_out past 64: 128-wide
        (64, 64, 8),
        (64, 128, 27),
        (128, 136, 2),  # a second, partial 128-wide column tile
        (256, 256, 27),
        (24, 200, 32),
    ],
)
def test_pipelined_forward(
    dtype: torch.dtype, tf32: bool, cin: int, cout: int, k: int,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The pipelined kernel runs and agrees with the float64 reference and with the
    previous kernel, in every tile shape, with and without the kept row order. float32
    with TF32 allowed runs it too (inputs rounded to TF32 once, when staged)."""
    if torch.cuda.get_device_capability()[0] < 8:
        pytest.skip("the pipelined kernel needs sm_80")
    n_in, n_out = 3000, SORT_MIN_ROWS + 101  # a last, partial row tile
    nbr = patterned_nbr(n_in, n_out, k, seed=cin + cout + k)
    g = torch.Generator().manual_seed(cin * cout)
    x = torch.randn(n_in, cin, generator=g).to(dtype)
    w = (torch.randn(k, cin, cout, generator=g) / cin**0.5).to(dtype)
    ref = _forward_reference(x, w, nbr)
    xc, wc, table = x.cuda(), w.cuda(), nbr.cuda()

    tol = TF32_TOL if tf32 else None
    monkeypatch.delenv(conv_cuda.PENDING_ENV, raising=False)
    before, ran = _run(xc, wc, table, tf32)
    assert not ran
    _check(before, ref, dtype, "previous kernel", tol)

    for value in ("pipelined_forward", "1"):  # sorting in the call, then the kept order
        monkeypatch.setenv(conv_cuda.PENDING_ENV, value)
        for _ in range(2):
            y, ran = _run(xc, wc, table, tf32)
            assert ran, value
            _check(y, ref, dtype, f"pipelined, PENDING={value}", tol)
            empty = (nbr < 0).all(dim=1).cuda()
            assert (y[empty] == 0).all(), "rows without neighbours are written as zeros"
            _check(y, before.double().cpu(), dtype, "pipelined against the previous", tol)


@needs_gpu
@pytest.mark.parametrize(
    ("case", "cin", "cout", "n_out", "k"),
    [
        ("unsorted: fewer rows than the sort needs", 32, 32, SORT_MIN_ROWS - 1, 27),
        ("unsorted: more than 32 kernel rows", 32, 32, SORT_MIN_ROWS, 33),
        ("C_in not a multiple of 8", 12, 32, SORT_MIN_ROWS, 27),
        ("C_out not a multiple of 8", 32, 20, SORT_MIN_ROWS, 27),
        ("x not 16-byte aligned", 32, 32, SORT_MIN_ROWS, 27),
    ],
)
def test_other_calls_keep_the_previous_kernel(
    case: str, cin: int, cout: int, n_out: int, k: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Calls the pipelined kernel does not serve run the previous one, right."""
    monkeypatch.setenv(conv_cuda.PENDING_ENV, "pipelined_forward")
    n_in = 2000
    nbr = patterned_nbr(n_in, n_out, k, seed=n_out + k + cin)
    g = torch.Generator().manual_seed(7)
    x = torch.randn(n_in, cin, generator=g).half()
    w = (torch.randn(k, cin, cout, generator=g) / cin**0.5).half()
    xc = _misaligned(x) if case.startswith("x not") else x.cuda()
    y, ran = _run(xc, w.cuda(), nbr.cuda())
    assert not ran, case
    _check(y, _forward_reference(x, w, nbr), torch.float16, case)


@needs_gpu
def test_plain_float32_keeps_the_previous_kernel(monkeypatch: pytest.MonkeyPatch) -> None:
    """float32 without TF32 (FMA) is not the pipelined kernel's: the option changes
    nothing there."""
    monkeypatch.setenv(conv_cuda.PENDING_ENV, "pipelined_forward")
    nbr = patterned_nbr(1000, SORT_MIN_ROWS, 27, seed=3)
    g = torch.Generator().manual_seed(3)
    x = torch.randn(1000, 32, generator=g)
    w = torch.randn(27, 32, 32, generator=g) / 32**0.5
    y, ran = _run(x.cuda(), w.cuda(), nbr.cuda())
    assert not ran
    ref = _forward_reference(x, w, nbr)
    err = (y.double().cpu() - ref).abs().max().item()
    assert err <= 1e-4 * ref.abs().max().item()


@needs_gpu
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
@pytest.mark.parametrize(
    ("cin", "cout", "k", "n_out"),
    [
        (8, 8, 27, 3000),
        (16, 24, 27, 5000),
        (32, 32, 8, 20000),  # long kernel rows: chunks of many 32-pair slices
        (40, 72, 27, 3000),  # partial 64-channel tiles on both sides
        (64, 64, 27, 6000),
        (128, 96, 2, 4000),
        (8, 200, 27, 300),  # kernel rows of a few pairs, some empty
    ],
)
def test_pipelined_weight_grad(
    dtype: torch.dtype, cin: int, cout: int, k: int, n_out: int,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The pipelined fetch-on-demand weight gradient runs and agrees with the float64
    reference and with the previous kernel, with and without the kept tile prefix."""
    if torch.cuda.get_device_capability()[0] < 8:
        pytest.skip("the pipelined kernel needs sm_80")
    n_in = 2500
    nbr = patterned_nbr(n_in, n_out, k, seed=cin * 7 + cout + k)
    g = torch.Generator().manual_seed(cin + 3 * cout)
    x = torch.randn(n_in, cin, generator=g).to(dtype)
    dy = torch.randn(n_out, cout, generator=g).to(dtype)
    ref = _wgrad_reference(x, dy, nbr)
    xc, dyc = x.cuda(), dy.cuda()
    pairs = kmap_cuda.kernel_pairs(nbr.cuda())
    # Sums of up to thousands of products, rounded once to the dtype, in an order the
    # atomics do not fix: the forward's tolerance, twice.
    tol = 2 * TOL[dtype]

    monkeypatch.delenv(conv_cuda.PENDING_ENV, raising=False)
    before, ran = _wgrad(xc, dyc, pairs)
    assert not ran
    _check(before, ref, dtype, "previous kernel", tol)

    for value in ("pipelined_wgrad", "1"):  # the tile prefix computed in the call, then kept
        monkeypatch.setenv(conv_cuda.PENDING_ENV, value)
        for _ in range(2):
            dw, ran = _wgrad(xc, dyc, pairs)
            assert ran, value
            assert dw.shape == (k, cin, cout)
            _check(dw, ref, dtype, f"pipelined, PENDING={value}", tol)
            _check(dw, before.double().cpu(), dtype, "pipelined against the previous", tol)


@needs_gpu
@pytest.mark.parametrize(
    ("case", "cin", "cout"),
    [("C_in not a multiple of 8", 12, 32), ("C_out not a multiple of 8", 32, 20),
     ("dy not 16-byte aligned", 32, 32)],
)
def test_other_weight_grads_keep_the_previous_kernel(
    case: str, cin: int, cout: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Weight gradients the pipelined kernel does not serve run the previous one, right."""
    monkeypatch.setenv(conv_cuda.PENDING_ENV, "pipelined_wgrad")
    n_in, n_out = 1500, 2000
    nbr = patterned_nbr(n_in, n_out, 27, seed=cin + cout)
    g = torch.Generator().manual_seed(11)
    x = torch.randn(n_in, cin, generator=g).half()
    dy = torch.randn(n_out, cout, generator=g).half()
    dyc = _misaligned(dy) if case.startswith("dy not") else dy.cuda()
    dw, ran = _wgrad(x.cuda(), dyc, kmap_cuda.kernel_pairs(nbr.cuda()))
    assert not ran, case
    _check(dw, _wgrad_reference(x, dy, nbr), torch.float16, case, 2 * TOL[torch.float16])


@needs_gpu
@FORWARD_TYPES
@pytest.mark.parametrize(
    ("cin", "cout", "k", "n_out"),
    [
        (8, 8, 27, 3000),
        (40, 72, 27, 2000),  # a partial slice of C_in; a 128-wide tile, partly used
        (64, 64, 8, 5000),
        (128, 136, 27, 1500),  # a second, partial 128-wide column tile
        (256, 32, 2, 4000),  # eight slices of C_in per tile
        (16, 200, 27, 300),  # kernel rows of a few pairs, some empty
    ],
)
def test_pipelined_fod_forward(
    dtype: torch.dtype, tf32: bool, cin: int, cout: int, k: int, n_out: int,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The pipelined fetch-on-demand forward runs and agrees with the float64 reference
    and with the previous kernel, with and without the kept tile prefix."""
    if torch.cuda.get_device_capability()[0] < 8:
        pytest.skip("the pipelined kernel needs sm_80")
    n_in = 2500
    nbr = patterned_nbr(n_in, n_out, k, seed=cin + 5 * cout + k)
    g = torch.Generator().manual_seed(cout * 3 + cin)
    x = torch.randn(n_in, cin, generator=g).to(dtype)
    w = (torch.randn(k, cin, cout, generator=g) / cin**0.5).to(dtype)
    ref = _forward_reference(x, w, nbr)
    xc, wc = x.cuda(), w.cuda()
    pairs = kmap_cuda.kernel_pairs(nbr.cuda())
    tol = TF32_TOL if tf32 else None

    def run() -> tuple[torch.Tensor, bool]:
        return kernel_ran(lambda: conv_cuda.conv_forward("fetch_on_demand", xc, wc, pairs=pairs,
                                                   n_out=n_out, allow_tf32=tf32), FOD_KERNEL)

    monkeypatch.delenv(conv_cuda.PENDING_ENV, raising=False)
    before, ran = run()
    assert not ran
    _check(before, ref, dtype, "previous kernel", tol)
    for value in ("pipelined_fod_forward", "1"):  # the tile prefix in the call, then kept
        monkeypatch.setenv(conv_cuda.PENDING_ENV, value)
        for _ in range(2):
            y, ran = run()
            assert ran, value
            _check(y, ref, dtype, f"pipelined, PENDING={value}", tol)
            _check(y, before.double().cpu(), dtype, "pipelined against the previous", tol)
            empty = (nbr < 0).all(dim=1).cuda()
            assert (y[empty] == 0).all(), "rows without pairs stay zero"


@needs_gpu
def test_other_fod_forwards_keep_the_previous_kernel(monkeypatch: pytest.MonkeyPatch) -> None:
    """Plain float32 and channel rows that are not whole 16-byte runs run the previous
    fetch-on-demand forward, right."""
    monkeypatch.setenv(conv_cuda.PENDING_ENV, "pipelined_fod_forward")
    n_in, n_out = 1500, 2000
    nbr = patterned_nbr(n_in, n_out, 27, seed=21)
    pairs = kmap_cuda.kernel_pairs(nbr.cuda())
    g = torch.Generator().manual_seed(21)
    for dtype, cin, cout in ((torch.float32, 32, 32), (torch.float16, 12, 32),
                             (torch.float16, 32, 20)):
        x = torch.randn(n_in, cin, generator=g).to(dtype)
        w = (torch.randn(27, cin, cout, generator=g) / cin**0.5).to(dtype)
        y, ran = kernel_ran(lambda x=x, w=w: conv_cuda.conv_forward(
            "fetch_on_demand", x.cuda(), w.cuda(), pairs=pairs, n_out=n_out), FOD_KERNEL)
        assert not ran, (dtype, cin, cout)
        tol = 1e-4 if dtype == torch.float32 else None
        _check(y, _forward_reference(x, w, nbr), dtype, f"{dtype} {cin} {cout}", tol)
