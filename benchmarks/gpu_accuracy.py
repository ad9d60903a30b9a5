"""Accuracy of SparseResUNet42 on CUDA: ``python3 -m benchmarks.gpu_accuracy [--out FILE]``.

Runs the same network (eval mode, so batch norm is a fixed affine map; ReLUs replaced by
SiLU unless ``--activation relu``, see ``smooth_activations``) forward and backward
on a LiDAR crop, once in float64 on the CPU (the reference), once in float32 on the CPU
(the yardstick: what float32 costs on the verified path), and on the GPU for every dataflow
in fp32, TF32, fp16 and bf16. For the output, the input gradient and every parameter
gradient it reports ``max|diff| / max|ref|``; the parameter column names the worst one.
A GPU error far above the CPU float32 one in the same storage type points at a kernel, not
at rounding.
"""

from __future__ import annotations

import argparse
import copy
import sys
from collections.abc import Sequence
from pathlib import Path

import torch

from torch_lattice.nn.modules.norm import BatchNorm
from torch_lattice.tensor import SparseTensor

DATAFLOWS = ("implicit_gemm", "fetch_on_demand", "gather_scatter")
PRECISIONS = {
    "fp32": (torch.float32, False),
    "tf32": (torch.float32, True),
    "fp16": (torch.float16, False),
    "bf16": (torch.bfloat16, False),
}
F64 = torch.float64
ACTIVATION_NAMES = {"silu": "SiLU", "relu": "ReLU"}


def crop(coords: torch.Tensor, rows: int) -> torch.Tensor:
    """The rows of ``coords`` with the ``rows`` smallest x (a slab of the scan)."""
    if coords.shape[0] <= rows:
        return coords
    cut = coords[:, 1].kthvalue(rows).values
    return coords[coords[:, 1] <= cut].contiguous()


def run(model: torch.nn.Module, feats: torch.Tensor, coords: torch.Tensor):
    """(output, input gradient, {name: parameter gradient}) of one forward and backward."""
    model.zero_grad(set_to_none=True)
    x = SparseTensor(feats.clone().requires_grad_(True), coords)
    y = model(x)
    g = torch.Generator().manual_seed(1)
    # Scaled like a loss scale (errors are relative): at 32 fp16 gradients neither underflow
    # in the deep layers nor overflow in the head's bias, a sum over every row (256 did).
    dy = torch.randn(y.feats.shape, generator=g, dtype=F64) * 32
    (y.feats * dy.to(y.feats.device, y.feats.dtype)).sum().backward()
    grads = {n: p.grad.detach().cpu().to(F64) for n, p in model.named_parameters()}
    return y.feats.detach().cpu().to(F64), x.feats.grad.detach().cpu().to(F64), grads


def smooth_activations(model: torch.nn.Module) -> torch.nn.Module:
    """``model`` with every ReLU replaced by SiLU, in place; returns it (a
    ``BatchNormReLU`` becomes a :class:`BatchNormSiLU` with the same state).

    For comparing gradients across devices or precisions (this tool and the CUDA tests).
    ReLU's gradient jumps where rounding moves a pre-activation across zero, so a
    rounding-level difference in the forward changes the gradient by whole terms: on the
    CPU, a relative input change of 1e-7 moves SparseResUNet42's float32 input gradient by
    5e-4 of its largest value. SiLU is smooth, so the gradients then differ only by
    rounding (about 1e-6 there).
    """
    from torch_lattice.nn.modules.activation import ReLU, SiLU
    from torch_lattice.nn.modules.norm import BatchNormReLU

    for module in list(model.modules()):
        for name, child in list(module.named_children()):
            if isinstance(child, ReLU):
                setattr(module, name, SiLU())
            elif isinstance(child, BatchNormReLU):
                # The same parameters and buffers, on their device, under the smooth class.
                smooth = copy.copy(child)
                smooth.__class__ = BatchNormSiLU
                setattr(module, name, smooth)
    return model


class BatchNormSiLU(BatchNorm):
    """``BatchNorm`` then SiLU, with ``BatchNorm``'s state-dict keys: what
    :func:`smooth_activations` makes of a ``BatchNormReLU``."""

    def forward(self, input: SparseTensor) -> SparseTensor:  # type: ignore[override]
        out = super().forward(input)
        return out.replace(torch.nn.functional.silu(out.feats))


