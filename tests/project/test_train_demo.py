"""The training demo (examples/train_segmentation.py) in a tiny configuration."""

from __future__ import annotations

import importlib.util
import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

DEMO = Path(__file__).resolve().parents[2] / "examples" / "train_segmentation.py"
# In this process the demo leaves malloc alone (--no-reuse-memory): tl.reuse_cpu_memory()
# lasts for the process, so its default is run in a subprocess below.
TINY = [
    "--epochs", "3", "--train-scans", "2", "--val-scans", "1", "--beams", "16",
    "--points-per-beam", "384", "--extent", "25", "--width", "0.25", "--voxel-size", "0.4",
    "--lr", "0.01", "--no-reuse-memory",
]  # fmt: skip


def load_demo():
    spec = importlib.util.spec_from_file_location("train_segmentation", DEMO)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up here
    spec.loader.exec_module(module)
    return module


def test_tiny_run_improves_and_writes_outputs(tmp_path, capsys, monkeypatch):
    demo = load_demo()
    out = tmp_path / "out"
    figures = []
    save_figure = demo.save_figure

    def keep(fig, path):
        figures.append((path.name, fig))
        save_figure(fig, path)

    monkeypatch.setattr(demo, "save_figure", keep)
    old = os.umask(0o027)  # not the usual 022: every output must follow the umask
    try:
        metrics = demo.main([*TINY, "--out", str(out)])
    finally:
        os.umask(old)
    assert sorted(p.name for p in out.iterdir()) == sorted(demo.OUTPUTS) == [
        "curves.png", "metrics.json", "model.safetensors", "segmentation.png",
    ]  # fmt: skip
    for name in demo.OUTPUTS:
        assert stat.S_IMODE((out / name).stat().st_mode) == 0o640, name
    assert json.loads((out / "metrics.json").read_text()) == metrics
    losses, mious = metrics["train_loss"], metrics["val_miou"]
    assert len(losses) == 3 and len(mious) == 4
    assert losses[-1] < losses[0]
    assert mious[-1] > mious[0] + 0.1  # the untrained network is near chance
    for png in ("curves.png", "segmentation.png"):
        assert (out / png).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    printed = capsys.readouterr().out
    assert "held-out mIoU" in printed
    # Captured output (not a terminal): plain progress lines, no carriage returns.
    assert "\r" not in printed
    steps = [ln for ln in printed.splitlines() if ln.startswith("  step ")]
    assert [ln.split("  loss")[0] for ln in steps] == [
        f"  step {e}/3 (epoch {e}, 1/1)" for e in (1, 2, 3)
    ], printed
    assert all(ln.endswith(" left") and " so far, about " in ln for ln in steps), steps
    assert "training should take about " in printed
    assert metrics["timing_s"]["train_expected"] > 0
    assert printed.splitlines()[-1] == f"outputs in {out.resolve()}: " + ", ".join(demo.OUTPUTS)

    # The plots say what they show, in the log's numbers.
    final = f"{100 * mious[-1]:.1f}%"
    scan = f"{100 * metrics['plotted_scan']['point_miou']:.1f}%"
    assert f"-> {final} (the held-out scan; segmentation.png shows held-out scan 1: {scan})" in (
        printed
    )
    texts = {name: figure_texts(fig) for name, fig in figures}
    assert sorted(texts) == ["curves.png", "segmentation.png"]
    seg = texts["segmentation.png"]
    assert f"as in the log: {final}" in seg and f"point mIoU {scan} on this scan" in seg
    assert "ground truth" in seg and "held-out scan 1 of 1" in seg
    curves = texts["curves.png"]
    assert "training curves" in curves and "training loss" in curves
    assert "held-out point IoU over the held-out scan" in curves
    for label in ("epoch", "loss", "IoU (%)"):
        assert label in curves

    from safetensors.torch import load_file

    import torch_lattice as tl

    model = tl.backbones.SparseResUNet42(3, 5, width=0.25)
    model.load_state_dict(load_file(out / "model.safetensors"), strict=True)


def figure_texts(fig) -> str:
    """The suptitle, axes titles and axis labels of a matplotlib figure, one per line."""
    parts = [fig.get_suptitle()]
    for ax in fig.axes:
        parts += [ax.get_title(), ax.get_xlabel(), ax.get_ylabel()]
    return "\n".join(parts)


