#!/usr/bin/env bash
# One prepared run for a lent GPU machine, as that machine is: no venv of ours, the image's
# `python3` (itself a venv's interpreter holding torch+CUDA, setuptools, pytest and
# pytest-xdist), nvcc, no network.  From the repository root:
#
#   bash scripts/device-check.sh              # on the GPU machine
#   DEVICE_CHECK_DRY=1 bash scripts/device-check.sh   # rehearsal where there is no GPU
#   DEVICE_CHECK_FAST=1 bash scripts/device-check.sh  # tuning: build + one benchmark group
#
# The fast mode (under 90 s) builds, imports and runs one group of the benchmark:
# DEVICE_CHECK_GROUP (kmap, layers, overhead or unet; default layers) at
# DEVICE_CHECK_CHANNELS (default 64,256) and DEVICE_CHECK_PRECISIONS (default fp16,fp32);
# no tests (DEVICE_CHECK_TESTS="tests/ops/test_cuda_pipelined.py ..." runs those, up to 60 s
# more), no accuracy table, so a kernel it times has not been verified by it
# (docs/gpu-validation.md).
#
# Steps of the full check (each under its own time limit; they add up to 555 s, about 9 minutes):
#   env     versions: GPU, python3, torch, setuptools, nvcc
#   build   the extension in place (setup.py build_ext --inplace), sm_90 only
#   import  torch_lattice._C: CUDA compiled in, devices seen
#   test    the CUDA tests (every test marked cuda: tests/*/test_cuda*.py and the GPU cases
#           of the other files) with pytest -n 8
#   spconv-unpack  where .spconv/site.tar.xz was carried (scripts/spconv-wheels.sh): spconv
#           unpacked into /tmp/spconv-site for the benchmark
#   bench   python3 -m benchmarks.gpu (mm peak, kernel maps, single layers on the modules'
#           own maps beside checked baselines and spconv, sync/launch counts,
#           SparseResUNet42 ours and spconv's; dry: a CPU rehearsal)
#   accuracy  python3 -m benchmarks.gpu_accuracy (SparseResUNet42 errors against the CPU)
#   attribution  only where tests failed with pending changes on: those tests again with
#           none and with each change alone (scripts/pending-attribution.sh), until 570 s
# The dry mode skips only what needs a GPU: nvidia-smi, the bench and accuracy; the tests
# still run (they skip themselves without a GPU, and the non-GPU checks among them run).
# Logs go to $OUT (default /tmp/device-check).  $OUT/summary.txt starts with a one-line
# verdict and ends with the benchmark table.  A failing step does not stop later ones
# unless they need it.
set -u
cd "$(dirname "$0")/.." || exit 1
# The CUDA changes that wait for a device run (docs/gpu-validation.md) are off by default;
# the check turns them on for its tests, benchmark and accuracy table, so that a passing run
# verifies them (TORCH_LATTICE_CUDA_PENDING=0 checks the default path instead; a list such
# such as "pipelined_forward,kept_map_data" turns on only those: conv_cuda.PENDING_CHANGES).
export TORCH_LATTICE_CUDA_PENDING="${TORCH_LATTICE_CUDA_PENDING:-1}"
OUT="${OUT:-/tmp/device-check}"
DRY="${DEVICE_CHECK_DRY:-0}"
FAST="${DEVICE_CHECK_FAST:-0}"
GROUP="${DEVICE_CHECK_GROUP:-layers}"
FAST_ARGS=(--groups "$GROUP" --channels "${DEVICE_CHECK_CHANNELS:-64,256}"
    --precisions "${DEVICE_CHECK_PRECISIONS:-fp16,fp32}")
mkdir -p "$OUT"
BODY="$OUT/summary.body"
: > "$BODY"
FAILED=()

log() { echo "[$(date -u +%H:%M:%S)] $*" | tee -a "$BODY"; }

# step NAME LIMIT CMD...: runs CMD under LIMIT seconds, output to $OUT/NAME.log.  At the
# limit CMD gets SIGINT first, so pytest still prints its summary and writes its junit file
# for the tests that ran (15 s later, SIGKILL).
step() {
    local name=$1 limit=$2
    shift 2
    local start=$SECONDS
    timeout -s INT -k 15 "$limit" "$@" > "$OUT/$name.log" 2>&1
    local rc=$?
    log "$name: rc=$rc in $((SECONDS - start)) s (limit $limit s)"
    tail -n 4 "$OUT/$name.log" | sed 's/^/    /' | tee -a "$BODY"
    [ $rc -eq 0 ] || FAILED+=("$name")
    return $rc
}

