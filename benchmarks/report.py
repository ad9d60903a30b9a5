"""Writes a run's results: ``results.json``, ``results.md`` and PNG plots.

Every file is written to a temporary name beside its destination and renamed into
place (torch_lattice.atomic_file), so an interrupted run never leaves a half-written
file, and each file gets the mode the user's umask gives a new file.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Iterator
from functools import partial
from pathlib import Path
from typing import Any

from benchmarks import workloads as wl
from torch_lattice.atomic_file import atomic_write
from torch_lattice.optional_deps import require_matplotlib
from torch_lattice.regular_file import parse_json, read_regular_file

__all__ = [
    "PLOTS",
    "Targets",
    "markdown",
    "read_json",
    "write_json",
    "write_markdown",
    "write_plots",
    "write_text",
]

Row = dict[str, Any]
# A suite's results.json is hundreds of kilobytes; a larger one is not a results file.
MAX_RESULTS_BYTES = 64 * 2**20
# The keys every results row needs, and their types (read_json).
_ROW_KINDS = {"workload": str, "scene": str, "impl": str, "channels": int, "status": str}
PLOTS = ("speedup.png", "sweep.png", "throughput.png")
TARGET_SCENES = ("surface", "lidar")


def _atomic_write(path: Path, write: Callable[[Path], None]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write(path, write)


def write_text(path: Path, text: str) -> None:
    """``text`` into ``path`` atomically (its folder made where missing)."""
    _atomic_write(path, lambda p: p.write_text(text))


def write_json(path: Path, meta: dict[str, Any], rows: list[Row]) -> None:
    """``{"meta": ..., "results": [...]}`` with sorted keys."""
    text = json.dumps({"meta": meta, "results": rows}, indent=1, sort_keys=True)
    _atomic_write(path, lambda p: p.write_text(text + "\n"))


def read_json(path: Path) -> tuple[dict[str, Any], list[Row]]:
    """``(meta, rows)`` of a ``results.json`` written by :func:`write_json`.

    Raises:
        ValueError: the file is not such a results file.
    """
    data = parse_json(read_regular_file(path, "results", max_bytes=MAX_RESULTS_BYTES),
                      str(path), "is not UTF-8 JSON")
    if not isinstance(data, dict) or "meta" not in data or "results" not in data:
        raise ValueError(f"{path}: not a benchmarks results.json (needs meta and results)")
    meta, rows = data["meta"], data["results"]
    if not isinstance(meta, dict):
        raise ValueError(f"{path}: meta must be an object, got {type(meta).__name__}")
    if not isinstance(rows, list):
        raise ValueError(f"{path}: results must be a list, got {type(rows).__name__}")
    for i, row in enumerate(rows):
        bad = [k for k, kind in _ROW_KINDS.items()
               if not isinstance(row, dict) or not isinstance(row.get(k), kind)]
        if bad:
            raise ValueError(f"{path}: results[{i}] needs {', '.join(bad)} (each row: "
                             "workload, scene, impl and status strings, channels an int)")
    return meta, rows


# --------------------------------------------------------------------------------------
# Lookups over result rows
# --------------------------------------------------------------------------------------


def _ok(rows: Iterable[Row]) -> list[Row]:
    return [r for r in rows if r.get("status") == "ok"]


def _matching(
    rows: list[Row], workload: str, scene: str, channels: int, impl: str
) -> Iterator[Row]:
    """The rows of one (workload, scene, channels, impl), in order."""
    key = (workload, scene, channels, impl)
    return (r for r in rows if (r["workload"], r["scene"], r["channels"], r["impl"]) == key)


def _find(rows: list[Row], workload: str, scene: str, channels: int, impl: str) -> Row | None:
    matching = _matching(rows, workload, scene, channels, impl)
    return next((r for r in matching if r.get("status") == "ok"), None)


def _any(rows: list[Row], workload: str, scene: str, channels: int, impl: str) -> Row | None:
    """The row of ``impl`` whatever its status (ok, disagrees, not available)."""
    return next(_matching(rows, workload, scene, channels, impl), None)


def _cell(rows: list[Row], case: tuple[str, str, int], impl: str, threads: Any) -> str:
    """A baseline's cell: time and speed-up, its thread count when it differs from the
    run's, or why it has no time when it disagreed with the library."""
    ref = _any(rows, *case, impl)
    if ref is None:
        return "-"
    if ref.get("status") != "ok":
        return ref["status"] if ref["status"].startswith("disagrees") else "-"
    ratio = _ratio(rows, *case, impl)
    shown = f"{ref['median_ms']:.1f}" + ("" if ratio is None else f" ({ratio:.2f}x")
    own = ref.get("threads")
    if own is not None and own != threads:
        shown += f", {own} thread" + ("s" if own != 1 else "")
    return shown + ("" if ratio is None else ")")


