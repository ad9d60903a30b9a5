#!/usr/bin/env bash
# Content hash of what a GPU run exercises (C/CUDA sources, the Python package, tests,
# benchmarks, setup.py): 12 hex digits, equal for equal trees whatever git says.
set -euo pipefail
cd "$(dirname "$0")/.."
find csrc torch_lattice tests benchmarks setup.py pyproject.toml -type f \
    \( -name '*.c' -o -name '*.h' -o -name '*.cu' -o -name '*.cuh' -o -name '*.py' \
       -o -name '*.toml' \) -print0 | LC_ALL=C sort -z | xargs -0 sha256sum | sha256sum | cut -c1-12
