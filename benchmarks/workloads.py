"""Named workloads: what is timed, against which baselines, with how many FLOPs.

Every workload function takes a :class:`~benchmarks.scenes.Scene`, a channel count and
the :class:`Options`, and returns result rows (plain dicts, one per implementation).
The library and the baselines it competes with (plain PyTorch, spconv) are timed
interleaved; the reference points (``REFERENCES``: dense conv3d, matmul proxies) after
them, interleaved among themselves. Convolution workloads time a layer in steady state:
the library's kernel map is cached on the input tensor after the warm-up call, and the
baselines get their index pairs precomputed (from
:func:`~benchmarks.baselines.torch_kernel_map`). Map construction is timed on its own by
``kmap_subm3``. The network workloads build every map on each call, as a new scan would.

Before anything is timed, every baseline's output is compared with the library's
(:mod:`benchmarks.checks`); one that disagrees is reported as ``disagrees: max |diff| = ...``
and not timed. The matmul proxies compute other numbers by design and are not compared.
spconv runs at ``Options.spconv_threads`` torch threads (1: the only count at which its CPU
build is right), restored after each call; each row records its thread count.

Workloads whose library module is missing (looked up by name) report ``not available``
instead of failing.
"""

from __future__ import annotations

import operator
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

import torch_lattice as tl
from benchmarks import baselines as bl
from benchmarks import checks as ck
from benchmarks.resunet_step import resunet_step
from benchmarks.scenes import Scene
from benchmarks.timing import Timing, time_side_by_side
from torch_lattice.geometry import ConvGeometry
from torch_lattice.ops.kmap import kernel_map

__all__ = ["WORKLOADS", "Options", "Workload", "lookup"]

LATTICE = "torch_lattice"
TORCH = "torch_gather_scatter"
TORCH_KMAP = "torch_sort_searchsorted"
DENSE = "dense_conv3d"
SPCONV = "spconv"
MM = "mm_same_shape"
MM_SQUARE = "mm_square"
LATTICE_FP32 = "torch_lattice_fp32"

SUBM3 = ConvGeometry.submanifold((3, 3, 3), (1, 1, 1))
DOWN2 = ConvGeometry.create(2, 2)
DOWN3 = ConvGeometry.create(3, 2, 1)

Row = dict[str, Any]


@dataclass
class Options:
    """Run settings shared by every workload.

    Attributes:
        repeats: Timed repetitions per implementation.
        warmup: Untimed runs per implementation first.
        memory: Measure peak resident-set growth.
        spconv: Time spconv where it imports.
        dense: Time the dense conv3d baseline where the grid fits.
        spconv_threads: torch threads while spconv runs (restored after each call).
    """

    repeats: int = 5
    warmup: int = 1
    memory: bool = True
    spconv: bool = True
    dense: bool = True
    spconv_threads: int = bl.SPCONV_THREADS
    _pairs: dict[tuple[str, ConvGeometry], list] = field(default_factory=dict)

    def pairs(self, scene: Scene, out_coords: torch.Tensor, geometry: ConvGeometry) -> list:
        """Baseline index pairs for ``scene -> out_coords`` (built once with torch ops)."""
        key = (scene.name, geometry)
        if key not in self._pairs:
            nbr = bl.torch_kernel_map(scene.coords, out_coords, geometry)
            self._pairs[key] = bl.pairs_from_nbr(nbr)
        return self._pairs[key]


@dataclass(frozen=True)
class Workload:
    """A named benchmark: ``run(scene, channels, options) -> rows``."""

    name: str
    description: str
    run: Callable[[Scene, int, Options], list[Row]]


def lookup(path: str) -> Any | None:
    """``torch_lattice`` attribute at a dotted ``path`` (e.g. ``nn.ConvTranspose3d``)."""
    try:
        return operator.attrgetter(path)(tl)
    except AttributeError:
        return None


