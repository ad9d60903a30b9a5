#!/usr/bin/env bash
# Which pending CUDA change a failing test comes from, in the same device run:
#
#   bash scripts/pending-attribution.sh TEST_LOG OUT_DIR
#
# TEST_LOG is a `pytest -v -n N` log of a run with TORCH_LATTICE_CUDA_PENDING=1; the tests it
# names FAILED or ERROR are run again, first with no pending change on (the default path),
# then with each change of conv_cuda.PENDING_CHANGES alone. One line per setting goes to
# stdout and OUT_DIR/attribution.txt as it finishes, so a run cut short by its time limit
# still says what it found. A lent GPU is rare (docs/gpu-validation.md): without this, a
# failure with every change on would take a second run to place.
#
# PYTHON (default python3) runs pytest; DEVICE_CHECK_WORKERS (default 8; 0: none) sets -n;
# ATTRIBUTION_MAX (default 40) is the most failed tests it reruns.
set -u
log_file=$1
out=$2
py="${PYTHON:-python3}"
workers="${DEVICE_CHECK_WORKERS:-8}"
mkdir -p "$out"
result="$out/attribution.txt"
: > "$result"
say() { echo "$*" | tee -a "$result"; }

# The failed node ids, in the order the log names them (ids may hold spaces).
mapfile -t ids < <("$py" - "$log_file" <<'PYEOF'
import re
import sys

seen = []
with open(sys.argv[1], errors="replace") as f:
    for line in f:
        m = re.match(r"^\[gw\d+\] \[\s*\d+%\] (?:FAILED|ERROR) (\S.*?)\s*$", line)
        if m and m.group(1) not in seen:
            seen.append(m.group(1))
print("\n".join(seen))
PYEOF
)
[ ${#ids[@]} -eq 1 ] && [ -z "${ids[0]}" ] && ids=()
if [ ${#ids[@]} -eq 0 ]; then
    say "attribution: no failed tests in $log_file"
    exit 0
fi
if [ ${#ids[@]} -gt "${ATTRIBUTION_MAX:-40}" ]; then
    say "attribution: ${#ids[@]} failed tests, more than ${ATTRIBUTION_MAX:-40}: not rerun" \
        "(rerun with TORCH_LATTICE_CUDA_PENDING=0, then with a list of changes)"
    exit 0
fi
changes=$("$py" -c "from torch_lattice.ops import conv_cuda; print(*conv_cuda.PENDING_CHANGES)") \
    || { say "attribution: cannot read conv_cuda.PENDING_CHANGES"; exit 1; }
n_args=()
[ "$workers" != 0 ] && n_args=(-n "$workers")
say "attribution: ${#ids[@]} failed with every pending change on; again with none, then each alone"
for setting in 0 $changes; do
    junit="$out/junit-$setting.xml"
    rm -f "$junit"
    TORCH_LATTICE_CUDA_PENDING=$setting "$py" -m pytest -q -p no:cacheprovider "${n_args[@]}" \
        --junitxml="$junit" "${ids[@]}" > "$out/pytest-$setting.log" 2>&1
    failed=$("$py" - "$junit" <<'PYEOF' 2>/dev/null
import sys
import xml.etree.ElementTree as ET

s = ET.parse(sys.argv[1]).getroot()
s = s if s.tag == "testsuite" else s[0]
t, f, e, k = (int(s.get(a, 0)) for a in ("tests", "failures", "errors", "skipped"))
print(f"{f + e} of {t - k} fail")
PYEOF
)
    label=$setting
    [ "$setting" = 0 ] && label="0 (the default path)"
    say "    TORCH_LATTICE_CUDA_PENDING=$label: ${failed:-no result (see $out/pytest-$setting.log)}"
done
