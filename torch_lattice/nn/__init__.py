"""Sparse neural-network modules: ``import torch_lattice.nn as spnn``."""

from torch_lattice.nn import functional
from torch_lattice.nn.modules import (
    GELU,
    AvgPool3d,
    BatchNorm,
    Conv3d,
    ConvTranspose3d,
    GenerativeConvTranspose3d,
    GlobalAvgPool,
    GlobalMaxPool,
    LeakyReLU,
    MaxPool3d,
    NormalizedConvTranspose3d,
    NormalizedGenerativeConvTranspose3d,
    NormalizedSubmConv3d,
    ReLU,
    SiLU,
    SubmConv3d,
    SumPool3d,
)

__all__ = [
    "GELU",
    "AvgPool3d",
    "BatchNorm",
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
    "functional",
]