def _row(
    workload: str, scene: Scene, channels: int, impl: str, flops: int, t: Timing, threads: int
) -> Row:
    med = t.median_ms
    return {
        "workload": workload,
        "scene": scene.name,
        "voxels": scene.voxels,
        "batch": scene.batch,
        "channels": channels,
        "impl": impl,
        "status": "ok",
        "threads": threads,
        "median_ms": round(med, 4),
        "min_ms": round(t.min_ms, 4),
        "times_ms": [round(v, 4) for v in t.times_ms],
        "gflops": round(flops / med / 1e6, 3) if flops and med > 0 else None,
        "peak_mb": None if t.peak_mb is None else round(t.peak_mb, 2),
        "ns_per_voxel": round(med * 1e6 / max(1, scene.voxels), 3),
    }


def _missing(workload: str, scene: Scene, channels: int, impl: str, why: str) -> Row:
    return {
        "workload": workload,
        "scene": scene.name,
        "voxels": scene.voxels,
        "batch": scene.batch,
        "channels": channels,
        "impl": impl,
        "status": why,
    }


# Reference points rather than contenders: the dense conv3d and the matmul proxies.
# They are timed after the contenders, interleaved among themselves: a dense grid or a
# (pairs x C) product allocates up to gigabytes per run, and between the contenders'
# runs that would hand each next run freshly mapped memory to fault in, a cost no
# steady-state layer pays.
REFERENCES = (DENSE, MM, MM_SQUARE)


def _measure(
    workload: str,
    scene: Scene,
    c: int,
    opts: Options,
    fns: dict,
    flops: dict[str, int],
    checks: dict[str, Callable[[], object]] | None = None,
) -> list[Row]:
    """Checks the baselines in ``checks`` against :data:`LATTICE`, then times ``fns``
    less the ones that disagree (those get a ``disagrees: ...`` row instead)."""
    bad = ck.disagreements(LATTICE, checks) if checks and len(checks) > 1 else {}
    fns = {name: fn for name, fn in fns.items() if name not in bad}
    timings: dict[str, Timing] = {}
    for group in (False, True):
        part = {name: fn for name, fn in fns.items() if (name in REFERENCES) == group}
        if part:
            timings.update(time_side_by_side(part, opts.repeats, opts.warmup, opts.memory))
    rows = [
        _row(workload, scene, c, name, flops.get(name, 0), t, _threads(name, opts))
        for name, t in timings.items()
    ]
    return rows + [_missing(workload, scene, c, name, why) for name, why in bad.items()]


def _threads(impl: str, opts: Options) -> int:
    return opts.spconv_threads if impl == SPCONV else torch.get_num_threads()


def _count(pairs: list) -> int:
    return sum(int(i.numel()) for i, _ in pairs)


def _features(n: int, c: int, grad: bool = False) -> torch.Tensor:
    g = torch.Generator().manual_seed(n * 131 + c)
    return torch.randn(n, c, generator=g).requires_grad_(grad)


def _layer(module: torch.nn.Module) -> torch.nn.Module:
    torch.manual_seed(0)
    return module.eval()


# --------------------------------------------------------------------------------------
# Kernel map
# --------------------------------------------------------------------------------------


def _table_outputs(nbr: torch.Tensor) -> ck.Outputs:
    """A neighbour table as checked outputs: the table itself (for baselines that number
    kernel rows as the library does) and its set of pairs (for those that do not)."""
    return {"nbr": nbr, "pairs": bl.pair_keys(nbr)}


def kmap_subm3(scene: Scene, c: int, opts: Options) -> list[Row]:
    """3x3x3 submanifold map: the library op (``nbr`` and ``rev``) vs the torch builder
    and spconv's index generation (at its thread count; checked as the set of pairs)."""
    coords, n = scene.coords, scene.voxels
    ks, s, p, d = (list(v) for v in SUBM3.as_c())
    fns = {
        LATTICE: lambda: kernel_map(coords, coords, ks, s, p, d),
        TORCH_KMAP: lambda: bl.torch_kernel_map(coords, coords, SUBM3),
    }
    checks = {
        LATTICE: lambda: _table_outputs(fns[LATTICE]()[0]),
        TORCH_KMAP: lambda: {"nbr": fns[TORCH_KMAP]()},
    }
    notes: list[Row] = []
    why = bl.spconv_status() if opts.spconv else "disabled"
    if why is None:
        sp = bl.with_threads(bl.spconv_subm_indices(coords), opts.spconv_threads)
        fns[SPCONV] = sp
        checks[SPCONV] = lambda: {"pairs": bl.spconv_pair_keys(sp(), n)}
    else:
        notes.append(_missing("kmap_subm3", scene, 0, SPCONV, why))
    return _measure("kmap_subm3", scene, 0, opts, fns, {}, checks) + notes


