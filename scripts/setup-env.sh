#!/usr/bin/env bash
# Prepares .venv in the repository root: Python venv, torch, and this package
# built from source (editable) with its test, docs and demo extras (and spconv where it
# has wheels).  Each step says what it does and how long it took.  Idempotent: the
# build step is skipped while csrc/, setup.py, pyproject.toml and TORCH_LATTICE_CUDA are unchanged.
#
# The torch it installed is recorded in .venv/torch-lattice-setup.json.  When the
# venv's torch is no longer that one (`uv run` / `uv sync` in this clone install
# uv.lock's torch into the same .venv), it stops, changes nothing and prints the
# command that restores the environment (scripts/setup_env_record.py).
#
#   TORCH_LATTICE_TORCH   pip requirement for torch (default torch==2.13.0,
#                         the CPU build this project's machines carry on disk)
#   TORCH_LATTICE_CUDA    auto | 0 | 1  (see setup.py; auto compiles CUDA when
#                         nvcc is found and a GPU is visible, 1 always, 0 never)
#   TORCH_LATTICE_ACCEPT_TORCH=1  keep and record a torch that something else
#                         installed into the venv, instead of stopping
#   TORCH_LATTICE_VENV    the venv's folder (default .venv)
#   PYTHON                interpreter for the venv (default python3, >= 3.10)
set -euo pipefail
cd "$(dirname "$0")/.."

py=${PYTHON:-python3}
venv=${TORCH_LATTICE_VENV:-.venv}
spec=${TORCH_LATTICE_TORCH:-torch==2.13.0}
record="$venv/torch-lattice-setup.json"
pip=("$venv/bin/python" -m pip --disable-pip-version-check)
say() { echo "[setup] $*"; }
since() { echo "$(($(date +%s) - $1)) s"; }

# Runs a command with its whole output in a log, showing only the lines that match a
# pattern (indented) while it runs; on failure, the end of the log.
logged() {
    local log=$1 pattern=$2
    shift 2
    : >"$log"  # exists before tail opens it
    "$@" >"$log" 2>&1 &
    local pid=$! status
    tail -n +1 -f --pid="$pid" "$log" | grep --line-buffered -E "$pattern" \
        | sed -u -e 's/^ *//' -e 's/^\(.\{200\}\).*/\1 .../' -e 's/^/    /' || true
    wait "$pid" && status=0 || status=$?
    if [ "$status" -ne 0 ]; then
        say "failed (exit status $status): $*"
        say "the end of $log:"
        tail -n 40 "$log"
        exit "$status"
    fi
}
t_all=$(date +%s)

if [ ! -x "$venv/bin/python" ]; then
    t=$(date +%s)
    say "1/3 creating $venv with $($py --version) (a few seconds)"
    "$py" -m venv "$venv"
    say "    done in $(since "$t")"
fi

# Stops (exit status 3) when the venv's torch is not the recorded one.
"$venv/bin/python" scripts/setup_env_record.py check --record "$record" --requirement "$spec" \
    --python "$venv/bin/python" --venv "$venv"

if ! "$venv/bin/python" -c "import torch, numpy" 2>/dev/null; then
    t=$(date +%s)
    say "2/3 installing $spec and numpy into $venv (a large download the first time;"
    say "    under a minute from a local wheel, several minutes on a slow link); log: $venv/torch.log"
    logged "$venv/torch.log" '^(Collecting|Downloading|Processing|Successfully installed)' \
        "${pip[@]}" install --progress-bar off "$spec" numpy
    "$venv/bin/python" scripts/setup_env_record.py write --record "$record" --requirement "$spec" \
        --python "$venv/bin/python"
    say "    done in $(since "$t"); recorded in $record"
fi

stamp="$venv/.torch-lattice-build"
cuda=${TORCH_LATTICE_CUDA:-auto}
want=$( (cat setup.py pyproject.toml; find csrc -type f | sort | xargs cat; echo "$cuda") | sha256sum | cut -d' ' -f1)
if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ] || ! "$venv/bin/python" -c "import torch_lattice._C" 2>/dev/null; then
    t=$(date +%s)
    say "3/3 building torch_lattice from source and installing it (editable) with its test,"
    say "    docs and demo tools (pytest, ruff, sphinx, myst-parser, matplotlib) and spconv's CPU"
    say "    build where it has wheels (the benchmarks' peer); log: $venv/build.log"
    say "    - the C core: $(find csrc/core csrc/python -name '*.c' | wc -l) sources, about a minute on 2 cores (one compiler per core)"
    if [ "$cuda" = 1 ]; then
        say "    - the CUDA kernels (TORCH_LATTICE_CUDA=1): $(find csrc/cuda -name '*.cu' | wc -l) sources,"
        say "      one nvcc per core; the build prints the time it took"
    elif [ "$cuda" = auto ]; then
        say "    - the CUDA kernels only if a GPU is visible here (the build says; TORCH_LATTICE_CUDA=1 forces them)"
    fi
    # spconv's CPU build (the peer the benchmarks and tests/project/test_gpu_spconv.py
    # compare with) has wheels for CPython 3.10-3.13 on x86-64 Linux only.
    extras=test,docs,demo
    if "$venv/bin/python" -c 'import platform, sys; sys.exit(not (sys.platform == "linux"
        and platform.machine() == "x86_64" and (3, 10) <= sys.version_info[:2] <= (3, 13)))'; then
        extras+=,spconv
    fi
    # pip -v passes the build's output on; its own lines start "[torch_lattice build]".
    logged "$venv/build.log" '\[torch_lattice build\]|^Successfully installed' \
        "${pip[@]}" install --progress-bar off -v -e ".[$extras]"
    echo "$want" >"$stamp"
    echo "$cuda" >"$venv/.torch-lattice-cuda-mode"  # what tests/project/test_build.py checks
    say "    done in $(since "$t")"
fi
say "$venv is ready ($(since "$t_all") for set-up): torch $("$venv/bin/python" -c 'import torch; print(torch.__version__)'), torch_lattice built from this checkout"
