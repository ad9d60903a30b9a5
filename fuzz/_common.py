"""Shared pieces of the fuzz harnesses (see docs/fuzzing.md).

Every harness is a pure ``check(data: bytes) -> None`` that decodes the bytes
into a small problem, calls ``torch_lattice._C`` directly (raw pointers of
numpy buffers), and raises :class:`Finding` when the C core disagrees with a
brute-force reference, raises an unclean exception, or writes outside the
buffers it was given.  ``main()`` runs a ``check`` under atheris; the pytest
file tests/project/test_fuzz_corpus.py replays the seed corpus without atheris.
"""

from __future__ import annotations

import os
import struct
import sys
from collections.abc import Callable

import numpy as np

_REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if _REPO not in sys.path:
    sys.path.insert(0, _REPO)


def _load_core():
    """torch_lattice._C without importing torch: the extension is torch-free,
    so a harness starts in milliseconds.  Reuses the module when the package
    is already imported (as under pytest)."""
    import glob
    import importlib.machinery
    import importlib.util

    name = "torch_lattice._C"
    override = os.environ.get("TORCH_LATTICE_FUZZ_C")  # e.g. a sanitizer build's _C
    if override:
        loader = importlib.machinery.ExtensionFileLoader(name, override)
        module = importlib.util.module_from_spec(
            importlib.util.spec_from_file_location(name, override, loader=loader)
        )
        loader.exec_module(module)
        return module
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.find_spec("torch_lattice")
    if spec is None or not spec.submodule_search_locations:
        raise ImportError("torch_lattice is not installed (run scripts/setup-env.sh)")
    found = []
    for d in spec.submodule_search_locations:
        found += glob.glob(os.path.join(d, "_C*.so")) + glob.glob(os.path.join(d, "_C*.pyd"))
    if not found:
        raise ImportError("torch_lattice._C is not built (run scripts/setup-env.sh)")
    loader = importlib.machinery.ExtensionFileLoader(name, found[0])
    mod_spec = importlib.util.spec_from_file_location(name, found[0], loader=loader)
    module = importlib.util.module_from_spec(mod_spec)
    loader.exec_module(module)
    sys.modules[name] = module
    return module


_C = _load_core()

INT32_MAX = 2**31 - 1
# The exception types the C core may raise for a bad argument (tl_raise and
# CPython's argument parsing).  RuntimeError is never expected here: every
# harness sizes its buffers so TL_ERR_CAPACITY cannot happen on a correct core.
CLEAN = (ValueError, OverflowError, TypeError)

__all__ = [
    "CLEAN",
    "INT32_MAX",
    "_C",
    "Decoder",
    "Finding",
    "Guarded",
    "call",
    "expect",
    "geometry_error",
    "kernel_positions",
    "kernel_volume",
    "main",
    "require_clean",
    "table_width",
]


class Finding(AssertionError):
    """A bug in the C core (or a wrong reference): the fuzzer reports it."""


def require_clean(run: Callable[[], object], clean: tuple[type[BaseException], ...]) -> None:
    """Runs ``run``: one of the ``clean`` exceptions must carry a message, and any
    other exception is a :class:`Finding` (the harnesses of whole tools use this)."""
    try:
        run()
    except clean as exc:
        if not str(exc):
            raise Finding(f"{type(exc).__name__} without a message") from exc
    except Finding:
        raise
    except Exception as exc:
        raise Finding(f"unclean exception {type(exc).__name__}: {exc!s:.200}") from exc


