"""Train SparseResUNet42 to segment synthetic LiDAR street scans (no downloads).

What it does, end to end:

1. Simulates seeded LiDAR sweeps of random streets (``torch_lattice.data.lidar_scan``):
   ground, buildings, poles, vehicles and vegetation, each point labelled.  Point
   features are ``[height / 4 m, exp(-range / 40 m), 1]``.
2. Each step batches scans with ``tl.collate`` (mean features per voxel; the voxel label
   is the majority class of its points, found by averaging one-hot labels).
3. Trains ``tl.backbones.SparseResUNet42`` with class-weighted cross-entropy and Adam,
   showing its progress (a line redrawn in place on a terminal, a plain line every few
   steps when the output is captured; both with the time so far and left, and, after
   the first steps, how long the whole training should take here).  After every epoch
   it evaluates on held-out scans: voxel logits are read back at every point with
   ``tl.devoxelize`` and the point-level mIoU over all held-out scans (one confusion
   matrix over their points) is printed; epoch 0 is the untrained network.
4. Writes into ``--out`` (default ``out/``): ``model.safetensors`` (weights),
   ``metrics.json`` (loss and mIoU per epoch, per-class IoU, the configuration, timing,
   device and versions), ``segmentation.png`` (top view of held-out scan 1 coloured by
   predicted class beside the ground truth; its title gives that scan's mIoU and the
   logged mIoU over all held-out scans) and ``curves.png`` (loss and mIoU per epoch).
   Every file is written to a temporary name first and renamed (none is ever left
   half-written) and gets the mode ``open()`` would give it under the user's umask.
   ``--out`` is checked before any work: it must be a folder this user can write to, or
   be creatable as one (else the script exits 2 with one ``error:`` line).

Runs on the CPU by default and on the GPU with ``--device cuda`` (``auto`` picks the GPU
when torch sees one).  The time it takes on 2 CPU cores is in README.md ("Two
commands"); metrics.json records each run's.  Plotting needs matplotlib, the ``demo``
extra: ``pip install 'torch-lattice[demo]'``.

    python examples/train_segmentation.py [--epochs 8] [--out out] [--device auto]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch

import torch_lattice as tl
from torch_lattice import _C
from torch_lattice.atomic_file import atomic_write
from torch_lattice.data import LIDAR_CLASSES, SyntheticScene, lidar_scan
from torch_lattice.optional_deps import require_matplotlib

NUM_CLASSES = len(LIDAR_CLASSES)
SENSOR_FALLOFF_M = 40.0
HEIGHT_SCALE_M = 4.0
OUTPUTS = ("model.safetensors", "metrics.json", "segmentation.png", "curves.png")


@dataclass(frozen=True)
class ClassStyle:
    """How one class is drawn in the top view."""

    colour: str
    size: float  # marker area in points^2
    zorder: int


# Ground has most points and is drawn first, pale and small; the rare, thin classes
# (poles: a few hundred points, vehicles) are drawn last, large and dark, so every
# class stays visible where they overlap in the top view.
CLASS_STYLES = {
    "ground": ClassStyle("#b3b3b3", 0.8, 1),
    "building": ClassStyle("#e4572e", 1.5, 3),
    "pole": ClassStyle("#6a0dad", 14.0, 6),
    "vehicle": ClassStyle("#1f5fbf", 5.0, 5),
    "vegetation": ClassStyle("#3a9d23", 1.5, 2),
}
assert tuple(CLASS_STYLES) == LIDAR_CLASSES


@dataclass(frozen=True)
class Config:
    """Everything that decides a run (saved in metrics.json)."""

    epochs: int = 8
    train_scans: int = 12
    val_scans: int = 2
    batch_size: int = 2
    voxel_size: float = 0.25
    width: float = 0.5
    lr: float = 4e-3
    extent: float = 40.0
    beams: int = 32
    points_per_beam: int = 1024
    seed: int = 0


@dataclass(frozen=True)
class Scan:
    """One simulated scan: points ``(P, 3)``, per-point features ``(P, 3)`` and labels."""

    points: torch.Tensor
    feats: torch.Tensor
    labels: torch.Tensor


def make_scan(scene: SyntheticScene, extent: float) -> Scan:
    pts = scene.points
    rng = torch.hypot(pts[:, 0] - extent, pts[:, 1] - extent)
    feats = torch.stack(
        [pts[:, 2] / HEIGHT_SCALE_M, torch.exp(-rng / SENSOR_FALLOFF_M), torch.ones_like(rng)], 1
    )
    return Scan(pts, feats, scene.labels)


def simulate(cfg: Config) -> tuple[list[Scan], list[Scan]]:
    """Seeded training and held-out scans (disjoint seeds)."""

    def scan(seed: int) -> Scan:
        scene = lidar_scan(
            seed, extent=cfg.extent, num_beams=cfg.beams, points_per_beam=cfg.points_per_beam
        )
        return make_scan(scene, cfg.extent)

    base = 1000 * cfg.seed
    train = [scan(base + i) for i in range(cfg.train_scans)]
    val = [scan(base + 500 + i) for i in range(cfg.val_scans)]
    return train, val


def collate_scans(
    scans: list[Scan], voxel_size: float, device: torch.device
) -> tuple[tl.SparseTensor, torch.Tensor]:
    """Voxelized batch on ``device`` and the ``(M,)`` majority label of each voxel."""
    onehot = [torch.nn.functional.one_hot(s.labels, NUM_CLASSES).float() for s in scans]
    x = tl.collate(
        [s.points.to(device) for s in scans],
        [torch.cat([s.feats, o], 1).to(device) for s, o in zip(scans, onehot, strict=True)],
        voxel_size=voxel_size,
    )
    labels = x.feats[:, 3:].argmax(1)
    return x.replace(x.feats[:, :3].contiguous()), labels


def class_weights(scans: list[Scan]) -> torch.Tensor:
    """Inverse square-root frequency, normalized to mean 1 (rare poles still count)."""
    counts = torch.bincount(torch.cat([s.labels for s in scans]), minlength=NUM_CLASSES)
    w = 1.0 / counts.clamp_min(1).double().sqrt()
    return (w / w.mean()).float()


def confusion(pred: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    return torch.bincount(target * NUM_CLASSES + pred, minlength=NUM_CLASSES**2).reshape(
        NUM_CLASSES, NUM_CLASSES
    )


def iou_per_class(conf: torch.Tensor) -> list[float]:
    """IoU of each class (NaN for a class absent from both prediction and truth)."""
    tp = conf.diag().double()
    union = conf.sum(0).double() + conf.sum(1).double() - tp
    return [float(t / u) if u > 0 else math.nan for t, u in zip(tp, union, strict=True)]


def mean_iou(ious: list[float]) -> float:
    valid = [v for v in ious if not math.isnan(v)]
    return sum(valid) / len(valid)


@torch.no_grad()
def evaluate(
    model: torch.nn.Module, scans: list[Scan], cfg: Config, device: torch.device
) -> tuple[list[float], list[torch.Tensor]]:
    """Point-level IoU per class over ``scans`` and each scan's predicted point labels."""
    model.eval()
    conf = torch.zeros(NUM_CLASSES, NUM_CLASSES, dtype=torch.long)
    preds = []
    for scan in scans:
        x, _ = collate_scans([scan], cfg.voxel_size, device)
        logits = model(x)
        point_logits = tl.devoxelize(scan.points.to(device), logits, voxel_size=cfg.voxel_size)
        pred = point_logits.argmax(1).cpu()
        conf += confusion(pred, scan.labels)
        preds.append(pred)
    model.train()
    return iou_per_class(conf), preds


