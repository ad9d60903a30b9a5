"""Large-input check: ``python -m benchmarks large`` (5 million voxels on the CPU by default).

The suites in :mod:`benchmarks.cli` compare implementations on scenes of up to about a
million voxels. This check runs the library alone on one much larger scene and records,
for each step, the wall time and the peak memory:

* ``scene``: building the coordinates (a square height field, one voxel per column);
* ``kmap_subm3``: the 3x3x3 submanifold kernel map (``lattice::kernel_map``: ``nbr`` and
  ``rev``), built from scratch on every call;
* ``subm3_fwd_cold``: ``SubmConv3d(C, C, 3)`` forward on a fresh tensor (map built inside);
* ``subm3_fwd``: the same forward with the map cached on the tensor (steady state);
* ``subm3_fwdbwd``: forward + backward (input and weight gradients), map cached.

Peak memory is reported two ways: the growth of the resident set sampled while one
untimed run executes (:func:`benchmarks.timing.peak_rss_growth_mb`), and the process's
``ru_maxrss`` (the high-water mark since start) after each step, with its growth over the
step. Times are the median of ``repeats`` runs after one warm-up (the cold forward and
the scene are timed once each: warming them up would make them warm).
"""

from __future__ import annotations

import gc
import resource
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

import torch

import torch_lattice as tl
from benchmarks.scenes import sweep_scene
from benchmarks.timing import peak_rss_growth_mb
from torch_lattice.ops.kmap import kernel_map

__all__ = ["DEFAULT_VOXELS", "maxrss_mb", "run_large"]

DEFAULT_VOXELS = 5_000_000


def maxrss_mb() -> float:
    """The process's resident-set high-water mark (``ru_maxrss``), in MiB."""
    kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    # Linux reports KiB, macOS bytes.
    return kib / (2**20 if sys.platform == "darwin" else 2**10)


def _step(
    name: str,
    fn: Callable[[], object],
    repeats: int,
    warm: bool,
    memory: bool,
    log: Callable[[str], None],
) -> dict[str, Any]:
    before = maxrss_mb()
    if warm:
        fn()
    times = []
    for _ in range(repeats):
        gc.collect()
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1e3)
    peak = peak_rss_growth_mb(fn) if memory else None
    after = maxrss_mb()
    row = {
        "step": name,
        "median_ms": round(statistics.median(times), 2),
        "times_ms": [round(t, 2) for t in times],
        "peak_rss_growth_mb": None if peak is None else round(peak, 1),
        "maxrss_mb": round(after, 1),
        "maxrss_growth_mb": round(after - before, 1),
    }
    log(
        f"{name}: median {row['median_ms']:.1f} ms over {repeats}; "
        f"peak RSS growth {row['peak_rss_growth_mb']} MiB; ru_maxrss {row['maxrss_mb']} MiB"
    )
    return row


