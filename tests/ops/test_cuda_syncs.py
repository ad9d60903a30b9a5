"""No host synchronisation in a convolution on a cached map (issue 23's target): once a
layer has run on a support, its forward and backward only enqueue work. Counted with
torch.profiler, which records the CUDA runtime calls of torch and of the extension alike
(``cudaStreamSynchronize``, synchronous ``cudaMemcpy``...), by the helper the benchmark's
``overhead`` group prints the same counts with (benchmarks.gpu.syncs_and_launches)."""

from __future__ import annotations

import pytest
import torch

import torch_lattice as tl
from torch_lattice.nn.functional import ConvConfig, Dataflow

try:
    from cuda_helpers import pending_without, random_coords
except ImportError:  # tests/ may become a package; then it is imported through it
    from tests.cuda_helpers import pending_without, random_coords

# After cuda_helpers, which puts the repository root (benchmarks/) on sys.path: a plain
# `pytest` run of this file alone does not.
from benchmarks.gpu import syncs_and_launches

pytestmark = pytest.mark.cuda
needs_gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


@needs_gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=str)
@pytest.mark.parametrize("dataflow", list(Dataflow), ids=lambda d: d.value)
@pytest.mark.parametrize("strided", [False, True], ids=["subm", "k2s2"])
def test_cached_map_forward_and_backward_make_no_host_sync(
    dataflow: Dataflow, dtype: torch.dtype, strided: bool
) -> None:
    coords = random_coords(4000, 24, 3).cuda()
    config = ConvConfig(dataflow=dataflow)
    conv = (tl.nn.Conv3d(32, 32, 2, stride=2, config=config) if strided
            else tl.nn.SubmConv3d(32, 32, 3, config=config)).cuda().to(dtype)
    feats = torch.randn(coords.shape[0], 32, device="cuda", dtype=dtype, requires_grad=True)
    x = tl.SparseTensor(feats, coords)

    def step() -> None:
        y = conv(x)
        y.feats.backward(torch.ones_like(y.feats))

    step()  # builds the map, its pair lists and what they cache
    torch.cuda.synchronize()
    syncs, launches = syncs_and_launches(step, cuda=True)
    assert launches > 0, "the profiler records no runtime calls here: nothing was counted"
    assert syncs == [], f"host synchronisations in a cached-map step: {syncs}"


@needs_gpu
@pytest.mark.parametrize("dataflow", [Dataflow.ImplicitGEMM, Dataflow.FetchOnDemand],
                         ids=lambda d: d.value)
def test_map_derived_data_is_computed_once(
    dataflow: Dataflow, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With the pending CUDA changes on (TORCH_LATTICE_CUDA_PENDING=1), what a dataflow
    derives from its map alone (implicit GEMM's order of output rows, fetch-on-demand's
    tile starts) is computed on the first call and kept with the map: later calls launch
    fewer kernels and give the same outputs and gradients as calls that derive it each
    time: bitwise where each value is written once (implicit GEMM's output and input
    gradient), else to fp32 rounding, since fp32 atomics add in no fixed order
    (fetch-on-demand, and every weight gradient). 6000 output rows: implicit GEMM orders
    rows from 4096. The calls that derive it each time run every other pending change, so
    that both sides run the same kernels (the pending pipelined ones round differently
    from the previous ones)."""
    from torch_lattice.ops import conv_cuda

    coords = random_coords(6000, 28, 3).cuda()
    conv = tl.nn.SubmConv3d(32, 32, 3, config=ConvConfig(dataflow=dataflow)).cuda()
    feats = torch.randn(coords.shape[0], 32, device="cuda", requires_grad=True)
    x = tl.SparseTensor(feats, coords)
    grad = torch.randn(coords.shape[0], 32, device="cuda")

    def step() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        feats.grad, conv.weight.grad = None, None
        y = conv(x)
        y.feats.backward(grad)
        return y.feats.detach().clone(), feats.grad.clone(), conv.weight.grad.clone()

    def forward() -> None:
        with torch.no_grad():
            conv(x)

    monkeypatch.setenv(conv_cuda.PENDING_ENV, pending_without("kept_map_data"))
    assert not conv_cuda.pending("kept_map_data")
    want = step()
    torch.cuda.synchronize()
    _, launches_each_call = syncs_and_launches(forward, cuda=True)

    monkeypatch.setenv(conv_cuda.PENDING_ENV, "1")
    first = step()  # derives and keeps it
    torch.cuda.synchronize()
    syncs, launches_kept = syncs_and_launches(forward, cuda=True)
    again = step()
    assert syncs == []
    assert launches_kept < launches_each_call, (launches_kept, launches_each_call)
    written_once = (True, True, False) if dataflow == Dataflow.ImplicitGEMM else (False,) * 3
    for got in (first, again):
        for a, b, once in zip(got, want, written_once, strict=True):
            if once:
                assert torch.equal(a, b)
            else:
                torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5 * b.abs().max().item())