class Decoder:
    """Reads small integers and floats from fuzz bytes; zeros once exhausted."""

    def __init__(self, data: bytes) -> None:
        self.data = data
        self.pos = 0

    def u8(self) -> int:
        if self.pos >= len(self.data):
            return 0
        v = self.data[self.pos]
        self.pos += 1
        return v

    def u16(self) -> int:
        return self.u8() | (self.u8() << 8)

    def u32(self) -> int:
        return self.u16() | (self.u16() << 16)

    def i32(self) -> int:
        v = self.u32()
        return v - 2**32 if v >= 2**31 else v

    def i64(self) -> int:
        v = self.u32() | (self.u32() << 32)
        return v - 2**64 if v >= 2**63 else v

    def int_in(self, lo: int, hi: int) -> int:
        """Integer in [lo, hi] (inclusive)."""
        span = hi - lo + 1
        if span <= 1:
            return lo
        v = self.u8() if span <= 256 else self.u32()
        return lo + v % span

    def chance(self, k: int) -> bool:
        """True with probability about 1/k."""
        return self.u8() % k == 0

    def f64(self) -> float:
        return struct.unpack("<d", bytes(self.u8() for _ in range(8)))[0]

    def remaining(self) -> int:
        return len(self.data) - self.pos

    # ---- geometry and coordinates -------------------------------------------

    def coord_value(self, mode: int) -> int:
        """One coordinate field; `mode` picks the scale of the problem."""
        if mode == 0:
            return self.int_in(0, 7)
        if mode == 1:
            return self.int_in(0, 40)
        if mode == 2:
            return INT32_MAX - self.int_in(0, 7)
        if mode == 3:
            return self.int_in(0, 5) if self.chance(2) else INT32_MAX - self.int_in(0, 5)
        if mode == 4:
            return self.int_in(-3, 5)
        if mode == 5:
            return (2**30) - 4 + self.int_in(0, 8)
        return self.i32()

    def coords(self, max_rows: int, allow_negative: bool = True) -> np.ndarray:
        """(n, 4) int32 rows, a few hundred at most: usually unique and
        non-negative, sometimes with a duplicated row or negative fields."""
        n = self.int_in(0, max_rows)
        negative = allow_negative and self.chance(6)
        modes = [self.int_in(0, 6 if negative else 5) for _ in range(4)]
        if not negative:
            modes = [m if m != 4 else 0 for m in modes]
        modes[0] = modes[0] if self.chance(3) else 0  # batch: usually small
        rows = np.empty((n, 4), dtype=np.int64)
        for i in range(n):
            for a in range(4):
                rows[i, a] = self.coord_value(modes[a])
                if a == 0 and modes[0] == 0:
                    rows[i, a] %= 3
        if not self.chance(6):  # unique rows, first occurrence order kept
            _, first = np.unique(rows, axis=0, return_index=True)
            rows = rows[np.sort(first)]
        elif len(rows):  # a duplicated row
            rows[self.int_in(0, len(rows) - 1)] = rows[self.int_in(0, len(rows) - 1)]
        return rows.astype(np.int32).reshape(-1, 4)

    def geometry(self, allow_bad: bool = True) -> tuple:
        """((ks), (stride), (padding), (dilation)), occasionally malformed."""
        ks = [self.int_in(1, 4) for _ in range(3)]
        st = [self.int_in(1, 3) for _ in range(3)]
        pd = [self.int_in(0, 3) for _ in range(3)]
        dl = [self.int_in(1, 3) for _ in range(3)]
        if allow_bad and self.chance(12):
            which = self.int_in(0, 5)
            a = self.int_in(0, 2)
            if which == 0:
                ks[a] = self.int_in(-2, 0)
            elif which == 1:
                st[a] = self.int_in(-2, 0)
            elif which == 2:
                pd[a] = self.int_in(-3, -1)
            elif which == 3:
                dl[a] = self.int_in(-2, 0)
            elif which == 4:  # kernel volume beyond int32
                ks = [65536, 65536, 1 + self.int_in(0, 3)]
            else:  # a value beyond a C int: argument parsing must refuse it
                [ks, st, pd, dl][self.int_in(0, 3)][a] = 2**31 + self.int_in(0, 3)
        return (tuple(ks), tuple(st), tuple(pd), tuple(dl))


def geometry_error(geom: tuple) -> type | None:
    """Exception tl_geom_check (or argument parsing) raises for geom, or None."""
    ks, st, pd, dl = geom
    if any(not -(2**31) <= v <= INT32_MAX for part in geom for v in part):
        return OverflowError
    if any(v < 1 for v in (*ks, *st, *dl)) or any(v < 0 for v in pd):
        return ValueError
    vol = 1
    for v in ks:
        vol *= v
        if vol > INT32_MAX:
            return OverflowError
    return None