skip() { log "$1: skipped ($2)"; }

# The machine's copy of .git may lag its working tree, so the run also names its sources by
# content: scripts/source-hash.sh prints the same hash for a commit's checkout anywhere.
log "commit $(git rev-parse --short HEAD 2>/dev/null || echo unknown)$(git diff --quiet HEAD 2>/dev/null || echo '+changes'), sources $(bash scripts/source-hash.sh), $(date -u +%F), dry=$DRY, fast=$FAST"

env_report() {
    if [ "$DRY" = 1 ]; then echo "nvidia-smi: skipped (dry)"; else nvidia-smi; fi
    echo "python3: $(command -v python3)"
    python3 --version
    python3 - <<'PYEOF'
import sysconfig
from pathlib import Path

import pytest
import setuptools
import torch

print("torch", torch.__version__, "cuda", torch.version.cuda, "available", torch.cuda.is_available())
print("setuptools", setuptools.__version__, "pytest", pytest.__version__)
include = sysconfig.get_paths()["include"]
print("Python.h:", include, (Path(include) / "Python.h").is_file())
if torch.cuda.is_available():
    print("gpu", torch.cuda.get_device_name(), "capability", torch.cuda.get_device_capability())
PYEOF
    python3 -c "import xdist; print('pytest-xdist', xdist.__version__)"
    echo "TORCH_LATTICE_CUDA_PENDING=$TORCH_LATTICE_CUDA_PENDING (pending CUDA changes on when 1)"
    nvcc --version 2>/dev/null || /usr/local/cuda/bin/nvcc --version
}
export -f env_report
export DRY
step env 30 bash -c env_report

