"""SparseResUNet42 with and without :func:`torch_lattice.reuse_cpu_memory`.

``python -m benchmarks.memory_reuse [--scenes lidar surface] [--rounds 3] [--steps 5]``

The setting is process-wide and cannot be undone for memory already kept, so the two
sides run in separate processes, alternated ``--rounds`` times so both see the same
machine state; each process times ``--steps`` calls after one warm-up (medians) and
reports its peak resident size. Each step is the benchmark suite's network call on the scene
(``benchmarks.workloads._resunet_step``: eval forward, or forward + backward of a
squared-mean loss, maps built in the call).
Both sides must compute the same loss to the bit before any time is reported.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time

SIDES = ("default", "reuse")
STEPS = ("eval", "train")


def _child(scene_name: str, step_name: str, side: str, steps: int) -> dict[str, float]:
    import torch

    import torch_lattice as tl
    from benchmarks.scenes import make_scene
    from benchmarks.workloads import _resunet_step

    if side == "reuse" and not tl.reuse_cpu_memory():
        raise SystemExit("reuse_cpu_memory: not applied (the C library is not glibc)")
    train = step_name == "train"
    net_step = _resunet_step(
        tl.backbones.SparseResUNet42, make_scene(scene_name), 4, train, torch.float32
    )

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


def _run_child(scene: str, step: str, side: str, steps: int) -> dict[str, float]:
    cmd = [sys.executable, "-m", "benchmarks.memory_reuse", "--child", scene, step, side]
    out = subprocess.run([*cmd, "--steps", str(steps)], capture_output=True, text=True)
    if out.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed:\n{out.stderr}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--scenes", nargs="+", default=["lidar", "surface"])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--child", nargs=3, metavar=("SCENE", "STEP", "SIDE"))
    args = parser.parse_args(argv)
    if args.child:
        print(json.dumps(_child(*args.child, args.steps)))
        return 0
    print("| scene | step | default s | reuse s | default / reuse | peak RSS MiB default / reuse |")
    print("|---|---|---|---|---|---|")
    for scene in args.scenes:
        for step in STEPS:
            got: dict[str, list[dict[str, float]]] = {side: [] for side in SIDES}
            for _ in range(args.rounds):
                for side in SIDES:
                    got[side].append(_run_child(scene, step, side, args.steps))
            losses = {r["loss"] for side in SIDES for r in got[side]}
            if len(losses) != 1:
                raise SystemExit(f"{scene} {step}: the two sides computed different losses")
            med = {side: statistics.median(r["median_s"] for r in got[side]) for side in SIDES}
            rss = {side: max(r["peak_rss_mib"] for r in got[side]) for side in SIDES}
            print(
                f"| {scene} | {step} | {med['default']:.2f} | {med['reuse']:.2f} | "
                f"{med['default'] / med['reuse']:.2f}x | {rss['default']:.0f} / "
                f"{rss['reuse']:.0f} |",
                flush=True,
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
