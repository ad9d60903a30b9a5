"""Torch Lattice demo: a small sparse encoder trained for one step on synthetic LiDAR.

What it does, end to end, with nothing downloaded:

1. Simulates two LiDAR sweeps of random streets (``torch_lattice.data.lidar_scan`` with
   seeds ``seed`` and ``seed + 1``) and voxelizes them at ``--voxel-size`` metres into
   one batch. Each voxel's features are the mean over its points of
   ``[height (m), intensity-like range falloff exp(-range / 40 m), 1.0]``; its label is
   the majority class of its points.
2. Builds ``tl.SparseTensor(feats, coords)`` and runs a four-layer encoder::

       SubmConv3d(3, 16, 3)                    stride 1 -> 1 (support kept)
       Conv3d(16, 32, kernel_size=2, stride=2) stride 1 -> 2 (downsample)
       SubmConv3d(32, 32, 3)                   stride 2 -> 2
       Conv3d(32, 64, kernel_size=3, stride=2, padding=1)  stride 2 -> 4

   with a ReLU on the features after every layer.
3. A per-voxel linear head classifies every stride-2 voxel from its own 32 features
   plus the 64 features of the stride-4 voxel above it (found with plain torch ops),
   a cross-entropy loss against the majority label of the points in each stride-2 voxel
   is computed, and ``loss.backward()`` runs.
4. Prints the data sizes, every layer's input/output voxel counts, strides, forward and
   backward wall time, the loss and each layer's weight-gradient norm.

Run it with ``python examples/demo.py [--seed 0] [--voxel-size 0.1] [--threads 2]``.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch

import torch_lattice as tl
from torch_lattice.data import LIDAR_CLASSES, lidar_scan, voxel_coords

NUM_CLASSES = len(LIDAR_CLASSES)
INTENSITY_FALLOFF_M = 40.0
IGNORE = -100


@dataclass(frozen=True)
class Batch:
    """A voxelized batch of scans.

    Attributes:
        feats: ``(M, 3)`` float32 mean point features per voxel.
        coords: ``(M, 4)`` int32 unique ``[batch, x, y, z]`` rows, sorted.
        labels: ``(M,)`` int64 majority class per voxel.
        point_voxel: ``(P,)`` int64 voxel row of every point of every scan.
        point_labels: ``(P,)`` int64 class of every point.
        points_per_scan: Number of points of each scan.
        voxels_per_scan: Number of voxels of each scan.
    """

    feats: torch.Tensor
    coords: torch.Tensor
    labels: torch.Tensor
    point_voxel: torch.Tensor
    point_labels: torch.Tensor
    points_per_scan: tuple[int, ...]
    voxels_per_scan: tuple[int, ...]


def majority(groups: torch.Tensor, labels: torch.Tensor, num_groups: int) -> torch.Tensor:
    """Most frequent label per group.

    Args:
        groups: ``(P,)`` int64 group of each item, ``-1`` to skip the item.
        labels: ``(P,)`` int64 labels in ``[0, NUM_CLASSES)``.
        num_groups: Number of groups ``G``.

    Returns:
        ``(G,)`` int64 majority label, ``IGNORE`` for empty groups.
    """
    keep = groups >= 0
    counts = torch.zeros(num_groups, NUM_CLASSES, dtype=torch.int64)
    counts.index_put_((groups[keep], labels[keep]), torch.ones(()).long(), accumulate=True)
    return torch.where(counts.sum(1) > 0, counts.argmax(1), IGNORE)


def make_batch(seeds: list[int], voxel_size: float) -> Batch:
    """Simulates one scan per seed and voxelizes them into one batch."""
    feats, coords, point_voxel, point_labels = [], [], [], []
    points_per_scan, voxels_per_scan = [], []
    offset = 0
    for b, seed in enumerate(seeds):
        scene = lidar_scan(seed)
        pts = scene.points
        # The sensor sits at (extent, extent) = (80, 80) in the scan frame.
        rng = torch.hypot(pts[:, 0] - 80.0, pts[:, 1] - 80.0)
        per_point = torch.stack(
            [pts[:, 2], torch.exp(-rng / INTENSITY_FALLOFF_M), torch.ones_like(rng)], dim=1
        )
        c, inverse = voxel_coords(pts, voxel_size, batch_index=b)
        count = torch.bincount(inverse, minlength=c.shape[0]).clamp_min(1).unsqueeze(1)
        sums = torch.zeros(c.shape[0], 3).index_add_(0, inverse, per_point)
        feats.append(sums / count)
        coords.append(c)
        point_voxel.append(inverse + offset)
        point_labels.append(scene.labels)
        points_per_scan.append(pts.shape[0])
        voxels_per_scan.append(c.shape[0])
        offset += c.shape[0]
    point_voxel_t, point_labels_t = torch.cat(point_voxel), torch.cat(point_labels)
    return Batch(
        feats=torch.cat(feats),
        coords=torch.cat(coords),
        labels=majority(point_voxel_t, point_labels_t, offset),
        point_voxel=point_voxel_t,
        point_labels=point_labels_t,
        points_per_scan=tuple(points_per_scan),
        voxels_per_scan=tuple(voxels_per_scan),
    )


def row_index(table: torch.Tensor, queries: torch.Tensor) -> torch.Tensor:
    """Row of ``table`` equal to each row of ``queries``, ``-1`` where there is none.

    Args:
        table: ``(N, 4)`` integer unique rows ``[b, x, y, z]``.
        queries: ``(Q, 4)`` integer rows.

    Returns:
        ``(Q,)`` int64 indices into ``table``.
    """
    table, queries = table.long(), queries.long()
    ext = torch.maximum(table.amax(0), queries.amax(0)) + 1

    def key(rows: torch.Tensor) -> torch.Tensor:
        return ((rows[:, 0] * ext[1] + rows[:, 1]) * ext[2] + rows[:, 2]) * ext[3] + rows[:, 3]

    sorted_keys, order = torch.sort(key(table))
    q = key(queries)
    pos = torch.searchsorted(sorted_keys, q).clamp_max(sorted_keys.numel() - 1)
    return torch.where(sorted_keys[pos] == q, order[pos], -1)


def parent_coords(coords: torch.Tensor) -> torch.Tensor:
    """Coarse voxel containing each fine voxel for a stride-2 downsample.

    Both downsamples of the encoder (k2 s2 p0 and k3 s2 p1) include input ``x`` in output
    ``x // 2`` (``x = 2q + r`` with ``r = 0`` or ``1``).
    """
    parent = coords.clone()
    parent[:, 1:] = torch.div(coords[:, 1:], 2, rounding_mode="floor")
    return parent


@dataclass
class LayerRecord:
    """What one encoder layer did."""

    name: str
    in_voxels: int
    out_voxels: int
    in_stride: tuple[int, ...]
    out_stride: tuple[int, ...]
    forward_s: float
    out_feats: torch.Tensor
    in_feats: torch.Tensor
    weight: torch.Tensor


def build_encoder() -> list[tuple[str, torch.nn.Module]]:
    return [
        ("SubmConv3d(3, 16, 3)", tl.nn.SubmConv3d(3, 16, 3)),
        ("Conv3d(16, 32, k=2, s=2)", tl.nn.Conv3d(16, 32, kernel_size=2, stride=2)),
        ("SubmConv3d(32, 32, 3)", tl.nn.SubmConv3d(32, 32, 3)),
        ("Conv3d(32, 64, k=3, s=2, p=1)", tl.nn.Conv3d(32, 64, kernel_size=3, stride=2, padding=1)),
    ]


def run_encoder(
    x: tl.SparseTensor, encoder: list[tuple[str, torch.nn.Module]]
) -> tuple[list[tl.SparseTensor], list[LayerRecord]]:
    """Runs every layer followed by a ReLU, timing each one."""
    outputs, records = [], []
    for name, layer in encoder:
        start = time.perf_counter()
        y = layer(x)
        y = y.replace(feats=torch.relu(y.feats))
        elapsed = time.perf_counter() - start
        records.append(
            LayerRecord(
                name=name,
                in_voxels=x.coords.shape[0],
                out_voxels=y.coords.shape[0],
                in_stride=tuple(x.stride),
                out_stride=tuple(y.stride),
                forward_s=elapsed,
                out_feats=y.feats,
                in_feats=x.feats,
                weight=layer.weight,
            )
        )
        outputs.append(y)
        x = y
    return outputs, records


def warm_up(encoder: list[tuple[str, torch.nn.Module]]) -> float:
    """Runs forward and backward once on a 2x2x2 cube and returns the wall time.

    The first call of any torch custom op pays one-time set-up in torch itself (it imports
    ``torch._dynamo``, about a second); doing that here keeps it out of the layer timings.
    Gradients of the warm-up are discarded.
    """
    start = time.perf_counter()
    grid = torch.stack(torch.meshgrid(*[torch.arange(2)] * 3, indexing="ij"), dim=-1)
    coords = torch.cat([torch.zeros(8, 1, dtype=torch.int64), grid.reshape(8, 3)], dim=1)
    outputs, _ = run_encoder(tl.SparseTensor(torch.ones(8, 3), coords.int()), encoder)
    outputs[-1].feats.sum().backward()
    for _, layer in encoder:
        layer.zero_grad(set_to_none=True)
    return time.perf_counter() - start


def timestamp_hook(store: dict[str, float], key: str) -> Callable[[torch.Tensor], None]:
    """A tensor hook that records when the tensor's gradient is complete."""

    def hook(_grad: torch.Tensor) -> None:
        store[key] = time.perf_counter()

    return hook


