"""SparseResUNet42: a MinkUNet-style encoder-decoder of residual sparse blocks.

Layout (``c`` = channel widths times ``width``)::

    stem      2 x [SubmConv3d k3 -> BatchNorm -> ReLU]                 32
    encoder   4 x [Conv3d k2 s2 -> BN -> ReLU, 2 x ResidualBlock]      32, 64, 128, 256
    decoder   4 x [ConvTranspose3d k2 s2 -> BN -> ReLU,
                   cat(skip), 2 x ResidualBlock]                        256, 128, 96, 96
    head      pointwise Conv3d (with bias) -> num_classes

The input's range is rounded up to a multiple of 16 per axis first (same rows),
so each of the four halvings keeps every voxel.  Each ``ConvTranspose3d`` is
called without a target, so it lands exactly on
the support of the encoder level it mirrors (the input of the matching k2 s2
``Conv3d``), where the skip tensor lives; ``tl.cat`` then joins them.  The 42
counts the convolutions of the stem, the 8 stages and the 16 residual blocks
(2 each), as in the published SparseResUNet42 / MinkUNet42.
"""

from __future__ import annotations

import math

from torch import nn

from torch_lattice.export_hints import export_as_relabel, export_as_same_rows
from torch_lattice.geometry import positive_int
from torch_lattice.nn.modules.activation import ReLU
from torch_lattice.nn.modules.conv import Conv3d, SubmConv3d
from torch_lattice.nn.modules.conv_transpose import ConvTranspose3d
from torch_lattice.nn.modules.norm import BatchNorm, BatchNormReLU
from torch_lattice.sparse_ops import add, cat
from torch_lattice.tensor import SparseTensor

__all__ = ["ResidualBlock", "SparseResUNet42"]

STEM = 32
ENCODER = (32, 64, 128, 256)
DECODER = (256, 128, 96, 96)


class ConvBlock(nn.Sequential):
    """Convolution -> BatchNorm -> ReLU (one fused module, so the state-dict keys are
    those of ``Sequential(conv, BatchNorm, ReLU)``)."""

    def __init__(self, conv: nn.Module, channels: int) -> None:
        super().__init__(conv, BatchNormReLU(channels))


class ResidualBlock(nn.Module):
    """``relu(bn(conv(relu(bn(conv(x))))) + shortcut(x))`` with 3x3x3 submanifold
    convolutions; the shortcut is a pointwise convolution + BN when widths differ."""

    def __init__(self, in_channels: int, out_channels: int) -> None:
        super().__init__()
        self.main = nn.Sequential(
            ConvBlock(SubmConv3d(in_channels, out_channels, 3), out_channels),
            SubmConv3d(out_channels, out_channels, 3),
            BatchNorm(out_channels),
        )
        self.shortcut: nn.Module
        if in_channels == out_channels:
            self.shortcut = nn.Identity()
        else:
            self.shortcut = nn.Sequential(
                Conv3d(in_channels, out_channels, 1), BatchNorm(out_channels)
            )
        self.relu = ReLU(inplace=True)

    def forward(self, x: SparseTensor) -> SparseTensor:
        """``relu(main(x) + shortcut(x))`` for ``x``.

        Support rule: the output keeps ``x``'s support (rows, order, stride,
        range); both branches are submanifold or pointwise convolutions.

        Args:
            x: ``(N, in_channels)`` features.

        Returns:
            SparseTensor: ``(N, out_channels)`` features on ``x``'s support.
        """
        return self.relu(add(self.main(x), self.shortcut(x)))


def _scaled(width: float, channels: int) -> int:
    return max(1, round(width * channels))