def rel(a: torch.Tensor, ref: torch.Tensor) -> float:
    """``max|a - ref| / max|ref|`` (0 for empty tensors)."""
    if ref.numel() == 0:
        return 0.0
    return (a - ref).abs().max().item() / max(ref.abs().max().item(), 1e-30)


def compare(result, ref) -> tuple[float, float, float, str]:
    """Output, input-gradient and worst parameter-gradient errors, and that parameter."""
    worst, name = max((rel(result[2][n], g), n) for n, g in ref[2].items())
    return rel(result[0], ref[0]), rel(result[1], ref[1]), worst, name


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.gpu_accuracy", description=__doc__)
    parser.add_argument("--voxels", type=int, default=20_000, help="rows of the LiDAR crop")
    parser.add_argument(
        "--activation",
        choices=tuple(ACTIVATION_NAMES),
        default="silu",
        help="the network's activations: its own ReLU, or SiLU (gradients without kinks)",
    )
    parser.add_argument("--out", type=Path, help="also write the table to this file")
    args = parser.parse_args(argv)
    if args.voxels < 1:
        parser.error(f"--voxels must be >= 1, got {args.voxels}")
    if not torch.cuda.is_available():
        print("benchmarks.gpu_accuracy: no CUDA device", file=sys.stderr)
        return 2
    from benchmarks.scenes import make_scene
    from torch_lattice.backbones import SparseResUNet42
    from torch_lattice.nn.functional import ConvConfig, Dataflow, conv_config

    coords = crop(make_scene("lidar").coords, args.voxels)
    torch.manual_seed(0)
    state = SparseResUNet42(4, 20, width=0.5).state_dict()
    feats = torch.randn(coords.shape[0], 4, generator=torch.Generator().manual_seed(2))
    lines = [
        f"{torch.cuda.get_device_name()}, torch {torch.__version__}; SparseResUNet42(4, 20, "
        f"width=0.5), {ACTIVATION_NAMES[args.activation]}, eval mode, LiDAR crop of "
        f"{coords.shape[0]} voxels; max|diff| / max|ref| against the CPU in float64",
        "",
        "| precision | run | output | input grad | worst parameter grad |",
        "|---|---|---|---|---|",
    ]
    print("\n".join(lines), flush=True)

    def model(dtype: torch.dtype, device: str, rounded: dict) -> torch.nn.Module:
        m = SparseResUNet42(4, 20, width=0.5).to(device, dtype).eval()
        m.load_state_dict(rounded)
        return smooth_activations(m) if args.activation == "silu" else m

    refs: dict[torch.dtype, tuple] = {}  # fp32 and TF32 share one float64 reference
    for prec, (dtype, tf32) in PRECISIONS.items():
        # Inputs and weights rounded to the storage type, so every run sees the same numbers.
        rounded = {k: v.to(dtype) if v.is_floating_point() else v for k, v in state.items()}
        x = feats.to(dtype)
        if dtype not in refs:
            refs[dtype] = run(model(F64, "cpu", rounded), x.to(F64), coords)
        ref = refs[dtype]
        runs = []
        if dtype == torch.float32 and not tf32:
            runs.append(("CPU float32", run(model(dtype, "cpu", rounded), x, coords)))
        gpu = model(dtype, "cuda", rounded)
        for df in DATAFLOWS:
            with conv_config(ConvConfig(dataflow=Dataflow(df), allow_tf32=tf32)):
                try:
                    runs.append((f"CUDA {df}", run(gpu, x.cuda(), coords.cuda())))
                except Exception as exc:  # a failing dataflow is a row, not the end
                    print(f"{prec} {df}: {exc!r}", file=sys.stderr)
        for label, result in runs:
            out, dx, dw, name = compare(result, ref)
            lines.append(f"| {prec} | {label} | {out:.1e} | {dx:.1e} | {dw:.1e} ({name}) |")
        print("\n".join(lines[-len(runs) :]), flush=True)
    if args.out is not None:
        args.out.write_text("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
