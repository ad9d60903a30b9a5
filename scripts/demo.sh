#!/usr/bin/env bash
# The main job from a fresh clone: set-up, then SparseResUNet42 trained on synthetic
# LiDAR scans (examples/train_segmentation.py; arguments pass on, outputs in out/).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup-env.sh
exec .venv/bin/python examples/train_segmentation.py "$@"
