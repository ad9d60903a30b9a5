"""Sparse neural-network modules: ``import torch_lattice.nn as spnn``."""

from torch_lattice.nn import functional
from torch_lattice.nn.modules import (
    Conv3d,
    ConvTranspose3d,
    GenerativeConvTranspose3d,
    NormalizedConvTranspose3d,
    NormalizedGenerativeConvTranspose3d,
    NormalizedSubmConv3d,
    SubmConv3d,
)

__all__ = [
    "Conv3d",
    "ConvTranspose3d",
    "GenerativeConvTranspose3d",
    "NormalizedConvTranspose3d",
    "NormalizedGenerativeConvTranspose3d",
    "NormalizedSubmConv3d",
    "SubmConv3d",
    "functional",
]
