"""The single layers of the GPU benchmark, on the maps the library's own modules build.

Each :class:`LayerCase` is one module called as a user calls it (``SubmConv3d`` k3 with its
centred kernel, ``Conv3d`` k2 s2 and k3 s2 p1, the inverse ``ConvTranspose3d`` and a target
transpose), so the timed relation is the real one. Its neighbour table (``table[o, n]``:
the input row kernel row ``n`` brings to output row ``o``, -1 for none) comes from the
module's cached kernel map and drives two plain-PyTorch baselines:

- ``torch loop``: per kernel row ``index_select``, ``mm``, ``index_add_`` (the classic
  gather-GEMM-scatter; many small launches);
- ``torch im2col``: one gather of every ``(output row, kernel row)`` input into an
  ``(N_out, K * C_in)`` matrix and one GEMM (few launches, cuBLAS on tensor cores, but it
  multiplies the absent neighbours' zeros too);
- ``spconv``: spconv 2.x's ``SubMConv3d``, ``SparseConv3d`` or ``SparseInverseConv3d`` with
  the same weight (:class:`benchmarks.gpu_spconv.SpconvLayer`), on a GPU when spconv imports
  (``scripts/spconv-wheels.sh`` prepares it for the device check).

:func:`check` compares a baseline's output, input gradient and weight gradient with the
library's before it is timed; a baseline that disagrees is reported, not timed.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

import torch_lattice as tl
from benchmarks.baselines import spconv_status
from torch_lattice.geometry import ConvGeometry
from torch_lattice.nn.functional.relation import kernel_map

__all__ = ["TOLERANCE", "LayerCase", "baselines", "check", "layer_cases", "rel_error"]

# Largest max|ours - baseline| / max|baseline| a baseline may show, per precision: both
# sides round differently (accumulation order, TF32 and half-precision products).
TOLERANCE = {"fp32": 1e-4, "tf32": 1e-2, "fp16": 1e-2, "bf16": 5e-2}


@dataclass
class LayerCase:
    """One module call on a fixed input, its neighbour table and useful FLOPs."""

    name: str
    module: tl.nn.ConvBase
    x: tl.SparseTensor
    target: tl.SparseTensor | None
    table: torch.Tensor  # (N_out, K) int32 on the features' device

    @property
    def pairs(self) -> int:
        return int((self.table >= 0).sum())

    @property
    def flops(self) -> int:
        """Useful multiply-adds x 2 of the forward: ``2 * pairs * C_in * C_out``."""
        return 2 * self.pairs * self.module.in_channels * self.module.out_channels

    def at(self, dtype: torch.dtype) -> LayerCase:
        """The same case with features and weights in ``dtype`` (supports and maps shared)."""
        module = self.module.to(dtype)
        x = tl.SparseTensor.from_support(self.x.feats.to(dtype), self.x.support)
        return LayerCase(self.name, module, x, self.target, self.table)

    def output(self, x: tl.SparseTensor | None = None) -> tl.SparseTensor:
        """The module's output for ``x`` (default: the case's input)."""
        x = self.x if x is None else x
        return self.module(x) if self.target is None else self.module(x, self.target)

    def ours(self) -> torch.Tensor:
        """The module's forward features."""
        return self.output().feats

    def ours_train(self, grad: torch.Tensor) -> Callable[[], None]:
        """The module's forward and backward (input and weight gradients) for ``grad``."""
        x = self.x.feats.detach().requires_grad_(True)
        src = tl.SparseTensor.from_support(x, self.x.support)

        def step() -> None:
            self.module.zero_grad(set_to_none=True)
            x.grad = None
            self.output(src).feats.backward(grad)

        return step


def _table(x: tl.SparseTensor, out: tl.SparseTensor, geometry: ConvGeometry,
           transposed: bool = False, fine: tl.SparseTensor | None = None) -> torch.Tensor:
    """The module's cached kernel map read as an (N_out, K) input-row table."""
    if transposed:  # the forward map from the fine support to the coarse one, reversed
        assert fine is not None
        return kernel_map(fine.support, x.support, geometry).rev
    return kernel_map(x.support, out.support, geometry).nbr


