"""The implicit-GEMM op's CUDA weight gradient over the map's pair lists (pending
``pair_weight_grad``, torch_lattice/ops/conv_cuda.py ``_kept_pairs``).

Implicit GEMM's own weight-gradient kernel walks every output row of every kernel row and
multiplies zeros where a row has no neighbour; with the change on, the op builds the
table's pair lists once, keeps them on the table, and runs the fetch-on-demand weight
gradient over them. The keeping is checked host-only; the rest needs a GPU.
"""

from __future__ import annotations

import os

import pytest
import torch

import torch_lattice.ops  # noqa: F401  (registers the lattice ops)
from torch_lattice.ops import conv_cuda

try:
    from cuda_helpers import kernels_run, patterned_nbr, table_reference
except ImportError:  # tests/ may become a package; then it is imported through it
    from tests.cuda_helpers import kernels_run, patterned_nbr, table_reference

pytestmark = pytest.mark.cuda
needs_gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")

if torch.cuda.is_available():
    # Deterministic mode's weight gradient runs cuBLAS GEMMs, which torch versions that
    # still check the cuBLAS workspace refuse in that mode without this (set before cuBLAS
    # starts, as test_determinism.py does; a run of this file alone does not import that).
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")

IG_WGRAD = "tl_ig_wgrad_kernel"
# The previous fetch-on-demand weight gradient and the pipelined one (fp16 and bf16 where
# pipelined_wgrad is pending too).
PAIR_WGRADS = ("tl_pairs_wgrad_kernel", "tl_fod_pipelined_wgrad_kernel")
PAIRS_BUILD = "tl_pairs_fill_kernel"


def _counting_pairs(monkeypatch: pytest.MonkeyPatch) -> list[torch.Tensor]:
    """Replace the pair builder with one that records its tables and returns a
    recognisable triple; host-only."""
    built: list[torch.Tensor] = []

    def fake(nbr: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        built.append(nbr)
        return torch.tensor([len(built)]), torch.empty(0), torch.empty(0)

    monkeypatch.setattr(conv_cuda.kmap_cuda, "kernel_pairs", fake)
    return built


def test_pairs_are_built_once_per_table_version(monkeypatch: pytest.MonkeyPatch) -> None:
    """The pairs are built on the first call, kept on the table, and built again after an
    in-place change to it; another table gets its own."""
    built = _counting_pairs(monkeypatch)
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: False)
    nbr = torch.zeros(4, 3, dtype=torch.int32)
    first = conv_cuda._kept_pairs(nbr)
    assert first is not None and len(built) == 1
    assert conv_cuda._kept_pairs(nbr) is first and len(built) == 1
    nbr[0, 0] = 1  # a new version: the kept pairs no longer describe it
    again = conv_cuda._kept_pairs(nbr)
    assert again is not first and len(built) == 2
    other = torch.zeros(4, 3, dtype=torch.int32)
    assert conv_cuda._kept_pairs(other) is not again and len(built) == 3


def test_no_pairs_are_built_during_graph_capture(monkeypatch: pytest.MonkeyPatch) -> None:
    """Counting the pairs reads a number back to the host, which a captured stream may not
    do: during capture only pairs built before are used."""
    built = _counting_pairs(monkeypatch)
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: True)
    nbr = torch.zeros(4, 3, dtype=torch.int32)
    assert conv_cuda._kept_pairs(nbr) is None and not built
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: False)
    kept = conv_cuda._kept_pairs(nbr)
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: True)
    assert conv_cuda._kept_pairs(nbr) is kept and len(built) == 1


def _has(names: set[str], kernel: str) -> bool:
    return any(kernel in n for n in names)


