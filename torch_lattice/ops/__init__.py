"""Custom ops in the ``lattice`` namespace (torch.library).

Importing this package registers them: kernel-map construction
(``ops.kernel_map``) and the sparse convolution with its autograd
(``ops.conv``).
"""

from torch_lattice.ops.conv import sparse_conv, sparse_conv_weight_grad
from torch_lattice.ops.kernel_map import (
    KernelMap,
    build_kernel_map,
    generate_support,
    generative_support,
)

__all__ = [
    "KernelMap",
    "build_kernel_map",
    "generate_support",
    "generative_support",
    "sparse_conv",
    "sparse_conv_weight_grad",
]
