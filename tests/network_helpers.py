"""One small network that runs every layer family, for the concurrency and
determinism tests: submanifold, strided (generated and target-conditioned),
inverse and target transposes, generative and normalized variants, windowed
and global pooling.  Every convolution that accepts a dataflow runs the one
asked for; target-conditioned transposes run gather-scatter (their only one).
"""

from __future__ import annotations

import torch

import torch_lattice as tl
from torch_lattice.nn import functional as F

DATAFLOWS = list(F.Dataflow)


def make_input(rows: int = 3000, channels: int = 6, seed: int = 0, dtype=torch.float64):
    """A fresh SparseTensor (fresh coordinate manager: every map is cold)."""
    g = torch.Generator().manual_seed(seed)
    side = max(8, round((rows / 2) ** (1 / 3) * 1.6))
    c = torch.randint(0, side, (rows * 2, 4), generator=g)
    c[:, 0] %= 2
    c = torch.unique(c, dim=0)
    c = c[torch.randperm(c.shape[0], generator=g)[:rows]]
    f = torch.randn(c.shape[0], channels, generator=g, dtype=torch.float64).to(dtype)
    return tl.SparseTensor(f.requires_grad_(), c)


class Net(torch.nn.Module):
    """Every family once; ``forward`` returns the list of outputs."""

    def __init__(self, dataflow: F.Dataflow, cin: int = 6, width: int = 8, seed: int = 1):
        super().__init__()
        torch.manual_seed(seed)
        cfg = F.ConvConfig(dataflow=dataflow)
        w = width
        nn = tl.nn
        self.subm = nn.SubmConv3d(cin, w, 3, bias=True, config=cfg)
        self.down = nn.Conv3d(w, w, 3, stride=2, padding=1, bias=True, config=cfg)
        self.nsubm = nn.NormalizedSubmConv3d(w, w, 3, config=cfg)
        self.up = nn.ConvTranspose3d(w, w, 3, stride=2, padding=1, bias=True, config=cfg)
        self.target_down = nn.Conv3d(w, 4, 2, stride=2, config=cfg)
        self.target_up = nn.ConvTranspose3d(w, 4, 3, stride=2, padding=1)  # gather-scatter
        self.gen = nn.GenerativeConvTranspose3d(w, 4, 2, stride=2, config=cfg)
        self.ngen = nn.NormalizedGenerativeConvTranspose3d(w, 4, (2, 1, 2), stride=2, config=cfg)
        self.ntarget = nn.NormalizedConvTranspose3d(w, 4, 2, stride=2)  # gather-scatter
        self.pools = torch.nn.ModuleList(
            [nn.MaxPool3d(2, 2), nn.AvgPool3d(3, 2, 1), nn.SumPool3d(3, 1, 1)]
        )
        self.global_pools = torch.nn.ModuleList([nn.GlobalAvgPool(), nn.GlobalMaxPool()])

    def forward(self, x: tl.SparseTensor) -> list[tl.SparseTensor | torch.Tensor]:
        a = self.subm(x)
        b = self.down(a)
        c = self.nsubm(b)
        e = self.up(c)  # back onto a's support
        outs: list[tl.SparseTensor | torch.Tensor] = [a, b, c, e]
        outs.append(self.target_down(e, coordinates=b))
        outs.append(self.target_up(c, x))
        outs.append(self.gen(c))
        outs.append(self.ngen(c))
        outs.append(self.ntarget(c, x))
        outs.extend(p(e) for p in self.pools)
        outs.extend(p(e) for p in self.global_pools)
        return outs


def run(net: Net, x: tl.SparseTensor, seed: int = 2):
    """Forward and backward of ``net`` on ``x``: (coords, feats, grads), all tensors.

    The loss weighs every output with fixed random numbers; the gradients are taken
    with ``torch.autograd.grad`` (for ``x.feats`` and every parameter), so threads
    sharing the layers never accumulate into ``.grad``.
    """
    outs = net(x)
    g = torch.Generator().manual_seed(seed)
    loss = x.feats.new_zeros(())
    coords, feats = [], []
    for y in outs:
        f = y.feats if isinstance(y, tl.SparseTensor) else y
        if isinstance(y, tl.SparseTensor):
            coords.append(y.coords)
        feats.append(f)
        wts = torch.randn(f.shape, generator=g, dtype=torch.float64).to(f.device, f.dtype)
        loss = loss + (f * wts).sum()
    params = list(net.parameters())
    grads = torch.autograd.grad(loss, [x.feats, *params])
    return coords, [f.detach() for f in feats], list(grads)


def assert_bitwise_equal(a, b, what: str = "") -> None:
    """Every tensor of two ``run`` results is bitwise equal (same dtype, shape, bits)."""
    for name, xs, ys in zip(("coords", "feats", "grads"), a, b, strict=True):
        assert len(xs) == len(ys), f"{what}: {name} count"
        for i, (u, v) in enumerate(zip(xs, ys, strict=True)):
            assert u.dtype == v.dtype and u.shape == v.shape, f"{what}: {name}[{i}] shape/dtype"
            assert torch.equal(u, v), f"{what}: {name}[{i}] differs"
