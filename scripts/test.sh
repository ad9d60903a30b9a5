#!/usr/bin/env bash
# The whole test suite from a fresh clone: set-up, lint, pytest.
# Extra arguments go to pytest (e.g. scripts/test.sh -k conformance).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup-env.sh
echo "[test] ruff: lint of torch_lattice, tests, examples, benchmarks, fuzz, scripts, setup.py (seconds)"
.venv/bin/ruff check torch_lattice tests examples benchmarks fuzz scripts setup.py
echo "[test] pytest: the whole suite (several minutes on 2 cores; pass -x to stop at the first failure)"
exec .venv/bin/python -m pytest "$@"
