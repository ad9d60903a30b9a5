"""spconv 2.x beside the library in the GPU benchmark: the peer most users would otherwise pick.

Used only where ``spconv.pytorch`` imports (:func:`benchmarks.baselines.spconv_status`): on
the GPU machine from the archive ``scripts/spconv-wheels.sh`` packs, and on a CPU where its
optional CPU build is installed (right at one torch thread only, and without a backward).

- :class:`SpconvLayer`: spconv's ``SubMConv3d``, ``SparseConv3d`` (k2 s2, k3 s2 p1) and
  ``SparseInverseConv3d`` holding one benchmark layer's weight. Called like the other
  baselines (features and output in the library's row order: spconv numbers a strided
  output its own way, so rows are matched by coordinates once), while :meth:`timed` and
  :meth:`timed_train` run spconv's own call on its own row order, so no reordering is timed.
  spconv reuses only submanifold and inverse indices: its strided layers build their
  indices in every call, which the report says beside their rows.
- :func:`indice_rows`: spconv's index generation (its implicit-GEMM one, spconv's default on
  a GPU; its native one on a CPU) for the submanifold k3 and the k2 s2 maps.
- :class:`SpconvResUNet42`: SparseResUNet42 built from spconv layers with a library model's
  weights and batch-norm state; :func:`unet_check` compares it with the library model.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import Any

import torch
from torch import nn

import torch_lattice as tl
from benchmarks.baselines import canonical_weight, spconv_weight
from benchmarks.gpu_layers import rel_error
from torch_lattice.backbones import SparseResUNet42
from torch_lattice.backbones.unet import ENCODER, ResidualBlock
from torch_lattice.nn.modules.conv import ConvBase

__all__ = [
    "SpconvLayer",
    "SpconvResUNet42",
    "indice_rows",
    "match_rows",
    "unet_check",
]

Coords = torch.Tensor


def _keys(coords: Coords, size: torch.Tensor) -> torch.Tensor:
    c = coords.long()
    return ((c[:, 0] * size[1] + c[:, 1]) * size[2] + c[:, 2]) * size[3] + c[:, 3]


def match_rows(src: Coords, dst: Coords) -> torch.Tensor:
    """``p`` with ``src[p] == dst`` for two ``(N, 4)`` coordinate lists of the same rows.

    Raises:
        ValueError: the two lists do not hold the same rows.
    """
    if src.shape != dst.shape:
        raise ValueError(f"spconv has {src.shape[0]} rows where the library has {dst.shape[0]}")
    size = torch.maximum(src.long().amax(0), dst.long().amax(0)) + 1 if src.numel() else None
    if size is None:
        return torch.zeros(0, dtype=torch.long, device=src.device)
    ks, kd = _keys(src, size), _keys(dst, size)
    order_s, order_d = torch.argsort(ks), torch.argsort(kd)
    if not torch.equal(ks[order_s], kd[order_d]):
        raise ValueError("spconv's rows are not the library's (another output support)")
    p = torch.empty_like(order_d)
    p[order_d] = order_s
    return p


def _shape(coords: Coords, multiple: int = 1) -> tuple[int, list[int]]:
    """Batch count and spatial shape of ``coords`` (each axis rounded up to ``multiple``)."""
    top = (coords.long().amax(0) + 1).tolist()
    return int(top[0]), [max(multiple, -(-v // multiple) * multiple) for v in top[1:]]


def _tensor(feats: torch.Tensor, coords: Coords, shape: tuple[int, list[int]]) -> Any:
    import spconv.pytorch as sp

    return sp.SparseConvTensor(feats, coords.int().contiguous(), shape[1], shape[0])


def _spconv_conv(module: nn.Module, key: str | None, inverse: bool = False) -> nn.Module:
    """The spconv layer of a library convolution, holding its weight and bias."""
    import spconv.pytorch as sp

    kernel = tuple(module.kernel_size)
    c_in, c_out, bias = module.in_channels, module.out_channels, module.bias is not None
    stride = tuple(getattr(module, "stride", None) or (1, 1, 1))
    padding = tuple(getattr(module, "padding", None) or (0, 0, 0))
    if inverse:
        layer = sp.SparseInverseConv3d(c_in, c_out, kernel, indice_key=key, bias=bias)
    elif isinstance(module, tl.nn.SubmConv3d) or (kernel == (1, 1, 1) and stride == (1, 1, 1)):
        layer = sp.SubMConv3d(c_in, c_out, kernel, bias=bias, indice_key=key)
    else:
        layer = sp.SparseConv3d(c_in, c_out, kernel, stride=stride, padding=padding, bias=bias,
                                indice_key=key)
    weight = module.weight.detach()
    layer.to(device=weight.device, dtype=weight.dtype)
    with torch.no_grad():
        layer.weight.copy_(spconv_weight(layer, weight))
        if module.bias is not None:
            layer.bias.copy_(module.bias.detach())
    return layer


class SpconvLayer:
    """spconv's layer for one of :func:`benchmarks.gpu_layers.layer_cases` (not the
    target transpose: spconv's transposes generate their own output rows).

    ``layer(x, w)`` takes and returns features in the library's row order (``w`` is
    ignored: spconv keeps its own copy, whose gradient :meth:`weight_grad` returns).
    """

    def __init__(self, case: Any) -> None:
        module, coords = case.module, case.x.coords
        inverse = isinstance(module, tl.nn.ConvTranspose3d)
        self.strided = not inverse and not isinstance(module, tl.nn.SubmConv3d)
        self.note = "builds its indices in every call" if self.strided else ""
        with torch.no_grad():
            out_coords = case.output().coords
        if inverse:
            # spconv's inverse needs the indices of its own k2 s2 convolution of the fine rows
            fine = out_coords
            shape = _shape(fine)
            self.layer = _spconv_conv(module, "inverse", inverse=True)
            stride = module.functional_geometry()[1]
            forward = tl.nn.Conv3d(module.out_channels, module.in_channels, module.kernel_size,
                                   stride=stride).to(module.weight)
            down = _spconv_conv(forward, "inverse")
            zeros = module.weight.new_zeros(fine.shape[0], module.out_channels)
            with torch.no_grad():
                self._input = down(_tensor(zeros, fine, shape))
            self.perm_in = match_rows(coords, self._input.indices)
        else:
            shape = _shape(coords)
            self.layer = _spconv_conv(module, "bench")
            zeros = module.weight.new_zeros(coords.shape[0], module.in_channels)
            self._input = _tensor(zeros, coords, shape)
            self.perm_in = None
        with torch.no_grad():
            primed = self.layer(self._input)
        if isinstance(module, tl.nn.SubmConv3d):
            self._input = primed  # holds the submanifold indices: later calls reuse them
        self.perm_out = match_rows(primed.indices, out_coords)

    def _run(self, feats: torch.Tensor) -> torch.Tensor:
        return self.layer(self._input.replace_feature(feats)).features

    def spconv_order(self, x: torch.Tensor) -> torch.Tensor:
        """``x`` (library row order) in spconv's input row order."""
        return x if self.perm_in is None else x[self.perm_in]

    def __call__(self, x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        return self._run(self.spconv_order(x))[self.perm_out]

    def weight_grad(self) -> torch.Tensor | None:
        g = self.layer.weight.grad
        return None if g is None else canonical_weight(self.layer, g)

    def timed(self, x: torch.Tensor) -> Callable[[], torch.Tensor]:
        """spconv's forward alone on ``x`` (library order), as a zero-argument call."""
        xs = self.spconv_order(x).detach().contiguous()
        return lambda: self._run(xs)

    def timed_train(self, x: torch.Tensor, grad: torch.Tensor) -> Callable[[], None]:
        """spconv's forward and backward (input and weight gradients) on ``x``."""
        xs = self.spconv_order(x).detach().contiguous().requires_grad_(True)
        gs = torch.empty_like(grad)
        gs[self.perm_out] = grad  # the output gradient in spconv's output order

        def step() -> None:
            self.layer.weight.grad = None
            xs.grad = None
            self._run(xs).backward(gs)

        return step


def indice_rows(coords: Coords) -> list[tuple[str, Callable[[], object]]]:
    """spconv's index generation for the submanifold k3 and the k2 s2 maps, as
    ``(case, zero-argument call)``: the implicit-GEMM generation spconv's layers use on a
    GPU (forward and backward masks, for training), the native pair lists on a CPU."""
    import spconv.pytorch.ops as sops
    from spconv.core import ConvAlgo

    c = coords.int().contiguous()
    batch, shape = _shape(coords)
    one, zero = [1, 1, 1], [0, 0, 0]
    cases = [("SubmConv3d k3", [3, 3, 3], one, True), ("Conv3d k2s2", [2, 2, 2], [2, 2, 2], False)]
    if c.is_cuda:
        return [(f"{name}: spconv indices", partial(
            sops.get_indice_pairs_implicit_gemm, c, batch, shape, ConvAlgo.MaskImplicitGemm,
            k, s, zero, one, zero, subm, False, True)) for name, k, s, subm in cases]
    return [(f"{name}: spconv indices", partial(
        sops.get_indice_pairs, c, batch, shape, ConvAlgo.Native, k, s, zero, one, zero, subm,
        False)) for name, k, s, subm in cases]


def _batch_norm(ours: nn.BatchNorm1d) -> nn.BatchNorm1d:
    bn = nn.BatchNorm1d(ours.num_features, ours.eps, ours.momentum, ours.affine,
                        ours.track_running_stats)
    bn.load_state_dict(ours.state_dict())
    return bn.to(device=ours.weight.device, dtype=ours.weight.dtype)


def _features(fn: nn.Module, x: Any) -> Any:
    return x.replace_feature(fn(x.features))


class _Residual(nn.Module):
    def __init__(self, ours: ResidualBlock, key: str) -> None:
        super().__init__()
        block, conv2, bn2 = ours.main
        self.conv1, self.bn1 = _spconv_conv(block[0], key), _batch_norm(block[1])
        self.conv2, self.bn2 = _spconv_conv(conv2, key), _batch_norm(bn2)
        self.shortcut: nn.Module | None = None
        self.bn_short: nn.Module | None = None
        if not isinstance(ours.shortcut, nn.Identity):
            self.shortcut = _spconv_conv(ours.shortcut[0], None)
            self.bn_short = _batch_norm(ours.shortcut[1])

    def forward(self, x: Any) -> Any:
        y = _features(self.bn1, self.conv1(x))
        y = y.replace_feature(torch.relu(y.features))
        y = _features(self.bn2, self.conv2(y))
        if self.shortcut is None:
            short = x.features
        else:
            short = self.bn_short(self.shortcut(x).features)
        return y.replace_feature(torch.relu(y.features + short))


class SpconvResUNet42(nn.Module):
    """SparseResUNet42 from spconv layers, with ``ours``'s weights and batch-norm state.

    Each level's submanifold layers share one index key, and each ``ConvTranspose3d`` is a
    ``SparseInverseConv3d`` on the key of the k2 s2 convolution it mirrors, so it lands on
    that convolution's input rows (the library's rule). The spatial shape is the input's
    range rounded up to a multiple of 16, as :func:`torch_lattice.backbones.unet.padded_range`.
    ``forward(feats, coords)`` returns the logits in the input's row order.
    """

    def __init__(self, ours: SparseResUNet42) -> None:
        super().__init__()
        self.stem = nn.ModuleList()
        for block in ours.stem:
            self.stem.append(nn.ModuleList([_spconv_conv(block[0], "subm0"),
                                            _batch_norm(block[1])]))
        self.down, self.encoder = nn.ModuleList(), nn.ModuleList()
        for level, (down, stage) in enumerate(zip(ours.down, ours.encoder, strict=True)):
            self.down.append(nn.ModuleList([_spconv_conv(down[0], f"down{level}"),
                                            _batch_norm(down[1])]))
            self.encoder.append(nn.ModuleList([_Residual(b, f"subm{level + 1}") for b in stage]))
        self.up, self.decoder = nn.ModuleList(), nn.ModuleList()
        levels = len(ours.down)
        for i, (up, stage) in enumerate(zip(ours.up, ours.decoder, strict=True)):
            level = levels - 1 - i
            self.up.append(nn.ModuleList([_spconv_conv(up[0], f"down{level}", inverse=True),
                                          _batch_norm(up[1])]))
            self.decoder.append(nn.ModuleList([_Residual(b, f"subm{level}") for b in stage]))
        self.head = _spconv_conv(ours.head, None)

    @staticmethod
    def _block(pair: nn.ModuleList, x: Any) -> Any:
        conv, bn = pair
        y = conv(x)
        return y.replace_feature(torch.relu(bn(y.features)))

    def forward(self, feats: torch.Tensor, coords: Coords) -> torch.Tensor:
        x = _tensor(feats, coords, _shape(coords, 2 ** len(ENCODER)))
        for pair in self.stem:
            x = self._block(pair, x)
        levels = [x]
        for down, stage in zip(self.down, self.encoder, strict=True):
            x = self._block(down, levels[-1])
            for block in stage:
                x = block(x)
            levels.append(x)
        y = levels.pop()
        for up, stage in zip(self.up, self.decoder, strict=True):
            y = self._block(up, y)
            skip = levels.pop()
            y = skip.replace_feature(torch.cat([y.features, skip.features], 1))
            for block in stage:
                y = block(y)
        return self.head(y).features

    def conv_pairs(self, ours: SparseResUNet42) -> list[tuple[str, nn.Module, nn.Module]]:
        """``(name, library convolution, spconv layer)`` for every convolution, in the same
        order on both sides (module registration order)."""
        mine = [m for m in self.modules() if hasattr(m, "indice_key")]
        theirs = [(n, m) for n, m in ours.named_modules() if isinstance(m, ConvBase)]
        if len(mine) != len(theirs):
            raise ValueError(f"{len(mine)} spconv convolutions for {len(theirs)} of the library")
        return [(n, m, s) for (n, m), s in zip(theirs, mine, strict=True)]


def unet_check(ours: SparseResUNet42, twin: SpconvResUNet42, feats: torch.Tensor,
               coords: Coords, backward: bool) -> float:
    """Worst relative difference between the two networks: the logits in ``ours``'s
    current mode, and with ``backward`` the input gradient and every convolution's weight
    gradient of the same loss. Batch-norm statistics are restored afterwards."""
    states = [{k: v.clone() for k, v in m.state_dict().items()} for m in (ours, twin)]
    x = feats.detach().clone().requires_grad_(backward)
    xs = feats.detach().clone().requires_grad_(backward)
    twin.train(ours.training)
    a = ours(tl.SparseTensor(x, coords)).feats
    b = twin(xs, coords)
    worst = rel_error(a, b)
    if backward:
        grad = torch.randn_like(a)
        a.backward(grad)
        b.backward(grad)
        assert x.grad is not None and xs.grad is not None
        worst = max(worst, rel_error(x.grad, xs.grad))
        for name, conv, layer in twin.conv_pairs(ours):
            if conv.weight.grad is None or layer.weight.grad is None:
                raise ValueError(f"{name} got no weight gradient")
            dw = canonical_weight(layer, layer.weight.grad)
            worst = max(worst, rel_error(conv.weight.grad, dw))
        ours.zero_grad(set_to_none=True)
        twin.zero_grad(set_to_none=True)
    for m, state in zip((ours, twin), states, strict=True):
        m.load_state_dict(state)
    return worst


def check_indices(result: tuple, nbr: torch.Tensor, out_coords: Coords) -> None:
    """Checks spconv's implicit-GEMM indices (``out_inds, _, pair_fwd, ...``) against the
    library's neighbour table ``nbr`` (``(N_out, K)``) and output rows: the same pairs,
    whatever order spconv numbers its output rows and kernel rows in.

    Raises:
        ValueError: another relation, or a result of another shape.
    """
    out_inds, pair_fwd = result[0], result[2]
    table = pair_fwd.T[: out_inds.shape[0]]
    if table.shape != nbr.shape:
        raise ValueError(f"spconv's table is {tuple(table.shape)}, the library's "
                         f"{tuple(nbr.shape)}")
    table = table[match_rows(out_inds, out_coords)].long()
    span = int(max(int(table.max()), int(nbr.max()))) + 1 if nbr.numel() else 1

    def keys(t: torch.Tensor) -> torch.Tensor:
        out, n = torch.nonzero(t >= 0, as_tuple=True)
        return torch.sort(out * span + t[out, n].long()).values

    if not torch.equal(keys(table), keys(nbr)):
        raise ValueError("spconv's pairs are not the library's")
