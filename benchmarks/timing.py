"""Side-by-side timing and peak-memory measurement.

Implementations of one workload are timed interleaved (``a b c a b c ...``), so a burst
of load from elsewhere on the machine hits all of them alike; each reports the median
of its repetitions. Peak memory is measured in one extra, untimed run per
implementation: a sampling thread would otherwise steal a core from the timed code.
"""

from __future__ import annotations

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

    Freed memory that the allocator keeps is not seen again, so the figure is the
    extra memory ``fn`` needed beyond what the process already held (a lower bound of
    its true peak when earlier runs left reusable blocks behind).
    """
    gc.collect()
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
