"""The training demo (examples/train_segmentation.py) in a tiny configuration."""

from __future__ import annotations

import importlib.util
import json
import os
import stat
import sys
from pathlib import Path

import pytest

DEMO = Path(__file__).resolve().parents[1] / "examples" / "train_segmentation.py"
TINY = [
    "--epochs", "3", "--train-scans", "2", "--val-scans", "1", "--beams", "16",
    "--points-per-beam", "384", "--extent", "25", "--width", "0.25", "--voxel-size", "0.4",
    "--lr", "0.01",
]  # fmt: skip


def load_demo():
    spec = importlib.util.spec_from_file_location("train_segmentation", DEMO)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up here
    spec.loader.exec_module(module)
    return module


def test_tiny_run_improves_and_writes_outputs(tmp_path, capsys):
    demo = load_demo()
    out = tmp_path / "out"
    metrics = demo.main([*TINY, "--out", str(out)])
    assert sorted(p.name for p in out.iterdir()) == [
        "curves.png", "metrics.json", "model.safetensors", "segmentation.png",
    ]  # fmt: skip
    assert json.loads((out / "metrics.json").read_text()) == metrics
    losses, mious = metrics["train_loss"], metrics["val_miou"]
    assert len(losses) == 3 and len(mious) == 4
    assert losses[-1] < losses[0]
    assert mious[-1] > mious[0] + 0.1  # the untrained network is near chance
    for png in ("curves.png", "segmentation.png"):
        assert (out / png).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    printed = capsys.readouterr().out
    assert "held-out mIoU" in printed and "[" in printed

    from safetensors.torch import load_file

    import torch_lattice as tl

    model = tl.backbones.SparseResUNet42(3, 5, width=0.25)
    model.load_state_dict(load_file(out / "model.safetensors"), strict=True)


def test_bad_arguments_exit_before_work(tmp_path):
    demo = load_demo()
    with pytest.raises(SystemExit):
        demo.main(["--epochs", "0", "--out", str(tmp_path / "x")])
    assert not (tmp_path / "x").exists()


@pytest.mark.parametrize("mask", [0o022, 0o077])
def test_saved_files_follow_the_umask(tmp_path, mask):
    """model.safetensors goes through torch_lattice.atomic_file: ``0o666 & ~umask``."""
    import torch

    demo = load_demo()
    old = os.umask(mask)
    try:
        demo.save_weights(torch.nn.Linear(2, 3), tmp_path / "model.safetensors")
    finally:
        os.umask(old)
    assert stat.S_IMODE((tmp_path / "model.safetensors").stat().st_mode) == 0o666 & ~mask
    assert [p.name for p in tmp_path.iterdir()] == ["model.safetensors"]
