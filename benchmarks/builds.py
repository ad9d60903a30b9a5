"""Two builds of the C core side by side: the kernels of another ``_C`` against this one's.

A kernel change is measured by loading the other build (say, ``main`` before the change,
built in a worktree) into the same process and calling the two alternately on the same
operands, so both see the same machine state; on a shared machine, single timings move by
10-30% between runs, ratios from interleaved calls much less. Outputs of the two builds are
compared before anything is timed (a change that is meant to keep results bitwise reports
``bitwise``). Four groups:

* ``layers``: ``conv_forward`` and ``conv_weight_grad`` (implicit GEMM; or with
  ``--kernels`` fetch-on-demand's ``pairs_forward`` and ``pairs_weight_grad``, or
  gather-scatter's with ``--pair-dataflow gather_scatter``, which take float32 only, as the
  op computes half types in float32 there; fp32, or ``--dtype bfloat16`` / ``float16``;
  ``--listed``: over the table's tile lists, as the op runs from a table's second call
  on, each kernel where the op reads them) on the 3x3x3 submanifold map of each scene
  (``--maps``: also a k2 s2 Conv3d's map, its inverse transpose's and a k3 s2 p1
  Conv3d's), per width;
* ``kmap``: what a new scan costs before any convolution, per scene: the tensor's
  duplicate check (``tl.SparseTensor``), the 3x3x3 submanifold kernel map (``nbr`` +
  ``rev``), and the generated support of a k2 s2 and a k3 s2 p1 Conv3d and the map onto
  it;
* ``unet``: SparseResUNet42 eval forward and training step on a new tensor (so its maps
  are built inside), every sparse convolution kernel (forward, input and weight
  gradient), kernel map, generated support, duplicate check and batch-norm pass taken
  from one build or the other (``--dtype``: the network's features and weights; the
  loss in float32; ``--width``: its width multiplier);
* ``norm`` (only when named): the four passes of a training ``BatchNormReLU`` (statistics,
  normalize + ReLU, the backward's reduction and its input gradient) on each scene's row
  count, per width (``--channels``) and ``--dtype``.

Usage (from the repository root)::

    git worktree add /tmp/base <commit> && (cd /tmp/base && \\
        TORCH_LATTICE_CUDA=0 ../path/to/.venv/bin/python setup.py -q build_ext --inplace)
    .venv/bin/python -m benchmarks.builds --base /tmp/base/torch_lattice/_C.abi3.so
"""

from __future__ import annotations

import argparse
import importlib.util
from collections.abc import Callable, Collection
from functools import partial
from types import ModuleType
from typing import Any

import torch

import torch_lattice as tl
from benchmarks.scenes import Scene, make_scene, scene_names, tiny_scene
from benchmarks.timing import time_side_by_side
from benchmarks.workloads import DOWN2, DOWN3, SUBM3, support_args
from torch_lattice.nn.functional.relation import kernel_map
from torch_lattice.ops._runtime import _C, DTYPE_CODES, ptr
from torch_lattice.ops.conv import (
    FETCH_ON_DEMAND,
    GATHER_SCATTER,
    TileLists,
    blocks_are_tiles,
    build_tile_lists,
)
from torch_lattice.ops.kmap import kernel_pairs

MAPS = ("subm3", "k2s2", "k2s2_inverse", "k3s2p1", "subm3_l2", "subm3_l3", "subm3_l4")
CONV_KERNELS = ("conv_forward", "conv_weight_grad")
# Fetch-on-demand over the map's pair lists (kernel_pairs), named as in _C.
PAIR_KERNELS = ("pairs_forward", "pairs_weight_grad")
SIDES = ("base", "this")


def load_build(path: str) -> ModuleType:
    """The ``_C`` extension at ``path``, loaded beside the installed one."""
    spec = importlib.util.spec_from_file_location("torch_lattice_base._C", path)
    if spec is None or spec.loader is None:
        raise SystemExit(f"--base {path}: not a loadable extension module")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def interleaved(calls: dict[str, Callable[[], Any]], repeats: int) -> dict[str, float]:
    """Median seconds of each call, timed interleaved after a warm-up
    (:func:`benchmarks.timing.time_side_by_side`)."""
    timings = time_side_by_side(calls, repeats, warmup=1, memory=False)
    return {name: t.median_ms / 1e3 for name, t in timings.items()}


def _scene(name: str) -> Scene:
    return tiny_scene() if name == "tiny" else make_scene(name)


