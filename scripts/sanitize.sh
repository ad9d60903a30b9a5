#!/usr/bin/env bash
# Sanitizer and leak checks of the C core (docs/sanitizers.md).  Fails on any
# AddressSanitizer, UndefinedBehaviorSanitizer, LeakSanitizer or valgrind
# report, or on any test failure.
#
#   1. tests/c/test_core.c with csrc/core (no Python) built with -fsanitize=address,undefined
#      and run with LeakSanitizer on;
#   2. the same program built without sanitizers, run under valgrind
#      (--leak-check=full, definite leaks are errors);
#   3. torch_lattice._C built with TORCH_LATTICE_SANITIZE=1 in a scratch copy
#      of the repository (the editable build .venv uses is never touched), then
#      the C-level and conformance tests under that build, with gcc's libasan
#      preloaded into Python.
#
# Python: .venv/bin/python when it has torch, numpy and pytest (scripts/setup-env.sh
# makes it); otherwise a scratch venv with torch==2.13.0 (TORCH_LATTICE_TORCH).
#   TL_SANITIZE_DIR   scratch folder (default: a fresh temporary one, removed)
#   TL_SANITIZE_SKIP  space-separated steps to skip: asan valgrind python
# Extra arguments go to pytest in step 3 (more test files, -k, -x ...).
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)

skip=" ${TL_SANITIZE_SKIP:-} "
if [ -n "${TL_SANITIZE_DIR:-}" ]; then
    work=$TL_SANITIZE_DIR
    mkdir -p "$work"
else
    work=$(mktemp -d "${TMPDIR:-/tmp}/tl-sanitize.XXXXXX")
    trap 'rm -rf "$work"' EXIT
fi
log() { echo "[sanitize $(date -u +%H:%M:%S)] $*"; }

cc=${CC:-gcc}
# The flags of setup.py's TORCH_LATTICE_SANITIZE=1 build.
san_flags=(-fsanitize=address,undefined -fsanitize=float-cast-overflow
    -fno-sanitize-recover=undefined,float-cast-overflow -fno-omit-frame-pointer -g -O1)
