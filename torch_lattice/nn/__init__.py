"""Sparse neural-network modules: ``import torch_lattice.nn as spnn``."""

from torch_lattice.nn import functional, modules
from torch_lattice.nn.modules import *  # noqa: F403  (the list is modules.__all__)

__all__ = [*modules.__all__, "functional"]
