"""Functional API: ``from torch_lattice.nn import functional as F``."""

from torch_lattice.nn.functional.conv import conv3d, subm_conv3d

__all__ = ["conv3d", "subm_conv3d"]
