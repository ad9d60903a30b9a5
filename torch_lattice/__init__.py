"""Torch Lattice: exact, fast sparse 3D convolution for PyTorch.

``import torch_lattice as tl``; build a :class:`SparseTensor` and apply the
modules in :mod:`torch_lattice.nn`.
"""

from torch_lattice import backbones, nn, ops
from torch_lattice.sparse_join import reindex_sparse, sparse_binary, sparse_cat
from torch_lattice.sparse_ops import cat, to_dense
from torch_lattice.tensor import CoordinateManager, SparseTensor
from torch_lattice.voxel import collate, devoxelize, voxelize

__version__ = "0.1.0"
"""The package version (PEP 440)."""

__all__ = [
    "CoordinateManager",
    "SparseTensor",
    "__version__",
    "backbones",
    "cat",
    "collate",
    "devoxelize",
    "nn",
    "ops",
    "reindex_sparse",
    "sparse_binary",
    "sparse_cat",
    "to_dense",
    "voxelize",
]