def _ratio(rows: list[Row], workload: str, scene: str, c: int, base: str) -> float | None:
    """``baseline median / library median`` (> 1: the library is faster)."""
    lat = _find(rows, workload, scene, c, wl.LATTICE)
    ref = _find(rows, workload, scene, c, base)
    if lat is None or ref is None or lat["median_ms"] <= 0:
        return None
    return ref["median_ms"] / lat["median_ms"]


def _cases(rows: list[Row]) -> list[tuple[str, str, int]]:
    seen: dict[tuple[str, str, int], None] = {}
    for r in rows:
        if not r["scene"].startswith("sweep-"):
            seen[(r["workload"], r["scene"], r["channels"])] = None
    return list(seen)


def _sweep(rows: list[Row], workload: str, impl: str) -> list[Row]:
    out = [
        r
        for r in _ok(rows)
        if r["scene"].startswith("sweep-") and r["workload"] == workload and r["impl"] == impl
    ]
    return sorted(out, key=lambda r: r["voxels"])


# --------------------------------------------------------------------------------------
# Targets of the CPU-speed issue
# --------------------------------------------------------------------------------------


class Targets:
    """Checks of the issue's targets against a run's rows."""

    def __init__(self, rows: list[Row], channels: int = 64) -> None:
        self.rows = rows
        self.c = channels

    def lines(self) -> list[tuple[str, str, str]]:
        """``(target, measured, verdict)`` rows; verdict is met / missed / not measured."""
        out = []
        for scene in TARGET_SCENES:
            checks = (
                (f"SubmConv3d fwd C={self.c}, {scene}: >= 3x torch", "subm3_fwd", self.c, wl.TORCH),
                (
                    f"SubmConv3d fwd+bwd C={self.c}, {scene}: >= 3x torch",
                    "subm3_fwdbwd",
                    self.c,
                    wl.TORCH,
                ),
                (f"kernel map, {scene}: >= 3x torch builder", "kmap_subm3", 0, wl.TORCH_KMAP),
            )
            for text, workload, c, base in checks:
                out.append(self._at_least(text, _ratio(self.rows, workload, scene, c, base), 3.0))
            for base in (wl.MM, wl.MM_SQUARE):
                r = _ratio(self.rows, "subm3_fwd", scene, self.c, base)
                text = f"stretch: fwd C={self.c}, {scene}: >= 60% of {base} throughput"
                out.append(self._at_least(text, r, 0.6, percent=True))
        for scene in TARGET_SCENES:
            for c in (64, 128, 256):
                r = _ratio(self.rows, "subm3_fwd_bf16", scene, c, wl.LATTICE_FP32)
                text = f"SubmConv3d fwd bf16 C={c}, {scene}: >= 1.6x our fp32"
                out.append(self._at_least(text, r, 1.6))
        out.append(self._sweep_line())
        return out

    @staticmethod
    def _at_least(text: str, value: float | None, goal: float, percent: bool = False):
        if value is None:
            return (text, "-", "not measured")
        shown = f"{100 * value:.0f}%" if percent else f"{value:.2f}x"
        return (text, shown, "met" if value >= goal else "missed")

    def _sweep_line(self) -> tuple[str, str, str]:
        text = f"time per voxel, SubmConv3d fwd C={self.c}, across the size sweep: <= 1.5x spread"
        pts = [r for r in _sweep(self.rows, "subm3_fwd", wl.LATTICE) if r["channels"] == self.c]
        if len(pts) < 2:
            return (text, "-", "not measured")
        per = [r["ns_per_voxel"] for r in pts]
        spread = max(per) / min(per)
        span = f"{pts[0]['voxels']:,}-{pts[-1]['voxels']:,} voxels"
        return (text, f"{spread:.2f}x ({span})", "met" if spread <= 1.5 else "missed")


# --------------------------------------------------------------------------------------
# Markdown
# --------------------------------------------------------------------------------------


def _fmt(v: float | None, spec: str = ".1f", suffix: str = "") -> str:
    return "-" if v is None else f"{v:{spec}}{suffix}"