def support_args(coords: torch.Tensor, geometry: ConvGeometry) -> tuple[Any, ...]:
    """The arguments after ``coords`` of ``lattice::generate_support`` for a strided
    ``geometry`` over the extent and batches of ``coords``."""
    n = coords.shape[0]
    extent = (coords[:, 1:].amax(dim=0) + 1).tolist() if n else [0, 0, 0]
    out_range = [max(0, r) for r in geometry.output_range(extent)]
    batches = int(coords[:, 0].amax()) + 1 if n else 0
    return (*[list(v) for v in geometry.as_c()], out_range, batches)


def _kmap_strided(name: str, geometry: ConvGeometry) -> Callable[[Scene, int, Options], list[Row]]:
    """A strided Conv3d's map on a new scan: the generated output support and the map onto
    it (``nbr`` and ``rev``), as the layer's first call builds them, vs spconv's index
    generation (output rows and pairs in one call, at its thread count), checked as the
    set of (output coordinate, input row) pairs."""

    def run(scene: Scene, c: int, opts: Options) -> list[Row]:
        coords, n = scene.coords, scene.voxels
        args = support_args(coords, geometry)

        def lattice() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
            support = torch.ops.lattice.generate_support(coords, *args)
            return (support, *kernel_map(coords, support, *args[:4]))

        def keys_of(result: tuple[torch.Tensor, ...]) -> torch.Tensor:
            support, nbr = result[0], result[1]
            out_rows, k = torch.nonzero(nbr >= 0, as_tuple=True)
            return bl.coord_pair_keys(support, out_rows, nbr[out_rows, k], n)

        fns: dict[str, Callable[[], object]] = {LATTICE: lattice}
        checks: dict[str, Callable[[], object]] = {LATTICE: lambda: {"pairs": keys_of(lattice())}}
        notes: list[Row] = []
        why = bl.spconv_status() if opts.spconv else "disabled"
        if why is None:
            sp = bl.with_threads(bl.spconv_strided_indices(coords, geometry), opts.spconv_threads)
            fns[SPCONV] = sp
            checks[SPCONV] = lambda: {"pairs": bl.spconv_strided_pair_keys(sp(), n)}
        else:
            notes.append(_missing(name, scene, 0, SPCONV, why))
        return _measure(name, scene, 0, opts, fns, {}, checks) + notes

    return run


# --------------------------------------------------------------------------------------
# Submanifold convolution
# --------------------------------------------------------------------------------------


def _proxies(pairs: int, c: int, backward: bool) -> dict[str, Callable[[], object]]:
    def run_all(mms: list[bl.MatmulProxy]) -> Callable[[], object]:
        return lambda: [m.run() for m in mms]

    reps = 3 if backward else 1  # forward, input grad, weight grad
    return {
        MM: run_all([bl.mm_proxy(pairs, c, c, square=False) for _ in range(reps)]),
        MM_SQUARE: run_all([bl.mm_proxy(pairs, c, c, square=True) for _ in range(reps)]),
    }


def _spconv_fns(
    scene: Scene, conv: torch.nn.Module, feats: torch.Tensor, grad: bool, threads: int
) -> tuple[Callable[[], object], Callable[[], object]]:
    """spconv's timed callable and its check, both at ``threads`` torch threads."""
    with bl.torch_threads(threads):
        sp = bl.SpconvSubm(scene.coords, conv.weight.detach())
    if not grad:
        fwd = bl.with_threads(torch.no_grad()(lambda: sp(feats)), threads)
        return fwd, fwd
    g = torch.ones(feats.shape[0], conv.weight.shape[2])

    def check() -> ck.Outputs:  # its weight is laid out its own way: output and input grad
        y = sp(feats)
        return {"out": y, "grad_in": torch.autograd.grad(y, feats, g)[0]}

    return bl.with_threads(lambda: sp(feats).backward(g), threads), bl.with_threads(check, threads)