def layer_cases(coords: torch.Tensor, channels: int, device: str, seed: int = 0
                ) -> list[LayerCase]:
    """The five layers at ``channels`` in and out, fp32, on ``coords`` (``(N, 4)`` int32)."""
    g = torch.Generator().manual_seed(seed)
    feats = torch.randn(coords.shape[0], channels, generator=g)
    x = tl.SparseTensor(feats.to(device), coords.to(device))
    torch.manual_seed(seed)
    cases = []
    subm = tl.nn.SubmConv3d(channels, channels, 3).to(device)
    cases.append(LayerCase("SubmConv3d k3", subm, x, None,
                           _table(x, x, ConvGeometry.submanifold((3, 3, 3), (1, 1, 1)))))
    coarse = None
    for k, p in ((2, 0), (3, 1)):
        conv = tl.nn.Conv3d(channels, channels, k, stride=2, padding=p).to(device)
        with torch.no_grad():
            y = conv(x)
        geometry = ConvGeometry.create(k, 2, p, 1)
        cases.append(LayerCase(f"Conv3d k{k}s2" + (f"p{p}" if p else ""), conv, x, None,
                               _table(x, y, geometry)))
        if k == 2:
            coarse = tl.SparseTensor.from_support(
                torch.randn(y.feats.shape, generator=g).to(device), y.support)
    assert coarse is not None
    k2s2 = ConvGeometry.create(2, 2, 0, 1)
    up = tl.nn.ConvTranspose3d(channels, channels, 2, stride=2).to(device)
    rev = _table(coarse, x, k2s2, transposed=True, fine=x)
    cases.append(LayerCase("ConvTranspose3d k2s2 inverse", up, coarse, None, rev))
    target_up = tl.nn.ConvTranspose3d(channels, channels, 2, stride=2).to(device)
    cases.append(LayerCase("ConvTranspose3d k2s2 target", target_up, coarse, x, rev))
    return cases


def _loop(table: torch.Tensor) -> Callable[[torch.Tensor, torch.Tensor], torch.Tensor]:
    """``torch loop``: gather-mm-scatter per kernel row (index lists built once)."""
    lists = []
    for n in range(table.shape[1]):
        rows = (table[:, n] >= 0).nonzero().squeeze(1)
        lists.append((table[rows, n].long(), rows))

    def run(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        y = torch.zeros(table.shape[0], w.shape[2], device=x.device, dtype=x.dtype)
        for n, (src, dst) in enumerate(lists):
            if dst.numel():
                y = y.index_add(0, dst, x.index_select(0, src) @ w[n])
        return y

    return run


def _im2col(table: torch.Tensor) -> Callable[[torch.Tensor, torch.Tensor], torch.Tensor]:
    """``torch im2col``: one gather into (N_out, K * C_in) (absent rows read a zero row)
    and one GEMM with the (K * C_in, C_out) weight."""
    n_in = int(table.max()) + 1 if table.numel() else 0
    index = torch.where(table >= 0, table, n_in).long()

    def run(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        padded = torch.cat([x[:n_in], x.new_zeros(1, x.shape[1])])
        cols = padded[index].reshape(index.shape[0], -1)
        return cols @ w.reshape(-1, w.shape[2])

    return run


def baselines(case: LayerCase) -> dict[str, Callable[[torch.Tensor, torch.Tensor], torch.Tensor]]:
    """The baselines of ``case``, by name: ``fn(features, weight)``. The plain-PyTorch
    two always; spconv's layer beside every case but the target transpose (spconv's
    transposes make their own output rows) on a GPU where spconv imports (its CPU build
    is wrong at more than one thread and has no backward)."""
    out: dict[str, Callable[[torch.Tensor, torch.Tensor], torch.Tensor]] = {
        "torch loop": _loop(case.table), "torch im2col": _im2col(case.table)}
    if case.target is None and case.x.feats.is_cuda and spconv_status() is None:
        from benchmarks.gpu_spconv import SpconvLayer

        out["spconv"] = SpconvLayer(case)
    return out


def rel_error(a: torch.Tensor, b: torch.Tensor) -> float:
    """``max|a - b| / max|b|`` (0 for empty tensors)."""
    a, b = a.detach(), b.detach()
    scale = max(float(b.float().abs().max()), 1e-30) if b.numel() else 1.0
    return float((a.float() - b.float()).abs().max()) / scale if a.numel() else 0.0


def check(case: LayerCase, fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]) -> float:
    """Worst relative difference between ``fn`` and the library: output, input gradient,
    weight gradient (``max|ours - fn| / max|fn|``, each)."""
    x = case.x.feats.detach().requires_grad_(True)
    module = case.module
    module.zero_grad(set_to_none=True)
    src = tl.SparseTensor.from_support(x, case.x.support)
    ours = module(src) if case.target is None else module(src, case.target)
    grad = torch.randn_like(ours.feats)
    ours.feats.backward(grad)
    assert x.grad is not None and module.weight.grad is not None
    ours_dx, ours_dw = x.grad.clone(), module.weight.grad.clone()
    xb = case.x.feats.detach().requires_grad_(True)
    wb = module.weight.detach().requires_grad_(True)
    ref = fn(xb, wb)
    ref.backward(grad)
    # a baseline that keeps its own weight copy (spconv) says where its gradient is
    dw = wb.grad if wb.grad is not None else getattr(fn, "weight_grad", lambda: None)()
    if xb.grad is None or dw is None:
        raise ValueError("the baseline gave no input or weight gradient")
    module.zero_grad(set_to_none=True)
    return max(rel_error(ours.feats, ref), rel_error(ours_dx, xb.grad), rel_error(ours_dw, dw))
