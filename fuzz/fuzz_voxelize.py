"""Fuzz target: voxelization (_C.voxel_quantize, _C.voxel_unique,
_C.voxel_reduce).

Points are float32 or float64 with NaN, infinities, huge values and points
below the origin mixed in; batch indices are optional int64 (negative and
beyond int32 too); the grid may be malformed (zero, negative or non-finite
size).  Reference: u = (p - origin) / size in float64, floor, checks in the
core's order (first bad point wins), then numpy's lexicographic unique with
the inverse, then per-voxel sum / mean / max (first maximum) in point order.
"""

from __future__ import annotations

import math
import sys

import numpy as np

if __package__ in (None, ""):
    import os

    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from fuzz._common import _C, INT32_MAX, Decoder, Finding, Guarded, call, expect, main

TL_ERR_INVALID, TL_ERR_OVERFLOW = -1, -3
SPECIAL = [math.nan, math.inf, -math.inf, 1e300, -1e300, 2.0**31, 2.0**31 - 1, -0.0, 5e-324]


def point_value(d: Decoder, clean: bool) -> float:
    k = d.u8()
    if clean:
        return k / 8.0
    if k < 200:
        return (k % 64) / 4.0 - (1.0 if k % 17 == 0 else 0.0)
    if k < 230:
        return SPECIAL[k % len(SPECIAL)]
    return d.f64()


def grid(d: Decoder) -> tuple[tuple[float, ...], tuple[float, ...], bool]:
    size = [(1 + d.int_in(0, 7)) / 4.0 for _ in range(3)]
    origin = [d.int_in(-4, 4) / 2.0 for _ in range(3)]
    bad = False
    if d.chance(8):  # tiny voxels: indices near and beyond int32
        size = [2.0**-28] * 3
    if d.chance(10):
        a = d.int_in(0, 2)
        v = [0.0, -1.0, math.nan, math.inf, -0.0][d.int_in(0, 4)]
        if d.chance(2):
            size[a] = v
        else:
            origin[a] = v if not (v == 0.0 or v == -1.0) else math.inf
        bad = True
    return tuple(size), tuple(origin), bad


def quantize_ref(pts: np.ndarray, batch, size, origin) -> tuple[int, int, np.ndarray]:
    """(status, first bad point, rows) following tl_quantize_one."""
    rows = np.empty((len(pts), 4), dtype=np.int64)
    for p in range(len(pts)):
        b = 0 if batch is None else int(batch[p])
        if b < 0:
            return TL_ERR_INVALID, p, None
        if b > INT32_MAX:
            return TL_ERR_OVERFLOW, p, None
        rows[p, 0] = b
        for a in range(3):
            u = (float(pts[p, a]) - origin[a]) / size[a]
            if not math.isfinite(u) or not u >= 0.0:
                return TL_ERR_INVALID, p, None
            f = math.floor(u)
            if f > INT32_MAX:
                return TL_ERR_OVERFLOW, p, None
            rows[p, a + 1] = f
    return 0, -1, rows


def reduce_ref(feats: np.ndarray, inverse: np.ndarray, m: int, red: int):
    c = feats.shape[1]
    out = np.zeros((m, c), dtype=np.float64)
    arg = np.full((m, c), -1, dtype=np.int64)
    count = np.zeros(m, dtype=np.int64)
    for p in range(len(feats)):
        v = int(inverse[p])
        count[v] += 1
        for j in range(c):
            x = float(feats[p, j])
            if red == 2:
                best = arg[v, j]
                if best < 0 or x > out[v, j] or (x != x and out[v, j] == out[v, j]):
                    out[v, j], arg[v, j] = x, p
            else:
                out[v, j] += x
    if red == 0:
        for v in range(m):
            if count[v]:
                out[v] /= count[v]
    return out, arg


