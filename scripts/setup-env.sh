#!/usr/bin/env bash
# Prepares .venv in the repository root: Python venv, torch, and this package
# built from source (editable), with test tools.  Idempotent: the build step
# is skipped while csrc/, setup.py and pyproject.toml are unchanged.
#
#   TORCH_LATTICE_TORCH   pip requirement for torch (default torch==2.13.0,
#                         the CPU build this project's machines carry on disk)
#   TORCH_LATTICE_CUDA    auto | 0 | 1  (see setup.py)
#   PYTHON                interpreter for the venv (default python3, >= 3.10)
set -euo pipefail
cd "$(dirname "$0")/.."

py=${PYTHON:-python3}
venv=.venv
if [ ! -x "$venv/bin/python" ]; then
    echo "[setup] creating $venv with $($py --version)"
    "$py" -m venv "$venv"
fi
pip=("$venv/bin/python" -m pip --disable-pip-version-check -q)

if ! "$venv/bin/python" -c "import torch" 2>/dev/null; then
    spec=${TORCH_LATTICE_TORCH:-torch==2.13.0}
    echo "[setup] installing $spec"
    "${pip[@]}" install "$spec"
fi

stamp="$venv/.torch-lattice-build"
want=$( (cat setup.py pyproject.toml; find csrc -type f | sort | xargs cat; echo "${TORCH_LATTICE_CUDA:-auto}") | sha256sum | cut -d' ' -f1)
if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ] || ! "$venv/bin/python" -c "import torch_lattice._C" 2>/dev/null; then
    echo "[setup] building torch_lattice (C core$(command -v nvcc >/dev/null && [ "${TORCH_LATTICE_CUDA:-auto}" != 0 ] && echo ' + CUDA'))"
    "${pip[@]}" install -e '.[test]'
    echo "$want" > "$stamp"
fi
