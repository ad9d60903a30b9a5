"""Torch Lattice: exact, fast sparse 3D convolution for PyTorch.

``import torch_lattice as tl``; build a :class:`SparseTensor` and apply the
modules in :mod:`torch_lattice.nn`.
"""

import importlib as _importlib
import typing as _typing
from types import ModuleType as _ModuleType

from torch_lattice import _extension, backbones, nn, ops  # noqa: F401 (_extension: _C is built)
from torch_lattice.cpu_memory import reuse_cpu_memory
from torch_lattice.memory_budget import get_memory_budget, set_memory_budget
from torch_lattice.sparse_join import reindex_sparse, sparse_binary, sparse_cat
from torch_lattice.sparse_ops import cat, to_dense
from torch_lattice.tensor import CoordinateManager, SparseTensor
from torch_lattice.voxel import collate, devoxelize, voxelize

if _typing.TYPE_CHECKING:  # the lazy attribute below, for type checkers
    from torch_lattice import artifact

__version__ = "0.1.0"
"""The package version (PEP 440)."""

__all__ = [
    "CoordinateManager",
    "SparseTensor",
    "__version__",
    "artifact",
    "backbones",
    "cat",
    "collate",
    "devoxelize",
    "get_memory_budget",
    "nn",
    "ops",
    "reindex_sparse",
    "reuse_cpu_memory",
    "set_memory_budget",
    "sparse_binary",
    "sparse_cat",
    "to_dense",
    "voxelize",
]

# Imported on first use: the exporter and replay (torch.fx, safetensors, the MLIR
# parser) add about 4% to ``import torch_lattice`` and most programs never need them.
_LAZY = ("artifact",)


def __getattr__(name: str) -> _ModuleType:
    if name in _LAZY:
        return _importlib.import_module(f"{__name__}.{name}")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted({*globals(), *_LAZY})
