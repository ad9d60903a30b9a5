"""The memory budget: one limit every size-computed allocation is checked against.

Operations that allocate from sizes they compute (kernel maps and neighbour tables,
generated supports, pooling and upsampling, global pooling, ``dense()``, artifact
replay, the checkpoint converter) call :func:`check_allocation` with their estimate
*before* allocating, so a small hostile input (a one-row tensor with a huge kernel, a
batch index of 2^31 - 1, a checkpoint holding an expanded tensor) is refused with a
``ValueError`` naming the operation, the size and the limit instead of reaching the
allocator (or the out-of-memory killer).

The budget, in order of precedence:

1. :func:`set_memory_budget` (``None`` restores the default);
2. the environment variable ``TORCH_LATTICE_MEMORY_BUDGET`` (bytes, or a number with a
   binary suffix ``K``, ``M``, ``G``, ``T``, e.g. ``64G``);
3. half of the smallest of physical memory, the process's address-space limit
   (``RLIMIT_AS``) and the cgroup memory limit, where the system reports them.

It is a process-wide setting on purpose (like ``torch.set_num_threads``): a limit that
one thread could escape by running in another context would not bound the process.
"""

from __future__ import annotations

import os
import re
import threading
from fractions import Fraction
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # only the annotation: this module imports no torch
    import torch

__all__ = [
    "DEFAULT_FRACTION",
    "ENV_VAR",
    "MemoryBudgetError",
    "check_allocation",
    "check_output",
    "default_memory_budget",
    "get_memory_budget",
    "set_memory_budget",
]

ENV_VAR = "TORCH_LATTICE_MEMORY_BUDGET"
DEFAULT_FRACTION = 0.5  # of min(physical memory, RLIMIT_AS, cgroup limit)
# Used only where the system reports no memory size at all.
_FALLBACK_TOTAL = 8 * 2**30
_SUFFIXES = {"": 1, "K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}
_CGROUP_FILES = ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes")

_lock = threading.Lock()
_explicit: int | None = None


class MemoryBudgetError(ValueError):
    """An operation would allocate more than the memory budget allows."""


def _physical_memory() -> int | None:
    try:
        pages, size = os.sysconf("SC_PHYS_PAGES"), os.sysconf("SC_PAGE_SIZE")
    except (AttributeError, ValueError, OSError):
        return None
    return pages * size if pages > 0 and size > 0 else None


def _address_space_limit() -> int | None:
    try:
        import resource
    except ImportError:  # not on Windows
        return None
    soft, _ = resource.getrlimit(resource.RLIMIT_AS)
    return None if soft == resource.RLIM_INFINITY or soft <= 0 else int(soft)


def _cgroup_limit() -> int | None:
    for path in _CGROUP_FILES:
        try:
            with open(path, encoding="ascii") as f:
                text = f.read(64).strip()
        except OSError:
            continue
        # "max" (v2) or a huge page-rounded number (v1) both mean "no limit".
        if text.isdigit() and int(text) < 2**60:
            return int(text)
    return None


def default_memory_budget() -> int:
    """``DEFAULT_FRACTION`` of the smallest memory size the system reports, in bytes."""
    sizes = [s for s in (_physical_memory(), _address_space_limit(), _cgroup_limit()) if s]
    total = min(sizes) if sizes else _FALLBACK_TOTAL
    return max(1, int(total * DEFAULT_FRACTION))


def parse_budget(text: str, name: str = ENV_VAR) -> int:
    """``"1073741824"``, ``"512M"``, ``"1.5G"`` -> bytes.

    Raises:
        ValueError: not a positive size, naming ``name``.
    """
    # (64 characters hold any byte count there is; a longer text is shown cut short)
    match = None if len(text) > 64 else re.fullmatch(
        r"\s*([0-9]+(?:\.[0-9]+)?)\s*([KMGT]?)(?:i?B)?\s*", text, re.IGNORECASE)
    if match is None:
        shown = repr(text) if len(text) <= 64 else f"{text[:40]!r}... ({len(text)} characters)"
        raise ValueError(f"{name} must be a positive byte count of at most 64 characters "
                         f"such as 1073741824 or 8G, got {shown}")
    # exact (a float rounded 12345678901234567891 to ...7168); a fraction of a unit
    # ("1.1G") rounds down to whole bytes, a fraction of a byte ("1.9") is refused
    value = Fraction(match.group(1)) * _SUFFIXES[match.group(2).upper()]
    if not match.group(2) and value.denominator != 1:
        raise ValueError(f"{name} must be a whole number of bytes without a unit, got "
                         f"{text!r}")
    nbytes = value.numerator // value.denominator
    if nbytes < 1:
        raise ValueError(f"{name} must be at least 1 byte, got {text!r}")
    return nbytes


def _check_bytes(value: object) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"memory budget must be an int (bytes) or None, got {value!r}")
    if value < 1:
        raise ValueError(f"memory budget must be at least 1 byte, got {value}")
    return value


def set_memory_budget(nbytes: int | None) -> int | None:
    """Sets the budget in bytes for this process; ``None`` restores the default.

    Returns:
        The previous explicit setting (``None`` if there was none), so a caller can
        restore it.

    Raises:
        TypeError: ``nbytes`` is not an int or ``None``.
        ValueError: ``nbytes < 1``.
    """
    global _explicit
    value = _check_bytes(nbytes)
    with _lock:
        previous, _explicit = _explicit, value
    return previous


def get_memory_budget() -> int:
    """The budget in force, in bytes (see the module docstring for the precedence).

    Raises:
        ValueError: ``TORCH_LATTICE_MEMORY_BUDGET`` is set but is not a size.
    """
    with _lock:
        explicit = _explicit
    if explicit is not None:
        return explicit
    env = os.environ.get(ENV_VAR)
    if env is not None and env.strip():
        return parse_budget(env)
    return default_memory_budget()


def _human(nbytes: int) -> str:
    for unit, scale in (("TiB", 2**40), ("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if nbytes >= scale:
            return f"{nbytes / scale:.3g} {unit}"
    return f"{nbytes} B"


def check_allocation(operation: str, nbytes: int) -> None:
    """Refuses an allocation of ``nbytes`` for ``operation`` beyond the budget.

    Call it with the estimate before allocating. Python ints do not overflow, so
    estimates may be products of untrusted sizes.

    Raises:
        MemoryBudgetError: (a ``ValueError``) naming the operation, the size and the
            limit, and how to raise the limit.
    """
    budget = get_memory_budget()
    if nbytes > budget:
        raise MemoryBudgetError(
            f"{operation} would allocate {nbytes} bytes ({_human(nbytes)}), beyond the memory "
            f"budget of {budget} bytes ({_human(budget)}); raise it with "
            f"torch_lattice.set_memory_budget(nbytes) or the {ENV_VAR} environment variable "
            "(docs/limits.md)"
        )


def check_output(
    op: str, rows: int, feats: torch.Tensor, copies: int = 1, *,
    channels: int | None = None, dtype: torch.dtype | None = None,
) -> None:  # fmt: skip
    """Refuses an output of ``rows`` x ``feats``' channels of ``feats``' dtype (or the
    given ``channels`` / ``dtype``; ``copies`` such blocks of working memory) beyond the
    memory budget, before it is made: features expanded to billions of channels from a
    few bytes of storage would ask for gigabytes."""
    if channels is None:
        channels = int(feats.shape[1]) if feats.dim() == 2 else 0
    size = dtype.itemsize if dtype is not None else feats.element_size()
    check_allocation(f"{op} output ({rows} rows x {channels} channels)",
                     copies * rows * channels * size)  # fmt: skip