def fmt_stride(stride: tuple[int, ...]) -> str:
    return str(stride[0]) if len(set(stride)) == 1 else "x".join(map(str, stride))


def class_shares(labels: torch.Tensor) -> str:
    counts = torch.bincount(labels[labels >= 0], minlength=NUM_CLASSES).double()
    share = 100.0 * counts / counts.sum().clamp_min(1)
    return "  ".join(f"{name} {s:4.1f}%" for name, s in zip(LIDAR_CLASSES, share, strict=True))


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__.splitlines()[0],
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    parser.add_argument("--seed", type=int, default=0, help="seed of the first scan and model")
    parser.add_argument("--voxel-size", type=float, default=0.1, help="voxel edge in metres")
    parser.add_argument(
        "--threads", type=int, default=None, help="torch CPU threads (None: torch's default)"
    )
    args = parser.parse_args()
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    t_total = time.perf_counter()

    print("Torch Lattice demo: sparse encoder on two synthetic LiDAR scans")
    print(
        f"torch {torch.__version__}, {torch.get_num_threads()} threads, seed {args.seed}, "
        f"voxel size {args.voxel_size:g} m\n"
    )

    # --- data ---------------------------------------------------------------------------
    t0 = time.perf_counter()
    seeds = [args.seed, args.seed + 1]
    batch = make_batch(seeds, args.voxel_size)
    t_data = time.perf_counter() - t0
    print(f"{'scan':>4} {'seed':>5} {'points':>9} {'voxels':>9} {'pts/vox':>8}   voxel labels")
    start = 0
    for b, seed in enumerate(seeds):
        n_pts, n_vox = batch.points_per_scan[b], batch.voxels_per_scan[b]
        labels = batch.labels[start : start + n_vox]
        start += n_vox
        print(
            f"{b:>4} {seed:>5} {n_pts:>9,} {n_vox:>9,} {n_pts / n_vox:>8.2f}   "
            f"{class_shares(labels)}"
        )
    print(f"simulate + voxelize: {t_data:.2f} s")

    # --- forward ------------------------------------------------------------------------
    encoder = build_encoder()
    heads = (torch.nn.Linear(32, NUM_CLASSES), torch.nn.Linear(64, NUM_CLASSES))
    t_warm = warm_up(encoder)
    x = tl.SparseTensor(batch.feats, batch.coords)

    t0 = time.perf_counter()
    outputs, records = run_encoder(x, encoder)
    encoder_fwd = time.perf_counter() - t0
    x2, x4 = outputs[2], outputs[3]
    # Targets: the majority label of the points in each stride-2 voxel. A fine voxel can
    # lack a parent when it sits on the last row of an odd-sized range (the dense-conv
    # floor in R_out); its points are then ignored.
    fine_to_coarse = row_index(x2.coords, parent_coords(batch.coords))
    labels2 = majority(fine_to_coarse[batch.point_voxel], batch.point_labels, x2.coords.shape[0])
    parent = row_index(x4.coords, parent_coords(x2.coords))
    if bool((parent < 0).any()):
        raise RuntimeError("a stride-2 voxel has no stride-4 parent: unexpected Conv3d support")

    t0 = time.perf_counter()
    logits = heads[0](x2.feats) + heads[1](x4.feats)[parent]
    loss = torch.nn.functional.cross_entropy(logits, labels2, ignore_index=IGNORE)
    head_fwd = time.perf_counter() - t0
    fwd_total = encoder_fwd + head_fwd

    # --- backward -----------------------------------------------------------------------
    marks: dict[str, float] = {}
    for i, rec in enumerate(records):
        rec.out_feats.register_hook(timestamp_hook(marks, f"{i}.out"))
        if rec.in_feats.requires_grad:
            rec.in_feats.register_hook(timestamp_hook(marks, f"{i}.in"))
    t0 = time.perf_counter()
    loss.backward()
    t_bwd_end = time.perf_counter()
    bwd_total = t_bwd_end - t0
    head_bwd = marks[f"{len(records) - 1}.out"] - t0

    # --- report -------------------------------------------------------------------------
    print(f"one-time warm-up (first custom-op call, tiny input): {t_warm:.2f} s\n")
    print("forward times include building each layer's kernel map")
    print(
        f"{'layer (+ ReLU)':<30} {'in vox':>9} {'out vox':>9} {'stride':>7} "
        f"{'fwd ms':>8} {'bwd ms':>8} {'|grad W|':>10}"
    )
    for i, rec in enumerate(records):
        bwd = marks.get(f"{i}.in", t_bwd_end) - marks[f"{i}.out"]
        stride = f"{fmt_stride(rec.in_stride)}->{fmt_stride(rec.out_stride)}"
        print(
            f"{rec.name:<30} {rec.in_voxels:>9,} {rec.out_voxels:>9,} {stride:>7} "
            f"{1e3 * rec.forward_s:>8.1f} {1e3 * bwd:>8.1f} {rec.weight.grad.norm():>10.4f}"
        )
    head_grad = torch.cat([h.weight.grad.flatten() for h in heads]).norm()
    print(
        f"{'head Linear(32+64, 5) + loss':<30} {x2.coords.shape[0]:>9,} "
        f"{x2.coords.shape[0]:>9,} {fmt_stride(x2.stride):>7} "
        f"{1e3 * head_fwd:>8.1f} {1e3 * head_bwd:>8.1f} {head_grad:>10.4f}"
    )
    valid = labels2 != IGNORE
    accuracy = (logits.argmax(1)[valid] == labels2[valid]).double().mean()
    print(
        f"\nloss (cross-entropy over {int(valid.sum()):,} stride-2 voxels, "
        f"{NUM_CLASSES} classes): {loss.item():.4f}   accuracy at init: {100 * accuracy:.1f}%"
    )
    print(f"stride-2 labels: {class_shares(labels2)}")
    print(
        f"forward {1e3 * fwd_total:.0f} ms, backward {1e3 * bwd_total:.0f} ms, "
        f"total wall time {time.perf_counter() - t_total:.1f} s"
    )


if __name__ == "__main__":
    main()