class SparseResUNet42(nn.Module):
    """MinkUNet-style sparse segmentation network (see the module docstring).

    Args:
        in_channels: input feature width.
        num_classes: output channels (per-voxel logits).
        width: multiplier of every hidden width (e.g. 0.5 for a half-width net).

    Input: a stride-1 SparseTensor with ``(N, in_channels)`` features.
    Output: ``(N, num_classes)`` logits on exactly the input support.
    """

    def __init__(self, in_channels: int, num_classes: int, width: float = 1.0) -> None:
        super().__init__()
        in_channels = positive_int("in_channels", in_channels)
        num_classes = positive_int("num_classes", num_classes)
        # Compared, not converted: an int beyond the float range must not overflow here.
        if (isinstance(width, bool) or not isinstance(width, (int, float))
                or not 0 < width < math.inf):  # fmt: skip
            raise ValueError(f"width must be a positive finite number, got {width!r}")
        stem = _scaled(width, STEM)
        enc = [_scaled(width, c) for c in ENCODER]
        dec = [_scaled(width, c) for c in DECODER]
        self.stem = nn.Sequential(
            ConvBlock(SubmConv3d(in_channels, stem, 3), stem),
            ConvBlock(SubmConv3d(stem, stem, 3), stem),
        )
        self.down = nn.ModuleList()
        self.encoder = nn.ModuleList()
        prev = stem
        for c in enc:
            self.down.append(ConvBlock(Conv3d(prev, c, kernel_size=2, stride=2), c))
            self.encoder.append(nn.Sequential(ResidualBlock(c, c), ResidualBlock(c, c)))
            prev = c
        skips = [stem, *enc[:-1]][::-1]
        self.up = nn.ModuleList()
        self.decoder = nn.ModuleList()
        for c, skip in zip(dec, skips, strict=True):
            self.up.append(ConvBlock(ConvTranspose3d(prev, c, kernel_size=2, stride=2), c))
            self.decoder.append(nn.Sequential(ResidualBlock(c + skip, c), ResidualBlock(c, c)))
            prev = c
        self.head = Conv3d(prev, num_classes, 1, bias=True)

    def forward(self, x: SparseTensor) -> SparseTensor:
        """Per-voxel class scores for ``x``.

        Support rule: the output rows are exactly ``x``'s rows in order (the
        encoder's strided supports are generated, the decoder's transposes
        return onto them).

        Args:
            x: ``(N, in_channels)`` features, stride 1.

        Returns:
            SparseTensor: ``(N, num_classes)`` scores on ``x``'s support.
        """
        # The two helpers hold all the Python that inspects x (type, range), so
        # torch.fx can trace this forward with them as single calls (the
        # artifact exporter has a lowering for each).
        levels = [self.stem(padded_range(x))]
        for down, stage in zip(self.down, self.encoder, strict=True):
            levels.append(stage(down(levels[-1])))
        y = levels.pop()
        for up, stage in zip(self.up, self.decoder, strict=True):
            y = stage(cat([up(y), levels.pop()]))
        return on_input_support(self.head(y), x)


@export_as_same_rows
def padded_range(x: SparseTensor) -> SparseTensor:
    """``x`` on a support with the same rows whose range is a multiple of 16 per axis.

    Every k2 s2 level then halves an even range: no row on the far edge of an
    odd range is dropped (``R_out = R // 2``), and a flat scene (range 1 in z)
    never reaches an empty range.  The network's output is put back on ``x``'s
    own support (:func:`on_input_support`).  The rows, their order and the
    features are ``x``'s; only the declared range grows.

    Raises:
        TypeError: ``x`` is not a SparseTensor.
    """
    if not isinstance(x, SparseTensor):
        raise TypeError(f"input must be a SparseTensor, got {type(x).__name__}")
    step = 2 ** len(ENCODER)
    r = [-(-v // step) * step for v in x.support.grid_range()]
    srange = (max(1, x.support.num_batches()), max(step, r[0]), max(step, r[1]), max(step, r[2]))
    support = x.coordinate_manager.ranged_support(x.support, srange)
    return SparseTensor.from_support(x.feats, support)


@export_as_relabel
def on_input_support(y: SparseTensor, x: SparseTensor) -> SparseTensor:
    """``y``'s features on ``x``'s own support object.

    ``y`` lives on the padded copy of ``x``'s support (:func:`padded_range`):
    the same rows in the same order, so the features are reused as they are.
    """
    return SparseTensor.from_support(y.feats, x.support)