@needs_gpu
@pytest.mark.parametrize(
    ("dtype", "tf32", "tol"),
    [
        (torch.float32, False, 1e-4),
        (torch.float32, True, 2e-2),
        (torch.float16, False, 4e-3),
        (torch.bfloat16, False, 3.2e-2),
    ],
    ids=["fp32", "tf32", "fp16", "bf16"],
)
@pytest.mark.parametrize(("cin", "cout", "k"), [(16, 16, 27), (32, 64, 27), (12, 20, 8)])
def test_weight_grad_runs_over_the_pairs(
    dtype: torch.dtype, tf32: bool, tol: float, cin: int, cout: int, k: int,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """With the change on, the op's weight gradient runs a pair-list kernel, not implicit
    GEMM's, agrees with the float64 reference and with the change off, and builds the
    pairs on the first call only."""
    n_in, n_out = 3000, 5000
    nbr = patterned_nbr(n_in, n_out, k, seed=cin + cout + k)
    g = torch.Generator().manual_seed(cin * cout + k)
    x = torch.randn(n_in, cin, generator=g).to(dtype)
    dy = torch.randn(n_out, cout, generator=g).to(dtype)
    ref = table_reference(x, torch.zeros(k, cin, cout), dy, nbr)[1]
    xc, dyc, table = x.cuda(), dy.cuda(), nbr.cuda()

    def run() -> tuple[torch.Tensor, set[str]]:
        return kernels_run(lambda: torch.ops.lattice.sparse_conv_weight_grad(xc, dyc, table, tf32))

    def check(dw: torch.Tensor, what: str) -> None:
        assert dw.dtype == dtype and dw.shape == (k, cin, cout)
        err = (dw.double().cpu() - ref).abs().max().item()
        scale = max(ref.abs().max().item(), 1e-30)
        assert err <= tol * scale, f"{what}: max error {err:.3g}, allowed {tol * scale:.3g}"

    monkeypatch.delenv(conv_cuda.PENDING_ENV, raising=False)
    before, names = run()
    assert _has(names, IG_WGRAD) and not any(_has(names, n) for n in PAIR_WGRADS)
    check(before, "implicit GEMM's kernel")
    assert not hasattr(table, "_tl_pairs")

    for value in ("pair_weight_grad", "1"):
        monkeypatch.setenv(conv_cuda.PENDING_ENV, value)
        for call in range(2):
            dw, names = run()
            assert not _has(names, IG_WGRAD), value
            assert any(_has(names, n) for n in PAIR_WGRADS), value
            first = call == 0 and value == "pair_weight_grad"
            assert _has(names, PAIRS_BUILD) == first, "pairs are built once per table"
            check(dw, f"over the pairs, PENDING={value}")
    assert hasattr(table, "_tl_pairs")


@needs_gpu
def test_changed_table_gets_new_pairs(monkeypatch: pytest.MonkeyPatch) -> None:
    """A table changed in place after its pairs were kept gets new pairs, and the
    gradient follows the new table."""
    monkeypatch.setenv(conv_cuda.PENDING_ENV, "pair_weight_grad")
    n_in, n_out, k = 800, 1200, 27
    nbr = patterned_nbr(n_in, n_out, k, seed=5)
    g = torch.Generator().manual_seed(5)
    x = torch.randn(n_in, 16, generator=g)
    dy = torch.randn(n_out, 16, generator=g)
    table = nbr.cuda()
    torch.ops.lattice.sparse_conv_weight_grad(x.cuda(), dy.cuda(), table)
    nbr[:, 13] = -1  # drop the centre row's pairs
    table.copy_(nbr)
    dw = torch.ops.lattice.sparse_conv_weight_grad(x.cuda(), dy.cuda(), table)
    ref = table_reference(x, torch.zeros(k, 16, 16), dy, nbr)[1]
    assert (dw[13] == 0).all()
    assert (dw.double().cpu() - ref).abs().max().item() <= 1e-5 * ref.abs().max().item()


@needs_gpu
def test_deterministic_mode_uses_the_kept_pairs(monkeypatch: pytest.MonkeyPatch) -> None:
    """Deterministic algorithms keep gather-scatter's weight gradient (no atomics), over
    the kept pairs, bitwise the same on every call."""
    monkeypatch.setenv(conv_cuda.PENDING_ENV, "pair_weight_grad")
    nbr = patterned_nbr(1000, 1500, 27, seed=9)
    g = torch.Generator().manual_seed(9)
    x, dy = torch.randn(1000, 16, generator=g).cuda(), torch.randn(1500, 8, generator=g).cuda()
    table = nbr.cuda()
    def wgrad() -> torch.Tensor:
        return torch.ops.lattice.sparse_conv_weight_grad(x, dy, table)

    previous = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(True)
    try:
        first, names = kernels_run(wgrad)
        second, names2 = kernels_run(wgrad)
    finally:
        torch.use_deterministic_algorithms(previous)
    assert not any(_has(names | names2, n) for n in (IG_WGRAD, *PAIR_WGRADS))
    assert _has(names, PAIRS_BUILD) and not _has(names2, PAIRS_BUILD)
    assert torch.equal(first, second)
