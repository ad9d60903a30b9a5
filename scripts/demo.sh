#!/usr/bin/env bash
# The main job from a fresh clone: set-up, then SparseResUNet42 trained on synthetic
# LiDAR scans (examples/train_segmentation.py; arguments pass on, outputs in out/).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup-env.sh
echo "[demo] training SparseResUNet42 on synthetic LiDAR scans (examples/train_segmentation.py;"
echo "[demo] 8 epochs; after its first 3 steps it prints how long training should take on this"
echo "[demo] machine, then the time so far and left as it goes; --help lists the options)"
exec .venv/bin/python examples/train_segmentation.py "$@"
