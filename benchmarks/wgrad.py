"""The weight gradient beside the forward on one cached map (issue 24, item 4).

``dW[n] = X[nbr[:, n]]^T dY`` is the forward's GEMM transposed, so the goal is the same
GFLOP/s as the forward. For each width this checks ``lattice::sparse_conv_weight_grad``
against the plain-PyTorch baselines (their own map, autograd of their gather-mm), then
times the two lattice ops interleaved (medians, same process, same thread count) and
prints GFLOP/s, the ratio and the fraction of the fp32 peak measured in the same run::

    .venv/bin/python -m benchmarks.wgrad [--scene surface] [--channels 32 64 128 256]
"""

from __future__ import annotations

import argparse

import torch

import torch_lattice as tl
from benchmarks import baselines as bl
from benchmarks.peak import measure_peak
from benchmarks.scenes import make_scene, scene_names, tiny_scene
from benchmarks.timing import time_side_by_side
from torch_lattice.geometry import ConvGeometry
from torch_lattice.nn.functional.relation import kernel_map
from torch_lattice.ops.kmap import KernelMap

SUBM3 = ConvGeometry.submanifold((3, 3, 3), (1, 1, 1))


def reference_weight_grad(
    coords: torch.Tensor, x: torch.Tensor, dy: torch.Tensor, w: torch.Tensor
) -> torch.Tensor:
    """``dW`` in float64 through the plain-PyTorch baselines: their own map of ``coords``
    and autograd of their gather-mm-scatter convolution."""
    pairs = bl.pairs_from_nbr(bl.torch_kernel_map(coords, coords, SUBM3))
    w64 = w.double().requires_grad_(True)
    y = bl.gather_scatter_conv(x.double(), w64, pairs, coords.shape[0])
    (dw,) = torch.autograd.grad(y, w64, dy.double())
    return dw


def _ops(x: torch.Tensor, dy: torch.Tensor, w: torch.Tensor, kmap: KernelMap) -> dict:
    """The two timed calls: the same map, the same (N x C) operands."""
    return {
        "wgrad": lambda: torch.ops.lattice.sparse_conv_weight_grad(x, dy, kmap.nbr),
        "forward": lambda: torch.ops.lattice.sparse_conv(x, w, kmap.nbr, kmap.rev),
    }


def run(scene_name: str, channels: list[int], repeats: int) -> list[dict[str, float]]:
    """One row per width: GFLOP/s of the weight gradient and the forward, and their ratio."""
    scene = tiny_scene() if scene_name == "tiny" else make_scene(scene_name)
    x0 = tl.SparseTensor(torch.zeros(scene.voxels, 1), scene.coords)
    kmap = kernel_map(x0.support, x0.support, SUBM3)
    pairs = int((kmap.nbr >= 0).sum())
    peak = measure_peak(torch.get_num_threads()).fp32_gflops
    rows = []
    for c in channels:
        g = torch.Generator().manual_seed(c)
        x = torch.randn(scene.voxels, c, generator=g)
        dy = torch.randn(scene.voxels, c, generator=g)
        w = torch.randn(27, c, c, generator=g)
        got = torch.ops.lattice.sparse_conv_weight_grad(x, dy, kmap.nbr)
        want = reference_weight_grad(scene.coords, x, dy, w)
        err = float((got.double() - want).abs().max() / want.abs().max())
        if err > 1e-5:
            raise SystemExit(f"C={c}: weight gradient differs from the reference by {err:.2e}")
        times = time_side_by_side(_ops(x, dy, w, kmap), repeats, warmup=1, memory=False)
        flops = 2 * pairs * c * c
        gw, gf = (flops / times[k].median_ms / 1e6 for k in ("wgrad", "forward"))
        rows.append(
            {
                "channels": c,
                "wgrad": gw,
                "forward": gf,
                "ratio": gw / gf,
                "wgrad_peak": gw / peak if peak else float("nan"),
                "err": err,
            }
        )
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--scene", default="surface", choices=[*scene_names(), "tiny"])
    parser.add_argument("--channels", type=int, nargs="+", default=[32, 64, 128, 256])
    parser.add_argument("--repeats", type=int, default=7)
    args = parser.parse_args()
    print(
        f"scene {args.scene}, {torch.get_num_threads()} threads, cpu_isa "
        f"{tl._C.cpu_isa()}; GFLOP/s (medians of {args.repeats}, interleaved)"
    )
    print("C      wgrad  forward  wgrad/forward  wgrad % of fp32 peak  max rel err")
    for r in run(args.scene, args.channels, args.repeats):
        print(
            f"{r['channels']:<5} {r['wgrad']:7.1f} {r['forward']:8.1f} {r['ratio']:14.2f}"
            f" {100 * r['wgrad_peak']:20.0f}% {r['err']:12.1e}"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
