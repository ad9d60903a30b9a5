"""torch.compile over the library's modules on the CPU: dynamo traces the custom ops
through their fake kernels, whose argument checks must take the symbolic ints it makes
of sizes that change between calls (two kernel sizes in one model, ``dynamic=True``), and
``dynamic=False`` traces each size as constants (docs/troubleshooting.md: each layer shape a
compile of the frames around the convolutions' graph breaks)."""

from __future__ import annotations

import pytest
import torch

import torch_lattice as tl


def _net() -> torch.nn.Module:
    # kernel sizes 3, 5 and 2 through the same functions: dynamo makes them symbolic
    return torch.nn.Sequential(
        tl.nn.SubmConv3d(3, 4, 3),
        tl.nn.ReLU(),
        tl.nn.SubmConv3d(4, 4, 5),
        tl.nn.Conv3d(4, 5, 2, stride=2),
    )


def _input(n: int, seed: int) -> tl.SparseTensor:
    g = torch.Generator().manual_seed(seed)
    coords = torch.randint(0, 10, (n, 4), generator=g) * torch.tensor([0, 1, 1, 1])
    coords = torch.unique(coords, dim=0)
    return tl.SparseTensor(torch.randn(len(coords), 3, generator=g), coords)


@pytest.mark.parametrize("dynamic", [None, True, False], ids=["default", "dynamic", "static"])
def test_compiled_model_matches_eager(dynamic: bool | None) -> None:
    torch.manual_seed(0)
    torch._dynamo.reset()
    net = _net()
    compiled = torch.compile(net, backend="aot_eager", dynamic=dynamic)
    for n, seed in ((200, 1), (260, 2)):  # a second size: dynamo recompiles or generalises
        # compiled first, on its own tensor: an eager call before it would leave the
        # kernel maps cached on the support, and the trace would never build one
        got = compiled(_input(n, seed))
        (got_grad,) = torch.autograd.grad(got.feats.square().sum(), net[0].weight)
        want = net(_input(n, seed))
        (want_grad,) = torch.autograd.grad(want.feats.square().sum(), net[0].weight)
        assert torch.equal(got.coords, want.coords)
        torch.testing.assert_close(got.feats, want.feats, rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(got_grad, want_grad, rtol=1e-5, atol=1e-6)
