"""DistributedDataParallel on 2 CPU processes (gloo) equals one process over the same batch.

Each rank holds one shard (one scene).  DDP averages the ranks' gradients, so the
single-process reference runs every shard through the model separately (BatchNorm
statistics are per shard in both runs) and averages the shard losses.  The network
uses every building block: convolutions of all kinds, BatchNorm, activations,
cat/add, windowed and global pooling.
"""

from __future__ import annotations

import os

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

import torch_lattice as tl

WORLD = 2
STEPS = 3


class Net(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.unet = tl.backbones.SparseResUNet42(2, 3, width=0.125)
        self.pool = tl.nn.MaxPool3d(2)
        self.avg = tl.nn.AvgPool3d(3, stride=2, padding=1)
        self.act = torch.nn.Sequential(tl.nn.GELU(), tl.nn.SiLU(), tl.nn.LeakyReLU(0.1))
        self.glob = tl.nn.GlobalAvgPool()
        self.gmax = tl.nn.GlobalMaxPool()
        self.cls = torch.nn.Linear(18, 2)

    def forward(self, x: tl.SparseTensor) -> tuple[torch.Tensor, torch.Tensor]:
        y = self.unet(x)
        z = self.act(tl.cat([y, y + y]))
        g = torch.cat(
            [self.glob(self.pool(z)), self.gmax(tl.nn.SumPool3d(2)(z)), self.glob(self.avg(z))], 1
        )
        return y.feats, self.cls(g)


def shard(rank: int) -> tuple[tl.SparseTensor, torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(100 + rank)
    points = torch.rand(3000, 3, generator=g, dtype=torch.float64) * torch.tensor([20, 20, 3])
    feats = torch.stack([points[:, 2], torch.ones(3000, dtype=torch.float64)], 1)
    x = tl.voxelize(points, feats, voxel_size=0.5)
    labels = (x.coords[:, 3] > 2).long() + (x.coords[:, 1] > 20).long()
    return x, labels, torch.tensor([rank % 2])


def loss_of(model: torch.nn.Module, x, labels, target) -> torch.Tensor:
    voxel_logits, scene_logits = model(x)
    ce = torch.nn.functional.cross_entropy
    return ce(voxel_logits, labels) + ce(scene_logits, target)


def new_model() -> torch.nn.Module:
    torch.manual_seed(0)
    return Net().double()


def train(model: torch.nn.Module, step_loss) -> list[list[torch.Tensor]]:
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    grads = []
    for _ in range(STEPS):
        opt.zero_grad()
        step_loss().backward()
        grads.append([p.grad.detach().clone() for p in model.parameters()])
        opt.step()
    return grads


def worker(rank: int, init_file: str, out: str) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=WORLD)
    try:
        model = torch.nn.parallel.DistributedDataParallel(new_model())
        data = shard(rank)
        grads = train(model, lambda: loss_of(model, *data))
        if rank == 0:
            params = [p.detach().clone() for p in model.module.parameters()]
            torch.save({"grads": grads, "params": params}, out)
    finally:
        dist.destroy_process_group()


def test_ddp_gradients_equal_single_process(tmp_path):
    out = str(tmp_path / "ddp.pt")
    mp.spawn(worker, args=(str(tmp_path / "init"), out), nprocs=WORLD, join=True)
    assert os.path.exists(out)
    ddp = torch.load(out, weights_only=True)

    model = new_model()
    shards = [shard(r) for r in range(WORLD)]
    grads = train(model, lambda: sum(loss_of(model, *s) for s in shards) / WORLD)
    assert len(ddp["grads"]) == STEPS
    for step in range(STEPS):
        for a, b in zip(ddp["grads"][step], grads[step], strict=True):
            torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-12)
    for a, b in zip(ddp["params"], model.parameters(), strict=True):
        torch.testing.assert_close(a, b.detach(), rtol=1e-9, atol=1e-12)
    assert any(g.abs().sum() > 0 for g in grads[-1])
