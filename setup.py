"""Build of torch_lattice._C: a C11, CPython Limited-API (abi3) extension.

Nothing of torch, no C++ binding library and no C++ runtime is involved, so one
binary serves every Python >= 3.10 and every torch >= 2.4.  CUDA sources in
csrc/cuda/*.cu are compiled with nvcc and linked in (cudart statically) when
TORCH_LATTICE_CUDA asks for it:

    TORCH_LATTICE_CUDA=auto  (default) build CUDA when nvcc is found and an NVIDIA
                             GPU is visible (a /dev/nvidia<N> device node, a
                             /proc/driver/nvidia/gpus entry, or a GPU in `nvidia-smi -L`)
    TORCH_LATTICE_CUDA=1     require CUDA, GPU or not (wheels, release builds, the
                             device check); fail if nvcc is missing
    TORCH_LATTICE_CUDA=0     CPU only

Without a visible GPU, auto builds the C core only and says in one line that
TORCH_LATTICE_CUDA=1 includes the kernels: nothing compiled by nvcc could run
on such a machine, and the CUDA compile is most of the build's time there.
The .cu files compile in parallel, one nvcc per core, and the build prints
each file's time and the measured time of the whole CUDA step.

TORCH_LATTICE_CUDA_ARCHS (default "80;86;89;90") lists the SM architectures;
PTX for the newest is always added so later GPUs can JIT it.

TORCH_LATTICE_SANITIZE=1 builds the C core for AddressSanitizer and
UndefinedBehaviorSanitizer (-fsanitize=address,undefined
-fsanitize=float-cast-overflow -fno-sanitize-recover=undefined,float-cast-overflow
-fno-wrapv -fno-omit-frame-pointer -g -O1, and -fsanitize=address,undefined at link time).
Such a build is CPU only: with TORCH_LATTICE_CUDA=auto CUDA is skipped, and
TORCH_LATTICE_CUDA=1 is refused.
Python itself is not instrumented, so the extension only loads with gcc's
runtime preloaded; docs/sanitizers.md and scripts/sanitize.sh show how.

The C sources compile in parallel too, one compiler per core.  The build says what
it does: one line per compiled source with a counter
("[torch_lattice build] 3/26 csrc/core/tl_dataflow_implicit_gemm.c"), and whether
the CUDA kernels are in and why.  pip shows these lines with -v
(scripts/setup-env.sh filters them out of its log).

The user's CFLAGS and LDFLAGS come last on the compiler and linker command
lines, after this file's own flags, so they take precedence: CFLAGS=-O0 gives
an unoptimised build, and CFLAGS/LDFLAGS=-fsanitize=thread a ThreadSanitizer one.
"""

from __future__ import annotations

import glob
import os
import shlex
import shutil
import subprocess
import threading
import time
from concurrent.futures import ThreadPoolExecutor, as_completed
from pathlib import Path

import setuptools
from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

ROOT = Path(__file__).parent.resolve()
# csrc/core is the torch-free C core (no Python.h), csrc/python its CPython binding.
C_SOURCES = sorted(
    str(p.relative_to(ROOT)) for d in ("core", "python") for p in (ROOT / "csrc" / d).glob("*.c")
)
CUDA_SOURCES = sorted((ROOT / "csrc" / "cuda").glob("*.cu"))
# -std=c11 turns floating-point contraction off; -ffp-contract=fast turns the
# kernels' multiply-adds back into FMA instructions where the target has them.
C_FLAGS = [
    "-std=c11",
    "-O3",
    "-ffp-contract=fast",
    "-Wall",
    "-Wextra",
    "-Werror",
    "-fopenmp",
    "-fvisibility=hidden",
]
LINK_FLAGS = ["-fopenmp", "-Wl,--exclude-libs,ALL"]
# float-cast-overflow is not part of GCC's "undefined" group; the voxel code
# casts doubles to int32 and must range-check first.  -fno-wrapv undoes the -fwrapv
# of Python's own CFLAGS, which setuptools puts first: under -fwrapv signed overflow
# is defined, so UBSan would not check it (and GCC took 10x longer to compile the
# kernel files with both).
SANITIZE_FLAGS = [
    "-fsanitize=address,undefined",
    "-fsanitize=float-cast-overflow",
    "-fno-sanitize-recover=undefined,float-cast-overflow",
    "-fno-wrapv",
    "-fno-omit-frame-pointer",
    "-g",
    "-O1",
]
SANITIZE_LINK_FLAGS = ["-fsanitize=address,undefined"]
# Prefix of every line the build prints itself (scripts/setup-env.sh shows these).
SAY = "[torch_lattice build]"


