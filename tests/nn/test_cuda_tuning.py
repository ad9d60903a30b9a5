"""The CUDA default autotunes (torch_lattice.nn.functional.tuning): the first call of a
layer shape times the three dataflows on the GPU, records the fastest under the GPU's
name, and the output and gradients are the relation's (against the CPU in float64)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch

import torch_lattice as tl
from torch_lattice.nn import functional as F
from torch_lattice.nn.functional import tuning

try:
    from cuda_helpers import random_coords
except ImportError:  # tests/ may become a package; then it is imported through it
    from tests.cuda_helpers import random_coords

pytestmark = pytest.mark.cuda
needs_gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


@pytest.fixture(autouse=True)
def _fresh() -> Iterator[None]:
    tuning.clear_tuning()
    yield
    tuning.clear_tuning()


@needs_gpu
@pytest.mark.parametrize(("dtype", "tol"), [(torch.float32, 1e-4), (torch.float16, 5e-3)])
def test_default_tunes_each_shape_once_and_computes_the_relation(
    dtype: torch.dtype, tol: float, monkeypatch: pytest.MonkeyPatch
) -> None:
    coords = random_coords(3000, 20, 7)
    feats = torch.randn(coords.shape[0], 16, generator=torch.Generator().manual_seed(1))
    torch.manual_seed(0)
    conv = tl.nn.SubmConv3d(16, 24, 3)
    ref = tl.nn.SubmConv3d(16, 24, 3).double()
    ref.load_state_dict(conv.state_dict())
    conv = conv.cuda().to(dtype)
    with torch.no_grad():
        ref.weight.copy_(conv.weight.double().cpu())
    assert F.resolved_dataflow(device="cuda") is F.Dataflow.FetchOnDemand  # the fallback
    x = tl.SparseTensor(feats.to(dtype).cuda().requires_grad_(True), coords.cuda())
    y = conv(x)
    (key,) = tuning.tuning_choices()
    assert key.device == "cuda:" + torch.cuda.get_device_name()
    assert key.dtype == str(dtype).removeprefix("torch.")
    assert F.resolved_dataflow(conv, input=x) is tuning.tuning_choices()[key]
    x_ref = tl.SparseTensor(feats.to(dtype).double().requires_grad_(True), coords)
    y_ref = ref(x_ref)
    grad = torch.randn(y_ref.feats.shape, generator=torch.Generator().manual_seed(2),
                       dtype=torch.float64)
    y.feats.backward(grad.to(dtype).cuda())
    y_ref.feats.backward(grad.to(dtype).double())
    for got, want in ((y.feats, y_ref.feats), (x.feats.grad, x_ref.feats.grad),
                      (conv.weight.grad, ref.weight.grad)):
        assert got is not None and want is not None
        err = (got.double().cpu() - want).abs().max() / want.abs().max()
        assert err <= tol

    def no_timing(run: object, device: object) -> float:
        raise AssertionError("a tuned shape was timed again")

    monkeypatch.setattr(tuning, "_seconds", no_timing)
    conv(tl.SparseTensor(x.feats.detach(), coords.cuda()))