def _subm_fns(scene: Scene, c: int, opts: Options, grad: bool) -> tuple[dict, dict, list[Row], int]:
    conv = _layer(tl.nn.SubmConv3d(c, c, 3, bias=False))
    feats = _features(scene.voxels, c, grad)
    x = tl.SparseTensor(feats, scene.coords)
    pairs = opts.pairs(scene, scene.coords, SUBM3)
    w = conv.weight
    n = scene.voxels
    g = torch.ones(n, c)
    fns: dict[str, Callable[[], object]] = {}
    checks: dict[str, Callable[[], object]] = {}
    notes: list[Row] = []
    if grad:
        fns[LATTICE] = lambda: conv(x).feats.backward(g)
        fns[TORCH] = lambda: bl.gather_scatter_conv(feats, w, pairs, n).backward(g)

        def grads(y: torch.Tensor) -> ck.Outputs:
            dx, dw = torch.autograd.grad(y, (feats, w), g)
            return {"out": y, "grad_in": dx, "grad_w": dw}

        checks[LATTICE] = lambda: grads(conv(x).feats)
        checks[TORCH] = lambda: grads(bl.gather_scatter_conv(feats, w, pairs, n))
    else:
        fns[LATTICE] = torch.no_grad()(lambda: conv(x))
        fns[TORCH] = torch.no_grad()(lambda: bl.gather_scatter_conv(feats, w, pairs, n))
        grid = bl.dense_grid(scene.coords, c) if opts.dense else None
        if grid is not None:
            w5 = bl.dense_weight(w.detach(), (3, 3, 3)).contiguous()
            cl = scene.coords.long()
            fns[DENSE] = torch.no_grad()(lambda: bl.dense_subm_conv(feats, cl, w5, grid))
        else:
            why = "not run (dense grid over the memory cap)" if opts.dense else "disabled"
            notes.append(_missing("", scene, c, DENSE, why))
        checks.update(fns)
    why = bl.spconv_status() if opts.spconv else "disabled"
    if why is None:
        spfn, spcheck = _spconv_fns(scene, conv, feats, grad, opts.spconv_threads)
        try:  # spconv's CPU build lacks some paths (its backward asks for a CUDA stream)
            spfn()
            fns[SPCONV], checks[SPCONV] = spfn, spcheck
        except Exception as exc:
            why = f"failed on CPU ({type(exc).__name__}: {exc})"[:160]
    if why is not None:
        notes.append(_missing("", scene, c, SPCONV, why))
    fns.update(_proxies(_count(pairs), c, grad))
    return fns, checks, notes, _count(pairs)


def _subm(name: str, grad: bool) -> Callable[[Scene, int, Options], list[Row]]:
    def run(scene: Scene, c: int, opts: Options) -> list[Row]:
        fns, checks, notes, npairs = _subm_fns(scene, c, opts, grad)
        flops = 2 * npairs * c * c * (3 if grad else 1)
        rows = _measure(name, scene, c, opts, fns, dict.fromkeys(fns, flops), checks)
        for r in notes:
            r["workload"] = name
        return rows + notes

    return run


def _subm_half(name: str, dtype: torch.dtype) -> Callable[[Scene, int, Options], list[Row]]:
    """SubmConv3d forward in a half type: the library layer in ``dtype`` beside the same
    layer in float32 (the speed-up over our own fp32) and gather-mm-scatter in ``dtype``;
    FLOPs are the same multiply-adds in every row."""

    def run(scene: Scene, c: int, opts: Options) -> list[Row]:
        conv = _layer(tl.nn.SubmConv3d(c, c, 3, bias=False))
        half = _layer(tl.nn.SubmConv3d(c, c, 3, bias=False)).to(dtype)
        with torch.no_grad():
            half.weight.copy_(conv.weight.to(dtype))
        feats = _features(scene.voxels, c).to(dtype)
        x = tl.SparseTensor(feats, scene.coords)
        x32 = tl.SparseTensor(feats.float(), scene.coords)
        pairs = opts.pairs(scene, scene.coords, SUBM3)
        w, n = half.weight, scene.voxels
        fns = {
            LATTICE: torch.no_grad()(lambda: half(x)),
            LATTICE_FP32: torch.no_grad()(lambda: conv(x32)),
            TORCH: torch.no_grad()(lambda: bl.gather_scatter_conv(feats, w, pairs, n)),
        }
        flops = 2 * _count(pairs) * c * c
        return _measure(name, scene, c, opts, fns, dict.fromkeys(fns, flops), dict(fns))

    return run