def _agreement(a: torch.Tensor, b: torch.Tensor) -> str:
    """``bitwise``, or the largest relative difference if within the dtype's tolerance
    (else the run stops): half-precision outputs are rounded once from float sums, so
    builds that add the same products in another order may land one unit of the last
    place apart."""
    rtol = 1e-2 if b.dtype in (torch.bfloat16, torch.float16) else 1e-5
    if torch.equal(a, b):
        return "bitwise"
    err = float((a.double() - b.double()).abs().max() / b.double().abs().max().clamp(min=1e-30))
    if err > rtol:
        raise SystemExit(f"the two builds disagree: max relative difference {err:.2e}")
    return f"rel {err:.1e}"


def _layer_case(
    base: ModuleType, kernel: str, nbr: torch.Tensor, n_in: int, c: int, repeats: int,
    dtype: torch.dtype = torch.float32, pair_mode: int = FETCH_ON_DEMAND,
    listed: bool = False,
) -> tuple[dict[str, float], str]:  # fmt: skip
    """One kernel of both builds on one map and width, in ``dtype`` (a pair kernel in
    ``pair_mode``; an implicit GEMM kernel over the table's tile lists where ``listed``):
    median seconds, and agreement."""
    n, k, threads = nbr.shape[0], nbr.shape[1], torch.get_num_threads()
    g = torch.Generator().manual_seed(c)
    x = torch.randn(n_in, c, generator=g).to(dtype)
    fwd = kernel in ("conv_forward", "pairs_forward")
    b = torch.randn(k, c, c, generator=g) if fwd else torch.randn(n, c)
    b = b.to(dtype)
    shape = (n, c) if fwd else (k, c, c)
    outs = {side: torch.empty(shape, dtype=dtype) for side in ("base", "this")}
    modules = {"base": base, "this": _C}
    code = DTYPE_CODES[dtype]
    pairs = kernel_pairs(nbr) if kernel in PAIR_KERNELS else None
    # each build's own lists: the two may tile the rows differently (conv_list_rows)
    lists = {side: _lists(mod, kernel, nbr, (code, n_in, n, k, c, c), threads)
             if listed and not pairs else None for side, mod in modules.items()}

    def call(side: str) -> None:
        fn = getattr(modules[side], kernel)
        own = lists[side]
        if own is not None:
            getattr(modules[side], kernel + "_listed")(
                code, n_in, n, k, c, c, ptr(x), ptr(b), ptr(nbr), *own.args,
                ptr(outs[side]), threads)  # fmt: skip
        elif pairs is None:
            fn(code, n_in, n, k, c, c, ptr(x), ptr(b), ptr(nbr), ptr(outs[side]), threads)
        else:
            fn(pair_mode, code, n_in, n, k, c, c, ptr(x), ptr(b), *map(ptr, pairs),
               ptr(outs[side]), threads)  # fmt: skip

    call("base")
    call("this")
    agree = _agreement(outs["this"], outs["base"])
    return interleaved({side: partial(call, side) for side in modules}, repeats), agree


def _lists(module: ModuleType, kernel: str, nbr: torch.Tensor, sizes: tuple[int, ...],
           threads: int) -> TileLists | None:
    """The tile lists ``kernel`` of the build ``module`` runs over once a forward has kept
    them for ``nbr`` (from the table's second call): the forward's own
    (``conv_list_rows``), which the weight gradient reads where its blocks are whole tiles
    (``blocks_are_tiles``, as ``kept_tile_lists``); None where the op keeps or reads none
    at this width and dtype, so the kernel lists the table, as the op does there."""
    rows = module.conv_list_rows(*sizes, threads)
    if kernel == "conv_weight_grad":
        reads = blocks_are_tiles(module.conv_weight_grad_list_rows(*sizes, threads), rows)
    else:
        reads = rows > 0
    return build_tile_lists(nbr, rows) if reads else None