# csrc/core on its own include path: the core builds without Python or CUDA headers.
warn_flags=(-std=c11 -Wall -Wextra -Werror -fopenmp -Icsrc/core)
core_sources=(csrc/core/*.c)

# The C runtime reports: any ASan or UBSan finding aborts the process; leaks
# are reported at exit (LeakSanitizer) by the standalone test only.
export UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1:report_error_type=1

# build_test_core OUT FLAGS...: tests/c/test_core.c and the core, one compiler per core
# (the kernel files take most of the time), linked into OUT.
build_test_core() {
    local out=$1 objs=$1.objs src
    shift
    mkdir -p "$objs/tests/c" "$objs/csrc/core"
    # xargs exits non-zero when any compile fails, and pipefail passes that on.
    printf '%s\n' tests/c/test_core.c "${core_sources[@]}" |
        xargs -P "$(nproc)" -I{} "$cc" "$@" -c {} -o "$objs/{}.o"
    local objects=("$objs/tests/c/test_core.c.o")
    for src in "${core_sources[@]}"; do objects+=("$objs/$src.o"); done
    "$cc" "$@" "${objects[@]}" -lm -o "$out"
}

if [[ $skip != *" asan "* ]]; then
    log "tests/c/test_core.c with ASan + UBSan + LeakSanitizer"
    build_test_core "$work/test_core_asan" "${warn_flags[@]}" "${san_flags[@]}"
    ASAN_OPTIONS=detect_leaks=1:abort_on_error=1:halt_on_error=1 "$work/test_core_asan"
fi

if [[ $skip != *" valgrind "* ]]; then
    if command -v valgrind >/dev/null; then
        log "tests/c/test_core.c under valgrind"
        build_test_core "$work/test_core" "${warn_flags[@]}" -O1 -g
        # libgomp keeps its thread pool until exit: "possibly lost", never definite.
        OMP_NUM_THREADS=2 valgrind -q --error-exitcode=1 --leak-check=full \
            --errors-for-leak-kinds=definite --show-leak-kinds=definite "$work/test_core"
    else
        log "valgrind not installed: skipped"
    fi
fi

if [[ $skip == *" python "* ]]; then
    log "done"
    exit 0
fi

py=.venv/bin/python
if ! { [ -x "$py" ] && "$py" -c "import torch, numpy, pytest" 2>/dev/null; }; then
    log "creating a scratch venv (no usable .venv)"
    python3 -m venv "$work/venv"
    py=$work/venv/bin/python
    "$py" -m pip -q --disable-pip-version-check install "${TORCH_LATTICE_TORCH:-torch==2.13.0}" \
        numpy safetensors pytest 'setuptools>=77'
fi
py=$(cd "$(dirname "$py")" && pwd)/$(basename "$py")

log "copying the tracked and untracked sources to $work/src"
rm -rf "$work/src"
mkdir -p "$work/src"
if git rev-parse --is-inside-work-tree >/dev/null 2>&1; then
    git ls-files -co --exclude-standard -z | while IFS= read -r -d '' f; do
        [ -f "$f" ] && printf '%s\0' "$f"
    done | tar --null -T - -cf - | tar -xf - -C "$work/src"
else
    tar --exclude='./.venv*' --exclude=./.git --exclude=./build --exclude='*.so' \
        --exclude='*.o' --exclude=__pycache__ -cf - . | tar -xf - -C "$work/src"
fi

log "building torch_lattice._C with TORCH_LATTICE_SANITIZE=1"
(cd "$work/src" && TORCH_LATTICE_SANITIZE=1 TORCH_LATTICE_CUDA=0 \
    "$py" setup.py -q build_ext --inplace -j "$(nproc)" >"$work/build.log" 2>&1) ||
    { cat "$work/build.log"; exit 1; }

libasan=$("$cc" -print-file-name=libasan.so)
libstdcxx=$("$cc" -print-file-name=libstdc++.so.6)
[ -f "$libasan" ] || { echo "libasan.so not found ($libasan)"; exit 1; }
# Python and torch are not instrumented, so the ASan runtime must be loaded
# first.  libstdc++ is preloaded too: ASan resolves its __cxa_throw
# interceptor when it starts, and without libstdc++ in the process by then the
# first C++ exception torch throws (pybind11 does, routinely) aborts with
# "CHECK failed: ... real___cxa_throw".  Leaks are not checked here because
# Python frees little at exit.  torch's own code runs under ASan's allocator
# but is not instrumented, and UBSan instruments only torch_lattice._C: no
# suppressions are needed.  --capture=sys leaves fd 2 alone, so a report
# reaches the log before the abort.
preload="$libasan $libstdcxx"
# test_cap_selects_other_kernels is left out: it tells the ISAs apart by the
# AVX kernels' fused multiply-adds, and GCC forms FMAs only from -O2 on, so
# in this -O1 build every ISA rounds alike.  The other test_cpu_isa cases
# still run every ISA's kernels against the dense oracle.
tests=(tests/nn/test_conformance_*.py tests/ops/test_ops.py tests/ops/test_kernel_map.py
    tests/ops/test_dataflows.py tests/nn/test_pooling.py tests/ops/test_voxel.py
    tests/ops/test_cpu_isa.py)
log "pytest under ASan + UBSan: ${tests[*]}"
cd "$work/src"
# The build must be the sanitized one, from this copy.
LD_PRELOAD=$preload ASAN_OPTIONS=detect_leaks=0:abort_on_error=1 \
    "$py" -c "import torch_lattice._C as c, sys; f = c.__file__; \
sys.exit(0 if f.startswith('$work/src/') else f'wrong _C: {f}')"
# grep -c reads all of nm's output: grep -q would stop at the first match and,
# under pipefail, nm's SIGPIPE would fail the check on an instrumented build.
[ "$(nm -D "$work/src/torch_lattice/_C.abi3.so" | grep -c __asan_init)" -gt 0 ] ||
    { echo "torch_lattice/_C.abi3.so is not instrumented"; exit 1; }
LD_PRELOAD=$preload ASAN_OPTIONS=detect_leaks=0:abort_on_error=1 OMP_NUM_THREADS=2 \
    "$py" -m pytest -q -p no:cacheprovider --capture=sys "${tests[@]}" \
    --deselect tests/ops/test_cpu_isa.py::test_cap_selects_other_kernels "$@"
log "done: no sanitizer reports"
