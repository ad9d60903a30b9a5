"""Batch norm + ReLU (issue 24, item 4): the library's C passes beside torch's own
``BatchNorm1d`` + ``relu``, on one layer and inside a SparseResUNet42 training step.

For each width the layer rows run ``BatchNormReLU`` (training mode) and torch's
``batch_norm`` then ``relu`` on the same ``(N, C)`` features of a scene (N its voxels),
check outputs and gradients against each other first, then time both interleaved
(medians, same process, same threads): forward alone and forward + backward. The op is
memory-bound, so the limit beside it is the copy bandwidth measured in the same run
(``torch`` copying a 256 MB tensor), and the rate column is the bytes the C passes
must move (forward: x read twice, y written; backward: dy and x read twice, dx
written) over the time. The network rows time one SparseResUNet42(C, 20) forward +
backward with every map built, against a twin whose batch norms are torch's
``BatchNorm1d`` followed by a separate ``ReLU`` (the library before this change); the
twin's loss is checked first::

    .venv/bin/python -m benchmarks.batch_norm [--scenes surface lidar]
        [--channels 32 64 128 256] [--dtypes float32 bfloat16] [--repeats 7]
        [--network-repeats 3] [--no-network] [--no-layers] [--reuse-cpu-memory]
"""

from __future__ import annotations

import argparse
import copy
import time
from collections.abc import Callable

import torch

import torch_lattice as tl
from benchmarks.scenes import make_scene, scene_names, tiny_scene
from benchmarks.timing import time_side_by_side
from torch_lattice.backbones import SparseResUNet42
from torch_lattice.tensor import SparseTensor

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


class TorchBatchNorm(torch.nn.BatchNorm1d):
    """torch's own ``BatchNorm1d`` on a SparseTensor's features (the baseline)."""

    def forward(self, input: SparseTensor) -> SparseTensor:  # type: ignore[override]
        return input.replace(super().forward(input.feats))


def torch_norm_twin(net: torch.nn.Module) -> torch.nn.Module:
    """A copy of ``net`` whose ``BatchNorm`` modules are :class:`TorchBatchNorm` (a
    ``BatchNormReLU`` becomes ``TorchBatchNorm`` then ``ReLU``), same state."""
    twin = copy.deepcopy(net)
    for parent in list(twin.modules()):
        for name, child in list(parent.named_children()):
            if isinstance(child, tl.nn.BatchNorm):
                base = TorchBatchNorm(
                    child.num_features, child.eps, child.momentum, child.affine,
                    child.track_running_stats,
                )  # fmt: skip
                base.load_state_dict(child.state_dict())
                base.to(next(iter(child.state_dict().values())).dtype)
                swap: torch.nn.Module = base
                if isinstance(child, tl.nn.BatchNormReLU):
                    swap = torch.nn.Sequential(base, tl.nn.ReLU(inplace=True))
                setattr(parent, name, swap)
    return twin