def _row_peak(workload: str, peak: dict[str, Any], kernels: str | None = None) -> float | None:
    """The peak a workload's GFLOP/s is divided by: for the bfloat16 rows, the peak of
    the instruction their kernels ran on (AMX tiles where ``kernels`` is amx_bf16, else
    the dot product, where measured); fp32 FMA for the rest."""
    if workload.endswith("_bf16"):
        if kernels == "amx_bf16" and peak.get("amx_bf16_gflops"):
            return peak["amx_bf16_gflops"]
        if peak.get("bf16_gflops"):
            return peak["bf16_gflops"]
    return peak.get("fp32_gflops")


def _case_line(rows: list[Row], case: tuple[str, str, int], threads: Any = None,
               peak: float | None = None) -> str | None:
    workload, scene, c = case
    lat = _find(rows, workload, scene, c, wl.LATTICE)
    if lat is None:
        return None
    base = wl.TORCH_KMAP if workload == "kmap_subm3" else wl.TORCH
    cells = [workload, scene, f"{lat['voxels']:,}", str(c or "-"), _fmt(lat["median_ms"])]
    for impl in (base, wl.DENSE, wl.SPCONV):
        cells.append(_cell(rows, case, impl, threads))
    mm = _find(rows, workload, scene, c, wl.MM)
    sq = _find(rows, workload, scene, c, wl.MM_SQUARE)
    cells.append(_fmt(lat.get("gflops")))
    cells.append(_fmt(100 * lat["gflops"] / peak if peak and lat.get("gflops") else None,
                      ".0f", "%"))
    for ref in (mm, sq):
        pct = None
        if ref is not None and lat.get("gflops") and ref.get("gflops"):
            pct = 100 * lat["gflops"] / ref["gflops"]
        cells.append(_fmt(pct, ".0f", "%"))
    ref = _find(rows, workload, scene, c, base)
    cells.append(f"{_fmt(lat.get('peak_mb'), '.0f')} / {_fmt(ref and ref.get('peak_mb'), '.0f')}")
    return "| " + " | ".join(cells) + " |"


def _main_table(rows: list[Row], threads: Any = None,
                peak: dict[str, Any] | None = None, kernels: str | None = None) -> list[str]:
    head = (
        "| workload | scene | voxels | C | lattice ms | torch ms (speed-up) | dense ms "
        "(speed-up) | spconv ms (speed-up) | lattice GFLOP/s | % of peak | "
        "% of mm same shape | % of mm square | peak MiB lattice / torch |"
    )
    lines = [head, "|" + "---|" * 13]
    for case in _cases(rows):
        line = _case_line(rows, case, threads, _row_peak(case[0], peak or {}, kernels))
        if line:
            lines.append(line)
    return lines


def _sweep_table(rows: list[Row]) -> list[str]:
    lat = _sweep(rows, "subm3_fwd", wl.LATTICE)
    if not lat:
        return []
    lines = [
        "| voxels | C | lattice fwd ns/voxel | torch fwd ns/voxel | lattice kmap ns/voxel | "
        "torch kmap ns/voxel |",
        "|---|---|---|---|---|---|",
    ]
    for r in lat:
        cells = [f"{r['voxels']:,}", str(r["channels"]), _fmt(r["ns_per_voxel"])]
        for workload, impl, c in (
            ("subm3_fwd", wl.TORCH, r["channels"]),
            ("kmap_subm3", wl.LATTICE, 0),
            ("kmap_subm3", wl.TORCH_KMAP, 0),
        ):
            ref = _find(rows, workload, r["scene"], c, impl)
            cells.append(_fmt(ref and ref["ns_per_voxel"]))
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def _half_table(rows: list[Row], peak: dict[str, Any], kernels: str | None = None) -> list[str]:
    """bfloat16 / float16 layers beside the same layer in float32, run side by side."""
    lines = []
    for case in _cases(rows):
        workload, scene, c = case
        if not workload.endswith(("_bf16", "_fp16")):
            continue
        lat = _find(rows, workload, scene, c, wl.LATTICE)
        fp32 = _find(rows, workload, scene, c, wl.LATTICE_FP32)
        if lat is None or fp32 is None:
            continue
        top = _row_peak(workload, peak, kernels)
        pct = 100 * lat["gflops"] / top if top and lat.get("gflops") else None
        lines.append(
            f"| {workload} | {scene} | {c} | "
            f"{_fmt(lat['median_ms'])} | {_fmt(fp32['median_ms'])} | "
            f"{fp32['median_ms'] / lat['median_ms']:.2f}x | "
            f"{_fmt(lat.get('gflops'))} | {_fmt(pct, '.0f', '%')} |"
        )
    if not lines:
        return []
    head = [
        "| workload | scene | C | half ms | our fp32 ms | speed-up over our fp32 | "
        "half GFLOP/s | % of peak |",
        "|---|---|---|---|---|---|---|---|",
    ]
    return head + lines


