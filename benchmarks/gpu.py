"""GPU benchmark of the device check: ``python3 -m benchmarks.gpu [--out FILE]``.

Times, with CUDA events (median of ``--reps`` after warm-up), on a LiDAR scene:

- one SubmConv3d 3x3x3 layer (C_in = C_out = C for C in 32, 64, 128, 256) in fp32, TF32,
  fp16 and bf16, through each dataflow's registered op, beside plain PyTorch
  gather-mm-scatter (``index_select``, cuBLAS ``mm``, ``index_add_``) on the same pairs;
- SparseResUNet42 forward and forward+backward, per dataflow, fp32 and fp16.

Every layer result is also compared with the plain-PyTorch one (``max|diff| / max|ref|``)
so a wrong kernel shows in the table, not only a fast one. Prints a Markdown table; the
ratio column is ``torch ms / ours ms`` (above 1: ours is faster).
"""

from __future__ import annotations

import argparse
import statistics
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import torch

DATAFLOWS = ("implicit_gemm", "fetch_on_demand", "gather_scatter")
CHANNELS = (32, 64, 128, 256)
PRECISIONS = ("fp32", "tf32", "fp16", "bf16")
_DTYPE = {
    "fp32": torch.float32,
    "tf32": torch.float32,
    "fp16": torch.float16,
    "bf16": torch.bfloat16,
}


@dataclass(frozen=True)
class Row:
    """One timed case; ``torch_ms`` and ``err`` only for single layers."""

    case: str
    precision: str
    dataflow: str
    ms: float
    torch_ms: float | None = None
    err: float | None = None


def timed(fn: Callable[[], object], reps: int, warm: int = 3) -> float:
    """Median milliseconds of ``fn`` on the current stream (CUDA events)."""
    for _ in range(warm):
        fn()
    times = []
    for _ in range(reps):
        start = torch.cuda.Event(enable_timing=True)
        stop = torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        stop.record()
        stop.synchronize()
        times.append(start.elapsed_time(stop))
    return statistics.median(times)


def _tf32(enabled: bool) -> None:
    """TF32 for the plain-PyTorch baseline's fp32 matmuls.

    Through the legacy ``allow_tf32`` setter: on torch >= 2.9 it sets the legacy precision
    and ``matmul.fp32_precision`` together, while setting ``fp32_precision`` alone leaves
    the two disagreeing, and torch then raises on every read of ``allow_tf32``."""
    torch.backends.cuda.matmul.allow_tf32 = enabled


def layer_rows(coords: torch.Tensor, reps: int) -> list[Row]:
    """Single SubmConv3d layers per channel count, precision and dataflow."""
    lattice = torch.ops.lattice
    n = coords.shape[0]
    nbr, rev = lattice.kernel_map(coords, coords, [3, 3, 3], [1, 1, 1], [0, 0, 0], [1, 1, 1])
    fwd = lattice.kernel_pairs(nbr)
    bwd = lattice.kernel_pairs(rev)
    offs = fwd[0].tolist()
    pin, pout = fwd[1].long(), fwd[2].long()
    rows = []
    for c in CHANNELS:
        g = torch.Generator(device="cuda").manual_seed(c)
        x32 = torch.randn(n, c, device="cuda", generator=g)
        w32 = torch.randn(27, c, c, device="cuda", generator=g) / (27 * c) ** 0.5
        for prec in PRECISIONS:
            tf32 = prec == "tf32"
            x, w = x32.to(_DTYPE[prec]), w32.to(_DTYPE[prec])

            def plain(x: torch.Tensor = x, w: torch.Tensor = w) -> torch.Tensor:
                y = torch.zeros(n, w.shape[2], device="cuda", dtype=x.dtype)
                for k in range(27):
                    a, b = offs[k], offs[k + 1]
                    if b > a:
                        y.index_add_(0, pout[a:b], x.index_select(0, pin[a:b]) @ w[k])
                return y

            _tf32(tf32)
            ref = plain()
            base = timed(plain, reps)
            scale = max(ref.float().abs().max().item(), 1e-30)
            for df in DATAFLOWS:
                if df == "implicit_gemm":
                    ours = partial(lattice.sparse_conv, x, w, nbr, rev, tf32)
                else:
                    ours = partial(lattice.pair_conv, x, w, *fwd, *bwd, n, df[0] == "g", tf32)
                try:
                    err = (ours().float() - ref.float()).abs().max().item() / scale
                    rows.append(Row(f"SubmConv3d C={c}", prec, df, timed(ours, reps), base, err))
                except Exception as exc:  # a failing kernel is a table row, not a crash
                    print(f"SubmConv3d C={c} {prec} {df}: {exc!r}", file=sys.stderr)
                    rows.append(Row(f"SubmConv3d C={c}", prec, df, float("nan"), base))
            _tf32(False)
    return rows


