"""Double-checked lookup of a cache shared between threads.

A hit is a plain dict read (atomic, no lock).  A miss takes the owner's
re-entrant lock and looks again before building, so threads that missed
together build the entry once: the ones that waited take it from the cache.
The builder only builds; storing its result is done here, once for every cache.
Entries are built as normal tensors even under ``torch.inference_mode``: they outlive
the call, and a later training call saves them for backward, which an inference tensor
refuses.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Hashable
from typing import TypeVar

import torch

__all__ = ["get_or_build"]

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")


def get_or_build(cache: dict[K, V], key: K, lock: threading.RLock, build: Callable[[], V]) -> V:
    """``cache[key]`` when present, else ``build()`` under ``lock``, stored as
    ``cache[key]`` and returned (``build`` must not return None)."""
    hit = cache.get(key)
    if hit is not None:
        return hit
    with lock:
        hit = cache.get(key)
        if hit is None:
            with torch.inference_mode(False):
                hit = build()
            cache[key] = hit
        return hit