def clock(seconds: float) -> str:
    """A duration as 0.4 s, 42 s, 3 min 05 s or 1 h 02 min (tenths below 10 s, so a
    short phase never reads 0 s)."""
    if seconds < 9.95:
        return f"{seconds:.1f} s"
    s = round(seconds)
    if s < 60:
        return f"{s} s"
    if s < 3600:
        return f"{s // 60} min {s % 60:02d} s"
    return f"{s // 3600} h {s % 3600 // 60:02d} min"


class Progress:
    """Training progress that fits where the output goes.

    On a terminal (``live``) one line is redrawn in place with a carriage return; when
    the output is captured (a file, a pipe, CI) a plain line is printed every ``every``
    steps and at the end of each epoch, so a log keeps one line per report.  Both give
    the time so far and an estimate of the time left, from the mean time per step so
    far (evaluations included, since they run between epochs).  After the first
    ``measure`` steps it prints once how long the whole training should take here.
    """

    def __init__(
        self,
        epochs: int,
        steps_per_epoch: int,
        eval_seconds: float,
        *,
        live: bool,
        every: int,
        measure: int = 3,
        stream: Any = None,
        now: Any = time.perf_counter,
    ) -> None:
        self.epochs, self.steps_per_epoch = epochs, steps_per_epoch
        self.total = epochs * steps_per_epoch
        self.eval_seconds = eval_seconds  # one evaluation, measured on the untrained net
        self.live, self.every, self.measure = live, every, min(measure, self.total)
        self.stream = sys.stdout if stream is None else stream
        self.now = now
        self.start = now()
        self.done = 0
        self.expected: float | None = None

    def _write(self, text: str) -> None:
        self.stream.write(text)
        self.stream.flush()

    def step(self, epoch: int, step: int, loss: float) -> None:
        """Reports step ``step`` (1-based) of epoch ``epoch``; ``loss``: the epoch's mean."""
        self.done += 1
        elapsed = self.now() - self.start
        left = elapsed / self.done * (self.total - self.done)
        if self.done == self.measure:
            self._expect(elapsed)
        timing = f"{clock(elapsed)} so far, about {clock(left)} left"
        if self.live:
            width = 30
            bar = "#" * (width * step // self.steps_per_epoch)
            self._write(
                f"\r  [{bar:.<{width}}] {step}/{self.steps_per_epoch} loss {loss:.3f}  "
                f"({timing})\033[K"
            )
            if step == self.steps_per_epoch:
                self._write("\n")
        elif self.done % self.every == 0 or step == self.steps_per_epoch:
            self._write(
                f"  step {self.done}/{self.total} (epoch {epoch}, {step}/{self.steps_per_epoch})"
                f"  loss {loss:.3f}  {timing}\n"
            )

    def _expect(self, elapsed: float) -> None:
        """The estimate of the whole training from the first steps: steps at the rate
        measured so far, plus one evaluation per epoch as measured before training."""
        per_step = elapsed / self.done
        self.expected = per_step * self.total + self.eval_seconds * self.epochs
        line = (
            f"  the first {self.done} steps took {clock(elapsed)} ({per_step:.2f} s per step): "
            f"training should take about {clock(self.expected)} on this machine "
            f"({self.total} steps and {self.epochs} evaluations)"
        )
        self._write(f"\r{line}\033[K\n" if self.live else f"{line}\n")


def steps_per_epoch(cfg: Config) -> int:
    return math.ceil(cfg.train_scans / cfg.batch_size)


def train_epoch(
    model: torch.nn.Module,
    opt: torch.optim.Optimizer,
    scans: list[Scan],
    cfg: Config,
    weights: torch.Tensor,
    gen: torch.Generator,
    device: torch.device,
    report: Any,
) -> float:
    """One pass over the shuffled training scans; returns the mean loss.
    ``report(step, mean_loss)`` is called after each step."""
    order = torch.randperm(len(scans), generator=gen).tolist()
    batches = [order[i : i + cfg.batch_size] for i in range(0, len(order), cfg.batch_size)]
    total = 0.0
    for step, idx in enumerate(batches, start=1):
        x, labels = collate_scans([scans[i] for i in idx], cfg.voxel_size, device)
        logits = model(x).feats
        loss = torch.nn.functional.cross_entropy(logits, labels, weight=weights)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        total += loss.item()
        report(step, total / step)
    return total / len(batches)


def fmt_ious(ious: list[float]) -> str:
    return "  ".join(f"{name} {100 * v:4.1f}" for name, v in zip(LIDAR_CLASSES, ious, strict=True))


def save_weights(model: torch.nn.Module, path: Path) -> None:
    from safetensors.torch import save_file

    state = {k: v.detach().cpu().contiguous() for k, v in model.state_dict().items()}
    atomic_write(path, lambda tmp: save_file(state, str(tmp), metadata={"format": "pt"}))


def held_out_scans(n: int) -> str:
    """What the logged mIoU is over, in the words the log and both plots use."""
    return {1: "the held-out scan", 2: "both held-out scans"}.get(n, f"all {n} held-out scans")


def pyplot() -> Any:
    return require_matplotlib("demo", purpose="the training demo (examples/train_segmentation.py)")


def save_figure(fig: Any, path: Path) -> None:
    atomic_write(path, lambda tmp: fig.savefig(tmp, dpi=110, bbox_inches="tight"))


def plot_segmentation(
    scan: Scan, pred: torch.Tensor, path: Path, scan_miou: float, val_miou: float, n_val: int
) -> None:
    """Top view of held-out scan 1: prediction beside ground truth, every class drawn
    with its own style (CLASS_STYLES)."""
    plt = pyplot()
    from matplotlib.lines import Line2D

    fig, axes = plt.subplots(1, 2, figsize=(13, 7), sharex=True, sharey=True, layout="constrained")
    xy = scan.points[:, :2].numpy()
    for ax, labels, title in (
        (axes[0], pred, f"prediction: point mIoU {100 * scan_miou:.1f}% on this scan"),
        (axes[1], scan.labels, "ground truth"),
    ):
        for c, (name, style) in enumerate(CLASS_STYLES.items()):
            mask = (labels == c).numpy()
            ax.scatter(
                xy[mask, 0],
                xy[mask, 1],
                s=style.size,
                c=style.colour,
                zorder=style.zorder,
                linewidths=0,
                label=name,
            )
        ax.set_title(title)
        ax.set_aspect("equal")
        ax.set_xlabel("x (m)")
    axes[0].set_ylabel("y (m)")
    scans = held_out_scans(n_val)
    fig.suptitle(
        f"Top view of held-out scan 1 of {n_val}, coloured by class\n"
        f"(point mIoU over {scans}, as in the log: {100 * val_miou:.1f}%)"
    )
    handles = [
        Line2D([], [], marker="o", linestyle="", color=st.colour, markersize=7, label=name)
        for name, st in CLASS_STYLES.items()
    ]
    fig.legend(handles=handles, loc="outside lower center", ncol=NUM_CLASSES, frameon=False)
    save_figure(fig, path)
    plt.close(fig)


def plot_curves(
    losses: list[float], mious: list[float], per_class: list[list[float]], n_val: int, path: Path
) -> None:
    """Training loss and held-out mIoU (with each class's IoU) per epoch."""
    plt = pyplot()
    from matplotlib.ticker import MaxNLocator

    fig, (a, b) = plt.subplots(1, 2, figsize=(12, 4.6), layout="constrained")
    fig.suptitle("SparseResUNet42 on synthetic LiDAR scans: training curves")
    a.plot(range(1, len(losses) + 1), losses, marker="o")
    a.set_title("training loss (class-weighted cross-entropy,\nmean over each epoch's steps)")
    a.set_xlabel("epoch")
    a.set_ylabel("loss")
    a.grid(alpha=0.3)
    a.xaxis.set_major_locator(MaxNLocator(integer=True))
    epochs = range(len(mious))
    for c, (name, style) in enumerate(CLASS_STYLES.items()):
        ious = [100 * row[c] for row in per_class]  # NaN (class absent) leaves a gap
        b.plot(epochs, ious, color=style.colour, linewidth=1, alpha=0.8, label=f"{name} IoU")
    b.plot(epochs, [100 * m for m in mious], marker="o", color="black", linewidth=2, label="mIoU")
    scans = held_out_scans(n_val)
    b.set_title(f"held-out point IoU over {scans}\n(epoch 0 = untrained network)")
    b.set_xlabel("epoch")
    b.set_ylabel("IoU (%)")
    b.set_ylim(0, 100)
    b.grid(alpha=0.3)
    b.xaxis.set_major_locator(MaxNLocator(integer=True))
    b.legend(fontsize=8, loc="center left", bbox_to_anchor=(1.02, 0.5), frameon=False)
    save_figure(fig, path)
    plt.close(fig)


def parse_args(argv: list[str] | None) -> tuple[Config, argparse.Namespace]:
    d = Config()
    p = argparse.ArgumentParser(
        description=__doc__.splitlines()[0],
        epilog=f"Writes {', '.join(OUTPUTS)} into --out. Plotting needs matplotlib: "
        "pip install 'torch-lattice[demo]'.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    p.add_argument("--epochs", type=int, default=d.epochs, help="training epochs")
    p.add_argument("--train-scans", type=int, default=d.train_scans, help="simulated scans")
    p.add_argument(
        "--val-scans", type=int, default=d.val_scans, help="held-out scans (mIoU is over all)"
    )
    p.add_argument("--batch-size", type=int, default=d.batch_size, help="scans per step")
    p.add_argument("--voxel-size", type=float, default=d.voxel_size, help="voxel edge, metres")
    p.add_argument("--width", type=float, default=d.width, help="channel multiplier")
    p.add_argument("--lr", type=float, default=d.lr, help="Adam learning rate (cosine decay)")
    p.add_argument("--extent", type=float, default=d.extent, help="scan radius in metres")
    p.add_argument("--beams", type=int, default=d.beams, help="LiDAR beams per scan")
    p.add_argument("--points-per-beam", type=int, default=d.points_per_beam, help="points per beam")
    p.add_argument("--seed", type=int, default=d.seed, help="seed of scans and model")
    p.add_argument("--out", type=Path, default=Path("out"), help="output directory")
    p.add_argument("--device", default="auto", help="auto, cpu, cuda or cuda:N")
    p.add_argument(
        "--threads", type=int, default=None, help="torch CPU threads (None: torch's default)"
    )
    p.add_argument(
        "--no-reuse-memory",
        action="store_true",
        help="on the CPU, leave glibc's malloc as it is instead of tl.reuse_cpu_memory() "
        "(each step's large tensors are then fresh memory, faulted in page by page)",
    )
    p.add_argument(
        "--progress",
        choices=("auto", "live", "lines"),
        default="auto",
        help="live: one line redrawn in place; lines: a plain line every --progress-every "
        "steps; auto: live on a terminal, lines when the output is captured",
    )
    p.add_argument(
        "--progress-every", type=int, default=4, help="steps between progress lines (lines mode)"
    )
    a = p.parse_args(argv)
    for name in (
        "epochs", "train_scans", "val_scans", "batch_size", "beams", "points_per_beam",
        "progress_every",
    ):  # fmt: skip
        if getattr(a, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be >= 1")
    for name in ("voxel_size", "width", "lr", "extent"):
        if not getattr(a, name) > 0:
            p.error(f"--{name.replace('_', '-')} must be > 0")
    problem = out_problem(a.out)
    if problem is not None:
        p.error(f"--out {str(a.out)!r} {problem}")
    cfg = Config(**{k: getattr(a, k) for k in asdict(d)})
    return cfg, a


def out_problem(out: Path) -> str | None:
    """Why the outputs could not be written into ``out``, or None when they can.

    Checked before training, so a bad ``--out`` costs seconds, not the whole run. Nothing
    is created here: a missing folder is made when the outputs are written.
    """
    if out.is_symlink() and not out.exists():
        return "is a broken symbolic link"
    if out.exists():
        if not out.is_dir():
            return "exists and is not a folder"
        if not os.access(out, os.W_OK | os.X_OK):
            return "is a folder this user cannot write to"
        for name in OUTPUTS:  # the rename of a finished file cannot replace a folder
            if (out / name).is_dir():
                return f"holds a folder named {name!r}, where an output file goes"
        return None
    ancestor = out.parent
    while not ancestor.exists() and ancestor != ancestor.parent:
        ancestor = ancestor.parent
    if not ancestor.is_dir():
        return f"cannot be created: {str(ancestor)!r} is not a folder"
    if not os.access(ancestor, os.W_OK | os.X_OK):
        return f"cannot be created: this user cannot write to {str(ancestor)!r}"
    return None


def cuda_supported() -> str | None:
    """None when this build runs the demo's ops on the GPU, else the reason it cannot."""
    try:
        pts = torch.rand(64, 3, device="cuda") * 4
        x = tl.voxelize(pts, torch.ones(64, 3, device="cuda"))
        tl.nn.SubmConv3d(3, 2, 3).cuda()(x)
    except RuntimeError as e:
        return str(e).splitlines()[0]
    return None


def pick_device(name: str) -> torch.device:
    if name == "auto":
        if not torch.cuda.is_available():
            return torch.device("cpu")
        reason = cuda_supported()
        if reason is not None:
            print(f"a GPU is present but this build cannot use it ({reason}); using the CPU")
            return torch.device("cpu")
        return torch.device("cuda")
    device = torch.device(name)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise SystemExit("--device cuda: torch sees no CUDA GPU")
    return device


def cpu_name() -> str:
    """The processor's model name (Linux's /proc/cpuinfo), else the architecture."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as info:
            for line in info:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def environment(device: torch.device, reuse_memory: bool) -> dict[str, Any]:
    """Where a run ran, for metrics.json: device, threads, memory reuse and versions."""
    env: dict[str, Any] = {
        "device": str(device),
        "reuse_cpu_memory": reuse_memory,
        "device_name": torch.cuda.get_device_name(device) if device.type == "cuda" else cpu_name(),
        "cpu_threads": torch.get_num_threads(),
        "cpu_count": os.cpu_count(),
        "versions": {
            "python": platform.python_version(),
            "torch": torch.__version__,
            "torch_lattice": tl.__version__,
            "cpu_isa": _C.cpu_isa(),
        },
        "platform": platform.platform(),
    }
    return env


def main(argv: list[str] | None = None) -> dict:
    cfg, args = parse_args(argv)
    try:  # before any work: a missing matplotlib is reported now, not after training
        pyplot()
    except ImportError as e:
        raise SystemExit(str(e)) from e
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    device = pick_device(args.device)
    # CPU training allocates the same large activations every step; kept freed memory is
    # reused instead of faulted in again (docs/troubleshooting.md).
    reuse = device.type == "cpu" and not args.no_reuse_memory and tl.reuse_cpu_memory()
    torch.manual_seed(cfg.seed)
    gen = torch.Generator().manual_seed(cfg.seed)
    t0 = time.perf_counter()
    print(
        f"Torch Lattice: SparseResUNet42 (width {cfg.width}) on synthetic LiDAR, {device}, "
        f"{torch.get_num_threads()} threads" + (", freed CPU memory reused" if reuse else "")
    )
    train, val = simulate(cfg)
    timing: dict[str, Any] = {"simulate": time.perf_counter() - t0}
    n_pts = sum(len(s.points) for s in train)
    print(
        f"simulated {len(train)} training scans ({n_pts:,} points) and {len(val)} held-out "
        f"scans in {timing['simulate']:.1f} s; voxel size {cfg.voxel_size} m"
    )
    scans = held_out_scans(len(val))
    print(f"mIoU below: point-level, over {scans}")

    model = tl.backbones.SparseResUNet42(3, NUM_CLASSES, width=cfg.width).to(device)
    opt = torch.optim.Adam(model.parameters(), lr=cfg.lr)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=cfg.epochs, eta_min=cfg.lr / 10)
    weights = class_weights(train).to(device)
    t = time.perf_counter()
    ious, _ = evaluate(model, val, cfg, device)
    timing["evaluate"] = time.perf_counter() - t
    losses, mious, per_class = [], [mean_iou(ious)], [ious]
    timing["train_epochs"], timing["train_cpu"] = [], 0.0
    print(f"epoch 0 (untrained)  held-out mIoU {100 * mious[0]:5.1f}%")
    live = args.progress == "live" or (args.progress == "auto" and sys.stdout.isatty())
    tracker = Progress(
        cfg.epochs, steps_per_epoch(cfg), timing["evaluate"], live=live, every=args.progress_every
    )
    for epoch in range(1, cfg.epochs + 1):
        print(f"epoch {epoch}/{cfg.epochs}", flush=True)
        t, cpu = time.perf_counter(), time.process_time()

        def report(step: int, loss: float, epoch: int = epoch) -> None:
            tracker.step(epoch, step, loss)

        losses.append(train_epoch(model, opt, train, cfg, weights, gen, device, report))
        sched.step()
        timing["train_epochs"].append(time.perf_counter() - t)
        # CPU seconds of all this process's threads: unlike wall time, barely changed
        # by other jobs on a shared machine.
        timing["train_cpu"] += time.process_time() - cpu
        t = time.perf_counter()
        ious, preds = evaluate(model, val, cfg, device)
        timing["evaluate"] += time.perf_counter() - t
        mious.append(mean_iou(ious))
        per_class.append(ious)
        print(f"  loss {losses[-1]:.4f}  held-out mIoU {100 * mious[-1]:5.1f}%   {fmt_ious(ious)}")
    timing["train"] = sum(timing["train_epochs"])
    # What the first steps predicted for training with its evaluations (compare with
    # train + evaluate; None when the run had fewer steps than the measurement needs).
    timing["train_expected"] = tracker.expected
    scan_miou = mean_iou(iou_per_class(confusion(preds[0], val[0].labels)))
    print(
        f"held-out mIoU {100 * mious[0]:.1f}% -> {100 * mious[-1]:.1f}% ({scans}; "
        f"segmentation.png shows held-out scan 1: {100 * scan_miou:.1f}%)"
    )
    metrics = {
        "config": asdict(cfg),
        "classes": list(LIDAR_CLASSES),
        "train_loss": losses,
        "val_scans": len(val),
        "val_miou": mious,
        "val_iou_per_class": [[None if math.isnan(v) else v for v in row] for row in per_class],
        "plotted_scan": {"index": 0, "point_miou": scan_miou},
        "environment": environment(device, reuse),
        "timing_s": timing,
    }
    write_outputs(args.out, model, metrics, val[0], preds[0], t0)
    print(
        f"training took {timing['train']:.0f} s ({timing['train'] / cfg.epochs:.1f} s per "
        f"epoch, {timing['train_cpu']:.0f} s of CPU time), {timing['total']:.0f} s in all"
    )
    print(f"outputs in {args.out.resolve()}: {', '.join(OUTPUTS)}")
    return metrics


def write_outputs(
    out: Path,
    model: torch.nn.Module,
    metrics: dict[str, Any],
    scan: Scan,
    pred: torch.Tensor,
    t0: float,
) -> None:
    """Writes the four outputs, metrics.json last (with the total time up to it)."""
    out.mkdir(parents=True, exist_ok=True)
    save_weights(model, out / "model.safetensors")
    n_val, mious = metrics["val_scans"], metrics["val_miou"]
    miou = metrics["plotted_scan"]["point_miou"]
    plot_segmentation(scan, pred, out / "segmentation.png", miou, mious[-1], n_val)
    per_class = [[math.nan if v is None else v for v in r] for r in metrics["val_iou_per_class"]]
    plot_curves(metrics["train_loss"], mious, per_class, n_val, out / "curves.png")
    metrics["timing_s"]["total"] = time.perf_counter() - t0
    text = json.dumps(metrics, indent=2)
    atomic_write(out / "metrics.json", lambda tmp: tmp.write_text(text))


if __name__ == "__main__":
    main()