# --------------------------------------------------------------------------------------
# Strided convolution and transposes
# --------------------------------------------------------------------------------------


def _down(scene: Scene, c: int) -> tuple[torch.nn.Module, tl.SparseTensor, tl.SparseTensor]:
    """A k2 s2 Conv3d, its input and its (coarse) output."""
    conv = _layer(tl.nn.Conv3d(c, c, 2, stride=2, bias=False))
    x = tl.SparseTensor(_features(scene.voxels, c), scene.coords)
    with torch.no_grad():
        y = conv(x)
    return conv, x, y


def conv_down2(scene: Scene, c: int, opts: Options) -> list[Row]:
    """k2 s2 Conv3d forward: the library layer vs gather-mm-scatter on the same relation."""
    conv, x, y = _down(scene, c)
    pairs = opts.pairs(scene, y.coords, DOWN2)
    w, n_out, feats = conv.weight, y.coords.shape[0], x.feats
    fns = {
        LATTICE: torch.no_grad()(lambda: conv(x)),
        TORCH: torch.no_grad()(lambda: bl.gather_scatter_conv(feats, w, pairs, n_out)),
    }
    flops = 2 * _count(pairs) * c * c
    return _measure("conv_k2s2", scene, c, opts, fns, dict.fromkeys(fns, flops), dict(fns))


def _transpose(name: str, target: bool) -> Callable[[Scene, int, Options], list[Row]]:
    """Inverse (``up(src)``) or target (``up(src, target)``) k2 s2 transpose."""

    def run(scene: Scene, c: int, opts: Options) -> list[Row]:
        cls = lookup("nn.ConvTranspose3d")
        if cls is None:
            return [_missing(name, scene, c, LATTICE, "not available (tl.nn.ConvTranspose3d)")]
        _, x, src = _down(scene, c)
        up = _layer(cls(c, c, 2, stride=2, bias=False))
        pairs = bl.swap_pairs(opts.pairs(scene, src.coords, DOWN2))
        w, n_out, feats = up.weight, scene.voxels, src.feats

        def lattice() -> object:
            return up(src, x) if target else up(src)

        fns = {
            LATTICE: torch.no_grad()(lattice),
            TORCH: torch.no_grad()(lambda: bl.gather_scatter_conv(feats, w, pairs, n_out)),
        }
        flops = 2 * _count(pairs) * c * c
        return _measure(name, scene, c, opts, fns, dict.fromkeys(fns, flops), dict(fns))

    return run


def gen_transpose2(scene: Scene, c: int, opts: Options) -> list[Row]:
    """Generative k2 s2 transpose of the k2 s2 output (support generated by the layer)."""
    name = "gen_convtr_k2s2"
    cls = lookup("nn.GenerativeConvTranspose3d")
    if cls is None:
        why = "not available (tl.nn.GenerativeConvTranspose3d)"
        return [_missing(name, scene, c, LATTICE, why)]
    _, _, src = _down(scene, c)
    gen = _layer(cls(c, c, 2, stride=2, bias=False))
    with torch.no_grad():
        out = gen(src)
    # input = output*1 - 0 + r with the roles swapped: fine = coarse*2 + r.
    fine_nbr = bl.torch_kernel_map(out.coords, src.coords, DOWN2)
    pairs = bl.swap_pairs(bl.pairs_from_nbr(fine_nbr))
    w, n_out, feats = gen.weight, out.coords.shape[0], src.feats
    fns = {
        LATTICE: torch.no_grad()(lambda: gen(src)),
        TORCH: torch.no_grad()(lambda: bl.gather_scatter_conv(feats, w, pairs, n_out)),
    }
    flops = 2 * _count(pairs) * c * c
    return _measure(name, scene, c, opts, fns, dict.fromkeys(fns, flops), dict(fns))


# --------------------------------------------------------------------------------------
# Network
# --------------------------------------------------------------------------------------


