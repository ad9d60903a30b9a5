#!/usr/bin/env bash
# Bounded fuzzing of the C core and the artifact graph parser: every
# fuzz/fuzz_*.py target under atheris (libFuzzer) for FUZZ_SECONDS each, starting
# from fuzz/corpus/<target>/ (targets: checkpoint generate generative graph hash
# kernel_map pairs pool voxelize; "graph" is the pure-Python graph.mlir parser,
# "checkpoint" convert-checkpoint's archive reader).
# Prints one line per target; exits non-zero when any target finds a crash,
# a sanitizer report, an unclean exception or a result that differs from its
# brute-force reference.  See docs/fuzzing.md.
#
#   FUZZ_SECONDS   seconds per target (default 30)
#   FUZZ_TARGETS   space-separated target names (default: all), e.g. "pool pairs"
#   FUZZ_OUT       where findings (reproducer inputs and logs) are kept
#                  (default: fuzz-findings/ in the repository root, git-ignored)
#   PYTHON         interpreter with torch_lattice built (default .venv/bin/python,
#                  which scripts/setup-env.sh creates)
#
# The repository's corpus is copied to a temporary folder, so a run never
# changes it; add a new seed by hand (docs/fuzzing.md).
set -euo pipefail
cd "$(dirname "$0")/.."

py=${PYTHON:-.venv/bin/python}
secs=${FUZZ_SECONDS:-30}
out=${FUZZ_OUT:-fuzz-findings}
if [ ! -x "$py" ]; then
    echo "fuzz: $py not found; run scripts/setup-env.sh first" >&2
    exit 2
fi
if ! "$py" -c "import atheris" 2>/dev/null; then
    echo "[fuzz] installing atheris==3.0.0"
    "$py" -m pip --disable-pip-version-check -q install atheris==3.0.0
fi
"$py" -c "import torch_lattice._C" || {
    echo "fuzz: torch_lattice._C does not import; run scripts/setup-env.sh" >&2
    exit 2
}

# Tiny problems: idle OpenMP threads should sleep, not spin against the
# fuzzer on a 2-core machine.
export OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-PASSIVE}

if [ -n "${FUZZ_TARGETS:-}" ]; then
    targets=$FUZZ_TARGETS
else
    targets=$(for f in fuzz/fuzz_*.py; do f=${f#fuzz/fuzz_}; echo "${f%.py}"; done)
fi

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
failed=0
for t in $targets; do
    src=fuzz/fuzz_$t.py
    if [ ! -f "$src" ]; then
        echo "fuzz $t: FAIL (no $src)"
        failed=1
        continue
    fi
    corpus=$work/$t/corpus
    mkdir -p "$corpus" "$work/$t/art"
    if [ -d "fuzz/corpus/$t" ]; then cp fuzz/corpus/"$t"/* "$corpus"/; fi
    start=$(date +%s)
    set +e
    "$py" "$src" -max_total_time="$secs" -timeout=20 -rss_limit_mb=3072 -max_len=4096 \
        -print_final_stats=1 -artifact_prefix="$work/$t/art/" "$corpus" >"$work/$t/log" 2>&1
    rc=$?
    set -e
    took=$(($(date +%s) - start))
    runs=$(grep -oE '^Done [0-9]+ runs' "$work/$t/log" | grep -oE '[0-9]+' | tail -1 || true)
    cov=$(grep -oE 'cov: [0-9]+ ft: [0-9]+' "$work/$t/log" | tail -1 || true)
    if [ "$rc" -eq 0 ] && ! grep -qE 'ERROR: (Address|Undefined|Leak)Sanitizer|runtime error:' "$work/$t/log"; then
        echo "fuzz $t: ok, ${runs:-?} runs in ${took}s (${cov:-no coverage line})"
    else
        mkdir -p "$out/$t"
        cp "$work/$t/log" "$out/$t/log"
        cp "$work/$t"/art/* "$out/$t"/ 2>/dev/null || true
        echo "fuzz $t: FAIL (exit $rc after ${took}s); log and reproducers in $out/$t/"
        grep -E 'Finding|Error|error|SUMMARY|Traceback' "$work/$t/log" | head -5 | sed 's/^/    /' || true
        failed=1
    fi
done
exit $failed
