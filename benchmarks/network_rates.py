"""How near SparseResUNet42's convolutions run to the CPU's peak: each sparse convolution
kernel of one network call timed as it runs, its useful work (2 x pairs x C_in x C_out)
and its GFLOP/s, beside the fp32 peak measured in the same run; optionally the same for
another checkout of the library, to see how much of a network-level speed-up its kernels
left to gain.

``python -m benchmarks.network_rates [--scenes surface lidar] [--step eval|train]
[--steps 3] [--base CHECKOUT] [--layers]``

Each side runs in its own process (``--base``: a checkout built in place, e.g. a ``git
worktree`` of an older commit, imported instead of this one) on the scene's features, made
once by this process (:func:`benchmarks.memory_reuse._inputs`), with glibc's malloc keeping
freed memory (``GLIBC_TUNABLES``, the same on both sides and for checkouts older than
:func:`torch_lattice.reuse_cpu_memory`), so first-touch page faults of fresh outputs do not
count against the kernels. A side times ``--steps`` whole calls after a warm-up (median),
then one more call in which a :class:`~torch.utils._python_dispatch.TorchDispatchMode`
times every ``lattice::sparse_conv`` and ``lattice::sparse_conv_weight_grad`` call (the
dispatch adds microseconds per call) and counts its pairs. ``forward`` rows are the
``sparse_conv`` calls of the network's forward; ``input gradient`` those of the loss's
backward.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from collections import defaultdict
from typing import Any

from benchmarks.memory_reuse import _inputs, import_library, run_child

__all__ = ["main"]

KINDS = ("forward", "input gradient", "weight gradient")
# glibc keeps freed blocks up to 1 GiB instead of unmapping them (docs/troubleshooting.md).
TUNABLES = "glibc.malloc.mmap_threshold=1073741824:glibc.malloc.trim_threshold=1073741824"


def _child(inputs: str, step_name: str, steps: int, checkout: str | None) -> dict[str, Any]:
    """One side: the median step time and, for one more step, every convolution kernel's
    (kind, C_in, C_out, K, output rows) with its summed seconds, FLOPs and calls."""
    tl = import_library(checkout)
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode

    from benchmarks.resunet_step import resunet_step

    data = torch.load(inputs)
    train = step_name == "train"
    phase = ["forward"]  # "input gradient" from the loss's backward on
    net_step = resunet_step(
        tl.backbones.SparseResUNet42, tl.SparseTensor, data["coords"], data["feats"], train,
        torch.float32, lambda: phase.__setitem__(0, "input gradient"),
    )  # fmt: skip

    def step() -> None:
        phase[0] = "forward"
        net_step()

    conv = torch.ops.lattice.sparse_conv.default
    wgrad = torch.ops.lattice.sparse_conv_weight_grad.default
    kernels: dict[tuple, list[float]] = defaultdict(lambda: [0.0, 0.0, 0.0])

    class Timed(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
            kwargs = kwargs or {}
            if func is not conv and func is not wgrad:
                return func(*args, **kwargs)
            nbr = args[2]
            if func is conv:  # feats, weight (K, C_in, C_out), nbr
                kind, (k, c_in, c_out) = phase[0], tuple(args[1].shape)
            else:  # feats, grad_out, nbr
                kind, k = "weight gradient", nbr.shape[1]
                c_in, c_out = args[0].shape[1], args[1].shape[1]
            pairs = int((nbr >= 0).sum())
            t0 = time.perf_counter()
            out = func(*args, **kwargs)
            seconds = time.perf_counter() - t0
            row = kernels[(kind, c_in, c_out, k, nbr.shape[0])]
            row[0] += seconds
            row[1] += 2.0 * pairs * c_in * c_out
            row[2] += 1
            return out

    step()
    times = []
    for _ in range(steps):
        t0 = time.perf_counter()
        step()
        times.append(time.perf_counter() - t0)
    with Timed():
        step()
    return {
        "step_s": statistics.median(times),
        "threads": torch.get_num_threads(),
        "kernels": [[*key, *value] for key, value in kernels.items()],
    }


def _run_child(inputs: str, step: str, steps: int, base: str | None) -> dict[str, Any]:
    args = ["--child", inputs, step, "--steps", str(steps)]
    args += ["--checkout", base] if base else []
    return run_child("benchmarks.network_rates", args, dict(os.environ, GLIBC_TUNABLES=TUNABLES))


def _rate(flops: float, seconds: float, peak: float) -> str:
    rate = flops / seconds / 1e9 if seconds > 0 else 0.0
    return f"{rate:.1f} | {100 * rate / peak:.0f}%"


def summary_rows(scene: str, step: str, side: str, got: dict[str, Any], peak: float) -> list[str]:
    """A row per kind of kernel and one for all of them: seconds, share of the step,
    GFLOP/s and % of ``peak``."""
    rows = []
    kernels = got["kernels"]
    for kind in (*KINDS, "all"):
        mine = [r for r in kernels if kind in (r[0], "all")]
        if not mine:
            continue
        seconds, flops = sum(r[5] for r in mine), sum(r[6] for r in mine)
        share = 100 * seconds / got["step_s"]
        rows.append(f"| {scene} | {step} | {side} | {got['step_s']:.3f} | {kind} | "
                    f"{int(sum(r[7] for r in mine))} | {seconds:.3f} ({share:.0f}%) | "
                    f"{flops / 1e9:.1f} | {_rate(flops, seconds, peak)} |")  # fmt: skip
    return rows


def layer_rows(scene: str, side: str, got: dict[str, Any], peak: float) -> list[str]:
    """A row per (kind, C_in, C_out, K, output rows), the slowest first."""
    rows = []
    for kind, c_in, c_out, k, n_out, seconds, flops, calls in sorted(
            got["kernels"], key=lambda r: -r[5]):  # fmt: skip
        rows.append(f"| {scene} | {side} | {kind} | {c_in} | {c_out} | {k} | {n_out} | "
                    f"{int(calls)} | {seconds * 1e3:.1f} | {_rate(flops, seconds, peak)} |")
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--scenes", nargs="+", default=["surface", "lidar"])
    parser.add_argument("--step", choices=("eval", "train"), default="train")
    parser.add_argument("--steps", type=int, default=3, help="whole steps timed per side")
    parser.add_argument("--base", metavar="CHECKOUT", help="another checkout, built in place")
    parser.add_argument("--layers", action="store_true", help="also a row per layer shape")
    parser.add_argument("--child", nargs=2, metavar=("INPUTS", "STEP"), help=argparse.SUPPRESS)
    parser.add_argument("--checkout", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.steps < 1:
        parser.error(f"--steps must be >= 1, got {args.steps}")
    if args.child:
        print(json.dumps(_child(*args.child, args.steps, args.checkout)))
        return 0
    import torch

    from benchmarks.peak import measure_peak

    peak = measure_peak(torch.get_num_threads()).fp32_gflops
    if not peak:
        raise SystemExit("no fp32 peak on this CPU (benchmarks/peak_probe.c found no FMA)")
    sides = (("base", args.base),) if args.base else ()
    sides += (("this", None),)
    print(f"{torch.get_num_threads()} threads, fp32 peak measured now {peak:.0f} GFLOP/s; "
          f"SparseResUNet42(4, 20) {args.step} step, maps built in the step")  # fmt: skip
    print()
    print("| scene | step | side | step s | kernels | calls | kernel s (share of step) | "
          "GFLOP | GFLOP/s | % of peak |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    layers: list[str] = []
    with tempfile.TemporaryDirectory() as folder:
        for scene in args.scenes:
            inputs = _inputs(scene, folder)
            for side, checkout in sides:
                got = _run_child(inputs, args.step, args.steps, checkout)
                for row in summary_rows(scene, args.step, side, got, peak):
                    print(row, flush=True)
                layers += layer_rows(scene, side, got, peak)
    if args.layers:
        print()
        print("| scene | side | kernel | C_in | C_out | K | output rows | calls | ms | "
              "GFLOP/s | % of peak |")
        print("|---|---|---|---|---|---|---|---|---|---|---|")
        print("\n".join(layers))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
