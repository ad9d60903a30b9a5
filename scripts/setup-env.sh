#!/usr/bin/env bash
# Prepares .venv in the repository root: Python venv, torch, and this package
# built from source (editable) with its test, docs and demo extras.  Each step
# says what it does and how long it took.  Idempotent: the build step is skipped
# while csrc/, setup.py, pyproject.toml and TORCH_LATTICE_CUDA are unchanged.
#
#   TORCH_LATTICE_TORCH   pip requirement for torch (default torch==2.13.0,
#                         the CPU build this project's machines carry on disk)
#   TORCH_LATTICE_CUDA    auto | 0 | 1  (see setup.py; auto compiles CUDA when
#                         nvcc is found, 0 skips it)
#   PYTHON                interpreter for the venv (default python3, >= 3.10)
set -euo pipefail
cd "$(dirname "$0")/.."

py=${PYTHON:-python3}
venv=.venv
pip=("$venv/bin/python" -m pip --disable-pip-version-check)
say() { echo "[setup] $*"; }
since() { echo "$(($(date +%s) - $1)) s"; }
t_all=$(date +%s)

if [ ! -x "$venv/bin/python" ]; then
    t=$(date +%s)
    say "1/3 creating $venv with $($py --version) (a few seconds)"
    "$py" -m venv "$venv"
    say "    done in $(since "$t")"
fi

if ! "$venv/bin/python" -c "import torch" 2>/dev/null; then
    t=$(date +%s)
    spec=${TORCH_LATTICE_TORCH:-torch==2.13.0}
    say "2/3 installing $spec into $venv (a large download the first time: about a"
    say "    minute from a local wheel, several on a slow link)"
    "${pip[@]}" install --progress-bar off "$spec" | grep -E '^(Collecting|Successfully)' || true
    "$venv/bin/python" -c "import torch" || { say "torch did not install"; exit 1; }
    say "    done in $(since "$t")"
fi

stamp="$venv/.torch-lattice-build"
log="$venv/build.log"
cuda=${TORCH_LATTICE_CUDA:-auto}
want=$( (cat setup.py pyproject.toml; find csrc -type f | sort | xargs cat; echo "$cuda") | sha256sum | cut -d' ' -f1)
if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ] || ! "$venv/bin/python" -c "import torch_lattice._C" 2>/dev/null; then
    t=$(date +%s)
    n_c=$(find csrc -maxdepth 1 -name '*.c' | wc -l)
    what="the C core ($n_c sources, about 10 s on 2 cores)"
    if [ "$cuda" != 0 ] && command -v nvcc >/dev/null; then
        n_cu=$(find csrc/cuda -name '*.cu' | wc -l)
        what="$what and the CUDA kernels ($n_cu sources with nvcc: about a minute on 2 cores;"
        what="$what TORCH_LATTICE_CUDA=0 skips them)"
    fi
    say "3/3 building torch_lattice from source: $what; then installing it editable"
    say "    with its test, docs and demo tools (pytest, ruff, sphinx, myst-parser, matplotlib)."
    say "    Full log: $log"
    # pip -v streams the build's output into the log; the build's own progress lines
    # ([torch_lattice build] ...) and pip's summary are shown.
    set +e
    "${pip[@]}" install -v --progress-bar off -e '.[test,docs,demo]' >"$log" 2>&1 &
    pip_pid=$!
    tail -n +1 -f --pid="$pip_pid" "$log" \
        | grep --line-buffered -E '\[torch_lattice build\]|^Successfully installed' \
        | sed -u -e 's/^ *//' -e 's/^/    /'
    wait "$pip_pid"
    status=$?
    set -e
    if [ "$status" -ne 0 ]; then
        say "the build failed (pip exit status $status); the end of $log:"
        tail -n 40 "$log"
        exit "$status"
    fi
    echo "$want" >"$stamp"
    say "    done in $(since "$t")"
fi
say "$venv is ready ($(since "$t_all") for set-up): torch $("$venv/bin/python" -c 'import torch; print(torch.__version__)'), torch_lattice built from this checkout"