def run_large(
    voxels: int = DEFAULT_VOXELS,
    channels: int = 16,
    repeats: int = 3,
    backward: bool = True,
    memory: bool = True,
    log: Callable[[str], None] = print,
) -> dict[str, Any]:
    """Runs the large-input check and returns ``{"scene": ..., "steps": [...]}``.

    Args:
        voxels: About how many voxels (a square height field with ``round(sqrt(voxels))``
            columns per side).
        channels: ``C`` of the ``SubmConv3d(C, C, 3)`` layer.
        repeats: Timed runs per step (after one warm-up).
        backward: Also time forward + backward.
        memory: Also measure peak resident-set growth (one extra run per step).
        log: Called with one line per finished step.

    Raises:
        ValueError: ``voxels``, ``channels`` or ``repeats`` below 1.
    """
    for name, v in (("voxels", voxels), ("channels", channels), ("repeats", repeats)):
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ValueError(f"{name}: must be an int >= 1, got {v!r}")
    start_rss = maxrss_mb()
    t0 = time.perf_counter()
    scene = sweep_scene(voxels)
    scene_ms = (time.perf_counter() - t0) * 1e3
    coords = scene.coords
    n = scene.voxels
    steps: list[dict[str, Any]] = [
        {
            "step": "scene",
            "median_ms": round(scene_ms, 2),
            "times_ms": [round(scene_ms, 2)],
            "peak_rss_growth_mb": None,
            "maxrss_mb": round(maxrss_mb(), 1),
            "maxrss_growth_mb": round(maxrss_mb() - start_rss, 1),
        }
    ]
    log(f"scene {scene.name}: {n} voxels, built in {scene_ms:.0f} ms")

    ks, s, p, d = [3, 3, 3], [1, 1, 1], [1, 1, 1], [1, 1, 1]
    steps.append(
        _step(
            "kmap_subm3",
            lambda: kernel_map(coords, coords, ks, s, p, d),
            repeats,
            True,
            memory,
            log,
        )
    )

    torch.manual_seed(0)
    conv = tl.nn.SubmConv3d(channels, channels, 3, bias=False)
    g = torch.Generator().manual_seed(1)
    feats = torch.randn(n, channels, generator=g)

    @torch.no_grad()
    def cold() -> object:
        return conv(tl.SparseTensor(feats, coords))

    steps.append(_step("subm3_fwd_cold", cold, 1, False, memory, log))

    x = tl.SparseTensor(feats, coords)
    steps.append(_step("subm3_fwd", torch.no_grad()(lambda: conv(x)), repeats, True, memory, log))
    if backward:
        feats_g = feats.clone().requires_grad_(True)
        xg = tl.SparseTensor(feats_g, coords)
        ones = torch.ones(n, channels)

        def fwdbwd() -> None:
            conv.zero_grad(set_to_none=True)
            feats_g.grad = None
            conv(xg).feats.backward(ones)

        steps.append(_step("subm3_fwdbwd", fwdbwd, repeats, True, memory, log))

    # Counted last, so that its temporaries do not raise the high-water mark of a step.
    pairs = int((kernel_map(coords, coords, ks, s, p, d)[0] >= 0).sum())
    return {
        "scene": {
            "name": scene.name,
            "voxels": n,
            "description": scene.description,
            "pairs_subm3": pairs,
        },
        "channels": channels,
        "repeats": repeats,
        "threads": torch.get_num_threads(),
        "start_maxrss_mb": round(start_rss, 1),
        "steps": steps,
    }


def markdown(meta: dict[str, Any], result: dict[str, Any]) -> str:
    """The result as a Markdown page (``large.md``)."""
    sc = result["scene"]
    lines = [
        "# Large-input check (CPU)",
        "",
        f"Command: `{meta['command']}`  ",
        f"Date: {meta['date']}; commit `{meta['commit']}`; {meta['machine']}; "
        f"kernels {meta['kernels']}; torch {meta['torch']}; {result['threads']} threads; "
        f"load average before {meta['load_before']}, after {meta['load_after']}.",
        "",
        f"Scene: {sc['name']} ({sc['description']}), {sc['voxels']:,} voxels, "
        f"{sc['pairs_subm3']:,} 3x3x3 submanifold pairs. `SubmConv3d({result['channels']}, "
        f"{result['channels']}, 3)`, fp32, default dataflow. Median of "
        f"{result['repeats']} timed runs after one warm-up (cold forward: one run). "
        "Threads: the machine's cores, shared with whatever else ran (see the load).",
        "",
        "| step | median ms | ns / voxel | peak RSS growth MiB | ru_maxrss MiB | "
        "ru_maxrss growth MiB |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for r in result["steps"]:
        peak = "-" if r["peak_rss_growth_mb"] is None else f"{r['peak_rss_growth_mb']:.0f}"
        lines.append(
            f"| {r['step']} | {r['median_ms']:.1f} | {r['median_ms'] * 1e6 / sc['voxels']:.0f} "
            f"| {peak} | {r['maxrss_mb']:.0f} | {r['maxrss_growth_mb']:.0f} |"
        )
    lines += [
        "",
        f"Process ru_maxrss at start (torch imported): {result['start_maxrss_mb']:.0f} MiB.",
        "",
    ]
    return "\n".join(lines)
