"""Custom ops in the ``lattice`` namespace (torch.library), one module per op family.

``kmap`` (supports, neighbour tables, pair lists), ``conv`` (convolution over a
neighbour table or pair lists, with autograd), ``pool`` and ``voxel`` define the
ops with their CPU and fake kernels; each ``<family>_cuda`` module registers the
family's CUDA kernels.  ``_runtime`` is the one bridge to ``torch_lattice._C``.
Importing this package registers every op and kernel.
"""

# The *_cuda modules import their families, so this registers both halves.
from torch_lattice.ops import conv_cuda, kmap_cuda, pool_cuda, voxel_cuda
from torch_lattice.ops.conv import sparse_conv, sparse_conv_weight_grad
from torch_lattice.ops.kmap import (
    KernelMap,
    build_kernel_map,
    generate_support,
    generative_support,
)

__all__ = [
    "KernelMap",
    "build_kernel_map",
    "conv_cuda",
    "generate_support",
    "generative_support",
    "kmap_cuda",
    "pool_cuda",
    "sparse_conv",
    "sparse_conv_weight_grad",
    "voxel_cuda",
]
