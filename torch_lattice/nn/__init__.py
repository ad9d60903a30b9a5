"""Sparse neural-network modules: ``import torch_lattice.nn as spnn``."""

from torch_lattice.nn import functional
from torch_lattice.nn.modules import Conv3d, SubmConv3d

__all__ = ["Conv3d", "SubmConv3d", "functional"]
