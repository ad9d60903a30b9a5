"""Double backward (gradient penalties, second-order methods) through every convolution
module in each dataflow and through max pooling: the weight gradients are bilinear in
(features, output gradient) and max pooling's backward is linear in its gradient given
the argmax, so their own gradients are registered (ops/conv.py, ops/pool.py) and checked
here with ``gradgradcheck`` in float64 on small supports."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
from torch.autograd import gradgradcheck

import torch_lattice as tl
from torch_lattice.nn import functional as F


def _coords(seed: int = 0, rows: int = 40, extent: int = 4) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    c = torch.cat([torch.randint(0, 2, (rows, 1), generator=g),
                   torch.randint(0, extent, (rows, 3), generator=g)], 1)  # fmt: skip
    return torch.unique(c, dim=0).int()


def _feats(n: int, c: int, seed: int = 1) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, c, generator=g, dtype=torch.float64).requires_grad_()


def _module(cls: type[torch.nn.Module], *args: object, **kw: object) -> torch.nn.Module:
    torch.manual_seed(2)
    return cls(*args, bias=False, **kw).double()


# Each family: (modules, how to run them on x) with 2 input channels.
def subm() -> tuple[list[torch.nn.Module], Callable[..., tl.SparseTensor]]:
    m = _module(tl.nn.SubmConv3d, 2, 3, 3)
    return [m], m


def strided() -> tuple[list[torch.nn.Module], Callable[..., tl.SparseTensor]]:
    m = _module(tl.nn.Conv3d, 2, 3, 2, stride=2)
    return [m], m


def transpose() -> tuple[list[torch.nn.Module], Callable[..., tl.SparseTensor]]:
    down = _module(tl.nn.Conv3d, 2, 2, 2, stride=2)
    up = _module(tl.nn.ConvTranspose3d, 2, 3, 2, stride=2)
    return [down, up], lambda x: up(down(x))


def generative() -> tuple[list[torch.nn.Module], Callable[..., tl.SparseTensor]]:
    m = _module(tl.nn.GenerativeConvTranspose3d, 2, 3, 2, stride=2)
    return [m], m


def normalized() -> tuple[list[torch.nn.Module], Callable[..., tl.SparseTensor]]:
    m = _module(tl.nn.NormalizedSubmConv3d, 2, 3, 3)
    return [m], m


FAMILIES = [subm, strided, transpose, generative, normalized]
INPUT_STRIDE = {generative: 2}


class _Run(torch.nn.Module):
    """A family's modules as one module, so ``functional_call`` can swap their weights."""

    def __init__(self, mods: list[torch.nn.Module], run: Callable[..., tl.SparseTensor]):
        super().__init__()
        self.mods = torch.nn.ModuleList(mods)
        self.run = run

    def forward(self, x: tl.SparseTensor) -> torch.Tensor:
        return self.run(x).feats


@pytest.mark.parametrize("dataflow", list(F.Dataflow), ids=lambda d: d.name)
@pytest.mark.parametrize("family", FAMILIES, ids=lambda f: f.__name__)
def test_conv_gradgradcheck(family: Callable, dataflow: F.Dataflow) -> None:
    coords = _coords()
    mods, run = family()
    net = _Run(mods, run)
    names = [f"mods.{i}.weight" for i in range(len(mods))]

    def f(feats: torch.Tensor, *ws: torch.Tensor) -> torch.Tensor:
        x = tl.SparseTensor(feats, coords, stride=INPUT_STRIDE.get(family, 1))
        with F.conv_config(dataflow=dataflow):
            return torch.func.functional_call(net, dict(zip(names, ws, strict=True)), (x,))

    feats = _feats(coords.shape[0], 2)
    ws = [m.weight.detach().clone().requires_grad_() for m in mods]
    assert gradgradcheck(f, (feats, *ws))


@pytest.mark.parametrize("dataflow", list(F.Dataflow), ids=lambda d: d.name)
def test_gradient_penalty_on_weights(dataflow: F.Dataflow) -> None:
    """The reported case: a loss on the weight gradient, taken with create_graph=True."""
    x = tl.SparseTensor(_feats(_coords().shape[0], 2), _coords())
    m = _module(tl.nn.SubmConv3d, 2, 3, 3)
    with F.conv_config(dataflow=dataflow):
        y = m(x).feats
        (gw,) = torch.autograd.grad((y * y).sum(), [m.weight], create_graph=True)
        penalty = gw.pow(2).sum()
        gx, gw2 = torch.autograd.grad(penalty, [x.feats, m.weight])
    assert gx.abs().sum() > 0 and gw2.abs().sum() > 0


def test_max_pool_gradgradcheck() -> None:
    coords = _coords(rows=60)
    pool = tl.nn.MaxPool3d(2, stride=2)

    def f(feats: torch.Tensor) -> torch.Tensor:
        return pool(tl.SparseTensor(feats, coords)).feats

    assert gradgradcheck(f, (_feats(coords.shape[0], 3),))