def _resunet_step(
    cls: Any, scene: Scene, c: int, grad: bool, dtype: torch.dtype
) -> Callable[[], object]:
    """One call of SparseResUNet42(c, 20) in ``dtype`` on a new scan (every map built in
    the call): eval forward, or forward + backward of a float32 loss
    (:func:`benchmarks.resunet_step.resunet_step` on the scene's features)."""
    return resunet_step(cls, tl.SparseTensor, scene.coords, _features(scene.voxels, c), grad, dtype)


def _resunet(
    name: str, grad: bool, dtype: torch.dtype = torch.float32
) -> Callable[[Scene, int, Options], list[Row]]:
    """The network in ``dtype``; a half type runs beside the same network in float32
    (not compared: 42 layers of bfloat16 rounding are not a check of the kernels, which
    ``subm3_fwd_bf16`` and the tests compare)."""

    def run(scene: Scene, c: int, opts: Options) -> list[Row]:
        cls = lookup("backbones.SparseResUNet42")
        if cls is None:
            why = "not available (tl.backbones.SparseResUNet42)"
            return [_missing(name, scene, c, LATTICE, why)]
        fns = {LATTICE: _resunet_step(cls, scene, c, grad, dtype)}
        if dtype != torch.float32:
            fns[LATTICE_FP32] = _resunet_step(cls, scene, c, grad, torch.float32)
        return _measure(name, scene, c, opts, fns, {})

    return run


WORKLOADS: dict[str, Workload] = {
    w.name: w
    for w in (
        Workload("kmap_subm3", "3x3x3 submanifold kernel map (nbr + rev)", kmap_subm3),
        Workload(
            "kmap_k2s2",
            "Conv3d k2 s2 generated support + kernel map (nbr + rev)",
            _kmap_strided("kmap_k2s2", DOWN2),
        ),
        Workload(
            "kmap_k3s2p1",
            "Conv3d k3 s2 p1 generated support + kernel map (nbr + rev)",
            _kmap_strided("kmap_k3s2p1", DOWN3),
        ),
        Workload("subm3_fwd", "SubmConv3d 3x3x3 forward", _subm("subm3_fwd", False)),
        Workload(
            "subm3_fwdbwd", "SubmConv3d 3x3x3 forward + backward", _subm("subm3_fwdbwd", True)
        ),
        Workload(
            "subm3_fwd_bf16",
            "SubmConv3d 3x3x3 forward in bfloat16",
            _subm_half("subm3_fwd_bf16", torch.bfloat16),
        ),
        Workload(
            "subm3_fwd_fp16",
            "SubmConv3d 3x3x3 forward in float16",
            _subm_half("subm3_fwd_fp16", torch.float16),
        ),
        Workload("conv_k2s2", "Conv3d k2 s2 forward (generated support)", conv_down2),
        Workload(
            "convtr_k2s2_inverse",
            "ConvTranspose3d k2 s2 inverse forward, up(src)",
            _transpose("convtr_k2s2_inverse", target=False),
        ),
        Workload(
            "convtr_k2s2_target",
            "ConvTranspose3d k2 s2 target forward, up(src, target)",
            _transpose("convtr_k2s2_target", target=True),
        ),
        Workload("gen_convtr_k2s2", "GenerativeConvTranspose3d k2 s2 forward", gen_transpose2),
        Workload(
            "resunet42_fwd",
            "SparseResUNet42 forward (maps built)",
            _resunet("resunet42_fwd", False),
        ),
        Workload(
            "resunet42_fwdbwd",
            "SparseResUNet42 forward + backward",
            _resunet("resunet42_fwdbwd", True),
        ),
        Workload(
            "resunet42_fwd_bf16",
            "SparseResUNet42 forward in bfloat16 (maps built)",
            _resunet("resunet42_fwd_bf16", False, torch.bfloat16),
        ),
        Workload(
            "resunet42_fwdbwd_bf16",
            "SparseResUNet42 forward + backward in bfloat16",
            _resunet("resunet42_fwdbwd_bf16", True, torch.bfloat16),
        ),
        Workload(
            "resunet42_fwd_fp16",
            "SparseResUNet42 forward in float16 (maps built)",
            _resunet("resunet42_fwd_fp16", False, torch.float16),
        ),
        Workload(
            "resunet42_fwdbwd_fp16",
            "SparseResUNet42 forward + backward in float16",
            _resunet("resunet42_fwdbwd_fp16", True, torch.float16),
        ),
    )
}
