"""The CPU's arithmetic peak, measured: the denominator of every "% of peak".

``benchmarks/peak_probe.c`` holds register-only loops (FMA on AVX2 or AVX-512,
``vdpbf16ps`` where the CPU has AVX512_BF16, ``tdpbf16ps`` on AMX tiles where it has
AMX-BF16); this module compiles it with the
system C compiler into a temporary folder, runs one loop per thread at once
(ctypes releases the GIL during the call) and reports the best of a few tries in
GFLOP/s. ``python -m benchmarks peak`` prints it for 1 .. N threads.
"""

from __future__ import annotations

import ctypes
import os
import shutil
import subprocess
import tempfile
import threading
import time
from dataclasses import asdict, dataclass
from functools import cache
from pathlib import Path
from typing import Any

__all__ = ["Peak", "measure_peak"]

SOURCE = Path(__file__).with_name("peak_probe.c")
# (function, flops per iteration, ISA bit of tl_probe_isa)
_FP32 = (("tl_probe_fma_avx512", 768, 2, "avx512f"), ("tl_probe_fma_avx2", 192, 1, "avx2+fma"))
_BF16 = ("tl_probe_dpbf16_avx512", 1536, 4, "avx512_bf16")
_AMX = ("tl_probe_tdpbf16", 65536, 8, "amx_bf16")


@dataclass(frozen=True)
class Peak:
    """Measured arithmetic peak at ``threads`` threads (GFLOP/s; None: not on this CPU)."""

    threads: int
    fp32_isa: str | None
    fp32_gflops: float | None
    bf16_gflops: float | None
    amx_bf16_gflops: float | None = None

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


@cache
def _library() -> ctypes.CDLL:
    compiler = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if compiler is None:
        raise RuntimeError("no C compiler (cc) to build the peak probe")
    folder = Path(tempfile.mkdtemp(prefix="tl_peak_"))
    out = folder / "peak_probe.so"
    subprocess.run(
        [compiler, "-O2", "-std=c11", "-shared", "-fPIC", "-o", str(out), str(SOURCE)],
        check=True, capture_output=True, text=True,
    )
    lib = ctypes.CDLL(str(out))
    shutil.rmtree(folder, ignore_errors=True)  # the mapping stays valid once loaded
    for name in ("tl_probe_fma_avx2", "tl_probe_fma_avx512", "tl_probe_dpbf16_avx512",
                 "tl_probe_tdpbf16"):
        fn = getattr(lib, name)
        fn.argtypes, fn.restype = [ctypes.c_int64], ctypes.c_double
    lib.tl_probe_isa.argtypes, lib.tl_probe_isa.restype = [], ctypes.c_int
    return lib


def _rate(fn: Any, flops_per_iter: int, threads: int, seconds: float, tries: int) -> float:
    """Best GFLOP/s of ``tries`` runs of ``fn`` on ``threads`` threads at once."""
    iters = 1000
    while True:  # calibrate: one call of about ``seconds`` on one thread
        start = time.perf_counter()
        fn(iters)
        spent = time.perf_counter() - start
        if spent >= seconds / 4 or iters > 1 << 40:
            break
        iters *= 4
    iters = max(1, int(iters * seconds / max(spent, 1e-9)))
    best = 0.0

    def work(barrier: threading.Barrier) -> None:
        barrier.wait()
        fn(iters)

    for _ in range(tries):
        barrier = threading.Barrier(threads + 1)
        pool = [threading.Thread(target=work, args=(barrier,)) for _ in range(threads)]
        for t in pool:
            t.start()
        barrier.wait()
        start = time.perf_counter()
        for t in pool:
            t.join()
        best = max(best, threads * iters * flops_per_iter / (time.perf_counter() - start) / 1e9)
    return best


def measure_peak(threads: int, seconds: float = 0.2, tries: int = 3) -> Peak:
    """The fp32 FMA peak (widest vector ISA here), with AVX512_BF16 the bf16
    dot-product peak and with AMX-BF16 the bf16 tile peak, in GFLOP/s at ``threads``
    concurrent threads."""
    if threads < 1:
        raise ValueError(f"threads must be at least 1, got {threads}")
    lib = _library()
    isa = int(lib.tl_probe_isa())
    fp32_isa, fp32 = None, None
    for name, flops, bit, label in _FP32:
        if isa & bit:
            fp32_isa, fp32 = label, _rate(getattr(lib, name), flops, threads, seconds, tries)
            break
    bf16, amx = None, None
    name, flops, bit, _ = _BF16
    if isa & bit:
        bf16 = _rate(getattr(lib, name), flops, threads, seconds, tries)
    name, flops, bit, _ = _AMX
    if isa & bit:
        amx = _rate(getattr(lib, name), flops, threads, seconds, tries)
    return Peak(threads, fp32_isa, fp32, bf16, amx)


def main(max_threads: int) -> int:
    """Prints the peak for 1 .. ``max_threads`` threads."""
    print("| threads | fp32 ISA | fp32 FMA peak GFLOP/s | bf16 dot peak GFLOP/s |"
          " bf16 AMX tile peak GFLOP/s |")
    print("|---|---|---|---|---|")
    for n in range(1, max_threads + 1):
        p = measure_peak(n)
        fp32 = "-" if p.fp32_gflops is None else f"{p.fp32_gflops:.0f}"
        bf16 = "-" if p.bf16_gflops is None else f"{p.bf16_gflops:.0f}"
        amx = "-" if p.amx_bf16_gflops is None else f"{p.amx_bf16_gflops:.0f}"
        print(f"| {n} | {p.fp32_isa or '-'} | {fp32} | {bf16} | {amx} |")
    return 0
