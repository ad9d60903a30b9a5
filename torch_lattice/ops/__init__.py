"""Custom ops in the ``lattice`` namespace (torch.library), one module per op family.

``kmap`` (supports, neighbour tables, pair lists), ``conv`` (convolution over a
neighbour table or pair lists, with autograd), ``pool``, ``voxel`` and ``norm``
(batch norm's CPU passes; autograd in ``nn.functional.norm``, CUDA through torch's
own kernels) define the ops with their CPU and fake kernels; each ``<family>_cuda``
module registers the family's CUDA kernels.  ``_runtime`` is the one bridge to
``torch_lattice._C``.  ``keep_tile_lists`` and ``clear_tile_lists`` control the CPU
forward's tile lists kept beside each neighbour table (docs/kernel-maps.md).
Importing this package registers every op and kernel.
"""

# Registration only: each *_cuda module imports its family and registers the CUDA kernels.
from torch_lattice.ops import conv_cuda, kmap_cuda, norm, pool_cuda, voxel_cuda  # noqa: F401
from torch_lattice.ops.conv import (
    clear_tile_lists,
    keep_tile_lists,
    sparse_conv,
    sparse_conv_weight_grad,
)
from torch_lattice.ops.kmap import (
    KernelMap,
    build_kernel_map,
    generate_support,
    generative_support,
)

__all__ = [
    "KernelMap",
    "build_kernel_map",
    "clear_tile_lists",
    "generate_support",
    "generative_support",
    "keep_tile_lists",
    "sparse_conv",
    "sparse_conv_weight_grad",
]
