"""Fuzz target: generative-transpose supports (_C.generative).

Reference: the sorted set {c * s + r} over input rows c and kernel rows r;
the first input row with a negative field is a ValueError and the first one
whose c * s + k - 1 passes 2^31 - 1 an OverflowError; padding != 0 or
dilation != 1 is a ValueError.  Capacity n * K always suffices; a smaller
capacity must fail cleanly (no write past it).
"""

from __future__ import annotations

import sys

import numpy as np

if __package__ in (None, ""):
    import os

    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from fuzz._common import (
    _C,
    INT32_MAX,
    Decoder,
    Finding,
    Guarded,
    call,
    expect,
    geometry_error,
    kernel_positions,
    main,
    table_width,
)


def reference(rows: np.ndarray, geom) -> tuple[type | None, set | None]:
    err = geometry_error(geom)
    if err is not None:
        return err, None
    ks, st, pd, dl = geom
    if any(p != 0 for p in pd) or any(v != 1 for v in dl):
        return ValueError, None
    for r in rows.tolist():
        if min(r) < 0:
            return ValueError, None
        if any(r[a + 1] * st[a] + ks[a] - 1 > INT32_MAX for a in range(3)):
            return OverflowError, None
    out = set()
    for b, x, y, z in rows.tolist():
        for i, j, k in kernel_positions(ks):
            out.add((b, x * st[0] + i, y * st[1] + j, z * st[2] + k))
    return None, out


def check(data: bytes) -> None:
    d = Decoder(data)
    rows = d.coords(100)
    geom = d.geometry()
    if not d.chance(5):  # mostly a valid generative geometry
        geom = (geom[0], geom[1], (0, 0, 0), (1, 1, 1))
    want, ref = reference(rows, geom)
    cap = len(rows) * table_width(geom)
    short = ref is not None and len(ref) > 0 and d.chance(6)
    if short:  # a too-small buffer: TL_ERR_CAPACITY, a RuntimeError
        cap = d.int_in(0, len(ref) - 1)
    src = Guarded.of(rows)
    out = Guarded((cap, 4), np.int32)
    outcome = call(_C.generative, src.ptr, len(rows), geom, out.ptr, cap)
    out.check("generative out")
    if short:
        ok, exc = outcome
        if ok or not isinstance(exc, RuntimeError) or "too small" not in str(exc):
            raise Finding(f"generative with capacity {cap} < {len(ref)}: {outcome}")
        return
    m = expect("generative", outcome, want)
    if m is None:
        return
    expect_rows = np.array(sorted(ref), dtype=np.int32).reshape(-1, 4)
    if m != len(expect_rows) or not np.array_equal(out.view[:m], expect_rows):
        raise Finding(f"generative: {m} rows, reference {len(expect_rows)} ({geom})")


if __name__ == "__main__":
    main(check)
