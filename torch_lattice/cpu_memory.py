"""Keeping freed CPU memory for reuse: :func:`reuse_cpu_memory`.

glibc's ``malloc`` hands every block of 32 MiB or more (less before its threshold
adapts) to the operating system with ``mmap`` and gives it back on ``free``. A sparse
network's feature tensors are that large (158k voxels x 96 channels of float32 is
58 MiB), so each layer's output is fresh memory that the kernel must fault in and zero
page by page as the convolution first writes it: on the development VM a 58 MiB
output took 123 ms to compute fresh against 46 ms into memory touched before, and a
SparseResUNet42 training step ran 1.5x faster with freed memory kept for reuse
(``python -m benchmarks.memory_reuse``). Allocators that cache (PyTorch's CUDA
allocator, jemalloc, tcmalloc) avoid this by design; glibc does when told to.

The setting is process-wide, like ``torch.set_num_threads``, and the price is memory:
the process keeps up to ``max_block`` bytes of freed memory at the top of its heap
instead of returning it, so its resident size stays near its peak.
``GLIBC_TUNABLES=glibc.malloc.mmap_threshold=N:glibc.malloc.trim_threshold=N`` in the
environment does the same from the process's start.

It holds for memory allocated by the main thread. glibc serves other threads, and the
main thread after one of its allocations failed (a caught ``MemoryError``), from arenas
whose heaps are at most 64 MiB, so blocks above that still get their own ``mmap`` there.
"""

from __future__ import annotations

from torch_lattice.ops._runtime import _C

__all__ = ["DEFAULT_MAX_BLOCK", "reuse_cpu_memory"]

DEFAULT_MAX_BLOCK = 1 << 30
"""The default ``max_block`` of :func:`reuse_cpu_memory`: 1 GiB."""

# mallopt takes a C int.
_MAX = 2**31 - 1


def reuse_cpu_memory(max_block: int | None = DEFAULT_MAX_BLOCK) -> bool:
    """Let glibc's ``malloc`` keep freed CPU memory for reuse instead of returning it
    to the operating system, so large tensors (a layer's features, its gradients) reuse
    pages already faulted in. Process-wide; see the module's notes for the memory it
    keeps and the threads it covers.

    Args:
        max_block: blocks up to this many bytes come from the heap instead of their own
            ``mmap``, and up to this many bytes of freed memory at the heap's top are
            kept (``mallopt`` ``M_MMAP_THRESHOLD`` and ``M_TRIM_THRESHOLD``); an int in
            ``[1, 2**31 - 1]``. ``None`` sets glibc's default values back (128 KiB; the
            threshold no longer adapts by itself afterwards).

    Returns:
        True where applied; False where the process's C library is not glibc (nothing
        changed).

    Raises:
        TypeError: ``max_block`` is not an int or None.
        ValueError: ``max_block`` is outside ``[1, 2**31 - 1]``.
    """
    if max_block is None:
        return bool(_C.malloc_reuse(-1))
    if isinstance(max_block, bool) or not isinstance(max_block, int):
        raise TypeError(
            f"reuse_cpu_memory: max_block must be an int (bytes) or None, "
            f"got {type(max_block).__name__}"
        )
    if not 1 <= max_block <= _MAX:
        raise ValueError(
            f"reuse_cpu_memory: max_block must be in [1, 2**31 - 1] bytes (a C int), "
            f"got {max_block}"
        )
    return bool(_C.malloc_reuse(max_block))
