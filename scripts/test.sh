#!/usr/bin/env bash
# The whole test suite from a fresh clone: set-up, lint, pytest.
# Extra arguments go to pytest (e.g. scripts/test.sh -k conformance).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup-env.sh
.venv/bin/ruff check torch_lattice tests examples benchmarks fuzz setup.py
exec .venv/bin/python -m pytest "$@"
