"""1x1x1 stride-1 convolutions on the CPU run the library's implicit GEMM over the
identity map (not torch.mm), with the values and gradients of the matrix product."""

from __future__ import annotations

import pytest
import torch
from torch.profiler import profile

import torch_lattice as tl

COORDS = torch.tensor(
    [[0, 0, 0, 0], [0, 1, 0, 0], [0, 1, 1, 0], [0, 4, 2, 1], [1, 0, 0, 0]], dtype=torch.int32
)


def _modules() -> list[torch.nn.Module]:
    torch.manual_seed(0)
    return [
        tl.nn.SubmConv3d(6, 10, 1, bias=True),
        tl.nn.Conv3d(6, 10, 1, bias=True),
        tl.nn.ConvTranspose3d(6, 10, 1, bias=True),
    ]


@pytest.mark.parametrize("index", range(3))
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
def test_pointwise_values_and_gradients(index: int, dtype: torch.dtype) -> None:
    conv = _modules()[index].to(dtype)
    feats = torch.randn(5, 6, dtype=torch.float64).to(dtype).requires_grad_(True)
    y = conv(tl.SparseTensor(feats, COORDS))
    assert torch.equal(y.coords, COORDS)
    g = torch.randn(5, 10, dtype=torch.float64).to(dtype)
    y.feats.backward(g)
    # float64 reference from the same (rounded) values
    f64, w64 = feats.detach().double(), conv.weight.detach().double()[0]
    b64 = conv.bias.detach().double()
    want = f64 @ w64 + b64
    tol = 1e-12 if dtype == torch.float64 else 1e-5 if dtype == torch.float32 else 2e-2
    scale = want.abs().max().item()
    assert (y.feats.double() - want).abs().max().item() <= tol * scale
    gd = g.double()
    assert torch.allclose(feats.grad.double(), gd @ w64.T, atol=tol * 10, rtol=tol * 10)
    assert torch.allclose(
        conv.weight.grad.double()[0], f64.T @ gd, atol=tol * 10, rtol=tol * 10
    )


@pytest.mark.parametrize("index", range(3))
def test_pointwise_runs_the_library_kernel(index: int) -> None:
    conv = _modules()[index]
    feats = torch.randn(5, 6, requires_grad=True)
    with profile() as prof:
        conv(tl.SparseTensor(feats, COORDS)).feats.sum().backward()
    names = {e.name for e in prof.events()}
    assert "lattice::sparse_conv" in names
    assert "lattice::sparse_conv_weight_grad" in names
    assert "aten::mm" not in names
