"""Fuzz target: pooling maps and pooling (_C.generate, _C.kmap_build,
_C.pool_sum, _C.pool_max, _C.pool_max_backward).

Mode "maps": a random support and a pooling geometry (stride = kernel size
or any stride, padding and dilation small); the output support comes from
_C.generate with the inferred range, the table from _C.kmap_build, and both
are checked against a brute-force scan of each output's window; then sum,
average and max pooling and the max gradient are checked against numpy.
Mode "tables": arbitrary (often malformed) neighbour tables, reverse tables
and argmax arrays, which must be refused with a ValueError.
"""

from __future__ import annotations

import sys

import numpy as np

if __package__ in (None, ""):
    import os

    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from fuzz._common import (
    _C,
    Decoder,
    Finding,
    Guarded,
    call,
    expect,
    kernel_positions,
    kernel_volume,
    main,
)


def window_ref(inp: np.ndarray, geom) -> tuple[np.ndarray, np.ndarray]:
    """(output support, nbr): every window position some input row falls in
    (q * s - p + r * d == c for a kernel row r), then a lookup per window row."""
    ks, st, pd, dl = geom
    table = {tuple(r): i for i, r in enumerate(inp.tolist())}
    pos = kernel_positions(ks)
    outs = set()
    for b, *c in inp.tolist():
        for r in pos:
            t = [c[a] + pd[a] - r[a] * dl[a] for a in range(3)]
            if all(t[a] >= 0 and t[a] % st[a] == 0 for a in range(3)):
                outs.add((b, *(t[a] // st[a] for a in range(3))))
    outs = sorted(outs)
    rows = [
        [
            table.get((q[0], *(q[a + 1] * st[a] - pd[a] + r[a] * dl[a] for a in range(3))), -1)
            for r in pos
        ]
        for q in outs
    ]
    return (
        np.array(outs, dtype=np.int32).reshape(-1, 4),
        np.array(rows, dtype=np.int32).reshape(-1, len(pos)),
    )


def pool_ref(x: np.ndarray, nbr: np.ndarray, dy: np.ndarray, rev: np.ndarray):
    n_out, k = nbr.shape
    c = x.shape[1]
    s = np.zeros((n_out, c))
    mx = np.zeros((n_out, c))
    arg = np.full((n_out, c), -1, dtype=np.int32)
    cnt = (nbr >= 0).sum(axis=1)
    for o in range(n_out):
        for n in range(k):
            i = nbr[o, n]
            if i < 0:
                continue
            s[o] += x[i]
            for j in range(c):
                if arg[o, j] < 0 or x[i, j] > mx[o, j]:
                    mx[o, j], arg[o, j] = x[i, j], i
    avg = s / np.maximum(cnt, 1)[:, None]
    dx = np.zeros((x.shape[0], c))
    for i in range(rev.shape[0]):  # the documented rule, over rev
        for n in range(k):
            o = rev[i, n]
            if o >= 0:
                dx[i] += np.where(arg[o] == i, dy[o], 0.0)
    return s, avg, mx, arg, dx


def pool_call(fn, code, n_in, n_out, k, c, a, table, flag, out, aux, threads, want):
    return expect(
        fn.__name__,
        call(fn, code, n_in, n_out, k, c, a, table, flag, out, aux, threads),
        want,
    )


def maps_mode(d: Decoder, threads: int) -> None:
    inp = d.coords(150, allow_negative=False)
    if not len(inp) or inp.max() > 12:
        inp = np.array(
            [[d.int_in(0, 1), *(d.int_in(0, 9) for _ in range(3))] for _ in range(d.int_in(1, 80))],
            dtype=np.int32,
        )
    _, first = np.unique(inp, axis=0, return_index=True)
    inp = np.ascontiguousarray(inp[np.sort(first)])
    ks = tuple(d.int_in(1, 3) for _ in range(3))
    st = ks if d.chance(2) else tuple(d.int_in(1, 3) for _ in range(3))
    pd = (0, 0, 0) if d.chance(2) else tuple(d.int_in(0, ks[a] - 1) for a in range(3))
    dl = (1, 1, 1) if d.chance(2) else tuple(d.int_in(1, 2) for _ in range(3))
    geom = (ks, st, pd, dl)
    rng = tuple((int(inp[:, a + 1].max()) + pd[a]) // st[a] + 1 for a in range(3))
    nb = int(inp[:, 0].max()) + 1
    bound = _C.generate_bound(len(inp), geom, rng, nb)
    out = Guarded((bound, 4), np.int32)
    m = _C.generate(inp.ctypes.data, len(inp), geom, rng, out.ptr, bound)
    out.check("generate out")
    ref_out, ref_nbr = window_ref(inp, geom)
    if m != len(ref_out) or not np.array_equal(out.view[:m], ref_out):
        raise Finding(f"pooling support: {m} rows, window scan {len(ref_out)} ({geom})")
    k = kernel_volume(ks)
    nbr = Guarded((m, k), np.int32)
    _C.kmap_build(inp.ctypes.data, len(inp), out.ptr, m, geom, nbr.ptr, threads)
    nbr.check("kmap_build nbr")
    if not np.array_equal(nbr.view, ref_nbr):
        raise Finding(f"pooling map differs from the window scan ({geom})")
    rev = Guarded((len(inp), k), np.int32)
    _C.kmap_reverse(nbr.ptr, m, k, len(inp), rev.ptr, threads)
    rev.check("kmap_reverse rev")
    run_pool(d, nbr.view.copy(), rev.view.copy(), len(inp), threads, None)


def run_pool(d, nbr, rev, n_in, threads, want) -> None:
    n_out, k = nbr.shape
    c = d.int_in(0, 3)
    dtype = np.float32 if d.chance(2) else np.float64
    code = 0 if dtype == np.float32 else 1
    x = np.array([d.int_in(-6, 6) for _ in range(n_in * c)], dtype=dtype).reshape(n_in, c)
    dy = np.array([d.int_in(-6, 6) for _ in range(n_out * c)], dtype=dtype).reshape(n_out, c)
    tb, rb = np.ascontiguousarray(nbr), np.ascontiguousarray(rev)
    ys = Guarded((n_out, c), dtype)
    ya = Guarded((n_out, c), dtype)
    ym = Guarded((n_out, c), dtype)
    am = Guarded((n_out, c), np.int32)
    args = (code, n_in, n_out, k, c, x.ctypes.data, tb.ctypes.data)
    pool_call(_C.pool_sum, *args, 0, ys.ptr, 0, threads, want)
    pool_call(_C.pool_sum, *args, 1, ya.ptr, 0, threads, want)
    pool_call(_C.pool_max, *args, 0, ym.ptr, am.ptr, threads, want)
    for g, what in ((ys, "sum"), (ya, "avg"), (ym, "max"), (am, "argmax")):
        g.check(f"pool {what}")
    if want is not None:
        return
    s, avg, mx, arg, dx = pool_ref(x.astype(np.float64), nbr, dy.astype(np.float64), rev)
    tol = 1e-5 if dtype == np.float32 else 1e-12
    if not np.allclose(ys.view, s, rtol=tol, atol=tol):
        raise Finding("pool_sum differs from the reference")
    if not np.allclose(ya.view, avg, rtol=tol, atol=tol):
        raise Finding("pool_sum (average) differs from the reference")
    if not np.array_equal(ym.view, mx.astype(dtype)) or not np.array_equal(am.view, arg):
        raise Finding("pool_max differs from the reference")
    gx = Guarded((n_in, c), dtype)
    bargs = (code, n_in, n_out, k, c, dy.ctypes.data, rb.ctypes.data, 0, gx.ptr, am.ptr)
    pool_call(_C.pool_max_backward, *bargs, threads, None)
    gx.check("pool_max_backward dx")
    if not np.array_equal(gx.view, dx.astype(dtype)):
        raise Finding("pool_max_backward differs from the reference")


def tables_mode(d: Decoder, threads: int) -> None:
    n_in, n_out, k, c = d.int_in(0, 30), d.int_in(0, 30), d.int_in(1, 8), d.int_in(0, 3)
    nbr = np.array(
        [d.int_in(-3, n_in + 2) if d.chance(2) else -1 for _ in range(n_out * k)], dtype=np.int32
    ).reshape(n_out, k)
    bad = bool(((nbr < -1) | (nbr >= n_in)).any())
    if not bad and not d.chance(3):
        run_pool(d, nbr, np.full((n_in, k), -1, dtype=np.int32), n_in, threads, None)
        return
    dtype = np.float64
    x = np.zeros((n_in, max(c, 1)))
    y = Guarded((n_out, max(c, 1)), dtype)
    arg = Guarded((n_out, max(c, 1)), np.int32)
    want = ValueError if bad and c * n_out > 0 else None
    if want is None and bad and c == 0:
        want = ValueError if n_out * k > 0 else None
    args = (1, n_in, n_out, k, c, x.ctypes.data, nbr.ctypes.data)
    pool_call(_C.pool_sum, *args, 0, y.ptr, 0, threads, want)
    pool_call(_C.pool_max, *args, 0, y.ptr, arg.ptr, threads, want)
    y.check("pool out")
    arg.check("pool argmax")
    # Malformed argmax for the backward pass, with a well-formed rev.
    rev = np.full((n_in, k), -1, dtype=np.int32)
    am = np.array(
        [d.int_in(-3, n_in + 2) for _ in range(n_out * max(c, 1))], dtype=np.int32
    ).reshape(n_out, max(c, 1))
    dy = np.zeros((n_out, max(c, 1)))
    am_bad = c > 0 and bool(((am[:, :c] < -1) | (am[:, :c] >= n_in)).any())
    dx = Guarded((n_in, max(c, 1)), dtype)
    pool_call(
        _C.pool_max_backward,
        1,
        n_in,
        n_out,
        k,
        c,
        dy.ctypes.data,
        rev.ctypes.data,
        0,
        dx.ptr,
        am.ctypes.data,
        threads,
        ValueError if am_bad else None,
    )
    dx.check("pool_max_backward dx")
    # Bad sizes and dtype codes.
    code = [0, 1, 2, 7, -1][d.int_in(0, 4)]
    neg = d.chance(2)
    w = ValueError if neg else (RuntimeError if code not in (0, 1) else None)
    if w is None:
        return
    ok, exc = call(_C.pool_sum, code, -1 if neg else 0, 0, 1, 0, 0, 0, 0, 0, 0, threads)
    if ok or type(exc) is not w or not str(exc):
        raise Finding(f"pool_sum with dtype {code}, n_in {-1 if neg else 0}: {ok, exc!r}")


def check(data: bytes) -> None:
    d = Decoder(data)
    threads = d.int_in(1, 2)
    if d.chance(2):
        maps_mode(d, threads)
    else:
        tables_mode(d, threads)


if __name__ == "__main__":
    main(check)
