"""Fuzz target: pair lists (_C.pairs_count, _C.pairs_fill).

Reference: for each kernel row n, the (nbr[o, n], o) pairs with
nbr[o, n] >= 0 in increasing o; offsets are their prefix counts.  Tables are
arbitrary int32 with -1 for absent; a table with an entry below -1 (drawn now and
then) must be refused by pairs_count with a ValueError.  Malformed offsets given
to pairs_fill (not the ones pairs_count produced) must be refused with a
ValueError, never written past.
"""

from __future__ import annotations

import sys

import numpy as np

if __package__ in (None, ""):
    import os

    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from fuzz._common import _C, Decoder, Finding, Guarded, call, expect, main


def check(data: bytes) -> None:
    d = Decoder(data)
    threads = d.int_in(1, 2)
    n_out, k = d.int_in(0, 60), d.int_in(1, 30)
    dense = d.int_in(1, 4)
    nbr = np.array(
        [d.int_in(0, 100) if d.chance(dense) else -d.int_in(1, 3) for _ in range(n_out * k)],
        dtype=np.int32,
    ).reshape(n_out, k)
    # Only -1 means absent: most tables use it alone; some keep entries below -1.
    malformed = d.chance(6)
    if not malformed:
        nbr = np.maximum(nbr, -1)
    ref_in = [[int(nbr[o, n]) for o in range(n_out) if nbr[o, n] >= 0] for n in range(k)]
    ref_out = [[o for o in range(n_out) if nbr[o, n] >= 0] for n in range(k)]
    ref_off = np.cumsum([0] + [len(c) for c in ref_in]).astype(np.int64)
    off = Guarded((k + 1,), np.int64)
    want = None
    n_arg, k_arg = n_out, k
    if d.chance(12):
        which = d.int_in(0, 2)
        if which == 0:
            n_arg, want = -1, ValueError
        elif which == 1:
            k_arg, want = 0, ValueError
        elif n_out:
            want = ValueError
    p_nbr = 0 if (want is ValueError and n_arg == n_out and k_arg == k) else nbr.ctypes.data
    if want is None and bool((nbr < -1).any()):
        want = ValueError
    expect("pairs_count", call(_C.pairs_count, p_nbr, n_arg, k_arg, off.ptr, threads), want)
    off.check("pairs_count offsets")
    if want is not None:
        return
    if not np.array_equal(off.view, ref_off):
        raise Finding(f"pairs_count offsets {off.view.tolist()}, reference {ref_off.tolist()}")
    offsets = off.view.copy()
    want = None
    if d.chance(4) and k > 0:  # corrupt the offsets: fewer slots than pairs in a row
        n = d.int_in(0, k - 1)
        if ref_off[n + 1] > ref_off[n]:
            offsets[n + 1 :] -= 1
            want = ValueError
    elif d.chance(4):  # arbitrary offsets: only the count's own are accepted
        offsets = np.array(
            [d.int_in(-2, int(ref_off[k]) + 2) for _ in range(k + 1)], dtype=np.int64
        )
        want = None if np.array_equal(offsets, ref_off) else ValueError
    total = max(int(offsets[k]), 0)
    pin = Guarded((total,), np.int32)
    pout = Guarded((total,), np.int32)
    expect(
        "pairs_fill",
        call(
            _C.pairs_fill,
            nbr.ctypes.data,
            n_out,
            k,
            offsets.ctypes.data,
            pin.ptr,
            pout.ptr,
            threads,
        ),
        want,
    )
    pin.check("pairs_fill in")
    pout.check("pairs_fill out")
    if want is not None:
        return
    flat_in = [i for row in ref_in for i in row]
    flat_out = [o for row in ref_out for o in row]
    if pin.view.tolist() != flat_in or pout.view.tolist() != flat_out:
        raise Finding("pairs_fill lists differ from the reference")


if __name__ == "__main__":
    main(check)
