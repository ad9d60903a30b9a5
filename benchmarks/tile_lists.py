"""Layers and a network with and without the tile lists kept beside each neighbour table
(``torch_lattice.ops.conv.keep_tile_lists``; docs/kernel-maps.md), interleaved in one
process (medians, same threads).

Layer rows: one ``SubmConv3d`` per width on a scene, its kernel map cached (every call
after the first reuses it and, with keeping on, its tables' lists), forward without
autograd and forward + backward (both gradients, an upstream gradient of ones).
Network rows: ``SparseResUNet42`` at a width multiplier on a new scan each call (every
map built inside the call, so lists are built on a table's second call and pay for
themselves only where a table is run over more), eval forward and a training step.
Outputs (and gradients) with and without the lists are checked bitwise equal before
anything is timed::

    .venv/bin/python -m benchmarks.tile_lists [--scenes lidar surface] [--channels 16 32]
        [--widths 1 0.5] [--dtype float32] [--repeats 9] [--reuse-cpu-memory]
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial

import torch

import torch_lattice as tl
from benchmarks.cpu_dataflows import STEPS, layer_arguments, layer_outputs, started, subm_layers
from benchmarks.scenes import make_scene, tiny_scene
from benchmarks.timing import time_side_by_side
from torch_lattice.backbones import SparseResUNet42
from torch_lattice.nn import functional as F
from torch_lattice.ops.conv import keep_tile_lists

SIDES = ("without", "with")


def _network(net: torch.nn.Module, feats: torch.Tensor, coords: torch.Tensor,
             train: bool) -> list[torch.Tensor]:  # fmt: skip
    """One call on a new scan (its maps built inside): eval output, or a training step's
    loss and first-layer weight gradient."""
    net.zero_grad(set_to_none=True)
    if not train:
        with torch.no_grad():
            return [net(tl.SparseTensor(feats, coords)).feats]
    loss = net(tl.SparseTensor(feats, coords)).feats.float().square().mean()
    loss.backward()
    first = next(p for p in net.parameters() if p.grad is not None)
    return [loss.detach(), first.grad.clone()]


def _sided(fn: Callable[[], list[torch.Tensor]], keep: bool) -> list[torch.Tensor]:
    previous = keep_tile_lists(keep)
    try:
        return fn()
    finally:
        keep_tile_lists(previous)


def _row(label: str, fn: Callable[[], list[torch.Tensor]], repeats: int) -> str:
    """Checks both sides agree bitwise (each side twice, so the lists exist), then times
    them interleaved; the table row."""
    outs = {side: [_sided(fn, side == "with") for _ in range(2)][-1] for side in SIDES}
    for a, b in zip(outs["with"], outs["without"], strict=True):
        if not torch.equal(a, b):
            raise SystemExit(f"{label}: differs with and without tile lists")
    calls = {side: partial(_sided, fn, side == "with") for side in SIDES}
    med = {k: t.median_ms for k, t in time_side_by_side(calls, repeats, 1, memory=False).items()}
    return (f"| {label} | {med['without']:.2f} | {med['with']:.2f} | "
            f"{med['without'] / med['with']:.2f}x | bitwise |")  # fmt: skip


def run(scenes: list[str], channels: list[int], widths: list[float], repeats: int,
        dtype: torch.dtype = torch.float32) -> None:  # fmt: skip
    print("| case | without lists ms | with lists ms | speed-up | outputs |")
    print("|---|---|---|---|---|")
    for name in scenes:
        scene = tiny_scene() if name == "tiny" else make_scene(name)
        for c, conv, x in subm_layers(scene, channels):
            conv, x = conv.to(dtype), x.replace(x.feats.to(dtype))
            for step, backward in STEPS:
                fn = partial(layer_outputs, conv, x, F.Dataflow.ImplicitGEMM, backward)
                print(_row(f"{name} SubmConv3d C = {c} {step}", fn, repeats), flush=True)
        feats = torch.randn(scene.voxels, 4, generator=torch.Generator().manual_seed(0))
        feats = feats.to(dtype)
        for width in widths:
            torch.manual_seed(0)
            net = SparseResUNet42(4, 20, width=width).to(dtype)
            for step, train in (("eval", False), ("train step", True)):
                net.train(train)
                fn = partial(_network, net, feats, scene.coords, train)
                label = f"{name} SparseResUNet42 width {width:g} {step}"
                print(_row(label, fn, repeats), flush=True)


def main() -> int:
    p = layer_arguments(__doc__, ["lidar", "surface"], [16, 32], 9)
    p.add_argument("--widths", nargs="*", type=float, default=[1.0, 0.5],
                   help="SparseResUNet42 width multipliers (none: layers only)")  # fmt: skip
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    a = started(p)
    run(a.scenes, a.channels, a.widths, a.repeats, getattr(torch, a.dtype))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