def markdown(meta: dict[str, Any], rows: list[Row]) -> str:
    """The results page: run facts, target verdicts, the full table, the sweep, gaps."""
    out = ["# Benchmark results", ""]
    threads = meta.get("threads")
    keys = ("command", "date", "commit", "machine", "cpu_flags", "kernels", "threads", "torch")
    for key in keys:
        out.append(f"- {key}: `{meta.get(key, '-')}`")
    out.append(
        f"- load average before / after: {meta.get('load_before')} / {meta.get('load_after')}"
    )
    out += ["", "Medians of the repetitions; speed-up = baseline time / lattice time.", ""]
    if meta.get("checked"):
        out += [
            "Every baseline's output was compared with the library's before it was timed; one",
            "that disagreed shows `disagrees: max |diff| = ...` instead of a time.",
        ]
    else:
        out += ["This run predates the output check: no baseline was compared before timing."]
    single = sorted({r["impl"] for r in _ok(rows) if r.get("threads") not in (None, threads)})
    if single:
        out += [
            "Timed at their own thread count (shown in their cells): " + ", ".join(single) + "."
        ]
        if wl.SPCONV in single:
            out.append("spconv's CPU build returns wrong sums at more than one torch thread.")
    racy = {r.get("threads", threads) for r in _ok(rows) if r["impl"] == wl.SPCONV}
    racy = {n for n in racy if isinstance(n, int) and n > 1}
    if racy:
        out.append(
            f"spconv was timed at {max(racy)} threads, where its CPU build returns wrong sums"
            " in many calls: its times are void."
        )
    out.append("")
    out += ["## Targets", "", "| target | measured | verdict |", "|---|---|---|"]
    out += [f"| {a} | {b} | {c} |" for a, b, c in Targets(rows).lines()]
    peak = meta.get("peak") or {}
    fp32_peak = peak.get("fp32_gflops")
    if fp32_peak:
        bf16, amx = peak.get("bf16_gflops"), peak.get("amx_bf16_gflops")
        out += ["", f"Measured peak in this run at {peak.get('threads')} threads "
                f"(`python -m benchmarks peak`, register-only loops): fp32 FMA "
                f"({peak.get('fp32_isa')}) {fp32_peak:.0f} GFLOP/s"
                + (f", bf16 dot product {bf16:.0f} GFLOP/s" if bf16 else "")
                + (f", bf16 AMX tiles {amx:.0f} GFLOP/s" if amx else "")
                + "; \"% of peak\" divides bfloat16 rows by the peak of the instruction"
                " their kernels ran on (AMX tiles with kernels amx_bf16, else the dot"
                " product, where measured) and the rest by the fp32 one."]
    else:
        out += ["", "No peak was measured in this run (it is older than the peak probe): "
                "the \"% of peak\" column is empty."]
    out += ["", "## All workloads", "", *_main_table(rows, threads, peak, meta.get("kernels"))]
    half = _half_table(rows, peak, meta.get("kernels"))
    if half:
        out += ["", "## Half precision beside float32", "", *half]
    sweep = _sweep_table(rows)
    if sweep:
        out += ["", "## Size sweep (height fields)", "", *sweep]
    missing = [r for r in rows if r.get("status") != "ok"]
    if missing:
        out += ["", "## Not timed", ""]
        for r in missing:
            where = f"{r['workload']} / {r['scene']} / C={r['channels']} / {r['impl']}"
            out.append(f"- {where}: {r['status']}")
    return "\n".join(out) + "\n"


def write_markdown(path: Path, meta: dict[str, Any], rows: list[Row]) -> None:
    text = markdown(meta, rows)
    _atomic_write(path, lambda p: p.write_text(text))


# --------------------------------------------------------------------------------------
# Plots
# --------------------------------------------------------------------------------------


