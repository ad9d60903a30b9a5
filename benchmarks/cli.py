"""Command line: ``python -m benchmarks run --suite default`` (from the repository root).

``run`` times a suite's workloads on its scenes and writes ``results.json``,
``results.md`` and the plots into ``--out`` (default ``docs/benchmarks``); ``list``
shows the suites and workloads. ``large`` runs the large-input check
(:mod:`benchmarks.large`, 5M voxels by default) and writes ``large.json`` and ``large.md``.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import shlex
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

import torch_lattice
from benchmarks import baselines as bl
from benchmarks import report, scenes
from benchmarks.peak import measure_peak
from benchmarks.workloads import WORKLOADS, Options
from torch_lattice.atomic_file import refuse_non_regular
from torch_lattice.ops._runtime import _C
from torch_lattice.optional_deps import require_matplotlib

__all__ = ["SUITES", "Suite", "main"]

ROOT = Path(__file__).resolve().parent.parent

Plan = tuple[tuple[str, tuple[int, ...]], ...]

_ALL: Plan = (
    ("kmap_subm3", (0,)),
    ("kmap_k2s2", (0,)),
    ("kmap_k3s2p1", (0,)),
    ("subm3_fwd", (16, 32, 64, 128)),
    ("subm3_fwdbwd", (64,)),
    ("subm3_fwd_bf16", (32, 64, 128, 256)),
    ("subm3_fwd_fp16", (64,)),
    ("conv_k2s2", (64,)),
    ("convtr_k2s2_inverse", (64,)),
    ("convtr_k2s2_target", (64,)),
    ("gen_convtr_k2s2", (64,)),
    ("resunet42_fwd", (4,)),
    ("resunet42_fwdbwd", (4,)),
    ("resunet42_fwd_bf16", (4,)),
    ("resunet42_fwdbwd_bf16", (4,)),
    ("resunet42_fwd_fp16", (4,)),
    ("resunet42_fwdbwd_fp16", (4,)),
)
_CORE: Plan = (("kmap_subm3", (0,)), ("subm3_fwd", (64,)), ("subm3_fwdbwd", (64,)))
# The targets' scenes also time the strided maps (issue 24: 2x spconv's index generation).
_TARGETS: Plan = (*_CORE, ("kmap_k2s2", (0,)), ("kmap_k3s2p1", (0,)))
_SWEEP: Plan = (("kmap_subm3", (0,)), ("subm3_fwd", (64,)))


@dataclass(frozen=True)
class Suite:
    """What one ``run`` measures.

    Attributes:
        main: ``(kind, batch)`` scenes that get every workload in ``plan``.
        plan: ``(workload, channel counts)`` for the main scenes.
        extra: Scenes that get only ``extra_plan`` (other scene kinds, batch 4).
        extra_plan: The workloads for ``extra``.
        sweep: Voxel counts of the height-field size sweep (``_SWEEP`` workloads).
        repeats: Timed repetitions per implementation.
        tiny: Replace every scene by a 24x24 height field (smoke runs and tests).
    """

    main: tuple[tuple[str, int], ...]
    plan: Plan
    extra: tuple[tuple[str, int], ...]
    extra_plan: Plan
    sweep: tuple[int, ...]
    repeats: int
    tiny: bool = False


SUITES: dict[str, Suite] = {
    "default": Suite(
        main=(("surface", 1), ("lidar", 1)),
        plan=_ALL,
        extra=(("indoor", 1), ("surface", 4), ("lidar", 4)),
        extra_plan=_CORE,
        sweep=(10_000, 30_000, 100_000, 300_000, 1_000_000),
        repeats=5,
    ),
    "targets": Suite(
        main=(("surface", 1), ("lidar", 1)),
        plan=_TARGETS,
        extra=(),
        extra_plan=(),
        sweep=(10_000, 100_000, 1_000_000),
        repeats=7,
    ),
    "smoke": Suite(
        main=(("surface", 1),),
        plan=tuple((w, (8,) if c != (0,) else c) for w, c in _ALL),
        extra=(),
        extra_plan=(),
        sweep=(64, 144),
        repeats=1,
        tiny=True,
    ),
}


def _machine() -> dict[str, Any]:
    model = platform.processor() or platform.machine()
    flags = ""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name") and model in ("", platform.machine()):
                    model = line.split(":", 1)[1].strip()
                if line.startswith("flags"):
                    have = set(line.split(":", 1)[1].split())
                    flags = " ".join(
                        x for x in ("avx2", "fma", "avx512f", "avx512_bf16", "amx_bf16")
                        if x in have
                    )
                    break
    except OSError:
        pass
    return {
        "machine": f"{model}, {os.cpu_count()} logical CPUs",
        "cpu_flags": flags or "-",
        "kernels": _C.cpu_isa(),
    }


def _commit() -> str:
    try:
        head = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],
            cwd=ROOT,
            capture_output=True,
            text=True,
        ).stdout.strip()
    except OSError:
        return "unknown"
    return (head or "unknown") + (" (with uncommitted changes)" if dirty else "")


def _load() -> str:
    try:
        return " ".join(f"{v:.2f}" for v in os.getloadavg())
    except OSError:
        return "-"


def _cases(suite: Suite, only: set[str] | None):
    """Yields ``(scene, workload, channels)`` in run order (scenes built lazily)."""
    groups = [(suite.main, suite.plan), (suite.extra, suite.extra_plan)]
    for scene_list, plan in groups:
        for kind, batch in scene_list:
            scene = scenes.tiny_scene() if suite.tiny else scenes.make_scene(kind, batch)
            for name, channels in plan:
                if only is None or name in only:
                    for c in channels:
                        yield scene, name, c
    for voxels in suite.sweep:
        scene = scenes.sweep_scene(voxels)
        for name, channels in _SWEEP:
            if only is None or name in only:
                for c in channels:
                    yield scene, name, c


def _run(args: argparse.Namespace) -> int:
    suite = SUITES[args.suite]
    only = set(args.only.split(",")) if args.only else None
    if only and not only <= set(WORKLOADS):
        raise SystemExit(f"--only: unknown workloads {sorted(only - set(WORKLOADS))}")
    if args.threads:
        torch.set_num_threads(args.threads)
    if not args.no_plots:
        try:
            require_matplotlib("benchmarks", purpose="the benchmark plots (or pass --no-plots)")
        except ImportError as exc:
            raise SystemExit(str(exc)) from None
    opts = Options(
        repeats=args.repeats or suite.repeats,
        warmup=args.warmup,
        spconv=not args.no_spconv,
        memory=not args.no_memory,
        spconv_threads=args.spconv_threads,
    )
    meta = {
        "command": "python -m benchmarks "
        + shlex.join(sys.argv[1:] if args.argv is None else args.argv),
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "commit": _commit(),
        "threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "torch_lattice": str(Path(torch_lattice.__file__).resolve().parent),
        "python": platform.python_version(),
        "suite": args.suite,
        "checked": True,  # baselines compared with the library before timing
        "spconv_threads": opts.spconv_threads,
        "repeats": opts.repeats,
        "load_before": _load(),
        **_machine(),
    }
    # The machine's own limit, measured in this run at this thread count: the
    # denominator of the report's "% of peak" column.
    meta["peak"] = measure_peak(torch.get_num_threads()).as_dict()
    rows: list[dict[str, Any]] = []
    for scene, name, c in _cases(suite, only):
        t0 = time.perf_counter()
        got = WORKLOADS[name].run(scene, c, opts)
        rows.extend(got)
        brief = ", ".join(
            f"{r['impl']} {r['median_ms']:.1f} ms"
            if r["status"] == "ok"
            else f"{r['impl']}: {r['status']}"
            for r in got
        )
        print(f"[{time.perf_counter() - t0:6.1f}s] {name} {scene.name} C={c}: {brief}", flush=True)
    meta["load_after"] = _load()
    out = Path(args.out)
    report.write_json(out / "results.json", meta, rows)
    report.write_markdown(out / "results.md", meta, rows)
    written = ["results.json", "results.md"]
    if not args.no_plots:
        written += [p.name for p in report.write_plots(out, rows, meta.get("peak"))]
    print(f"wrote {', '.join(written)} to {out}")
    return 0


def _report(args: argparse.Namespace) -> int:
    """Rewrites results.md and the plots from an existing results.json."""
    out = Path(args.out)
    src = out / "results.json"
    if not src.exists():  # other non-regular files: read_json names what they are
        raise SystemExit(f"--out: {src} does not exist (run the benchmarks first)")
    _check_outputs(out, ["results.md"] + ([] if args.no_plots else list(report.PLOTS)))
    try:
        meta, rows = report.read_json(src)
        text = report.markdown(meta, rows)
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        # A hand-edited or foreign file: one line naming it, not a traceback.
        raise SystemExit(f"--out: {src} cannot be redrawn: {type(exc).__name__}: {exc}"
                         ) from None
    report.write_text(out / "results.md", text)
    written = ["results.md"]
    if not args.no_plots:
        try:
            written += [p.name for p in report.write_plots(out, rows, meta.get("peak"))]
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise SystemExit(f"--out: the plots of {src} cannot be drawn: "
                             f"{type(exc).__name__}: {exc}") from None
    print(f"wrote {', '.join(written)} to {out}")
    return 0


def _large(args: argparse.Namespace) -> int:
    """Runs the large-input check and writes ``large.json`` and ``large.md``."""
    from benchmarks import large

    out = Path(args.out)
    _check_outputs(out, ("large.json", "large.md"))
    if args.threads:
        torch.set_num_threads(args.threads)
    meta = {
        "command": "python -m benchmarks "
        + shlex.join(sys.argv[1:] if args.argv is None else args.argv),
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "commit": _commit(),
        "torch": torch.__version__,
        "python": platform.python_version(),
        "load_before": _load(),
        **_machine(),
    }
    result = large.run_large(
        voxels=args.voxels,
        channels=args.channels,
        repeats=args.repeats,
        backward=not args.no_backward,
        memory=not args.no_memory,
    )
    meta["load_after"] = _load()
    # Atomically, like the suite's reports: never through a link or into a FIFO.
    text = json.dumps({"meta": meta, **result}, indent=1) + "\n"
    report.write_text(out / "large.json", text)
    report.write_text(out / "large.md", large.markdown(meta, result))
    print(f"wrote large.json, large.md to {out}")
    return 0


def _check_outputs(out: Path, names: Sequence[str]) -> None:
    """Stops before any work when an output in ``out`` exists and is not a regular file
    (a link, a FIFO, a device, a folder): only regular files are replaced."""
    for name in names:
        try:
            refuse_non_regular(out / name)
        except FileExistsError as exc:
            raise SystemExit(f"--out: {exc.strerror}") from None


def _list() -> int:
    for name, suite in SUITES.items():
        kinds = ", ".join(f"{k}-b{b}" if b > 1 else k for k, b in suite.main + suite.extra)
        print(f"suite {name}: scenes {kinds or 'tiny'}; sweep {list(suite.sweep)}")
    for w in WORKLOADS.values():
        print(f"workload {w.name}: {w.description}")
    return 0


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m benchmarks", description=__doc__)
    sub = p.add_subparsers(dest="cmd", required=True)
    run = sub.add_parser("run", help="run a suite and write results")
    run.add_argument("--suite", choices=sorted(SUITES), default="default")
    run.add_argument("--out", default=str(ROOT / "docs" / "benchmarks"))
    run.add_argument("--only", help="comma-separated workload names")
    run.add_argument("--repeats", type=int, help="timed repetitions (default: per suite)")
    run.add_argument("--warmup", type=int, default=1)
    run.add_argument("--threads", type=int, help="torch.set_num_threads before running")
    run.add_argument("--no-plots", action="store_true", help="skip the PNG plots")
    run.add_argument("--no-spconv", action="store_true", help="skip spconv even if installed")
    run.add_argument(
        "--spconv-threads",
        type=int,
        default=bl.SPCONV_THREADS,
        help="torch threads while spconv runs (default 1: its CPU build is wrong at more)",
    )
    run.add_argument("--no-memory", action="store_true", help="skip peak-memory runs")
    rep = sub.add_parser("report", help="redraw results.md and plots from results.json")
    rep.add_argument("--out", default=str(ROOT / "docs" / "benchmarks"))
    rep.add_argument("--no-plots", action="store_true", help="skip the PNG plots")
    sub.add_parser("list", help="list suites and workloads")
    pk = sub.add_parser("peak", help="the CPU's measured arithmetic peak per thread count")
    pk.add_argument("--max-threads", type=int, default=os.cpu_count() or 1)
    big = sub.add_parser("large", help="large-input check (5M voxels): time and peak memory")
    big.add_argument("--voxels", type=int, default=5_000_000)
    big.add_argument("--channels", type=int, default=16)
    big.add_argument("--repeats", type=int, default=3, help="timed runs per step")
    big.add_argument("--threads", type=int, help="torch.set_num_threads before running")
    big.add_argument("--no-backward", action="store_true", help="skip forward + backward")
    big.add_argument("--no-memory", action="store_true", help="skip peak-memory runs")
    big.add_argument("--out", default=str(ROOT / "docs" / "benchmarks"))
    return p


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point; returns the process exit code."""
    args = _parser().parse_args(argv)
    args.argv = None if argv is None else list(argv)
    if args.cmd == "list":
        return _list()
    if args.cmd == "report":
        return _report(args)
    if args.cmd == "peak":
        if args.max_threads < 1:
            raise SystemExit("--max-threads: must be >= 1")
        from benchmarks import peak

        return peak.main(args.max_threads)
    if args.cmd == "large":
        for name in ("voxels", "channels", "repeats"):
            if getattr(args, name) < 1:
                raise SystemExit(f"--{name}: must be >= 1")
        if args.threads is not None and args.threads < 1:
            raise SystemExit("--threads: must be >= 1")
        return _large(args)
    if args.repeats is not None and args.repeats < 1:
        raise SystemExit("--repeats: must be >= 1")
    if args.threads is not None and args.threads < 1:
        raise SystemExit("--threads: must be >= 1")
    if args.spconv_threads < 1:
        raise SystemExit("--spconv-threads: must be >= 1")
    return _run(args)