def test_metrics_record_timing_device_and_versions(tmp_path):
    import platform

    import torch

    import torch_lattice as tl
    from torch_lattice import _C

    demo = load_demo()
    metrics = demo.main([*TINY, "--epochs", "2", "--out", str(tmp_path)])
    saved = json.loads((tmp_path / "metrics.json").read_text())
    assert saved == metrics
    env = saved["environment"]
    assert env["device"] == "cpu" and env["device_name"]
    assert env["reuse_cpu_memory"] is False
    assert env["cpu_threads"] == torch.get_num_threads() and env["cpu_threads"] >= 1
    assert env["versions"] == {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "torch_lattice": tl.__version__,
        "cpu_isa": _C.cpu_isa(),
    }
    timing = saved["timing_s"]
    assert set(timing) == {
        "simulate", "evaluate", "train_epochs", "train", "train_cpu", "total", "train_expected",
    }  # fmt: skip
    assert timing["train_expected"] > 0  # from the first steps (here both of them)
    assert len(timing["train_epochs"]) == 2
    assert timing["train"] == sum(timing["train_epochs"])
    assert all(v > 0 for v in (timing["simulate"], timing["evaluate"], *timing["train_epochs"]))
    assert timing["train_cpu"] > 0
    assert timing["total"] > timing["simulate"] + timing["train"] + timing["evaluate"]
    assert saved["val_scans"] == 1 and saved["plotted_scan"]["index"] == 0
    assert 0 <= saved["plotted_scan"]["point_miou"] <= 1


def test_help_shows_every_default(capsys):
    demo = load_demo()
    with pytest.raises(SystemExit) as exit_info:
        demo.main(["--help"])
    assert exit_info.value.code == 0
    text = " ".join(capsys.readouterr().out.split())  # argparse wraps lines
    for default in ("8", "12", "2", "0.25", "0.5", "0.004", "40.0", "32", "1024", "0", "out"):
        assert f"(default: {default})" in text, default
    assert "(default: auto)" in text and "torch-lattice[demo]" in text


def test_without_matplotlib_names_the_extra_before_any_work(tmp_path):
    """matplotlib is an extra: the demo says which one, before simulating or training."""
    code = (
        "import sys\n"
        "sys.modules['matplotlib'] = None  # import matplotlib now raises ImportError\n"
        f"sys.path.insert(0, {str(DEMO.parents[1])!r})\n"
        "import runpy\n"
        f"sys.argv = ['train_segmentation.py', '--out', {str(tmp_path / 'out')!r}]\n"
        f"runpy.run_path({str(DEMO)!r}, run_name='__main__')\n"
    )
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300
    )
    assert done.returncode == 1, done.stdout + done.stderr
    assert "needs matplotlib: pip install 'torch-lattice[demo]'" in done.stderr
    assert "Traceback" not in done.stderr
    assert done.stdout == "" and not (tmp_path / "out").exists()


