"""Side-by-side timing and peak-memory measurement.

Implementations of one workload are timed interleaved (``a b c a b c ...``), so a burst
of load from elsewhere on the machine hits all of them alike; each reports the median
of its repetitions. Peak memory is measured in one extra, untimed run per
implementation: a sampling thread would otherwise steal a core from the timed code.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import gc
import os
import statistics
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

__all__ = ["Timing", "peak_rss_growth_mb", "time_side_by_side"]

_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096
_STATM = "/proc/self/statm"
# glibc mallopt parameters.  glibc keeps freed blocks below its (self-raising) mmap
# threshold, so a run that reuses them shows no growth; during a memory run the free
# pages are first handed back (malloc_trim) and every block above 64 KiB is mmapped
# and returned at free, so the resident set tracks live memory.  Afterwards the
# threshold is pinned at glibc's dynamic maximum.
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3
_STRICT_BYTES, _RELAXED_BYTES = 64 * 1024, 32 * 1024 * 1024


def _mallopt(isolate: bool) -> bool:
    """Switches glibc's allocator to (or from) mmap-every-large-block; False if absent."""
    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name) if name else None
        fn = libc.mallopt if libc is not None else None
    except (OSError, AttributeError):
        return False
    if fn is None:
        return False
    size = _STRICT_BYTES if isolate else _RELAXED_BYTES
    ok = bool(fn(_M_MMAP_THRESHOLD, size)) and bool(fn(_M_TRIM_THRESHOLD, size))
    if isolate:
        # Free blocks inside the heap would be reused without growing the resident
        # set; hand their pages back so that reuse shows up as growth.
        libc.malloc_trim(0)
    return ok


@dataclass(frozen=True)
class Timing:
    """Repeated wall-clock times of one implementation.

    Attributes:
        times_ms: Every timed repetition, in milliseconds.
        peak_mb: Growth of the resident set during one run (MiB), None if unknown.
    """

    times_ms: tuple[float, ...]
    peak_mb: float | None

    @property
    def median_ms(self) -> float:
        return statistics.median(self.times_ms)

    @property
    def min_ms(self) -> float:
        return min(self.times_ms)


def _rss_bytes() -> int | None:
    try:
        with open(_STATM) as f:
            return int(f.read().split()[1]) * _PAGE
    except (OSError, ValueError, IndexError):
        return None


def peak_rss_growth_mb(fn: Callable[[], object], interval_s: float = 0.0005) -> float | None:
    """Peak growth of the process's resident set while ``fn`` runs, in MiB.

    With glibc, large blocks are mmapped for the duration of the run (see
    :func:`_mallopt`), so blocks freed by earlier runs do not hide the growth.
    Elsewhere the figure is a lower bound: reused free blocks are not seen.
    """
    gc.collect()
    _mallopt(isolate=True)
    try:
        return _peak(fn, interval_s)
    finally:
        _mallopt(isolate=False)


def _peak(fn: Callable[[], object], interval_s: float) -> float | None:
    start = _rss_bytes()
    if start is None:
        return None
    peak = start
    done = threading.Event()

    def sample() -> None:
        nonlocal peak
        while not done.is_set():
            now = _rss_bytes() or 0
            peak = max(peak, now)
            time.sleep(interval_s)

    thread = threading.Thread(target=sample, daemon=True)
    thread.start()
    try:
        fn()
    finally:
        done.set()
        thread.join()
    peak = max(peak, _rss_bytes() or 0)
    return (peak - start) / 2**20


def time_side_by_side(
    fns: dict[str, Callable[[], object]], repeats: int, warmup: int, memory: bool = True
) -> dict[str, Timing]:
    """Times every function ``repeats`` times, interleaved, after ``warmup`` runs each.

    Args:
        fns: Implementation name -> zero-argument callable (the whole timed work).
        repeats: Timed repetitions per implementation, ``>= 1``.
        warmup: Untimed runs per implementation before timing.
        memory: Also measure peak resident-set growth (one more run each).

    Returns:
        Name -> :class:`Timing`, in the order of ``fns``.
    """
    if repeats < 1:
        raise ValueError(f"repeats: must be >= 1, got {repeats}")
    for fn in fns.values():
        for _ in range(warmup):
            fn()
    times: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(repeats):
        for name, fn in fns.items():
            t0 = time.perf_counter()
            fn()
            times[name].append((time.perf_counter() - t0) * 1e3)
    peaks = {name: peak_rss_growth_mb(fn) if memory else None for name, fn in fns.items()}
    return {name: Timing(tuple(times[name]), peaks[name]) for name in fns}