def check(data: bytes) -> None:
    d = Decoder(data)
    dtype = np.float32 if d.chance(2) else np.float64
    n = d.int_in(0, 200)
    clean = not d.chance(3)
    pts = np.array([[point_value(d, clean) for _ in range(3)] for _ in range(n)], dtype=np.float64)
    with np.errstate(over="ignore", invalid="ignore"):
        pts = pts.astype(dtype).reshape(n, 3)
    batch = None
    if d.chance(2):
        batch = np.array([d.int_in(0, 3) for _ in range(n)], dtype=np.int64)
        if n and d.chance(5):
            batch[d.int_in(0, n - 1)] = [-1, INT32_MAX, INT32_MAX + 1, -(2**63)][d.int_in(0, 3)]
    size, origin, bad_grid = grid(d)
    if clean and not bad_grid:
        origin = tuple(min(o, 0.0) for o in origin)
    threads = d.int_in(1, 2)
    code = 0 if dtype == np.float32 else 1
    rows = Guarded((n, 4), np.int32)
    outcome = call(
        _C.voxel_quantize,
        code,
        pts.ctypes.data,
        0 if batch is None else batch.ctypes.data,
        n,
        size,
        origin,
        rows.ptr,
        threads,
    )
    rows.check("voxel_quantize rows")
    if bad_grid:
        expect("voxel_quantize", outcome, ValueError)
        return
    st, bad = expect("voxel_quantize", outcome, None)
    want_st, want_bad, want_rows = quantize_ref(pts, batch, size, origin)
    if (st, bad) != (want_st, want_bad):
        raise Finding(f"voxel_quantize: (st, bad) = {(st, bad)}, reference {(want_st, want_bad)}")
    if st != 0:
        if not rows.untouched():
            raise Finding("voxel_quantize: rows written although a point was rejected")
        return
    if not np.array_equal(rows.view, want_rows):
        raise Finding("voxel_quantize: rows differ from floor((p - origin) / size)")
    # Unique.
    uniq = Guarded((n, 4), np.int32)
    inverse = Guarded((n,), np.int64)
    m = expect(
        "voxel_unique",
        call(_C.voxel_unique, rows.ptr, n, uniq.ptr, inverse.ptr, threads),
        None,
    )
    uniq.check("voxel_unique uniq")
    inverse.check("voxel_unique inverse")
    ref_u, ref_inv = (
        np.unique(want_rows, axis=0, return_inverse=True) if n else (want_rows, np.zeros(0))
    )
    if m != len(ref_u) or not np.array_equal(uniq.view[:m], ref_u):
        raise Finding(f"voxel_unique: {m} rows, reference {len(ref_u)} (or order differs)")
    if not np.array_equal(inverse.view, ref_inv.reshape(-1)):
        raise Finding("voxel_unique: inverse differs")
    # Reduce, sometimes with a malformed inverse.
    c = d.int_in(0, 3)
    red = d.int_in(0, 2)
    feats = np.array([[d.int_in(-8, 8) for _ in range(c)] for _ in range(n)], dtype=dtype)
    feats = feats.reshape(n, c)
    inv = ref_inv.reshape(-1).astype(np.int64)
    want = None
    if n and d.chance(8):
        inv[d.int_in(0, n - 1)] = [-1, m, m + 5][d.int_in(0, 2)]
        want = ValueError
    if d.chance(15):
        red, want = 3 + d.int_in(0, 2), ValueError
    out = Guarded((m, c), dtype)
    arg = Guarded((m if red == 2 else 0, c), np.int64)
    outcome = call(
        _C.voxel_reduce,
        code,
        red,
        feats.ctypes.data,
        n,
        c,
        inv.ctypes.data,
        m,
        out.ptr,
        arg.ptr,
        threads,
    )
    out.check("voxel_reduce out")
    arg.check("voxel_reduce argmax")
    if expect("voxel_reduce", outcome, want) is None and want is None:
        ref_out, ref_arg = reduce_ref(feats, inv, m, red)
        if not np.array_equal(out.view, ref_out.astype(dtype)):
            raise Finding(f"voxel_reduce ({red}): values differ from the reference")
        if red == 2 and not np.array_equal(arg.view, ref_arg):
            raise Finding("voxel_reduce (max): argmax differs from the reference")
    devoxel(
        d,
        code,
        dtype,
        pts,
        batch,
        size,
        origin,
        np.ascontiguousarray(ref_u, dtype=np.int32),
        threads,
    )


