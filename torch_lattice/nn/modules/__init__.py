"""Modules of :mod:`torch_lattice.nn`."""

from torch_lattice.nn.modules.activation import GELU, LeakyReLU, ReLU, SiLU
from torch_lattice.nn.modules.conv import Conv3d, SubmConv3d
from torch_lattice.nn.modules.conv_transpose import ConvTranspose3d, GenerativeConvTranspose3d
from torch_lattice.nn.modules.fold import fold_batch_norm
from torch_lattice.nn.modules.norm import BatchNorm, BatchNormReLU
from torch_lattice.nn.modules.normalized import (
    NormalizedConvTranspose3d,
    NormalizedGenerativeConvTranspose3d,
    NormalizedSubmConv3d,
)
from torch_lattice.nn.modules.pooling import (
    AvgPool3d,
    GlobalAvgPool,
    GlobalMaxPool,
    MaxPool3d,
    SumPool3d,
)

__all__ = [
    "GELU",
    "AvgPool3d",
    "BatchNorm",
    "BatchNormReLU",
    "Conv3d",
    "ConvTranspose3d",
    "GenerativeConvTranspose3d",
    "GlobalAvgPool",
    "GlobalMaxPool",
    "LeakyReLU",
    "MaxPool3d",
    "NormalizedConvTranspose3d",
    "NormalizedGenerativeConvTranspose3d",
    "NormalizedSubmConv3d",
    "ReLU",
    "SiLU",
    "SubmConv3d",
    "SumPool3d",
    "fold_batch_norm",
]