def _plot_speedup(plt: Any, rows: list[Row], path: Path) -> None:
    cases = [
        c
        for c in _cases(rows)
        if _find(rows, *c, wl.LATTICE)
        and any(
            r["impl"] not in (wl.LATTICE, wl.MM, wl.MM_SQUARE)
            for r in _ok(rows)
            if (r["workload"], r["scene"], r["channels"]) == c
        )
    ]
    labels, series = [], {wl.TORCH: [], wl.DENSE: [], wl.SPCONV: []}
    for workload, scene, c in cases:
        labels.append(f"{workload}\n{scene}" + (f" C={c}" if c else ""))
        for impl in series:
            base = wl.TORCH_KMAP if workload == "kmap_subm3" and impl == wl.TORCH else impl
            series[impl].append(_ratio(rows, workload, scene, c, base) or float("nan"))
    fig, ax = plt.subplots(figsize=(max(8, 0.7 * len(labels)), 5))
    width = 0.27
    for k, (impl, vals) in enumerate(series.items()):
        xs = [i + (k - 1) * width for i in range(len(vals))]
        ax.bar(xs, vals, width, label=f"vs {impl}")
    ax.axhline(3.0, color="k", linestyle="--", linewidth=1, label="3x target")
    ax.set_xticks(range(len(labels)), labels, rotation=70, fontsize=7)
    ax.set_yscale("log")
    ax.set_ylabel("speed-up of torch_lattice (baseline / lattice time, log)")
    ax.set_title("torch_lattice speed-up over each baseline")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _plot_sweep(plt: Any, rows: list[Row], path: Path) -> None:
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for workload, impl, label in (
        ("subm3_fwd", wl.LATTICE, "lattice SubmConv3d fwd"),
        ("subm3_fwd", wl.TORCH, "torch gather-scatter fwd"),
        ("kmap_subm3", wl.LATTICE, "lattice kernel map"),
        ("kmap_subm3", wl.TORCH_KMAP, "torch kernel map"),
    ):
        pts = _sweep(rows, workload, impl)
        if pts:
            ax.plot([r["voxels"] for r in pts], [r["ns_per_voxel"] for r in pts], "o-", label=label)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("voxels")
    ax.set_ylabel("ns per voxel (median)")
    ax.set_title("Time per voxel across the size sweep")
    ax.legend(fontsize=8)
    ax.grid(True, which="both", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _plot_throughput(plt: Any, rows: list[Row], path: Path, peak: dict[str, Any]) -> None:
    fwd = [
        r for r in _ok(rows) if r["workload"] == "subm3_fwd" and not r["scene"].startswith("sweep-")
    ]
    # Scenes timed at several channel counts (the others have a single point).
    scenes = sorted(
        {
            r["scene"]
            for r in fwd
            if len({q["channels"] for q in fwd if q["scene"] == r["scene"]}) > 1
        }
    ) or sorted({r["scene"] for r in fwd})
    fig, axes = plt.subplots(1, max(1, len(scenes)), figsize=(5 * max(1, len(scenes)), 4.2))
    axes = list(axes) if len(scenes) > 1 else [axes]
    for ax, scene in zip(axes[: len(scenes)], scenes, strict=True):
        for impl in (wl.LATTICE, wl.TORCH, wl.DENSE, wl.SPCONV, wl.MM, wl.MM_SQUARE):
            pts = sorted(
                (r for r in fwd if r["scene"] == scene and r["impl"] == impl),
                key=lambda r: r["channels"],
            )
            if pts:
                ax.plot([r["channels"] for r in pts], [r["gflops"] for r in pts], "o-", label=impl)
        if peak.get("fp32_gflops"):  # the same run's fp32 limit: what "% of peak" divides by
            ax.axhline(peak["fp32_gflops"], color="k", linestyle="--", linewidth=1,
                       label=f"fp32 FMA peak, {peak['fp32_gflops']:.0f} GFLOP/s (this run)")
        ax.set_xscale("log", base=2)
        ax.set_xlabel("channels (C_in = C_out)")
        ax.set_ylabel("useful GFLOP/s")
        ax.set_title(f"SubmConv3d fwd, {scene}")
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def write_plots(out_dir: Path, rows: list[Row], peak: dict[str, Any] | None = None) -> list[Path]:
    """Writes :data:`PLOTS` into ``out_dir``; ``throughput.png`` draws the fp32 peak of
    ``peak`` (the run's ``meta["peak"]``) beside the rates where it was measured.

    Raises:
        ImportError: matplotlib is not installed; the message names the ``benchmarks``
            extra (and ``--no-plots``).
    """
    plt = require_matplotlib("benchmarks", purpose="the benchmark plots (or pass --no-plots)")
    paths = []
    throughput = partial(_plot_throughput, peak=peak or {})
    for name, draw in zip(PLOTS, (_plot_speedup, _plot_sweep, throughput), strict=True):
        path = out_dir / name
        _atomic_write(path, lambda tmp, draw=draw: draw(plt, rows, tmp))
        paths.append(path)
    return paths