def _say(message: str) -> None:
    print(f"{SAY} {message}", flush=True)


def _sanitize() -> bool:
    mode = os.environ.get("TORCH_LATTICE_SANITIZE", "0").strip().lower()
    if mode not in ("0", "1", ""):
        raise SystemExit(f"TORCH_LATTICE_SANITIZE must be 0 or 1, got {mode!r}")
    return mode == "1"


def _compile_flags() -> list[str]:
    """This file's C flags, then the sanitizer's, then the user's CFLAGS.

    setuptools puts CFLAGS before extra_compile_args, where this file's -O3
    would override a user's -O0; repeating CFLAGS at the end makes the user's
    choice win (for gcc and clang the last -O and -f flag of a kind counts)."""
    flags = [f for f in C_FLAGS if not (_sanitize() and f == "-O3")]
    if _sanitize():
        flags += SANITIZE_FLAGS
    return flags + shlex.split(os.environ.get("CFLAGS", ""))


def _link_flags() -> list[str]:
    """This file's link flags, then the sanitizer's, then the user's LDFLAGS."""
    flags = list(LINK_FLAGS)
    if _sanitize():
        flags += SANITIZE_LINK_FLAGS
    return flags + shlex.split(os.environ.get("LDFLAGS", ""))


def _cuda_mode() -> str:
    mode = os.environ.get("TORCH_LATTICE_CUDA", "auto").strip().lower()
    if mode not in ("auto", "0", "1"):
        raise SystemExit(f"TORCH_LATTICE_CUDA must be auto, 0 or 1, got {mode!r}")
    return mode


