#!/usr/bin/env bash
# The main job from a fresh clone: set-up, then the demo (arguments pass on).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup-env.sh
exec .venv/bin/python examples/demo.py "$@"
