"""Fuzz target: the coordinate hash table through _C.find_duplicate.

Reference: the index of the second occurrence of the earliest repeated row
found by a Python dict scan in row order; negative fields are a ValueError.
Wide coordinates (near 2^31) and many colliding rows exercise the full-width
keys and long probe chains.
"""

from __future__ import annotations

import sys

import numpy as np

if __package__ in (None, ""):
    import os

    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from fuzz._common import _C, Decoder, Finding, Guarded, call, expect, main


def reference(rows: np.ndarray) -> tuple[type | None, int]:
    if (rows < 0).any():
        return ValueError, -1
    seen: set[tuple[int, ...]] = set()
    for i, r in enumerate(rows.tolist()):
        t = tuple(r)
        if t in seen:
            return None, i
        seen.add(t)
    return None, -1


def check(data: bytes) -> None:
    d = Decoder(data)
    rows = d.coords(300)
    if len(rows) and d.chance(3):  # repeat a few rows at random places
        for _ in range(d.int_in(1, 4)):
            rows[d.int_in(0, len(rows) - 1)] = rows[d.int_in(0, len(rows) - 1)]
    buf = Guarded.of(rows)
    want, dup = reference(rows)
    p, n = buf.ptr, len(rows)
    if d.chance(12):
        if n and d.chance(2):
            p, want = 0, ValueError
        else:
            n, want = -1 - n, ValueError
    got = expect("find_duplicate", call(_C.find_duplicate, p, n), want)
    buf.check("find_duplicate rows")
    if not np.array_equal(buf.view, rows):
        raise Finding("find_duplicate modified its input")
    if want is None and got != dup:
        raise Finding(f"find_duplicate returned {got}, reference {dup}")


if __name__ == "__main__":
    main(check)