def test_cpu_training_reuses_freed_memory_by_default(tmp_path):
    """On the CPU the demo calls tl.reuse_cpu_memory() (glibc; elsewhere it reports
    False) and says so, in its own process."""
    import platform

    glibc = platform.libc_ver()[0] == "glibc"
    out = tmp_path / "out"
    args = [a for a in TINY if a != "--no-reuse-memory"]
    args[args.index("--epochs") + 1] = "1"
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    done = subprocess.run(
        [sys.executable, str(DEMO), *args, "--device", "cpu", "--out", str(out)],
        capture_output=True, text=True, env=env, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    reused = json.loads((out / "metrics.json").read_text())["environment"]["reuse_cpu_memory"]
    assert reused is glibc
    assert ("freed CPU memory reused" in done.stdout) is glibc


def test_bad_arguments_exit_before_work(tmp_path):
    demo = load_demo()
    with pytest.raises(SystemExit):
        demo.main(["--epochs", "0", "--out", str(tmp_path / "x")])
    assert not (tmp_path / "x").exists()


def _out_refused(capsys, out, fragment):
    """main() exits 2 with argparse's one error line, before any simulation or training."""
    demo = load_demo()
    with pytest.raises(SystemExit) as exit_info:
        demo.main([*TINY, "--out", str(out)])
    assert exit_info.value.code == 2
    captured = capsys.readouterr()
    assert captured.out == ""  # nothing simulated, nothing trained
    errors = [line for line in captured.err.splitlines() if "error:" in line]
    assert len(errors) == 1 and f"error: --out {str(out)!r} {fragment}" in errors[0], captured.err
    assert "Traceback" not in captured.err


def test_out_that_is_a_file_is_refused_before_training(tmp_path, capsys):
    (tmp_path / "outfile").write_text("keep")
    _out_refused(capsys, tmp_path / "outfile", "exists and is not a folder")
    _out_refused(capsys, tmp_path / "outfile" / "sub",
                 f"cannot be created: {str(tmp_path / 'outfile')!r} is not a folder")
    os.symlink(tmp_path / "missing", tmp_path / "broken")
    _out_refused(capsys, tmp_path / "broken", "is a broken symbolic link")
    (tmp_path / "out" / "metrics.json").mkdir(parents=True)
    _out_refused(capsys, tmp_path / "out", "holds a folder named 'metrics.json'")
    assert (tmp_path / "outfile").read_text() == "keep"
    assert not (tmp_path / "missing").exists()


def test_out_that_cannot_be_written_is_refused_before_training(tmp_path, capsys,
                                                               monkeypatch):
    locked = tmp_path / "locked"
    locked.mkdir()
    # root may write anywhere, so the permission answer is the one os.access gives.
    monkeypatch.setattr(os, "access", lambda path, mode: Path(path) != locked)
    _out_refused(capsys, locked, "is a folder this user cannot write to")
    _out_refused(capsys, locked / "new" / "deeper",
                 f"cannot be created: this user cannot write to {str(locked)!r}")
    assert list(locked.iterdir()) == []


def test_out_that_can_be_written_is_accepted_without_creating_it(tmp_path):
    demo = load_demo()
    for out in (tmp_path, tmp_path / "new" / "deeper"):
        _, args = demo.parse_args(["--out", str(out)])
        assert args.out == out
    assert list(tmp_path.iterdir()) == []  # made only when the outputs are written


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


class FakeClock:
    """A clock that advances only when told: progress output without real time."""

    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


def _progress(live: bool, every: int = 2):
    import io

    demo = load_demo()
    clock, stream = FakeClock(), io.StringIO()
    tracker = demo.Progress(2, 3, 1.5, live=live, every=every, stream=stream, now=clock)
    return tracker, clock, stream


def test_progress_lines_when_captured():
    """Every `every` steps and at each epoch's end one plain line with the time so far and
    the time left; after the first 3 steps, the expected duration of the whole training."""
    tracker, clock, stream = _progress(live=False)
    for epoch in (1, 2):
        for step in (1, 2, 3):
            clock.t += 2.0  # two seconds per step
            tracker.step(epoch, step, 1.0 / (epoch * step))
    assert stream.getvalue().splitlines() == [
        "  step 2/6 (epoch 1, 2/3)  loss 0.500  4.0 s so far, about 8.0 s left",
        "  the first 3 steps took 6.0 s (2.00 s per step): training should take about 15 s on "
        "this machine (6 steps and 2 evaluations)",
        "  step 3/6 (epoch 1, 3/3)  loss 0.333  6.0 s so far, about 6.0 s left",
        "  step 4/6 (epoch 2, 1/3)  loss 0.500  8.0 s so far, about 4.0 s left",
        "  step 6/6 (epoch 2, 3/3)  loss 0.167  12 s so far, about 0.0 s left",
    ]
    assert tracker.expected == 6 * 2.0 + 2 * 1.5


def test_progress_live_line_on_a_terminal():
    """One line redrawn with carriage returns (and erased to its end), ended at each epoch's
    last step; the estimate takes the line's place and the next step redraws below it."""
    tracker, clock, stream = _progress(live=True)
    for step in (1, 2, 3):
        clock.t += 30.0
        tracker.step(1, step, 0.25)
    erase = "\033[K"
    assert stream.getvalue() == (
        f"\r  [##########....................] 1/3 loss 0.250  "
        f"(30 s so far, about 2 min 30 s left){erase}"
        f"\r  [####################..........] 2/3 loss 0.250  "
        f"(1 min 00 s so far, about 2 min 00 s left){erase}"
        f"\r  the first 3 steps took 1 min 30 s (30.00 s per step): training should take "
        f"about 3 min 03 s on this machine (6 steps and 2 evaluations){erase}\n"
        f"\r  [##############################] 3/3 loss 0.250  "
        f"(1 min 30 s so far, about 1 min 30 s left){erase}\n"
    )


def test_progress_choice_and_clock():
    demo = load_demo()
    assert [demo.clock(s) for s in (0.04, 0.4, 9.94, 9.96, 59.6, 185, 3725)] == [
        "0.0 s", "0.4 s", "9.9 s", "10 s", "1 min 00 s", "3 min 05 s", "1 h 02 min",
    ]  # fmt: skip