def kernel_positions(ks) -> list[tuple[int, int, int]]:
    """Kernel rows r in the C core's order (last axis fastest)."""
    return [(a, b, c) for a in range(ks[0]) for b in range(ks[1]) for c in range(ks[2])]


def kernel_volume(ks) -> int:
    return ks[0] * ks[1] * ks[2]


def table_width(geom: tuple) -> int:
    """Columns of a kernel-map table for geom: the kernel volume, or 1 when the
    geometry is bad (the call must refuse it before writing anything)."""
    return kernel_volume(geom[0]) if geometry_error(geom) is None else 1


class Guarded:
    """A numpy buffer with sentinel-filled guard elements after it.

    ``ptr`` is the address of the first element; :meth:`check` raises
    :class:`Finding` when the C core wrote past the end.
    """

    GUARD = 64

    def __init__(self, shape: tuple, dtype, fill=None) -> None:
        self.shape = shape
        count = int(np.prod(shape)) if shape else 1
        self.full = np.empty(count + self.GUARD, dtype=dtype)
        sentinel = fill if fill is not None else _sentinel(self.full.dtype)
        self.full[:] = sentinel
        self.sentinel = sentinel
        self.count = count
        self.view = self.full[:count].reshape(shape)

    @classmethod
    def of(cls, rows: np.ndarray, dtype=np.int32) -> Guarded:
        """A guarded copy of rows (cast to dtype)."""
        g = cls(rows.shape, dtype)
        g.view[...] = rows
        return g

    @property
    def ptr(self) -> int:
        return self.full.ctypes.data

    def check(self, what: str) -> None:
        tail = self.full[self.count :]
        if not _same(tail, self.sentinel):
            raise Finding(f"{what}: the C core wrote past the end of its buffer")

    def untouched(self) -> bool:
        return _same(self.full[: self.count], self.sentinel)


def _sentinel(dtype: np.dtype):
    if dtype.kind == "f":
        return dtype.type(-12345.25)
    return dtype.type(-7777777)


def _same(a: np.ndarray, v) -> bool:
    return bool(np.all(a == v))


def call(fn, *args):
    """(True, result) or (False, exception) of fn(*args)."""
    try:
        return True, fn(*args)
    except Exception as exc:
        return False, exc


def expect(name: str, outcome: tuple, want_error: type | None):
    """Checks a call's outcome against the reference's verdict.

    Returns the call's result when both agree it succeeds; raises Finding
    when one fails and the other does not, when the error is of the wrong
    type, or when its message does not name the entry point.
    """
    ok, value = outcome
    if ok:
        if want_error is not None:
            raise Finding(f"{name}: succeeded, but the reference expects {want_error.__name__}")
        return value
    exc = value
    if not isinstance(exc, CLEAN):
        raise Finding(f"{name}: unclean exception {type(exc).__name__}: {exc}") from exc
    if not str(exc):
        raise Finding(f"{name}: {type(exc).__name__} without a message") from exc
    if want_error is None:
        raise Finding(f"{name}: raised {type(exc).__name__}: {exc}, reference succeeds") from exc
    if not isinstance(exc, want_error):
        raise Finding(
            f"{name}: raised {type(exc).__name__}: {exc}, reference expects {want_error.__name__}"
        ) from exc
    return None


def main(check, argv: list[str] | None = None) -> None:
    """Runs `check` under atheris (libFuzzer flags in argv)."""
    import atheris

    def one(data: bytes) -> None:
        check(data)

    # Coverage feedback comes from the harness's own Python (the decoders and
    # references branch on what the C core is given and returns); the C core
    # itself is not built with libFuzzer's instrumentation.
    for mod in list(sys.modules.values()):
        if getattr(mod, "__name__", "").startswith(("fuzz", "__main__")):
            for obj in list(vars(mod).values()):
                if callable(obj) and getattr(obj, "__module__", None) == mod.__name__:
                    if hasattr(obj, "__code__"):
                        atheris.instrument_func(obj)
                    for meth in vars(obj).values() if isinstance(obj, type) else ():
                        if hasattr(meth, "__code__"):
                            atheris.instrument_func(meth)
    atheris.Setup(list(sys.argv if argv is None else argv), one)
    atheris.Fuzz()
