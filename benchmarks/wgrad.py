"""The weight gradient beside the forward on one cached map (issue 24, item 4).

``dW[n] = X[nbr[:, n]]^T dY`` is the forward's GEMM transposed, so the goal is the same
GFLOP/s as the forward. For each width this checks ``lattice::sparse_conv_weight_grad``
against a plain-PyTorch gather-mm over the same map, then times the two lattice ops
interleaved (medians, same process, same thread count) and prints GFLOP/s, the ratio and
the fraction of the fp32 peak measured in the same run::

    .venv/bin/python -m benchmarks.wgrad [--scene surface] [--channels 32 64 128 256]
"""

from __future__ import annotations

import argparse

import torch

import torch_lattice as tl
from benchmarks.peak import measure_peak
from benchmarks.scenes import make_scene, scene_names, tiny_scene
from benchmarks.timing import time_side_by_side
from torch_lattice.geometry import ConvGeometry
from torch_lattice.nn.functional.relation import kernel_map
from torch_lattice.ops.kmap import KernelMap

SUBM3 = ConvGeometry.submanifold((3, 3, 3), (1, 1, 1))


def torch_weight_grad(x: torch.Tensor, dy: torch.Tensor, nbr: torch.Tensor) -> torch.Tensor:
    """``dW[n] = sum_o x[nbr[o, n]]^T dy[o]`` over the rows present, in plain PyTorch."""
    out = x.new_zeros((nbr.shape[1], x.shape[1], dy.shape[1]))
    for n in range(nbr.shape[1]):
        o = (nbr[:, n] >= 0).nonzero().squeeze(1)
        out[n] = x.index_select(0, nbr[o, n].long()).t() @ dy.index_select(0, o)
    return out


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
        want = torch_weight_grad(x.double(), dy.double(), kmap.nbr)
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
