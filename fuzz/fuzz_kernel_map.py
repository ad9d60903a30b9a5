"""Fuzz target: kernel maps of every family (_C.kmap_build, _C.kmap_reverse).

Families: submanifold (input and output are the same buffer, so the C core's
self-relation fast path runs), strided (output = the generated support), each
with the input rows in ascending order half the time (the C core's merge and
input-side paths),
transposed / generative (input = the generative support of the output),
arbitrary (two unrelated supports, any geometry), and malformed tables for
kmap_reverse.  Reference: dictionary lookup of every output row through
every kernel row, and the plain transpose of the table.
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


def reference_nbr(inp: np.ndarray, out: np.ndarray, geom) -> tuple[type | None, np.ndarray]:
    """(expected error, nbr) by dictionary lookup."""
    err = geometry_error(geom)
    if err is not None:
        return err, None
    rows = [tuple(int(v) for v in r) for r in inp]
    if any(v < 0 for r in rows for v in r):
        return ValueError, None
    table = {}
    for i, r in enumerate(rows):
        if r in table:
            return ValueError, None  # duplicate input row
        table[r] = i
    ks, st, pd, dl = geom
    pos = kernel_positions(ks)
    nbr = np.full((len(out), len(pos)), -1, dtype=np.int32)
    for o, q in enumerate(out.tolist()):
        for n, r in enumerate(pos):
            key = (q[0], *(q[a + 1] * st[a] - pd[a] + r[a] * dl[a] for a in range(3)))
            nbr[o, n] = table.get(key, -1)
    return None, nbr


def reference_rev(nbr: np.ndarray, n_in: int) -> tuple[type | None, np.ndarray]:
    n_out, k = nbr.shape
    rev = np.full((n_in, k), -1, dtype=np.int32)
    for o in range(n_out):
        for n in range(k):
            i = int(nbr[o, n])
            if i == -1:
                continue
            if i < 0 or i >= n_in or rev[i, n] != -1:
                return ValueError, None
            rev[i, n] = o
    return None, rev


def run_kmap(inp: np.ndarray, out: np.ndarray | None, geom, threads: int, nulls: int):
    """Calls kmap_build (out None: the submanifold self-relation, one buffer)."""
    same = out is None
    out_rows = inp if same else out
    bin_ = Guarded.of(inp)
    bout = bin_ if same else Guarded.of(out_rows)
    nbr = Guarded((len(out_rows), table_width(geom)), np.int32)
    want, ref = reference_nbr(inp, out_rows, geom)
    pin, pout, pnbr = bin_.ptr, bout.ptr, nbr.ptr
    n_in, n_out = len(inp), len(out_rows)
    if nulls == 1 and n_in:
        pin, want = 0, want or ValueError
    elif nulls == 2 and n_out:
        pnbr, want = 0, want or ValueError
    elif nulls == 3:
        n_in, want = -1 - n_in, want or ValueError
    res = expect(
        "kmap_build",
        call(_C.kmap_build, pin, n_in, pout, n_out, geom, pnbr, threads),
        want,
    )
    nbr.check("kmap_build nbr")
    bin_.check("kmap_build in")
    if want is not None:
        if not nbr.untouched():
            raise Finding("kmap_build: nbr written although the call failed")
        return None
    if res is not None:
        raise Finding(f"kmap_build returned {res!r}, expected None")
    if not np.array_equal(nbr.view, ref):
        bad = np.argwhere(nbr.view != ref)[0]
        raise Finding(
            f"kmap_build: nbr{tuple(int(v) for v in bad)} = {int(nbr.view[tuple(bad)])}, "
            f"reference {int(ref[tuple(bad)])} (geometry {geom}, self={same})"
        )
    return nbr.view.copy()


def run_reverse(nbr: np.ndarray, n_in: int, threads: int) -> None:
    n_out, k = nbr.shape
    src = Guarded.of(nbr)
    rev = Guarded((n_in, k), np.int32)
    want, ref = reference_rev(nbr, n_in)
    expect("kmap_reverse", call(_C.kmap_reverse, src.ptr, n_out, k, n_in, rev.ptr, threads), want)
    rev.check("kmap_reverse rev")
    if want is None and not np.array_equal(rev.view, ref):
        raise Finding("kmap_reverse: rev differs from the transpose of nbr")


def subm_geometry(d: Decoder) -> tuple:
    """A geometry for which (K-1)*d == 2p on every axis (the self fast path)."""
    ks, dl, pd = [], [], []
    for _ in range(3):
        k = d.int_in(1, 5)
        dil = d.int_in(1, 3)
        if (k - 1) * dil % 2:
            dil += 1  # even kernel sizes need an even dilation
        ks.append(k)
        dl.append(dil)
        pd.append((k - 1) * dil // 2)
    return (tuple(ks), (1, 1, 1), tuple(pd), tuple(dl))


def generated_support(inp: np.ndarray, geom) -> np.ndarray | None:
    """Output support of a strided relation, through _C.generate."""
    if geometry_error(geom) is not None or not len(inp) or (inp < 0).any():
        return None
    nb = int(inp[:, 0].max()) + 1
    rng = tuple(
        min(INT32_MAX + 1, (int(inp[:, a + 1].max()) + geom[2][a]) // geom[1][a] + 1)
        for a in range(3)
    )
    bound = _C.generate_bound(len(inp), geom, rng, nb)
    out = np.empty((max(bound, 1), 4), dtype=np.int32)
    m = _C.generate(inp.ctypes.data, len(inp), geom, rng, out.ctypes.data, bound)
    return out[:m].copy()


def check(data: bytes) -> None:
    d = Decoder(data)
    family = d.int_in(0, 4)
    threads = d.int_in(1, 2)
    nulls = d.int_in(0, 3) if d.chance(10) else 0
    if family == 0:  # submanifold: the same buffer on both sides
        inp = d.coords(200)
        if d.chance(2) and len(inp):  # ascending rows: the C core's merge path
            inp = np.ascontiguousarray(np.unique(inp, axis=0))
        geom = subm_geometry(d)
        nbr = run_kmap(inp, None, geom, threads, nulls)
    elif family == 1:  # strided: output = the generated support
        inp = d.coords(150, allow_negative=False)
        if d.chance(2) and len(inp):  # ascending rows: the merge, or the input-side fill
            inp = np.ascontiguousarray(np.unique(inp, axis=0))
        geom = d.geometry(allow_bad=False)
        out = generated_support(np.unique(inp, axis=0) if len(inp) else inp, geom)
        if out is None:
            out = d.coords(50)
        nbr = run_kmap(inp, out, geom, threads, nulls)
    elif family == 2:  # transposed / generative: input = generative support of out
        out = d.coords(60, allow_negative=False)
        ks = tuple(d.int_in(1, 3) for _ in range(3))
        st = tuple(d.int_in(1, 3) for _ in range(3))
        geom = (ks, st, (0, 0, 0), (1, 1, 1))
        inp = out
        cap = len(out) * kernel_volume(ks)
        fine = np.empty((max(cap, 1), 4), dtype=np.int32)
        ok, m = call(_C.generative, out.ctypes.data, len(out), geom, fine.ctypes.data, cap)
        inp = fine[:m].copy() if ok else d.coords(60)
        if d.chance(3) and len(inp):  # drop some fine rows
            inp = inp[:: d.int_in(1, 3)].copy()
        nbr = run_kmap(inp, out, geom, threads, nulls)
    elif family == 3:  # arbitrary supports and geometry
        inp = d.coords(120)
        out = d.coords(120)
        geom = d.geometry()
        nbr = run_kmap(inp, out, geom, threads, nulls)
    else:  # malformed tables for kmap_reverse
        n_out, k, n_in = d.int_in(0, 40), d.int_in(1, 9), d.int_in(0, 40)
        entries = [d.int_in(-3, n_in + 2) if d.chance(3) else -1 for _ in range(n_out * k)]
        nbr = np.array(entries, dtype=np.int32).reshape(n_out, k)
        run_reverse(nbr, n_in, threads)
        return
    if nbr is not None:
        run_reverse(nbr, len(inp), threads)


if __name__ == "__main__":
    main(check)
