"""The three dataflows side by side on the CPU (docs/dataflows.md, "What each is for on
the CPU"; issue 24, item 6): one ``SubmConv3d`` per width on a scene's features, its
kernel map built once and cached (every call after the first reuses it, and with it the
pair lists the pair dataflows run over), called under each dataflow in turn, interleaved
(medians, same process, same threads). The forward rows run without autograd; the
forward + backward rows ask for both gradients (features and weights) of ``y`` under an
upstream gradient of ones (contiguous, as a network's is).
Every dataflow's output and gradients are checked against implicit GEMM's before
anything is timed (fetch-on-demand's are bitwise equal: it runs implicit GEMM's
kernels over its pair lists)::

    .venv/bin/python -m benchmarks.cpu_dataflows [--scenes surface lidar]
        [--channels 16 32 64 128] [--repeats 7] [--reuse-cpu-memory]
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Iterator
from functools import partial

import torch

import torch_lattice as tl
from benchmarks.scenes import Scene, make_scene, scene_names, tiny_scene
from benchmarks.timing import time_side_by_side
from torch_lattice.nn import functional as F

DATAFLOWS = (F.Dataflow.ImplicitGEMM, F.Dataflow.FetchOnDemand, F.Dataflow.GatherScatter)
# Each layer's steps: (label, backward).
STEPS = (("forward", False), ("forward + backward", True))


def layer_outputs(conv: torch.nn.Module, x: tl.SparseTensor, flow: F.Dataflow,
          backward: bool) -> list[torch.Tensor]:  # fmt: skip
    """The layer under ``flow``: its output, and with ``backward`` both gradients."""
    with F.conv_config(dataflow=flow):
        if not backward:
            with torch.no_grad():
                return [conv(x).feats]
        feats = x.feats.detach().requires_grad_(True)
        y = conv(x.replace(feats)).feats
        dy = torch.ones_like(y)  # contiguous, as a network's upstream gradient is
        return [y.detach(), *torch.autograd.grad(y, [feats, conv.weight], dy)]


def subm_layers(scene: Scene, channels: list[int]
                ) -> Iterator[tuple[int, torch.nn.Module, tl.SparseTensor]]:  # fmt: skip
    """Each width's ``SubmConv3d(C, C, 3)`` and random features on ``scene`` (seeded by
    the width, so every benchmark that runs them runs the same layers)."""
    for c in channels:
        torch.manual_seed(c)
        x = tl.SparseTensor(torch.randn(scene.voxels, c), scene.coords)
        yield c, tl.nn.SubmConv3d(c, c, 3, bias=False), x


def _checked(got: list[torch.Tensor], want: list[torch.Tensor], flow: F.Dataflow) -> str:
    if all(torch.equal(a, b) for a, b in zip(got, want, strict=True)):
        return "bitwise"
    err = max(float((a - b).abs().max() / b.abs().max().clamp(min=1e-30))
              for a, b in zip(got, want, strict=True))  # fmt: skip
    if err > 1e-5:
        raise SystemExit(f"{flow.value}: differs from implicit GEMM by {err:.2e} (relative)")
    return f"{err:.1e}"


def run(scenes: list[str], channels: list[int], repeats: int) -> None:
    ratios = " | fetch-on-demand / implicit GEMM | gather-scatter / implicit GEMM | outputs |"
    print("| scene | C | step | " + " | ".join(f"{d.value} ms" for d in DATAFLOWS) + ratios)
    print("|---|---|---|" + "---|" * (len(DATAFLOWS) + 3))
    for name in scenes:
        scene = tiny_scene() if name == "tiny" else make_scene(name)
        for c, conv, x in subm_layers(scene, channels):
            for label, backward in STEPS:
                want = layer_outputs(conv, x, F.Dataflow.ImplicitGEMM, backward)
                agree = [_checked(layer_outputs(conv, x, d, backward), want, d)
                         for d in DATAFLOWS[1:]]  # fmt: skip
                calls: dict[str, Callable[[], object]] = {
                    d.value: partial(layer_outputs, conv, x, d, backward) for d in DATAFLOWS
                }
                timed = time_side_by_side(calls, repeats, warmup=1, memory=False)
                med = {k: t.median_ms for k, t in timed.items()}
                ig = med[F.Dataflow.ImplicitGEMM.value]
                print(
                    f"| {name} | {c} | {label} | "
                    + " | ".join(f"{med[d.value]:.2f}" for d in DATAFLOWS)
                    + f" | {ig / med[F.Dataflow.FetchOnDemand.value]:.2f}x speed"
                    + f" | {ig / med[F.Dataflow.GatherScatter.value]:.2f}x speed"
                    + f" | {' / '.join(agree)} |",
                    flush=True,
                )


def main() -> int:
    p = layer_arguments(__doc__, ["surface", "lidar"], [16, 32, 64, 128], 7)
    a = started(p)
    run(a.scenes, a.channels, a.repeats)
    return 0


def layer_arguments(doc: str | None, scenes: list[str], channels: list[int],
                    repeats: int) -> argparse.ArgumentParser:  # fmt: skip
    """The options of a benchmark of SubmConv3d layers (:func:`subm_layers`), with
    these defaults."""
    p = argparse.ArgumentParser(description=(doc or "").split("\n\n")[0])
    p.add_argument("--scenes", nargs="+", default=scenes,
                   choices=[*scene_names(), "tiny"])  # fmt: skip
    p.add_argument("--channels", nargs="+", type=int, default=channels)
    p.add_argument("--repeats", type=int, default=repeats)
    p.add_argument("--reuse-cpu-memory", action="store_true",
                   help="tl.reuse_cpu_memory() first (outputs reuse faulted-in pages)")  # fmt: skip
    return p


def started(p: argparse.ArgumentParser) -> argparse.Namespace:
    """``p``'s arguments, after ``tl.reuse_cpu_memory()`` where asked and the header."""
    a = p.parse_args()
    if a.reuse_cpu_memory:
        tl.reuse_cpu_memory()
    print(f"{torch.get_num_threads()} threads, torch {torch.__version__}\n")
    return a


if __name__ == "__main__":
    raise SystemExit(main())