export CUDA_HOME="${CUDA_HOME:-/usr/local/cuda}"
export PATH="$PATH:$CUDA_HOME/bin"
rm -f torch_lattice/_C*.so
# The GPU machine's 16 cores build sm_90 in about 30 s; a rehearsal runs the same build on
# a 2-core machine, where it takes minutes.
build_limit=45
[ "$DRY" = 1 ] && build_limit=600
if step build "$build_limit" env TORCH_LATTICE_CUDA=1 TORCH_LATTICE_CUDA_ARCHS=90 \
    python3 setup.py -q build_ext --inplace --force; then
    step import 15 python3 -c "import torch, torch_lattice._C as C; \
print('cuda_compiled', C.cuda_compiled(), 'devices', C.cuda_device_count(), \
'torch sees', torch.cuda.device_count()); \
assert C.cuda_compiled(), 'built without CUDA'"
    if [ "$FAST" = 1 ] && [ -z "${DEVICE_CHECK_TESTS:-}" ]; then
        skip test "fast mode"
    elif [ "$FAST" = 1 ]; then
        # Tuning a kernel: its own tests first (DEVICE_CHECK_TESTS, pytest paths or ids).
        read -ra fast_tests <<< "$DEVICE_CHECK_TESTS"
        step test 60 env OMP_NUM_THREADS=2 python3 -m pytest -v -n 8 -p no:cacheprovider -rfEs --tb=short \
            "${fast_tests[@]}" --junitxml="$OUT/test-junit.xml"
        grep -E "^\[gw[0-9]+\].* (FAILED|ERROR) " "$OUT/test.log" | sed 's/^.*\(FAILED\|ERROR\) /    \1 /' \
            | sort | uniq | tee -a "$BODY" > /dev/null
    else
        # -v: each test's name and verdict is logged as it finishes, so a run cut short by its
        # limit still says which tests failed.
        # 8 workers x 2 CPU threads fill the machine's 16 cores; torch's default (16 threads in
        # each worker) oversubscribes them while the tests compute their CPU references.
        step test 120 env OMP_NUM_THREADS=2 python3 -m pytest -v -n 8 -p no:cacheprovider -rfEs --tb=short --durations=15 \
            -m cuda tests/ --junitxml="$OUT/test-junit.xml"
        grep -E "^\[gw[0-9]+\].* (FAILED|ERROR) " "$OUT/test.log" | sed 's/^.*\(FAILED\|ERROR\) /    \1 /' \
            | sort | uniq | tee -a "$BODY" > /dev/null
    fi
    # spconv beside us when scripts/spconv-wheels.sh's archive was carried (.spconv): its
    # CPython 3.12 CUDA wheels unpacked into a folder put on the benchmark's PYTHONPATH (no
    # venv, no network). The rehearsal unpacks and inspects it too; only a GPU imports it.
    SPCONV_PATH=""
    if [ -f .spconv/site.tar.xz ]; then
        rm -rf /tmp/spconv-site && mkdir -p /tmp/spconv-site
        if step spconv-unpack 60 bash -c 'tar -C /tmp/spconv-site -xJf .spconv/site.tar.xz &&
            ls -d /tmp/spconv-site/spconv/pytorch /tmp/spconv-site/cumm &&
            du -sh /tmp/spconv-site'; then
            SPCONV_PATH=/tmp/spconv-site
        fi
    else
        log "spconv: not carried (bash scripts/spconv-wheels.sh, then carry .spconv)"
    fi
    if [ "$DRY" = 1 ]; then
        skip bench "dry: needs a GPU"
        skip accuracy "dry: needs a GPU"
        step bench-import 10 python3 -c "import benchmarks.gpu, benchmarks.gpu_accuracy"
        rehearse=(--precisions fp32,bf16 --no-unet)
        [ "$FAST" = 1 ] && rehearse=("${FAST_ARGS[@]}")
        step bench-rehearsal 60 python3 -m benchmarks.gpu --device cpu --scene tiny-12 \
            "${rehearse[@]}" --channels 4 --reps 1
    else
        bench_env=(env PYTHONUNBUFFERED=1 PYTHONPATH="${SPCONV_PATH}${PYTHONPATH:+:$PYTHONPATH}")
        if [ "$FAST" = 1 ]; then
            step bench 40 "${bench_env[@]}" python3 -m benchmarks.gpu "${FAST_ARGS[@]}" \
                --out "$OUT/bench.md"
            skip accuracy "fast mode"
        else
            step bench 240 "${bench_env[@]}" python3 -m benchmarks.gpu --out "$OUT/bench.md"
            step accuracy 45 env PYTHONUNBUFFERED=1 python3 -m benchmarks.gpu_accuracy \
                --out "$OUT/accuracy.md"
        fi
    fi
    # Failed tests with pending changes on: each change alone and none, to say which change
    # a failure comes from (scripts/pending-attribution.sh), in the time this call has left
    # (the device tool stops a command at 600 s).
    left=$((570 - SECONDS))
    if [[ " ${FAILED[*]} " == *" test "* ]] && [ "$TORCH_LATTICE_CUDA_PENDING" != 0 ]; then
        if [ $left -ge 30 ]; then
            log "attribution: up to $left s"
            timeout -s INT -k 10 "$left" bash scripts/pending-attribution.sh "$OUT/test.log" \
                "$OUT/attribution" > /dev/null 2>&1
            sed 's/^/    /' "$OUT/attribution/attribution.txt" | tee -a "$BODY"
        else
            skip attribution "$left s left"
        fi
    fi
else
    FAILED+=(import test bench accuracy)
    log "build failed: see build.log (import, tests, benchmark and accuracy not run)"
fi

# Test counts from the junit file (pytest -n 8 prints no single summary line per worker).
counts=$(python3 - "$OUT/test-junit.xml" <<'PYEOF' 2>/dev/null
import sys
import xml.etree.ElementTree as ET

s = ET.parse(sys.argv[1]).getroot()
s = s if s.tag == "testsuite" else s[0]
t, f, e, k = (int(s.get(a, 0)) for a in ("tests", "failures", "errors", "skipped"))
print(f"{t - f - e - k} passed, {f} failed, {e} errors, {k} skipped")
PYEOF
)
log "tests: ${counts:-no result}"
log "done in $SECONDS s"

SUMMARY="$OUT/summary.txt"
{
    if [ ${#FAILED[@]} -eq 0 ]; then
        echo "PASS: device check$([ "$FAST" = 1 ] && echo " (fast mode: $GROUP only, ${DEVICE_CHECK_TESTS:-no tests})")$([ "$DRY" = 1 ] && echo ' (dry rehearsal, no GPU)'); tests: ${counts:-none}; $SECONDS s"
    else
        echo "FAIL: ${FAILED[*]}; tests: ${counts:-none}; $SECONDS s"
    fi
    cat "$BODY"
    echo
    if [ -f "$OUT/accuracy.md" ]; then cat "$OUT/accuracy.md"; echo; fi
    if [ -f "$OUT/bench.md" ]; then cat "$OUT/bench.md"; else echo "(no benchmark table)"; fi
} > "$SUMMARY"
rm -f "$BODY"
head -n 1 "$SUMMARY"
exit 0
