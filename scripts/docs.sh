#!/usr/bin/env bash
# Builds the documentation site into docs/_build/html, warnings as errors.
#   scripts/docs.sh            set up .venv (scripts/setup-env.sh), then build
# Extra arguments go to sphinx-build (e.g. -E to rebuild every page).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup-env.sh
if ! .venv/bin/python -c "import sphinx, myst_parser, matplotlib" 2>/dev/null; then
    echo "[docs] .venv lacks the docs tools; install them with: .venv/bin/pip install -e '.[docs]'" >&2
    exit 2
fi
out=docs/_build/html
start=$(date +%s)
# -W --keep-going: report every warning, then fail; -n: check every cross-reference.
.venv/bin/python -m sphinx -W --keep-going -n -b html "$@" docs "$out"
echo "[docs] built in $(( $(date +%s) - start )) s: open $PWD/$out/index.html"
