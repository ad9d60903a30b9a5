"""Fuzz target: generated output supports (_C.generate_bound, _C.generate).

Reference: every candidate q = (c + p - r*d) / s reached from an input row c
through a kernel row r (exact division, 0 <= q < out_range), deduplicated
and sorted; when the output box is small, also a scan of every q in the box
asking whether any kernel row lands on an input row.  The bound must cover
the true count whenever the batch indices lie in [0, n_batches).
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
    kernel_volume,
    main,
    table_width,
)


def candidates(rows: np.ndarray, geom, rng) -> set[tuple[int, int, int, int]]:
    ks, st, pd, dl = geom
    out = set()
    for b, *c in rows.tolist():
        per_axis = []
        for a in range(3):
            qs = []
            for r in range(ks[a]):
                t = c[a] + pd[a] - r * dl[a]
                if t >= 0 and t % st[a] == 0 and t // st[a] < rng[a]:
                    qs.append(t // st[a])
            per_axis.append(qs)
        for x in per_axis[0]:
            for y in per_axis[1]:
                for z in per_axis[2]:
                    out.add((b, x, y, z))
    return out


def box_scan(rows: np.ndarray, geom, rng) -> set[tuple[int, int, int, int]]:
    ks, st, pd, dl = geom
    present = {tuple(r) for r in rows.tolist()}
    pos = kernel_positions(ks)
    out = set()
    if min(rng) == 0:
        return out
    for b in sorted({r[0] for r in present}):
        for x in range(rng[0]):
            for y in range(rng[1]):
                for z in range(rng[2]):
                    q = (x, y, z)
                    if any(
                        (b, *(q[a] * st[a] - pd[a] + r[a] * dl[a] for a in range(3))) in present
                        for r in pos
                    ):
                        out.add((b, x, y, z))
    return out


def out_range(d: Decoder, rows: np.ndarray, geom) -> tuple[int, int, int]:
    mode = d.int_in(0, 4)
    if mode == 0 and len(rows) and geometry_error(geom) is None:  # the inferred extent
        return tuple(
            max(0, (int(rows[:, a + 1].max()) + geom[2][a]) // geom[1][a] + 1) for a in range(3)
        )
    if mode == 1:
        return tuple(d.int_in(0, 6) for _ in range(3))
    if mode == 2:
        return tuple(INT32_MAX + 1 - d.int_in(0, 3) for _ in range(3))
    if mode == 3:  # a range the core must refuse
        return tuple(
            INT32_MAX + 1 + d.int_in(0, 2) if d.chance(2) else -d.int_in(1, 3) for _ in range(3)
        )
    return tuple(d.int_in(0, 12) for _ in range(3))


def check(data: bytes) -> None:
    d = Decoder(data)
    rows = d.coords(150)
    geom = d.geometry()
    rng = out_range(d, rows, geom)
    nb = int(rows[:, 0].max()) + 1 if len(rows) else 0
    nb = max(nb, 0) + (d.int_in(0, 2) if d.chance(4) else 0)
    # Expected verdicts.
    gerr = geometry_error(geom)
    ks = geom[0]
    # Both entry points refuse an out_range outside [0, 2^31]: outputs are int32.
    range_err = ValueError if min(rng) < 0 or max(rng) > INT32_MAX + 1 else None
    bound_err = gerr or range_err
    bound = expect("generate_bound", call(_C.generate_bound, len(rows), geom, rng, nb), bound_err)
    gen_err = gerr or range_err
    ref = None
    if gen_err is None:
        ref = candidates(rows, geom, rng)
        if any(q[0] < 0 for q in ref):
            gen_err = ValueError  # a negative batch reaches the (sorted) output
        elif rng[0] * rng[1] * rng[2] * len(set(rows[:, 0].tolist())) * kernel_volume(ks) <= 50000:
            scan = box_scan(rows, geom, rng)
            if scan != ref:
                raise Finding(f"reference disagreement {sorted(scan ^ ref)[:4]}")
    valid_batches = len(rows) == 0 or (rows[:, 0] >= 0).all()
    if bound is not None and ref is not None and gen_err is None and valid_batches:
        if bound < len(ref):
            raise Finding(f"generate_bound {bound} < true count {len(ref)} ({geom}, {rng})")
    k = table_width(geom)
    cap = bound if bound is not None and valid_batches else len(rows) * k
    cap = min(cap, len(rows) * k)
    src = Guarded.of(rows)
    out = Guarded((cap, 4), np.int32)
    pin = src.ptr
    if len(rows) and d.chance(15):
        pin, gen_err = 0, gen_err or ValueError
    m = expect("generate", call(_C.generate, pin, len(rows), geom, rng, out.ptr, cap), gen_err)
    out.check("generate out")
    if m is None:
        return
    want = np.array(sorted(ref), dtype=np.int32).reshape(-1, 4)
    if m != len(want) or not np.array_equal(out.view[:m], want):
        raise Finding(f"generate: {m} rows, reference {len(want)} ({geom}, {rng})")


if __name__ == "__main__":
    main(check)