def _unet_forward(model: torch.nn.Module, feats: torch.Tensor, coords: torch.Tensor):
    from torch_lattice import SparseTensor

    return model(SparseTensor(feats, coords)).feats


def _unet_step(model: torch.nn.Module, feats: torch.Tensor, coords: torch.Tensor) -> None:
    model.zero_grad(set_to_none=True)
    _unet_forward(model, feats, coords).float().square().mean().backward()


def unet_rows(coords: torch.Tensor, reps: int) -> list[Row]:
    """SparseResUNet42 forward and forward+backward per dataflow, fp32 and fp16."""
    from torch_lattice.backbones import SparseResUNet42
    from torch_lattice.nn.functional import ConvConfig, Dataflow, conv_config

    rows = []
    for prec in ("fp32", "fp16"):
        dtype = _DTYPE[prec]
        torch.manual_seed(0)
        model = SparseResUNet42(4, 20).cuda().to(dtype)
        feats = torch.randn(coords.shape[0], 4, device="cuda", dtype=dtype)
        for df in DATAFLOWS:
            with conv_config(ConvConfig(dataflow=Dataflow(df))):
                forward = partial(_unet_forward, model, feats, coords)
                train_step = partial(_unet_step, model, feats, coords)
                try:
                    model.train()
                    rows.append(Row("ResUNet42 fwd+bwd", prec, df, timed(train_step, reps)))
                    model.eval()
                    with torch.no_grad():
                        rows.append(Row("ResUNet42 forward", prec, df, timed(forward, reps)))
                except Exception as exc:
                    print(f"ResUNet42 {prec} {df}: {exc!r}", file=sys.stderr)
                    rows.append(Row("ResUNet42", prec, df, float("nan")))
    return rows


def table(rows: Sequence[Row]) -> list[str]:
    """Markdown table of ``rows``: medians, the plain-PyTorch time, ratio and error."""
    out = [
        "| case | precision | dataflow | ours ms | torch ms | torch/ours | max rel err |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        base = "" if r.torch_ms is None else f"{r.torch_ms:.3f}"
        ratio = "" if r.torch_ms is None or not r.ms > 0 else f"{r.torch_ms / r.ms:.2f}x"
        err = "" if r.err is None else f"{r.err:.1e}"
        ms = "FAILED" if r.ms != r.ms else f"{r.ms:.3f}"
        out.append(f"| {r.case} | {r.precision} | {r.dataflow} | {ms} | {base} | {ratio} | {err} |")
    return out


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.gpu", description=__doc__)
    parser.add_argument("--reps", type=int, default=10, help="timed repetitions per case")
    parser.add_argument("--out", type=Path, help="also write the table to this file")
    parser.add_argument("--no-unet", action="store_true", help="single layers only")
    args = parser.parse_args(argv)
    if args.reps < 1:
        parser.error(f"--reps must be >= 1, got {args.reps}")
    if not torch.cuda.is_available():
        print("benchmarks.gpu: no CUDA device", file=sys.stderr)
        return 2
    import torch_lattice.ops  # noqa: F401  (registers the lattice ops)
    from benchmarks.scenes import make_scene

    scene = make_scene("lidar")
    coords = scene.coords.cuda()
    head = (
        f"{torch.cuda.get_device_name()}, torch {torch.__version__}; scene {scene.name} "
        f"({scene.voxels} voxels: {scene.description}); medians of {args.reps} runs"
    )
    print(head, flush=True)
    rows = layer_rows(coords, args.reps)
    if not args.no_unet:
        rows += unet_rows(coords, max(3, args.reps // 2))
    lines = [head, "", *table(rows)]
    print("\n".join(lines[2:]))
    if args.out is not None:
        args.out.write_text("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
