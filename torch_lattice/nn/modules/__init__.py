"""Modules of :mod:`torch_lattice.nn`."""

from torch_lattice.nn.modules.conv import Conv3d, SubmConv3d
from torch_lattice.nn.modules.conv_transpose import ConvTranspose3d, GenerativeConvTranspose3d
from torch_lattice.nn.modules.normalized import (
    NormalizedConvTranspose3d,
    NormalizedGenerativeConvTranspose3d,
    NormalizedSubmConv3d,
)

__all__ = [
    "Conv3d",
    "ConvTranspose3d",
    "GenerativeConvTranspose3d",
    "NormalizedConvTranspose3d",
    "NormalizedGenerativeConvTranspose3d",
    "NormalizedSubmConv3d",
    "SubmConv3d",
]
