"""SparseResUNet42: structure, supports, and learning a toy geometric task."""

from __future__ import annotations

import pytest
import torch

import torch_lattice as tl


def toy_scene(seed: int) -> tuple[tl.SparseTensor, torch.Tensor]:
    """A 32 x 32 floor (label 0) with ten 6-voxel columns on it (label 1).

    Every voxel has the same feature, so only geometry tells the classes apart.
    """
    g = torch.Generator().manual_seed(seed)
    xs, ys = torch.meshgrid(torch.arange(32), torch.arange(32), indexing="ij")
    floor = torch.stack([xs.flatten(), ys.flatten(), torch.zeros(1024, dtype=torch.long)], 1)
    cols = torch.randperm(1024, generator=g)[:10]
    poles = [
        torch.tensor([[int(floor[c, 0]), int(floor[c, 1]), z] for z in range(1, 7)]) for c in cols
    ]
    xyz = torch.cat([floor, *poles])
    labels = torch.cat([torch.zeros(1024, dtype=torch.long), torch.ones(60, dtype=torch.long)])
    coords = torch.cat([torch.zeros(len(xyz), 1, dtype=torch.long), xyz], 1)
    return tl.SparseTensor(torch.ones(len(xyz), 1), coords), labels


def test_output_on_input_support_and_widths():
    x, _ = toy_scene(0)
    perm = torch.randperm(len(x))  # unsorted input rows stay in their order
    x = tl.SparseTensor(x.feats[perm], x.coords[perm])
    net = tl.backbones.SparseResUNet42(1, 7, width=0.25)
    y = net(x)
    assert y.support is x.support and y.feats.shape == (len(x), 7)
    full = tl.backbones.SparseResUNet42(4, 20)
    half = tl.backbones.SparseResUNet42(4, 20, width=0.5)
    n_full = sum(p.numel() for p in full.parameters())
    n_half = sum(p.numel() for p in half.parameters())
    assert 3.5 < n_full / n_half < 4.5  # widths scale every layer
    convs = [
        m
        for m in full.modules()
        if isinstance(m, tl.nn.SubmConv3d | tl.nn.Conv3d | tl.nn.ConvTranspose3d)
    ]
    k3 = [m for m in convs if m.kernel_size != (1, 1, 1)]
    assert len(k3) == 42  # stem 2 + 8 stage convs + 16 blocks x 2
    assert full.head.bias is not None and full.head.out_channels == 20
    assert any(k.endswith("running_var") for k in full.state_dict())


def test_batched_and_flat_inputs():
    # Two scenes in one batch, and a flat scene whose z range is 1.
    a, _ = toy_scene(1)
    flat = a.coords[a.coords[:, 3] == 0].clone()
    flat[:, 0] = 1
    coords = torch.cat([a.coords, flat])
    x = tl.SparseTensor(torch.randn(len(coords), 2), coords)
    y = tl.backbones.SparseResUNet42(2, 3, width=0.125)(x)
    assert y.feats.shape == (len(coords), 3) and torch.isfinite(y.feats).all()


def test_learns_toy_task():
    torch.manual_seed(0)
    scenes = [toy_scene(s) for s in range(2)]
    net = tl.backbones.SparseResUNet42(1, 2, width=0.25)
    opt = torch.optim.Adam(net.parameters(), lr=1e-2)
    losses = []
    for step in range(30):
        x, labels = scenes[step % 2]
        loss = torch.nn.functional.cross_entropy(net(x).feats, labels)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    net.eval()
    x, labels = toy_scene(5)  # unseen layout
    with torch.no_grad():
        pred = net(x).feats.argmax(1)
    pole_recall = (pred[labels == 1] == 1).double().mean()
    floor_recall = (pred[labels == 0] == 0).double().mean()
    assert losses[-1] < 0.3 * losses[0]
    assert pole_recall > 0.9 and floor_recall > 0.9


def test_arguments_checked():
    with pytest.raises(ValueError, match="in_channels"):
        tl.backbones.SparseResUNet42(0, 3)
    with pytest.raises(ValueError, match="width"):
        tl.backbones.SparseResUNet42(3, 3, width=0)
    with pytest.raises(TypeError, match="SparseTensor"):
        tl.backbones.SparseResUNet42(3, 3)(torch.zeros(4, 3))
