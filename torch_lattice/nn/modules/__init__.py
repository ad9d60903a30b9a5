"""Modules of :mod:`torch_lattice.nn`."""

from torch_lattice.nn.modules.conv import Conv3d, SubmConv3d

__all__ = ["Conv3d", "SubmConv3d"]