def copy_bandwidth_gbs(mb: int = 256, repeats: int = 5) -> float:
    """GB/s of torch copying an ``mb`` MB float32 tensor into another (read + write),
    best of ``repeats``."""
    src = torch.randn(mb * (1 << 20) // 4)
    dst = torch.empty_like(src)
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        dst.copy_(src)
        best = min(best, time.perf_counter() - t0)
    return 2 * src.numel() * 4 / best / 1e9


def _affine(c: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The layer rows' weight and bias."""
    return torch.linspace(0.5, 1.5, c), torch.linspace(-0.5, 0.5, c)


def _layer_fns(
    x: torch.Tensor, dy: torch.Tensor
) -> tuple[dict[str, Callable[[], object]], dict[str, Callable[[], object]]]:
    c = x.shape[1]
    ours = tl.nn.BatchNormReLU(c).to(x.dtype if x.dtype == torch.float32 else torch.float32)
    base = torch.nn.BatchNorm1d(c).to(ours.weight.dtype)
    with torch.no_grad():
        for m in (ours, base):
            w, b = _affine(c)
            m.weight.copy_(w)
            m.bias.copy_(b)
    xg = x.detach().requires_grad_()
    coords = torch.zeros(x.shape[0], 4, dtype=torch.int32)
    coords[:, 1] = torch.arange(x.shape[0], dtype=torch.int32)
    st = SparseTensor(xg, coords)

    def lattice_fwd() -> object:
        with torch.no_grad():
            return ours(st).feats

    def torch_fwd() -> object:
        with torch.no_grad():
            return torch.relu_(base(xg))

    def lattice_step() -> object:
        return torch.autograd.grad(ours(st).feats, (xg, ours.weight, ours.bias), dy)

    def torch_step() -> object:
        return torch.autograd.grad(torch.relu(base(xg)), (xg, base.weight, base.bias), dy)

    return (
        {"lattice": lattice_fwd, "torch": torch_fwd},
        {"lattice": lattice_step, "torch": torch_step},
    )


def _check_layer(steps: dict[str, Callable[[], object]], dtype: torch.dtype) -> float:
    """Largest relative difference of the two implementations' outputs and gradients."""
    got, want = steps["lattice"](), steps["torch"]()
    tol = {torch.float32: 1e-4, torch.bfloat16: 2e-2, torch.float16: 4e-3}[dtype]
    worst = 0.0
    for g, w in zip(got, want, strict=True):  # type: ignore[call-overload]
        err = float((g.double() - w.double()).abs().max() / w.double().abs().max().clamp_min(1))
        if err > tol:
            raise SystemExit(f"batch norm + ReLU differs from torch's by {err:.2e} (> {tol})")
        worst = max(worst, err)
    return worst


def layer_rows(scene_name: str, channels: list[int], dtypes: list[str], repeats: int) -> list[dict]:
    scene = tiny_scene() if scene_name == "tiny" else make_scene(scene_name)
    n = scene.voxels
    rows = []
    for dname in dtypes:
        dtype = DTYPES[dname]
        for c in channels:
            g = torch.Generator().manual_seed(c)
            x = (torch.randn(n, c, generator=g) * 2 + 1).to(dtype)
            dy = torch.randn(n, c, generator=g).to(dtype)
            # The check leaves out dy where the pre-activation is within rounding of 0:
            # there the two float32 ReLU cuts may differ by a whole dy.
            w, b = _affine(c)
            x64, w64, b64 = x.double(), w.double(), b.double()
            pre = torch.nn.functional.batch_norm(x64, None, None, w64, b64, True)
            err = _check_layer(_layer_fns(x, dy * (pre.abs() > 1e-3).to(dtype))[1], dtype)
            fwd, step = _layer_fns(x, dy)
            tf = time_side_by_side(fwd, repeats, warmup=1, memory=False)
            ts = time_side_by_side(step, repeats, warmup=1, memory=False)
            nbytes = n * c * x.element_size()
            rows.append(
                {
                    "scene": scene.name, "voxels": n, "dtype": dname, "channels": c,
                    "fwd_lattice_ms": tf["lattice"].median_ms,
                    "fwd_torch_ms": tf["torch"].median_ms,
                    "step_lattice_ms": ts["lattice"].median_ms,
                    "step_torch_ms": ts["torch"].median_ms,
                    "fwd_gbs": 3 * nbytes / tf["lattice"].median_ms / 1e6,
                    "step_gbs": 8 * nbytes / ts["lattice"].median_ms / 1e6,
                    "err": err,
                }
            )  # fmt: skip
    return rows


def network_rows(scene_name: str, dtypes: list[str], repeats: int) -> list[dict]:
    scene = tiny_scene() if scene_name == "tiny" else make_scene(scene_name)
    rows = []
    for dname in dtypes:
        dtype = DTYPES[dname]
        torch.manual_seed(0)
        net = SparseResUNet42(4, 20).to(dtype).train()
        twin = torch_norm_twin(net)
        feats = torch.randn(scene.voxels, 4, generator=torch.Generator().manual_seed(1)).to(dtype)

        def step(model: torch.nn.Module, feats: torch.Tensor = feats) -> Callable[[], torch.Tensor]:
            def run() -> torch.Tensor:
                model.zero_grad(set_to_none=True)
                loss = model(SparseTensor(feats, scene.coords)).feats.float().square().mean()
                loss.backward()
                return loss.detach()

            return run

        fns = {"lattice": step(net), "torch": step(twin)}
        a, b = float(fns["lattice"]()), float(fns["torch"]())
        tol = 1e-3 if dtype == torch.float32 else 3e-2
        if abs(a - b) > tol * abs(b):
            raise SystemExit(f"SparseResUNet42 loss {a} differs from the torch-norm twin's {b}")
        t = time_side_by_side(fns, repeats, warmup=1, memory=False)
        rows.append(
            {
                "scene": scene.name, "voxels": scene.voxels, "dtype": dname,
                "lattice_ms": t["lattice"].median_ms, "torch_ms": t["torch"].median_ms,
                "loss_rel_diff": abs(a - b) / abs(b),
            }
        )  # fmt: skip
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--scenes", nargs="+", default=["surface", "lidar"],
                        choices=[*scene_names(), "tiny"])  # fmt: skip
    parser.add_argument("--channels", type=int, nargs="+", default=[32, 64, 128, 256])
    parser.add_argument("--dtypes", nargs="+", default=["float32", "bfloat16"], choices=DTYPES)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--network-repeats", type=int, default=3)
    parser.add_argument("--no-network", action="store_true")
    parser.add_argument("--no-layers", action="store_true")
    parser.add_argument(
        "--reuse-cpu-memory", action="store_true",
        help="tl.reuse_cpu_memory() first: fresh tensors reuse faulted-in pages",
    )  # fmt: skip
    args = parser.parse_args()
    if args.reuse_cpu_memory:
        tl.reuse_cpu_memory()
    bw = copy_bandwidth_gbs()
    print(
        f"{torch.get_num_threads()} threads, cpu_isa {tl._C.cpu_isa()}; copy bandwidth "
        f"{bw:.1f} GB/s (read + write); medians of {args.repeats}, interleaved; "
        f"reuse_cpu_memory {args.reuse_cpu_memory}"
    )
    print("scene     N       dtype     C    fwd ms: lattice  torch  ratio  GB/s (% copy)"
          "   fwd+bwd ms: lattice  torch  ratio  GB/s (% copy)  max rel diff")  # fmt: skip
    for scene in [] if args.no_layers else args.scenes:
        for r in layer_rows(scene, args.channels, args.dtypes, args.repeats):
            print(
                f"{r['scene']:<9} {r['voxels']:<7} {r['dtype']:<9} {r['channels']:<4}"
                f" {r['fwd_lattice_ms']:15.2f} {r['fwd_torch_ms']:6.2f}"
                f" {r['fwd_torch_ms'] / r['fwd_lattice_ms']:5.2f}x"
                f" {r['fwd_gbs']:5.1f} ({100 * r['fwd_gbs'] / bw:3.0f}%)"
                f" {r['step_lattice_ms']:20.2f} {r['step_torch_ms']:6.2f}"
                f" {r['step_torch_ms'] / r['step_lattice_ms']:5.2f}x"
                f" {r['step_gbs']:5.1f} ({100 * r['step_gbs'] / bw:3.0f}%) {r['err']:13.1e}"
            )
    if args.no_network:
        return 0
    print(f"\nSparseResUNet42(4, 20) training step (medians of {args.network_repeats})")
    print("scene     N       dtype     lattice ms  torch-norm twin ms  ratio  loss rel diff")
    for scene in args.scenes:
        for r in network_rows(scene, args.dtypes, args.network_repeats):
            print(
                f"{r['scene']:<9} {r['voxels']:<7} {r['dtype']:<9} {r['lattice_ms']:10.0f}"
                f" {r['torch_ms']:19.0f} {r['torch_ms'] / r['lattice_ms']:6.2f}x"
                f" {r['loss_rel_diff']:14.1e}"
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
