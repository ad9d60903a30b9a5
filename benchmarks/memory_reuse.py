"""SparseResUNet42 with and without :func:`torch_lattice.reuse_cpu_memory`, and optionally
beside another checkout of the library.

``python -m benchmarks.memory_reuse [--scenes lidar surface] [--rounds 3] [--steps 5]
[--base CHECKOUT]``

The setting is process-wide and cannot be undone for memory already kept, so each side runs
in its own processes, alternated ``--rounds`` times so all see the same machine state; each
process times ``--steps`` calls after one warm-up (medians) and reports its peak resident
size. Each step is the benchmark suite's network call
(:func:`benchmarks.resunet_step.resunet_step`: eval forward, or forward + backward of a
squared-mean loss, maps built in the call) on the scene's features, made once by this
process and handed to every side. ``--base`` adds a side that imports ``torch_lattice``
from another checkout (built in place, e.g. a ``git worktree`` of an older commit) with
glibc's default malloc: the whole network of that build against this one's, its Python
layer included. This build's two sides must compute the same loss to the bit, the base
within ``BASE_RTOL`` of it, before any time is reported.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

SIDES = ("default", "reuse")
STEPS = ("eval", "train")
# A side's process runs this file; the repository root holds benchmarks/.
ROOT = Path(__file__).resolve().parents[1]


# How far the base checkout's loss may be from this build's.  Builds before round fourteen
# ran torch's float32 batch norm: on the LiDAR scan their training loss (0.6013839) is
# 6.8e-5 from the float64 network's (0.6013430), which this build's float32 loss matches to
# 1e-7; eval forwards agree within 1e-5.
BASE_RTOL = 2e-4


def import_library(checkout: str | None) -> Any:
    """``torch_lattice`` from ``checkout`` (another checkout, built in place), or this
    one's where None; stops where the import found the library elsewhere."""
    if checkout:  # that checkout's library, not this one's
        sys.path.insert(0, checkout)
    import torch_lattice as tl

    where = Path(tl.__file__).resolve()
    if checkout and Path(checkout).resolve() not in where.parents:
        raise SystemExit(f"--base {checkout}: torch_lattice was imported from {where}")
    return tl


def run_child(module: str, args: list[str], env: dict[str, str] | None = None) -> dict:
    """``python -m module *args`` from the repository root: the JSON of its last line."""
    cmd = [sys.executable, "-m", module, *args]
    out = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, env=env)
    if out.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed:\n{out.stderr}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def _child(inputs: str, step_name: str, side: str, steps: int, checkout: str | None) -> dict:
    tl = import_library(checkout)
    import torch

    from benchmarks.resunet_step import resunet_step

    if side == "reuse" and not tl.reuse_cpu_memory():
        raise SystemExit("reuse_cpu_memory: not applied (the C library is not glibc)")
    data = torch.load(inputs)
    train = step_name == "train"
    net_step = resunet_step(
        tl.backbones.SparseResUNet42, tl.SparseTensor, data["coords"], data["feats"], train,
        torch.float32,
    )  # fmt: skip

    def step() -> float:
        out = net_step()  # the loss (training), or the output (eval)
        return float(out if train else out.feats.square().mean())

    loss = step()
    times = []
    for _ in range(steps):
        t0 = time.perf_counter()
        step()
        times.append(time.perf_counter() - t0)
    with open("/proc/self/status", encoding="ascii") as f:
        hwm = next((int(line.split()[1]) for line in f if line.startswith("VmHWM")), 0)
    return {"median_s": statistics.median(times), "peak_rss_mib": hwm / 1024, "loss": loss}


def _run_child(inputs: str, step: str, side: str, steps: int, base: str | None) -> dict:
    args = ["--child", inputs, step, side, "--steps", str(steps)]
    return run_child("benchmarks.memory_reuse",
                     args + (["--checkout", base] if side == "base" and base else []))


def _inputs(scene_name: str, folder: str) -> str:
    """The scene's coordinates and 4-channel features, saved for every side."""
    import torch

    from benchmarks.builds import _scene
    from benchmarks.workloads import _features

    scene = _scene(scene_name)
    path = str(Path(folder) / f"{scene_name}.pt")
    torch.save({"coords": scene.coords, "feats": _features(scene.voxels, 4)}, path)
    return path


def _row(scene: str, step: str, got: dict[str, list[dict]]) -> str:
    sides = list(got)
    losses = {r["loss"] for side in SIDES for r in got[side]}
    if len(losses) != 1:
        raise SystemExit(f"{scene} {step}: default and reuse computed different losses")
    (loss,) = losses
    far = [r["loss"] for r in got.get("base", []) if abs(r["loss"] - loss) > BASE_RTOL * abs(loss)]
    if far:
        raise SystemExit(f"{scene} {step}: the base checkout's loss {far[0]!r} differs from "
                         f"this build's {loss!r} by more than {BASE_RTOL:g} (relative)")
    med = {side: statistics.median(r["median_s"] for r in got[side]) for side in sides}
    rss = " / ".join(f"{max(r['peak_rss_mib'] for r in got[side]):.0f}" for side in sides)
    ratios = " | ".join(f"{med[sides[0]] / med[side]:.2f}x" for side in sides[1:])
    times = " | ".join(f"{med[side]:.2f}" for side in sides)
    return f"| {scene} | {step} | {times} | {ratios} | {rss} |"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--scenes", nargs="+", default=["lidar", "surface"])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--base", metavar="CHECKOUT", help="another checkout, built in place")
    parser.add_argument("--child", nargs=3, metavar=("INPUTS", "STEP", "SIDE"))
    parser.add_argument("--checkout", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        print(json.dumps(_child(*args.child, args.steps, args.checkout)))
        return 0
    sides = (("base",) if args.base else ()) + SIDES
    first = sides[0]
    head = " | ".join(f"{s} s" for s in sides) + " | " + " | ".join(
        f"{first} / {s}" for s in sides[1:]
    )
    print(f"| scene | step | {head} | peak RSS MiB {' / '.join(sides)} |")
    print("|---|---|" + "---|" * (2 * len(sides)))
    with tempfile.TemporaryDirectory() as folder:
        for scene in args.scenes:
            inputs = _inputs(scene, folder)
            for step in STEPS:
                got: dict[str, list[dict]] = {side: [] for side in sides}
                for _ in range(args.rounds):
                    for side in sides:
                        got[side].append(_run_child(inputs, step, side, args.steps, args.base))
                print(_row(scene, step, got), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
