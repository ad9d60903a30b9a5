#!/usr/bin/env bash
# Prepares spconv 2.3.8 for CUDA (the peer most users would otherwise pick) so that the
# device check can time it beside us on a lent GPU machine, which has no network:
#
#   bash scripts/spconv-wheels.sh      # here, once (PyPI download ~98 MB, xz -9 ~2 min on 2 cores)
#
# then name .spconv in the device tool's `carry`; scripts/device-check.sh unpacks
# .spconv/site.tar.xz into /tmp/spconv-site and puts it on PYTHONPATH for the benchmark.
# The wheels are torch-independent binaries for CPython 3.12 with sm_90 code and their own
# CUDA 12.6 runtime (spconv-cu126 2.3.8 needs cumm-cu126 >= 0.7.11, < 0.8). The archive
# (40 MB: xz -9, without cumm's static libcudadevrt.a, which only links JIT-compiled code)
# fits the 64 MiB a call may carry beside the project.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=.spconv
WORK="$(mktemp -d)"
trap 'rm -rf "$WORK"' EXIT
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
    --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
    --platform manylinux2014_x86_64 -d "$WORK/wheels" \
    spconv-cu126==2.3.8 cumm-cu126==0.7.11 pccm==0.4.16 ccimport==0.4.4 fire termcolor lark
mkdir -p "$WORK/site" "$OUT"
for wheel in "$WORK"/wheels/*.whl; do
    python3 -m zipfile -e "$wheel" "$WORK/site/"
done
rm -f "$WORK/site/cumm/lib/libcudadevrt.a"
tar -C "$WORK/site" -cf - . | xz -T0 -9 > "$WORK/site.tar.xz"
size=$(stat -c %s "$WORK/site.tar.xz")
# Beside the project (about 15 MB), more would not travel in the 64 MiB a call carries.
if [ "$size" -gt 45000000 ]; then
    echo "[spconv-wheels] the archive is $size bytes, over the 45 MB that can travel" >&2
    exit 1
fi
mv "$WORK/site.tar.xz" "$OUT/site.tar.xz"
echo "[spconv-wheels] $OUT/site.tar.xz: $size bytes; carry .spconv"
