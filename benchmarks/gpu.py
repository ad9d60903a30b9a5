"""GPU benchmark of the device check: ``python3 -m benchmarks.gpu [--out FILE]``.

On a LiDAR scene, with CUDA events (medians of ``--reps``, at least 20 by default, with
the 10th-90th percentile spread), in one process:

- **peak**: cuBLAS ``mm`` on large squares per precision (fp32, TF32, fp16, bf16), the
  denominator of "% of mm peak", beside the datasheet's dense peak where the GPU is known;
- **kernel maps**: submanifold k3 (``nbr``, then pairs) and strided k2 s2 (support,
  ``nbr``, pairs) built from coordinates;
- **single layers** on the maps the library's own modules build (SubmConv3d k3 with its
  centred kernel, Conv3d k2 s2 and k3 s2 p1, the inverse ConvTranspose3d and a target
  transpose; :mod:`benchmarks.gpu_layers`) at C = 32, 64, 128, 256 in fp32, TF32, fp16 and
  bf16, per dataflow, beside two plain-PyTorch baselines on the same pairs (a per-kernel-row
  gather-mm-scatter loop and one im2col GEMM). Every baseline's output, input gradient and
  weight gradient is checked against ours before it is timed, and each of our dataflows
  against the loop baseline; rows print achieved TFLOP/s (useful work ``2 * pairs * C_in *
  C_out``) and the percentages of the peaks;
- **SparseResUNet42** per dataflow in fp32 and fp16: inference with cached maps (a fixed
  scan) and a training step with the maps built inside the timing (a new scan each step).

``--device cpu`` runs the same code on the CPU with wall-clock timing (the rehearsal the
tests use); prints a Markdown report.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from benchmarks.baselines import spconv_status

if TYPE_CHECKING:
    from benchmarks import gpu_layers as gl

DATAFLOWS = ("implicit_gemm", "fetch_on_demand", "gather_scatter")
CHANNELS = (32, 64, 128, 256)
PRECISIONS = ("fp32", "tf32", "fp16", "bf16")
GROUPS = ("kmap", "layers", "overhead", "unet")
_PREC = {torch.float32: "fp32", torch.float16: "fp16", torch.bfloat16: "bf16"}
_DTYPE = {
    "fp32": torch.float32,
    "tf32": torch.float32,
    "fp16": torch.float16,
    "bf16": torch.bfloat16,
}
# Dense (no structured sparsity) datasheet peaks in TFLOP/s, SXM parts: fp32 on CUDA
# cores, the rest on tensor cores.
SPEC_TFLOPS = {
    "H200": {"fp32": 67.0, "tf32": 494.7, "fp16": 989.4, "bf16": 989.4},
    "H100": {"fp32": 67.0, "tf32": 494.7, "fp16": 989.4, "bf16": 989.4},
}


@dataclass(frozen=True)
class Row:
    """One timed case. ``flops`` for convolutions; ``err`` where a result was checked."""

    section: str
    case: str
    precision: str
    impl: str
    ms: float  # median; NaN when not timed
    p10: float = float("nan")
    p90: float = float("nan")
    flops: int | None = None
    err: float | None = None
    note: str = ""


class Timer:
    """Medians and spread of a callable: CUDA events on a GPU, wall clock elsewhere."""

    def __init__(self, device: str, reps: int, warm: int = 3) -> None:
        self.cuda = device.startswith("cuda")
        self.reps, self.warm = reps, warm

    def __call__(self, fn: Callable[[], object], reps: int | None = None
                 ) -> tuple[float, float, float]:
        for _ in range(self.warm):
            fn()
        times = []
        for _ in range(reps or self.reps):
            if self.cuda:
                start = torch.cuda.Event(enable_timing=True)
                stop = torch.cuda.Event(enable_timing=True)
                start.record()
                fn()
                stop.record()
                stop.synchronize()
                times.append(start.elapsed_time(stop))
            else:
                t0 = time.perf_counter()
                fn()
                times.append((time.perf_counter() - t0) * 1e3)
        times.sort()
        pick = lambda q: times[min(len(times) - 1, int(q * len(times)))]  # noqa: E731
        return statistics.median(times), pick(0.1), pick(0.9)


def _tf32(enabled: bool) -> None:
    """TF32 for the plain-PyTorch baselines' fp32 matmuls.

    Through the legacy ``allow_tf32`` setter: on torch >= 2.9 it sets the legacy precision
    and ``matmul.fp32_precision`` together, while setting ``fp32_precision`` alone leaves
    the two disagreeing, and torch then raises on every read of ``allow_tf32``."""
    torch.backends.cuda.matmul.allow_tf32 = enabled


def peak_rows(timer: Timer, device: str) -> tuple[list[Row], dict[str, float]]:
    """cuBLAS (or CPU BLAS) ``mm`` TFLOP/s per precision on squares: the measured peak."""
    n = 8192 if timer.cuda else 512
    rows, peak = [], {}
    for prec in PRECISIONS:
        a = torch.randn(n, n, device=device).to(_DTYPE[prec])
        b = torch.randn(n, n, device=device).to(_DTYPE[prec])
        _tf32(prec == "tf32")
        ms, p10, p90 = timer(partial(torch.mm, a, b))
        _tf32(False)
        peak[prec] = 2 * n**3 / (p10 * 1e-3) / 1e12  # the best decile: the attainable rate
        rows.append(Row("peak", f"mm {n}^3", prec, "torch.mm", ms, p10, p90, 2 * n**3))
    return rows, peak


def kmap_rows(timer: Timer, coords: torch.Tensor, into: list[Row] | None = None) -> list[Row]:
    """Kernel-map construction from coordinates: submanifold k3 and strided k2 s2."""
    from torch_lattice.geometry import ConvGeometry

    lattice = torch.ops.lattice
    subm = ConvGeometry.submanifold((3, 3, 3), (1, 1, 1))
    k2s2 = ConvGeometry.create(2, 2, 0, 1)
    batches = int(coords[:, 0].max()) + 1
    extent = (coords[:, 1:].amax(0) + 1).tolist()
    out_range = list(k2s2.output_range(extent))
    args_s = [list(v) for v in subm.as_c()]
    args_k = [list(v) for v in k2s2.as_c()]
    nbr_s = lattice.kernel_map(coords, coords, *args_s)[0]
    coarse = lattice.generate_support(coords, *args_k, out_range, batches)
    nbr_k = lattice.kernel_map(coords, coarse, *args_k)[0]
    cases = [
        ("SubmConv3d k3: nbr", partial(lattice.kernel_map, coords, coords, *args_s)),
        ("SubmConv3d k3: pairs", partial(lattice.kernel_pairs, nbr_s)),
        ("Conv3d k2s2: support",
         partial(lattice.generate_support, coords, *args_k, out_range, batches)),
        ("Conv3d k2s2: nbr", partial(lattice.kernel_map, coords, coarse, *args_k)),
        ("Conv3d k2s2: pairs", partial(lattice.kernel_pairs, nbr_k)),
    ]
    rows = [] if into is None else into  # the caller keeps what ran if cut short
    rows += [Row("kernel map", name, "-", "lattice", *timer(fn)) for name, fn in cases]
    if spconv_here(coords.device.type) is None:
        from benchmarks.gpu_spconv import check_indices, indice_rows

        ours = {"SubmConv3d k3": (nbr_s, coords), "Conv3d k2s2": (nbr_k, coarse)}
        for name, fn in indice_rows(coords):
            try:
                check_indices(fn(), *ours[name.split(":")[0]])
            except Exception as exc:  # another format or another relation: not timed
                rows.append(Row("kernel map", name, "-", "spconv", float("nan"),
                                note=f"not checked: {exc!r}"[:120]))
                continue
            rows.append(Row("kernel map", name, "-", "spconv", *timer(fn)))
    return rows


def spconv_here(device: str) -> str | None:
    """None where spconv runs beside us (it imports, on a GPU), else why not. On a CPU its
    build is wrong at more than one thread and has no backward, so the rehearsal leaves it
    out."""
    if not device.startswith("cuda"):
        return "not on a GPU"
    return spconv_status()


def layer_rows(timer: Timer, coords: torch.Tensor, device: str, channels: Sequence[int],
               precisions: Sequence[str], into: list[Row] | None = None) -> list[Row]:
    """Single layers per channel count, precision and dataflow, beside the baselines:
    forward rows for every implementation, forward+backward rows for ours and spconv."""
    from benchmarks import gpu_layers as gl

    rows = [] if into is None else into  # the caller keeps what ran if cut short
    for c in channels:
        for base in gl.layer_cases(coords, c, device, seed=c):
            for prec in precisions:
                case = base.at(_DTYPE[prec])
                _tf32(prec == "tf32")
                baselines = gl.baselines(case)
                if prec == "tf32":  # spconv's fp32 GEMMs take no run-time TF32 switch
                    baselines.pop("spconv", None)
                name = case.name + f" C={c}"
                x = case.x.feats
                grad = torch.randn(case.table.shape[0], c, device=x.device, dtype=x.dtype)
                rows += _baseline_rows(timer, case, name, prec, grad, baselines)
                _tf32(False)
                rows += _our_layer_rows(timer, case, name, prec, grad, baselines["torch loop"])
    return rows


def _checked(section: str, case: str, prec: str, impl: str, check: Callable[[], float],
             tol: float) -> float | Row:
    """A baseline checked against ours before it is timed: ``check()``'s error when within
    ``tol``, else the row that reports it untimed (it could not run, or it disagrees)."""
    try:
        err = check()
    except Exception as exc:  # out of memory, or a baseline that cannot run
        return Row(section, case, prec, impl, float("nan"), note=f"not checked: {exc!r}"[:120])
    if err > tol:
        return Row(section, case, prec, impl, float("nan"), err=err,
                   note="disagrees: not timed")
    return err


def _baseline_rows(timer: Timer, case: gl.LayerCase, name: str, prec: str,
                   grad: torch.Tensor, baselines: dict) -> list[Row]:
    from benchmarks import gpu_layers as gl

    x, w = case.x.feats, case.module.weight.detach()
    rows = []
    for impl, fn in baselines.items():
        err = _checked("layer", name, prec, impl, partial(gl.check, case, fn),
                       gl.TOLERANCE[prec])
        if isinstance(err, Row):
            rows.append(err)
            continue
        note = getattr(fn, "note", "")
        with torch.no_grad():
            run = fn.timed(x) if hasattr(fn, "timed") else partial(fn, x, w)
            rows.append(Row("layer", name, prec, impl, *timer(run), case.flops, err, note))
        if hasattr(fn, "timed_train"):
            rows.append(Row("layer", name + " fwd+bwd", prec, impl,
                            *timer(fn.timed_train(x, grad)), 3 * case.flops, err, note))
    return rows


@contextlib.contextmanager
def _without_pending(changes: tuple[str, ...]) -> Iterator[None]:
    """The pending CUDA changes that are on (``conv_cuda.pending``) less ``changes``,
    restored on exit: the previous kernels timed beside the pending ones in one run."""
    from torch_lattice.ops import conv_cuda

    before = os.environ.get(conv_cuda.PENDING_ENV)
    keep = [c for c in conv_cuda.PENDING_CHANGES if c not in changes and conv_cuda.pending(c)]
    os.environ[conv_cuda.PENDING_ENV] = ",".join(keep) or "0"
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(conv_cuda.PENDING_ENV, None)
        else:
            os.environ[conv_cuda.PENDING_ENV] = before


def _layer_variants(prec: str) -> list[tuple[str, str, tuple[str, ...]]]:
    """(row label, dataflow, pending changes to leave off) of our layer rows: each
    dataflow, and where its pending kernels are on (the implicit-GEMM forward in fp16,
    bf16 and TF32, its weight gradient over pair lists in every precision; the
    fetch-on-demand forward and weight gradient in fp16, bf16 and TF32; the same tiles
    in plain fp32), the previous kernels beside them."""
    from torch_lattice.ops import conv_cuda

    piped = {"implicit_gemm": {"pipelined_forward": ("fp16", "bf16", "tf32"),
                               "pipelined_fp32": ("fp32",),
                               "pair_weight_grad": ("fp32", "tf32", "fp16", "bf16")},
             "fetch_on_demand": {"pipelined_fod_forward": ("fp16", "bf16", "tf32"),
                                 "pipelined_fp32": ("fp32",),
                                 "pipelined_wgrad": ("fp16", "bf16", "tf32")}}
    rows: list[tuple[str, str, tuple[str, ...]]] = []
    for df in DATAFLOWS:
        rows.append((df, df, ()))
        changes = tuple(c for c, precs in piped.get(df, {}).items()
                        if prec in precs and conv_cuda.pending(c))
        if changes:
            rows.append((f"{df} (previous kernel)", df, changes))
    return rows


def _our_layer_rows(timer: Timer, case: gl.LayerCase, name: str, prec: str,
                    grad: torch.Tensor,
                    reference: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
                    ) -> list[Row]:
    from benchmarks import gpu_layers as gl
    from torch_lattice.nn.functional import ConvConfig, Dataflow, conv_config

    rows = []
    for label, df, off in _layer_variants(prec):
        if case.target is not None and df != "gather_scatter":
            continue  # target transposes run gather-scatter only (docs/dataflows)
        config = ConvConfig(dataflow=Dataflow(df), allow_tf32=prec == "tf32")
        pending = _without_pending(off) if off else contextlib.nullcontext()
        try:
            with conv_config(config), pending:
                err = gl.check(case, reference)
                with torch.no_grad():
                    rows.append(Row("layer", name, prec, label, *timer(case.ours),
                                    case.flops, err))
                rows.append(Row("layer", name + " fwd+bwd", prec, label,
                                *timer(case.ours_train(grad)), 3 * case.flops, err))
        except Exception as exc:  # a failing kernel is a row, not a crash
            print(f"{name} {prec} {label}: {exc!r}", file=sys.stderr)
            rows.append(Row("layer", name, prec, label, float("nan"),
                            note=f"FAILED: {type(exc).__name__}"))
    return rows


# Names of the CUDA runtime and driver calls torch.profiler records for host
# synchronisations and kernel launches.
SYNC_CALLS = ("cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaEventSynchronize",
              "cudaMemcpy", "cuStreamSynchronize", "cuCtxSynchronize")
LAUNCH_CALLS = ("cudaLaunchKernel", "cudaLaunchKernelExC", "cuLaunchKernel", "cuLaunchKernelEx")


def _recorded(fn: Callable[[], object], cuda: bool) -> list[str]:
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    with profile(activities=activities) as prof:
        fn()
    if cuda:
        torch.cuda.synchronize()
    return [e.name for e in prof.events()]


def syncs_and_launches(fn: Callable[[], object], cuda: bool) -> tuple[list[str], int]:
    """The host synchronisations (names, sorted) and kernel launches torch.profiler
    records while ``fn()`` runs, less the synchronisations it records around a plain
    torch op (the profiler's own)."""
    plain = _recorded(lambda: torch.zeros(1, device="cuda" if cuda else "cpu") * 2, cuda)
    names = _recorded(fn, cuda)
    syncs = sorted(n for n in names if n in SYNC_CALLS)
    for n in plain:
        if n in syncs:
            syncs.remove(n)
    return syncs, sum(n in LAUNCH_CALLS for n in names)


def overhead_rows(coords: torch.Tensor, device: str, channels: int = 64,
                  into: list[Row] | None = None) -> list[Row]:
    """Host synchronisations and kernel launches of one SubmConv3d k3 forward and one
    forward+backward on a cached map, per dataflow (:func:`syncs_and_launches`; the
    issue's target: none, and few launches). On a CPU the counts are zero."""
    from benchmarks import gpu_layers as gl
    from torch_lattice.nn.functional import ConvConfig, Dataflow, conv_config

    cuda = device.startswith("cuda")
    dtype = torch.float16 if cuda else torch.float32
    case = gl.layer_cases(coords, channels, device, seed=channels)[0].at(dtype)
    grad = torch.randn(case.table.shape[0], channels, device=device, dtype=dtype)
    rows = [] if into is None else into  # the caller keeps what ran if cut short
    for df in DATAFLOWS:
        with conv_config(ConvConfig(dataflow=Dataflow(df))):
            train = case.ours_train(grad)
            train()  # maps, pair lists and their cached ranges exist before counting
            for what, fn in (("forward", torch.no_grad()(case.ours)), ("fwd+bwd", train)):
                syncs, launches = syncs_and_launches(fn, cuda)
                rows.append(Row("overhead", f"SubmConv3d k3 C={channels} {what}, cached map",
                                _PREC[dtype], df, float("nan"),
                                note=f"{len(syncs)} host syncs, {launches} kernel launches"))
    return rows


# Largest relative difference of spconv's SparseResUNet42 from ours: logits, and the input
# and weight gradients of a training step (42 layers of rounding, batch norm in half).
UNET_TOLERANCE = {"fp32": (1e-3, 1e-2), "fp16": (5e-2, 2e-1)}


def unet_rows(timer: Timer, coords: torch.Tensor, device: str, precisions: Sequence[str],
              into: list[Row] | None = None) -> list[Row]:
    """SparseResUNet42 per dataflow: inference with cached maps (a fixed scan) and with the
    maps built inside the timing (a new scan), and a training step with the maps built;
    spconv's build of the same network with the same weights beside it (it builds its
    indices in every call), checked first."""
    from torch_lattice import SparseTensor
    from torch_lattice.backbones import SparseResUNet42
    from torch_lattice.nn.functional import ConvConfig, Dataflow, conv_config

    def infer(model: torch.nn.Module, fixed: SparseTensor) -> torch.Tensor:
        return model(fixed).feats

    def infer_new(model: torch.nn.Module, feats: torch.Tensor) -> torch.Tensor:
        return model(SparseTensor(feats, coords)).feats  # a new SparseTensor: maps built

    def train_step(model: torch.nn.Module, feats: torch.Tensor) -> None:
        model.zero_grad(set_to_none=True)  # a new SparseTensor: every map is built again
        model(SparseTensor(feats, coords)).feats.float().square().mean().backward()

    rows = [] if into is None else into  # the caller keeps what ran if cut short
    for prec in precisions:
        dtype = _DTYPE[prec]
        torch.manual_seed(0)
        model = SparseResUNet42(4, 20).to(device).to(dtype)
        feats = torch.randn(coords.shape[0], 4, device=device, dtype=dtype)
        cached = partial(infer, model, SparseTensor(feats, coords))
        built = partial(infer_new, model, feats)
        # each dataflow, then the default: on CUDA autotuned per layer shape (its first
        # calls, in the warm-up, time the candidates)
        default = "default (autotuned)" if device.startswith("cuda") else "default"
        for df in (*DATAFLOWS, default):
            config = ConvConfig() if df == default else ConvConfig(dataflow=Dataflow(df))
            with conv_config(config):
                try:
                    model.eval()
                    with torch.no_grad():
                        rows.append(Row("network", "ResUNet42 forward, cached maps", prec, df,
                                        *timer(cached)))
                        rows.append(Row("network", "ResUNet42 forward, maps built", prec, df,
                                        *timer(built)))
                    model.train()
                    rows.append(Row("network", "ResUNet42 fwd+bwd, maps built", prec, df,
                                    *timer(partial(train_step, model, feats))))
                except Exception as exc:
                    print(f"ResUNet42 {prec} {df}: {exc!r}", file=sys.stderr)
                    rows.append(Row("network", "ResUNet42", prec, df, float("nan"),
                                    note=f"FAILED: {type(exc).__name__}"))
        if spconv_here(device) is None:
            rows += _spconv_unet_rows(timer, model, feats, coords, prec)
    return rows


def _spconv_unet_rows(timer: Timer, model: torch.nn.Module, feats: torch.Tensor,
                      coords: torch.Tensor, prec: str) -> list[Row]:
    """spconv's SparseResUNet42 with ``model``'s weights: forward (eval) and a training
    step, each after its check against ``model``."""
    from benchmarks.gpu_spconv import SpconvResUNet42, unet_check

    def step(twin: torch.nn.Module) -> None:
        twin.zero_grad(set_to_none=True)
        twin(feats, coords).float().square().mean().backward()

    rows = []
    try:
        twin = SpconvResUNet42(model)  # type: ignore[arg-type]
    except Exception as exc:
        return [Row("network", "ResUNet42", prec, "spconv", float("nan"),
                    note=f"not built: {exc!r}"[:120])]
    out_tol, grad_tol = UNET_TOLERANCE[prec]
    cases = (("forward, maps built", False, lambda: twin(feats, coords)),
             ("fwd+bwd, maps built", True, partial(step, twin)))
    for case, train, fn in cases:
        model.train(train)
        twin.train(train)

        def check(train: bool = train) -> float:
            with torch.set_grad_enabled(train):
                return unet_check(model, twin, feats, coords, backward=train)  # type: ignore[arg-type]

        err = _checked("network", f"ResUNet42 {case}", prec, "spconv", check,
                       grad_tol if train else out_tol)
        if isinstance(err, Row):
            rows.append(err)
            continue
        with torch.set_grad_enabled(train):
            rows.append(Row("network", f"ResUNet42 {case}", prec, "spconv", *timer(fn),
                            err=err, note="builds its indices in every call"))
    return rows


def _pct(part: float | None, whole: float | None) -> str:
    return "" if part is None or not whole else f"{100 * part / whole:.1f}%"


def table(rows: Sequence[Row], peak: dict[str, float], spec: dict[str, float] | None
          ) -> list[str]:
    """Markdown table: median, spread, TFLOP/s, % of the measured and datasheet peaks."""
    out = [
        "| section | case | precision | impl | median ms | p10-p90 ms | TFLOP/s | % of mm peak "
        "| % of datasheet | max rel err | note |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        timed = r.ms == r.ms
        tflops = r.flops / (r.ms * 1e-3) / 1e12 if timed and r.flops and r.ms > 0 else None
        out.append(
            f"| {r.section} | {r.case} | {r.precision} | {r.impl} | "
            f"{f'{r.ms:.3f}' if timed else '-'} | "
            f"{f'{r.p10:.3f}-{r.p90:.3f}' if timed else '-'} | "
            f"{'' if tflops is None else f'{tflops:.3g}'} | "
            f"{_pct(tflops, peak.get(r.precision)) if r.section != 'peak' else ''} | "
            f"{_pct(tflops, (spec or {}).get(r.precision))} | "
            f"{'' if r.err is None else f'{r.err:.1e}'} | {r.note} |"
        )
    return out


def _spconv_version() -> str:
    import spconv

    return f"{getattr(spconv, '__version__', '?')} beside us"


def _device_name(device: str) -> str:
    return torch.cuda.get_device_name() if device.startswith("cuda") else "CPU"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.gpu", description=__doc__)
    parser.add_argument("--reps", type=int, default=20, help="timed repetitions per case")
    parser.add_argument("--out", type=Path, help="also write the report to this file")
    parser.add_argument("--no-unet", action="store_true", help="skip SparseResUNet42")
    parser.add_argument("--device", default="cuda", help="cuda (default) or cpu (rehearsal)")
    parser.add_argument("--scene", default="lidar",
                        help="lidar, surface, indoor, or tiny-N (an N x N height field)")
    parser.add_argument("--channels", default=",".join(map(str, CHANNELS)))
    parser.add_argument("--precisions", default=",".join(PRECISIONS))
    parser.add_argument("--groups", default=",".join(GROUPS),
                        help=f"which of {','.join(GROUPS)} to run (the device check's fast "
                        "mode runs one); the peak always runs: every row's percentage needs it")
    args = parser.parse_args(argv)
    if args.reps < 1:
        parser.error(f"--reps must be >= 1, got {args.reps}")
    channels = [int(c) for c in args.channels.split(",")]
    precisions = args.precisions.split(",")
    groups = args.groups.split(",")
    if any(c < 1 for c in channels) or not set(precisions) <= set(PRECISIONS):
        parser.error(f"--channels must be positive, --precisions from {PRECISIONS}")
    if not set(groups) <= set(GROUPS):
        parser.error(f"--groups must be from {GROUPS}, got {args.groups!r}")
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        print("benchmarks.gpu: no CUDA device", file=sys.stderr)
        return 2
    import torch_lattice.ops  # noqa: F401  (registers the lattice ops)
    from benchmarks.scenes import make_scene, tiny_scene

    if args.scene.startswith("tiny-"):
        scene = tiny_scene(int(args.scene.removeprefix("tiny-")))
    else:
        scene = make_scene(args.scene)
    coords = scene.coords.to(args.device)
    name = _device_name(args.device)
    spec = next((v for k, v in SPEC_TFLOPS.items() if k in name), None)
    timer = Timer(args.device, args.reps)
    head = (
        f"{name}, torch {torch.__version__}; scene {scene.name} ({scene.voxels} voxels: "
        f"{scene.description}); medians of {args.reps} runs (p10-p90 spread)"
    )
    spconv = spconv_here(args.device)
    head += f"; spconv: {_spconv_version() if spconv is None else spconv}"
    print(head, flush=True)
    rows, peak = peak_rows(timer, args.device)
    runs = {
        "kmap": lambda: kmap_rows(timer, coords, into=rows),
        "layers": lambda: layer_rows(timer, coords, args.device, channels, precisions,
                                     into=rows),
        "overhead": lambda: overhead_rows(coords, args.device, into=rows),
        "unet": lambda: None if args.no_unet else unet_rows(
            timer, coords, args.device, [p for p in ("fp32", "fp16") if p in precisions],
            into=rows),
    }
    # The report is rewritten after each group, and what ran is kept when the run is
    # interrupted (the device check's time limit sends SIGINT): a lent GPU is rare.
    cut, group = "", ""
    try:
        for group in GROUPS:
            if group in groups:
                runs[group]()
                _report(args.out, head, rows, peak, spec)
    except KeyboardInterrupt:
        cut = f"cut short: interrupted during the {group} group; the rows above ran"
    lines = _report(args.out, head + (f"; {cut}" if cut else ""), rows, peak, spec)
    print("\n".join(lines[2:]))
    if cut:
        print(cut, file=sys.stderr)
        return 130
    failed = [r for r in rows if r.note.startswith(("FAILED", "disagrees"))]
    return 1 if failed else 0


def _report(out: Path | None, head: str, rows: Sequence[Row], peak: dict[str, float],
            spec: dict[str, float] | None) -> list[str]:
    """The report's lines, written to ``out`` where given."""
    lines = [head, "", *table(rows, peak, spec)]
    if out is not None:
        out.write_text("\n".join(lines) + "\n")
    return lines


if __name__ == "__main__":
    raise SystemExit(main())