def _find_nvcc() -> Path | None:
    for home in (os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"), "/usr/local/cuda"):
        if home and (Path(home) / "bin" / "nvcc").is_file():
            return Path(home) / "bin" / "nvcc"
    found = shutil.which("nvcc")
    return Path(found).resolve() if found else None


def _cuda_archs() -> list[str]:
    archs = [
        a.strip() for a in os.environ.get("TORCH_LATTICE_CUDA_ARCHS", "80;86;89;90").split(";")
    ]
    archs = [a for a in archs if a]
    if not archs or not all(a.isdigit() for a in archs):
        raise SystemExit("TORCH_LATTICE_CUDA_ARCHS must be a ;-separated list like 80;90")
    return archs


def _gencode_flags() -> list[str]:
    archs = _cuda_archs()
    flags = [f"-gencode=arch=compute_{a},code=sm_{a}" for a in archs]
    newest = max(archs, key=int)
    return [*flags, f"-gencode=arch=compute_{newest},code=compute_{newest}"]


def _gpu_present() -> bool:
    """Whether an NVIDIA GPU is visible here: a device node, a driver entry, or a
    "GPU <n>:" line from `nvidia-smi -L`.  Decides what TORCH_LATTICE_CUDA=auto
    compiles; nvidia-smi is asked last and given ten seconds at most."""
    if glob.glob("/dev/nvidia[0-9]*") or any(Path("/proc/driver/nvidia/gpus").glob("*")):
        return True
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return False
    try:
        listed = subprocess.run([smi, "-L"], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return listed.returncode == 0 and any(
        line.startswith("GPU ") for line in listed.stdout.splitlines()
    )


def _cores() -> int:
    """The cores this process may run on (its affinity where the OS says, which a
    container's CPU set narrows; os.cpu_count() counts the whole host's)."""
    if hasattr(os, "sched_getaffinity"):
        return max(1, len(os.sched_getaffinity(0)))
    return max(1, os.cpu_count() or 1)


def _run_nvcc(cmd: list[str]) -> float:
    start = time.perf_counter()
    subprocess.run(cmd, check=True)
    return time.perf_counter() - start


class LatticeBuildExt(build_ext):
    """Compiles csrc/cuda/*.cu with nvcc (when wanted) before the C sources."""

    def finalize_options(self) -> None:
        super().finalize_options()
        # Every build compiles: setuptools' up-to-date check compares the extension with
        # its .c files only, so a rebuild in a reused tree after a header edit or with
        # other settings (TORCH_LATTICE_CUDA, CFLAGS, TORCH_LATTICE_SANITIZE) would
        # install the previous binary.
        self.force = True

    def build_extension(self, ext: Extension) -> None:
        start = time.perf_counter()
        mode = _cuda_mode()
        if _sanitize():
            if mode == "1":
                raise SystemExit(
                    "TORCH_LATTICE_SANITIZE=1 builds the C core only; "
                    "set TORCH_LATTICE_CUDA=0 or auto"
                )
            mode = "0"
        nvcc = _find_nvcc() if mode != "0" and CUDA_SOURCES else None
        if mode == "1" and nvcc is None:
            raise SystemExit("TORCH_LATTICE_CUDA=1 but nvcc was not found (set CUDA_HOME)")
        if mode == "auto" and CUDA_SOURCES and not _gpu_present():
            found = f"nvcc is at {nvcc}" if nvcc else "needs nvcc or CUDA_HOME"
            _say(
                "no NVIDIA GPU visible: building the C core only (CPU); "
                f"TORCH_LATTICE_CUDA=1 includes the CUDA kernels ({found})"
            )
            nvcc = None
        elif mode == "auto" and CUDA_SOURCES and nvcc is None:
            _say("nvcc not found: building the C core only (CPU); CUDA needs nvcc or CUDA_HOME")
        if nvcc is not None:
            self._add_cuda(ext, nvcc)
        self._compile_in_parallel()
        super().build_extension(ext)
        _say(f"built {ext.name} in {time.perf_counter() - start:.0f} s")

    def _compile_in_parallel(self) -> None:
        """Compiles the C sources one per core, printing one line per source as its
        compile starts, with a counter.

        distutils' ``compile`` calls the compiler's ``_compile`` once per source, one
        after another; wrapping ``compile`` so that those calls are collected and then run
        on a thread pool is the one place that sees each file (the default build prints
        nothing under pip, or a long command line per file with -v).  The largest kernel
        files take most of the build, so on 2 cores this halves it."""
        compiler = self.compiler
        compile_all = compiler.compile
        compile_one = compiler._compile
        workers = _cores()

        def parallel(*args: object, **kwargs: object) -> list[str]:
            queued: list[tuple[object, ...]] = []
            compiler._compile = lambda *call: queued.append(call)
            try:
                objects = compile_all(*args, **kwargs)
            finally:
                compiler._compile = compile_one
            # Each worker takes the next source and says so under one lock, so the lines
            # come in source order, each as its compile starts; the first failure stops
            # the others from starting more and is raised.
            lock = threading.Lock()
            todo = iter(enumerate(queued, start=1))
            failed: list[BaseException] = []

            def work() -> None:
                while True:
                    with lock:
                        item = None if failed else next(todo, None)
                        if item is None:
                            return
                        _say(f"{item[0]}/{len(queued)} {_shown(str(item[1][1]))}")
                    try:
                        compile_one(*item[1])
                    except BaseException as error:
                        with lock:
                            failed.append(error)
                        return

            with ThreadPoolExecutor(max_workers=workers) as pool:
                for worker in [pool.submit(work) for _ in range(workers)]:
                    worker.result()
            if failed:
                raise failed[0]
            return objects

        compiler.compile = parallel

    def _add_cuda(self, ext: Extension, nvcc: Path) -> None:
        cuda_home = nvcc.parent.parent
        out_dir = Path(self.build_temp) / "cuda"
        out_dir.mkdir(parents=True, exist_ok=True)
        cmds = []
        for src in CUDA_SOURCES:
            obj = out_dir / (src.stem + ".o")
            cmds.append(
                [
                    str(nvcc),
                    "-c",
                    str(src),
                    "-o",
                    str(obj),
                    "-O3",
                    "-std=c++17",
                    "-I",
                    str(ROOT / "csrc"),
                    "--expt-relaxed-constexpr",
                    "-Xcompiler",
                    "-fPIC,-fvisibility=hidden,-fno-exceptions,-fno-threadsafe-statics",
                    *_gencode_flags(),
                ]
            )
            ext.extra_objects.append(str(obj))
        # One nvcc per core: the .cu files are independent and each takes seconds.
        workers = _cores()
        _say(
            f"compiling {len(cmds)} CUDA sources with nvcc for sm_{', sm_'.join(_cuda_archs())} "
            f"({workers} at a time, one per core)"
        )
        start = time.perf_counter()
        with ThreadPoolExecutor(max_workers=workers) as pool:
            jobs = {pool.submit(_run_nvcc, cmd): cmd for cmd in cmds}
            for done, job in enumerate(as_completed(jobs), start=1):
                seconds = job.result()
                _say(f"CUDA {done}/{len(cmds)} {_shown(jobs[job][2])} ({seconds:.0f} s)")
        _say(f"CUDA compiled in {time.perf_counter() - start:.0f} s")
        ext.define_macros.append(("TL_WITH_CUDA", "1"))
        # The architectures built, for the message a GPU the binary cannot run
        # on gets (torch_lattice/ops/_runtime.py, via _C.cuda_archs()).
        ext.define_macros.append(("TL_CUDA_ARCHS", '"' + ";".join(_cuda_archs()) + '"'))
        ext.include_dirs.append(str(cuda_home / "include"))
        lib_dirs = [
            cuda_home / "lib64",
            cuda_home / "lib",
            cuda_home / "targets" / "x86_64-linux" / "lib",
        ]
        ext.library_dirs.extend(str(d) for d in lib_dirs if d.is_dir())
        # Static cudart: the binary needs only the driver at run time, and
        # imports (CPU only) where there is none.
        ext.libraries.extend(["cudart_static", "rt", "dl", "pthread"])


def _shown(src: str) -> str:
    """A source path as the user knows it: relative to the repository when inside it."""
    path = Path(src).resolve()
    return str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else src


def _license() -> dict[str, str]:
    """Apache-2.0 in the form this setuptools takes: PEP 639's license_expression from
    setuptools 77 on, the older free-text field before (the GPU image's setuptools may be
    either, and --no-build-isolation builds with whatever is installed)."""
    major, minor = (int(v) for v in setuptools.__version__.split(".")[:2])
    if (major, minor) >= (77, 0):
        return {"license_expression": "Apache-2.0"}
    return {"license": "Apache-2.0"}


setup(
    **_license(),
    ext_modules=[
        Extension(
            "torch_lattice._C",
            sources=C_SOURCES,
            include_dirs=["csrc"],
            define_macros=[("Py_LIMITED_API", "0x030A0000")],
            extra_compile_args=_compile_flags(),
            # libgomp is linked dynamically so the process shares torch's runtime;
            # --exclude-libs keeps static archives' symbols out of the export table.
            extra_link_args=_link_flags(),
            py_limited_api=True,
        )
    ],
    cmdclass={"build_ext": LatticeBuildExt},
    options={"bdist_wheel": {"py_limited_api": "cp310"}},
)
