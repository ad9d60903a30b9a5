"""Benchmark scenes: voxel coordinates built from :mod:`torch_lattice.data.synthetic`.

Every scene is a pure function of its name, so two runs (or two machines) time the same
coordinates. Batched scenes stack independent scenes (different seeds) under batch
indices ``0..B-1``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from torch_lattice.data.synthetic import height_field, indoor_room, lidar_scan, voxel_coords

__all__ = ["Scene", "make_scene", "scene_names", "sweep_scene", "tiny_scene"]

# LiDAR: 64 beams x 4096 columns (about 245k returns), 5 cm voxels: ~160k voxels.
_LIDAR_COLUMNS = 4096
_LIDAR_VOXEL = 0.05
# Indoor room: 300k surface samples at 5 cm: ~110k voxels.
_INDOOR_VOXEL = 0.05


@dataclass(frozen=True)
class Scene:
    """Voxel coordinates of one benchmark input.

    Attributes:
        name: Identifier used in result tables, e.g. ``surface-300`` or ``lidar-b4``.
        coords: ``(N, 4)`` int32 unique rows ``[batch, x, y, z]``.
        description: One line for the report.
        batch: Number of batch indices in ``coords``.
    """

    name: str
    coords: torch.Tensor
    description: str
    batch: int

    @property
    def voxels(self) -> int:
        """Number of rows ``N``."""
        return int(self.coords.shape[0])


def _stack(parts: list[torch.Tensor]) -> torch.Tensor:
    rows = []
    for b, c in enumerate(parts):
        c = c.clone()
        c[:, 0] = b
        rows.append(c)
    return torch.cat(rows).contiguous()


def _surface(side: int, seed: int) -> torch.Tensor:
    return height_field(side, seed=seed)


def _lidar(seed: int) -> torch.Tensor:
    scan = lidar_scan(seed, points_per_beam=_LIDAR_COLUMNS)
    return voxel_coords(scan.points, _LIDAR_VOXEL)[0]


def _indoor(seed: int) -> torch.Tensor:
    room = indoor_room(seed)
    return voxel_coords(room.points, _INDOOR_VOXEL)[0]


_KINDS = {
    "surface": ("300x300 height field (one voxel per column)", lambda s: _surface(300, s)),
    "lidar": ("64-beam LiDAR street scan, 5 cm voxels", _lidar),
    "indoor": ("furnished room surfaces, 5 cm voxels", _indoor),
}


def scene_names() -> list[str]:
    """Names :func:`make_scene` accepts (without the ``-b4`` batch suffix)."""
    return sorted(_KINDS)


def make_scene(kind: str, batch: int = 1) -> Scene:
    """Builds ``kind`` (``surface``, ``lidar`` or ``indoor``) with ``batch`` scenes.

    Raises:
        ValueError: unknown ``kind`` or ``batch < 1``.
    """
    if kind not in _KINDS:
        raise ValueError(f"scene: unknown kind {kind!r}; choose from {scene_names()}")
    if batch < 1:
        raise ValueError(f"batch: must be >= 1, got {batch}")
    text, build = _KINDS[kind]
    coords = _stack([build(seed) for seed in range(batch)])
    name = kind if batch == 1 else f"{kind}-b{batch}"
    desc = text if batch == 1 else f"{batch} x {text}"
    return Scene(name, coords, desc, batch)


def sweep_scene(voxels: int) -> Scene:
    """A square height field with about ``voxels`` rows (for the size sweep).

    The surface keeps the same shape and neighbour density at every size, so time per
    voxel is comparable across the sweep.

    Raises:
        ValueError: ``voxels < 1``.
    """
    if voxels < 1:
        raise ValueError(f"voxels: must be >= 1, got {voxels}")
    side = max(1, round(math.sqrt(voxels)))
    coords = _surface(side, 0)
    return Scene(f"sweep-{coords.shape[0]}", coords, f"{side}x{side} height field", 1)


def tiny_scene(side: int = 24) -> Scene:
    """A very small height field for smoke runs and tests."""
    coords = _surface(side, 0)
    return Scene(f"tiny-{side}", coords, f"{side}x{side} height field", 1)