def _maps(scene: Scene, names: Collection[str] = ()) -> dict[str, tuple[torch.Tensor, int]]:
    """The scene's layer maps, each with its input row count: the 3x3x3 submanifold map
    (and its reverse, the map its input gradient runs over), a k2 s2 Conv3d's (onto its
    generated coarse support), its inverse transpose's, a k3 s2 p1 Conv3d's (onto its
    own generated support), and the 3x3x3 submanifold maps of the coarse levels a U-Net
    reaches after 2, 3 and 4 k2 s2 Conv3d's (``subm3_l2`` .. ``subm3_l4``: a few thousand
    rows down to a few hundred, where C = 128-256 weights outweigh the rows; built only
    where ``names`` asks for them)."""
    x = tl.SparseTensor(torch.zeros(scene.voxels, 1), scene.coords)
    subm = kernel_map(x.support, x.support, SUBM3)
    down = tl.nn.Conv3d(1, 1, 2, stride=2, bias=False)
    with torch.no_grad():
        coarse = down(x)
    dmap = kernel_map(x.support, coarse.support, DOWN2)
    down3 = tl.nn.Conv3d(1, 1, 3, stride=2, padding=1, bias=False)
    with torch.no_grad():
        coarse3 = down3(x)
    n = scene.voxels
    maps = {
        "subm3": (subm.nbr, n),
        "subm3_reverse": (subm.rev, n),
        "k2s2": (dmap.nbr, n),
        "k2s2_inverse": (dmap.rev, coarse.coords.shape[0]),
        "k3s2p1": (kernel_map(x.support, coarse3.support, DOWN3).nbr, n),
    }
    for depth in (2, 3, 4):  # the voxels k2 s2 Conv3d's generate, depth of them in turn
        if f"subm3_l{depth}" not in names:
            continue
        coords = scene.coords.clone()
        coords[:, 1:] = torch.div(coords[:, 1:], 2**depth, rounding_mode="floor")
        coords = coords.unique(dim=0)
        level = tl.SparseTensor(torch.zeros(coords.shape[0], 1), coords).support
        maps[f"subm3_l{depth}"] = (kernel_map(level, level, SUBM3).nbr, coords.shape[0])
    return maps


def layers(
    base: ModuleType,
    scenes: list[str],
    channels: list[int],
    repeats: int,
    maps: list[str],
    kernels: tuple[str, ...] = CONV_KERNELS,
    dtype: torch.dtype = torch.float32,
    pair_mode: int = FETCH_ON_DEMAND,
    listed: bool = False,
) -> None:
    print("| scene | map | C | kernel | base GFLOP/s | this GFLOP/s | this / base | outputs |")
    print("|---|---|---|---|---|---|---|---|")
    for name in scenes:
        scene = _scene(name)
        every = _maps(scene, maps)
        for map_name in maps:
            nbr, n_in = every[map_name]
            pairs = int((nbr >= 0).sum())
            for c in channels:
                for kernel in kernels:
                    med, agree = _layer_case(base, kernel, nbr, n_in, c, repeats, dtype,
                                             pair_mode, listed)
                    gf = {k: 2 * pairs * c * c / v / 1e9 for k, v in med.items()}
                    print(
                        f"| {scene.name} | {map_name} | {c} | {kernel} | {gf['base']:.1f} | "
                        f"{gf['this']:.1f} | {med['base'] / med['this']:.2f}x | {agree} |",
                        flush=True,
                    )


class Swap:
    """Points the named ``_C`` entry points at one build or the other, so the library's
    Python layer runs unchanged over either build's kernels."""

    def __init__(self, base: ModuleType, names: tuple[str, ...]) -> None:
        self.base, self.names = base, names
        self.current = {k: getattr(_C, k) for k in names}

    def use(self, side: str) -> None:
        for k in self.names:
            setattr(_C, k, getattr(self.base, k) if side == "base" else self.current[k])

    def run(self, side: str, fn: Callable[[], Any]) -> Any:
        self.use(side)
        try:
            return fn()
        finally:
            self.use("this")


