"""Functional API: ``from torch_lattice.nn import functional as F``."""

from torch_lattice.nn.functional.conv import conv3d, subm_conv3d
from torch_lattice.nn.functional.conv_transpose import (
    conv_transpose3d,
    generative_conv_transpose3d,
)
from torch_lattice.nn.functional.normalized import normalized

__all__ = [
    "conv3d",
    "conv_transpose3d",
    "generative_conv_transpose3d",
    "normalized",
    "subm_conv3d",
]