def devoxel_ref(pts, batch, size, origin, vox: np.ndarray, trilinear: bool):
    """Rows and weights of each point's voxel or 8 corners (csrc/core/tl_voxel.h)."""
    table = {tuple(r): i for i, r in enumerate(vox.tolist())}
    k = 8 if trilinear else 1
    idx = np.full((len(pts), k), -1, dtype=np.int64)
    w = np.zeros((len(pts), k))
    for p in range(len(pts)):
        b = 0 if batch is None else int(batch[p])
        u, base = [], []
        for a in range(3):
            v = (float(pts[p, a]) - origin[a]) / size[a] - (0.5 if trilinear else 0.0)
            f = math.floor(v)
            base.append(min(f, INT32_MAX + 1))
            u.append(v - f)
        for j in range(k):
            dj = ((j >> 2) & 1, (j >> 1) & 1, j & 1) if trilinear else (0, 0, 0)
            weight = 1.0
            corner = []
            for a in range(3):
                corner.append(base[a] + dj[a])
                weight *= u[a] if dj[a] else 1.0 - u[a]
            row = -1
            if all(0 <= c <= INT32_MAX for c in corner):
                row = table.get((b, *corner), -1)
            idx[p, j] = row
            if row >= 0:
                w[p, j] = weight if trilinear else 1.0
    return idx, w


def devoxel(d, code, dtype, pts, batch, size, origin, vox, threads) -> None:
    """devoxel_map on the voxels of the same points (some dropped, maybe a
    duplicate), then voxel_gather of random features through the map."""
    n = len(pts)
    if len(vox) and d.chance(3):
        vox = np.ascontiguousarray(vox[:: d.int_in(1, 3)])
    want = None
    if len(vox) and d.chance(10):
        vox = np.ascontiguousarray(np.concatenate([vox, vox[-1:]]))
        want = ValueError  # a repeated voxel row
    tri = d.chance(2)
    k = 8 if tri else 1
    idx = Guarded((n, k), np.int64)
    w = Guarded((n, k), np.float64)
    outcome = call(
        _C.voxel_devoxel_map,
        code,
        pts.ctypes.data,
        0 if batch is None else batch.ctypes.data,
        n,
        size,
        origin,
        vox.ctypes.data,
        len(vox),
        int(tri),
        idx.ptr,
        w.ptr,
        threads,
    )
    idx.check("voxel_devoxel_map idx")
    w.check("voxel_devoxel_map w")
    res = expect("voxel_devoxel_map", outcome, want)
    if want is not None:
        return
    if res != (0, -1):
        raise Finding(f"voxel_devoxel_map returned {res} for points quantize accepted")
    ref_idx, ref_w = devoxel_ref(pts, batch, size, origin, vox, tri)
    if not np.array_equal(idx.view, ref_idx):
        raise Finding(f"voxel_devoxel_map (trilinear={tri}): rows differ from the reference")
    if not np.array_equal(w.view, ref_w):
        raise Finding(f"voxel_devoxel_map (trilinear={tri}): weights differ from the reference")
    # Gather, sometimes through a malformed map.
    m, c = len(vox), d.int_in(0, 3)
    feats = np.array([d.int_in(-8, 8) for _ in range(m * c)], dtype=dtype).reshape(m, c)
    gidx = ref_idx.copy()
    want = None
    if n and d.chance(8):
        gidx[d.int_in(0, n - 1), d.int_in(0, k - 1)] = [-2, m, m + 3][d.int_in(0, 2)]
        want = ValueError
    out = Guarded((n, c), dtype)
    outcome = call(
        _C.voxel_gather,
        code,
        feats.ctypes.data,
        m,
        c,
        gidx.ctypes.data,
        ref_w.ctypes.data,
        n,
        k,
        out.ptr,
        threads,
    )
    out.check("voxel_gather out")
    if expect("voxel_gather", outcome, want) is not None or want is not None:
        return
    ref = np.zeros((n, c))
    for p in range(n):
        for j in range(c):
            acc = 0.0
            for q in range(k):
                if gidx[p, q] >= 0:
                    acc += ref_w[p, q] * float(feats[gidx[p, q], j])
            ref[p, j] = acc
    tol = 1e-6 if dtype == np.float32 else 1e-12
    if not np.allclose(out.view, ref.astype(dtype), rtol=tol, atol=tol):
        raise Finding("voxel_gather differs from the reference")


if __name__ == "__main__":
    main(check)