def _kmap(coords: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The 3x3x3 submanifold kernel map (``nbr``, ``rev``) of ``coords`` with itself."""
    one = [1, 1, 1]
    return torch.ops.lattice.kernel_map(coords, coords, [3, 3, 3], one, one, one)


MAP_ENTRY_POINTS = ("kmap_build", "kmap_reverse", "find_duplicate", "generate_bound", "generate")


def _map_steps(coords: torch.Tensor) -> dict[str, Callable[[], Any]]:
    """What a new scan costs before its first convolution, step by step."""
    feats = torch.zeros(coords.shape[0], 1)
    steps: dict[str, Callable[[], Any]] = {
        "duplicate check": lambda: tl.SparseTensor(feats, coords).coords,
        "subm3 nbr + rev": partial(_kmap, coords),
    }
    for name, g in (("k2 s2", DOWN2), ("k3 s2 p1", DOWN3)):
        args = support_args(coords, g)
        generate = partial(torch.ops.lattice.generate_support, coords, *args)
        steps[f"{name} support"] = generate
        steps[f"{name} nbr + rev"] = partial(
            torch.ops.lattice.kernel_map, coords, generate(), *args[:4]
        )
    return steps


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, torch.Tensor):
        return torch.equal(a, b)
    return all(map(torch.equal, a, b))


def _equal_then_timed(
    swap: Swap, step: Callable[[], Any], what: str, repeats: int
) -> dict[str, float]:
    """Both builds' median seconds for ``step``, after checking that they return the same
    outputs bit for bit (else the run stops, naming ``what``)."""
    got = {side: swap.run(side, step) for side in SIDES}
    if not _same(got["base"], got["this"]):
        raise SystemExit(f"{what}: the two builds' outputs differ")
    del got  # not held while timing: tens of MB that would move the allocator
    return interleaved({side: partial(swap.run, side, step) for side in SIDES}, repeats)


def kmaps(base: ModuleType, scenes: list[str], repeats: int) -> None:
    swap = Swap(base, MAP_ENTRY_POINTS)
    print("| scene | voxels | step | base ms | this ms | this / base | outputs |")
    print("|---|---|---|---|---|---|---|")
    for name in scenes:
        coords = _scene(name).coords
        for label, step in _map_steps(coords).items():
            med = _equal_then_timed(swap, step, f"{name}, {label}", repeats)
            print(
                f"| {name} | {coords.shape[0]} | {label} | {med['base'] * 1e3:.1f} | "
                f"{med['this'] * 1e3:.1f} | {med['base'] / med['this']:.2f}x | equal |",
                flush=True,
            )


NORM_ENTRY_POINTS = (
    "batch_norm_stats", "batch_norm_apply", "batch_norm_backward_reduce",
    "batch_norm_backward_apply",
)  # fmt: skip


def _norm_passes(n: int, c: int, dtype: torch.dtype) -> dict[str, Callable[[], Any]]:
    """The four passes of a training ``BatchNormReLU`` over ``n`` rows of ``c`` channels
    of ``dtype`` (through the library's ops, so either build's entry points serve them)."""
    g = torch.Generator().manual_seed(c)
    x = torch.randn(n, c, generator=g).to(dtype)
    dy = torch.randn(n, c, generator=g).to(dtype)
    scale, shift = torch.rand(c, generator=g) + 0.5, torch.randn(c, generator=g)
    a, b, k = (torch.randn(c, generator=g) for _ in range(3))
    mean = x.double().mean(0)
    ops = torch.ops.lattice
    return {
        "stats": partial(ops.batch_norm_stats, x),
        "apply + ReLU": partial(ops.batch_norm_apply, x, scale, shift, True),
        "backward reduce": partial(ops.batch_norm_backward_reduce, dy, x, scale, shift, mean, True),
        "backward apply": partial(
            ops.batch_norm_backward_apply, dy, x, scale, shift, a, b, k, True
        ),
    }


def norms(
    base: ModuleType, scenes: list[str], channels: list[int], repeats: int, dtype: torch.dtype
) -> None:
    """Batch norm's passes of both builds on each scene's row count, outputs compared
    bit for bit first."""
    swap = Swap(base, NORM_ENTRY_POINTS)
    print("| scene | rows | C | pass | base ms | this ms | this / base | outputs |")
    print("|---|---|---|---|---|---|---|---|")
    for name in scenes:
        n = _scene(name).voxels
        for c in channels:
            for label, step in _norm_passes(n, c, dtype).items():
                med = _equal_then_timed(swap, step, f"{name}, C = {c}, {label}", repeats)
                print(
                    f"| {name} | {n} | {c} | {label} | {med['base'] * 1e3:.2f} | "
                    f"{med['this'] * 1e3:.2f} | {med['base'] / med['this']:.2f}x | bitwise |",
                    flush=True,
                )


def _unet_step(
    net: torch.nn.Module, feats: torch.Tensor, coords: torch.Tensor, train: bool
) -> torch.Tensor:
    """Eval forward, or a training step (forward + backward of a float32 squared-mean
    loss)."""
    net.train(train)
    net.zero_grad()
    with torch.set_grad_enabled(train):
        y = net(tl.SparseTensor(feats, coords.clone())).feats
        if train:
            y.float().square().mean().backward()
    return y.detach()


def unet(
    base: ModuleType, scenes: list[str], repeats: int, dtype: torch.dtype = torch.float32,
    width: float = 1.0,
) -> None:  # fmt: skip
    swap = Swap(base, CONV_KERNELS + MAP_ENTRY_POINTS + NORM_ENTRY_POINTS)
    print("| scene | step | base s | this s | this / base | outputs |")
    print("|---|---|---|---|---|---|")
    for name in scenes:
        scene = _scene(name)
        torch.manual_seed(0)
        net = tl.backbones.SparseResUNet42(4, 20, width=width).to(dtype)
        feats = torch.randn(scene.voxels, 4).to(dtype)
        for label, train in (("eval forward", False), ("forward + backward", True)):
            step = partial(_unet_step, net, feats, scene.coords, train)
            got = {side: swap.run(side, step) for side in SIDES}
            agree = _agreement(got["this"], got["base"])
            med = interleaved({side: partial(swap.run, side, step) for side in SIDES}, repeats)
            print(
                f"| {name} | {label} | {med['base']:.3f} | {med['this']:.3f} | "
                f"{med['base'] / med['this']:.2f}x | {agree} |",
                flush=True,
            )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--base", required=True, help="path of the other build's _C.abi3.so")
    parser.add_argument(
        "--groups",
        nargs="+",
        default=["layers", "kmap", "unet"],
        choices=["layers", "kmap", "unet", "norm"],
    )
    parser.add_argument(
        "--scenes", nargs="+", default=["surface", "lidar"], choices=[*scene_names(), "tiny"]
    )
    parser.add_argument("--channels", type=int, nargs="+", default=[16, 32, 64, 128, 256])
    parser.add_argument("--maps", nargs="+", default=["subm3"], choices=MAPS)
    parser.add_argument(
        "--kernels",
        nargs="+",
        default=list(CONV_KERNELS),
        choices=CONV_KERNELS + PAIR_KERNELS,
        help="layers group: which kernels to time",
    )
    parser.add_argument(
        "--pair-dataflow", default="fetch_on_demand",
        choices=["fetch_on_demand", "gather_scatter"],
        help="layers group: the dataflow pairs_forward and pairs_weight_grad run",
    )  # fmt: skip
    parser.add_argument(
        "--dtype", default="float32", choices=["float32", "bfloat16", "float16"],
        help="layers, unet and norm groups: the features' (and weights') dtype",
    )  # fmt: skip
    parser.add_argument(
        "--width", type=float, default=1.0,
        help="unet group: SparseResUNet42's width multiplier (0.75: hidden widths 24-192)",
    )  # fmt: skip
    parser.add_argument(
        "--listed", action="store_true",
        help="layers group: conv_forward and conv_weight_grad over the table's tile lists "
        "(what the op runs from a table's second call on) instead of listing the table",
    )  # fmt: skip
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument(
        "--reuse-cpu-memory", action="store_true",
        help="tl.reuse_cpu_memory() first: outputs of 32 MiB and more reuse faulted-in "
        "pages instead of timing the kernel's page faults",
    )  # fmt: skip
    args = parser.parse_args()
    pair_kernels = set(args.kernels) & set(PAIR_KERNELS)
    if "layers" in args.groups and args.dtype != "float32" and pair_kernels:
        parser.error(f"--kernels {' '.join(PAIR_KERNELS)} run in float32 only: on the CPU the "
                     f"pair dataflows compute {args.dtype} features in float32 (ops.pair_conv)")
    base = load_build(args.base)
    reuse = args.reuse_cpu_memory and tl.reuse_cpu_memory()
    print(
        f"{torch.get_num_threads()} threads, cpu_isa {_C.cpu_isa()}, {args.dtype}; medians of "
        f"{args.repeats} interleaved calls; reuse_cpu_memory {reuse}; 'this' is "
        f"{_C.__file__}\n"
    )
    if "layers" in args.groups:
        layers(
            base, args.scenes, args.channels, args.repeats, args.maps, tuple(args.kernels),
            getattr(torch, args.dtype),
            GATHER_SCATTER if args.pair_dataflow == "gather_scatter" else FETCH_ON_DEMAND,
            args.listed,
        )  # fmt: skip
        print()
    if "kmap" in args.groups:
        kmaps(base, args.scenes, args.repeats)
        print()
    if "unet" in args.groups:
        unet(base, args.scenes, max(3, args.repeats // 2), getattr(torch, args.dtype),
             args.width)
        print()
    if "norm" in args.groups:
        norms(base, args.scenes, args.channels, args.repeats, getattr(torch, args.dtype))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
