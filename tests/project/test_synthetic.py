"""Tests for torch_lattice.data.synthetic: determinism, ranges, labels and sizes."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from torch_lattice.data import (
    INDOOR_CLASSES,
    LIDAR_CLASSES,
    SyntheticScene,
    height_field,
    indoor_room,
    lidar_scan,
    voxel_coords,
)

SEEDS = (0, 1, 2)


@pytest.fixture(scope="module")
def scans() -> dict[int, SyntheticScene]:
    return {seed: lidar_scan(seed) for seed in SEEDS}


@pytest.fixture(scope="module")
def room() -> SyntheticScene:
    return indoor_room(0)


def _assert_scene_equal(a: SyntheticScene, b: SyntheticScene) -> None:
    assert torch.equal(a.points, b.points)
    assert torch.equal(a.labels, b.labels)
    assert a.class_names == b.class_names


# ---------------------------------------------------------------------------------------
# lidar_scan
# ---------------------------------------------------------------------------------------


def test_lidar_is_deterministic_per_seed(scans: dict[int, SyntheticScene]) -> None:
    _assert_scene_equal(lidar_scan(1), scans[1])
    assert scans[0].points.shape != scans[1].points.shape or not torch.equal(
        scans[0].points, scans[1].points
    )


def test_lidar_scene_is_frozen(scans: dict[int, SyntheticScene]) -> None:
    with pytest.raises(dataclasses.FrozenInstanceError):
        scans[0].points = torch.zeros(1, 3)  # type: ignore[misc]


@pytest.mark.parametrize("seed", SEEDS)
def test_lidar_dtypes_ranges_and_labels(scans: dict[int, SyntheticScene], seed: int) -> None:
    scene = scans[seed]
    p, y = scene.points, scene.labels
    assert p.dtype == torch.float32 and p.dim() == 2 and p.shape[1] == 3
    assert y.dtype == torch.int64 and y.shape == (p.shape[0],)
    assert scene.class_names == LIDAR_CLASSES
    assert bool(torch.isfinite(p).all())
    assert float(p.min()) >= 0.0
    # The sensor sits at (extent, extent); no return is further than extent away.
    assert float(p[:, :2].max()) <= 2 * 80.0 + 1e-3
    assert set(y.unique().tolist()) == set(range(len(LIDAR_CLASSES)))


@pytest.mark.parametrize("seed", SEEDS)
def test_lidar_voxel_count_in_documented_range(scans: dict[int, SyntheticScene], seed: int) -> None:
    coords, _ = voxel_coords(scans[seed].points, 0.1)
    assert 50_000 <= coords.shape[0] <= 200_000


def test_lidar_density_falls_off_with_range(scans: dict[int, SyntheticScene]) -> None:
    """Ground points per square metre drop steeply from near to far annuli."""
    p, y = scans[0].points, scans[0].labels
    r = torch.hypot(p[:, 0] - 80.0, p[:, 1] - 80.0)[y == 0]

    def density(lo: float, hi: float) -> float:
        area = torch.pi * (hi * hi - lo * lo)
        return float(((r >= lo) & (r < hi)).sum()) / area

    near, mid, far = density(4.0, 8.0), density(10.0, 20.0), density(20.0, 40.0)
    assert near > 4 * mid > 0
    assert mid > far


def test_lidar_resolution_arguments() -> None:
    small = lidar_scan(0, num_beams=16, points_per_beam=256, extent=40.0)
    assert 0 < small.points.shape[0] <= 16 * 256
    assert float(small.points.min()) >= 0.0
    assert float(small.points[:, :2].max()) <= 80.0 + 1e-3


def test_lidar_rejects_bad_arguments() -> None:
    with pytest.raises(ValueError, match="extent"):
        lidar_scan(0, extent=0.0)
    with pytest.raises(ValueError, match="num_beams"):
        lidar_scan(0, num_beams=0)
    with pytest.raises(TypeError, match="seed"):
        lidar_scan(1.5)  # type: ignore[arg-type]


# ---------------------------------------------------------------------------------------
# indoor_room
# ---------------------------------------------------------------------------------------


def test_room_is_deterministic_per_seed(room: SyntheticScene) -> None:
    _assert_scene_equal(indoor_room(0), room)
    assert not torch.equal(indoor_room(1).points, room.points)


def test_room_ranges_and_labels(room: SyntheticScene) -> None:
    p, y = room.points, room.labels
    assert p.shape == (300_000, 3) and p.dtype == torch.float32
    assert y.shape == (300_000,) and y.dtype == torch.int64
    assert room.class_names == INDOOR_CLASSES
    assert float(p.min()) >= 0.0
    assert bool((p <= torch.tensor([8.0, 6.0, 3.0])).all())
    assert set(y.unique().tolist()) == set(range(len(INDOOR_CLASSES)))
    # Floor points lie on z = 0 and ceiling points on z = 3, up to the 5 mm jitter.
    assert float(p[y == 0, 2].max()) < 0.05
    assert float(p[y == 2, 2].min()) > 2.95


def test_room_size_and_point_count() -> None:
    scene = indoor_room(3, size=(4.0, 3.0, 2.5), points=1000)
    assert scene.points.shape == (1000, 3)
    assert bool((scene.points <= torch.tensor([4.0, 3.0, 2.5])).all())
    with pytest.raises(ValueError, match="size"):
        indoor_room(0, size=(4.0, 0.0, 2.5))


@pytest.mark.parametrize("size", [(1e-160, 1e-160, 1e-160), (10000.0, 5e-324, 5e-324),
                                  (1e-300, 1e-300, 10000.0), (4.0, 3.0, 9e-4)])
def test_room_sides_below_a_millimetre_are_refused_naming_size(size) -> None:
    """Face areas of 1e-320 m^2 underflowed to 0 and torch.multinomial raised a
    RuntimeError naming no argument; a side under 1 mm is now a ValueError naming it."""
    with pytest.raises(ValueError, match=r"size\[[xyz]\]: must be a number in \[0\.001, 10000\]"):
        indoor_room(0, size=size, points=10)


def test_a_millimetre_room_samples() -> None:
    scene = indoor_room(0, size=(1e-3, 1e-3, 1e-3), points=10)
    assert scene.points.shape == (10, 3) and bool(torch.isfinite(scene.points).all())


# ---------------------------------------------------------------------------------------
# height_field
# ---------------------------------------------------------------------------------------


def test_height_field_rows() -> None:
    coords = height_field(300, seed=0)
    assert coords.shape == (300 * 300, 4) and coords.dtype == torch.int32
    assert torch.unique(coords, dim=0).shape[0] == coords.shape[0]
    assert bool((coords[:, 0] == 0).all())
    assert int(coords.min()) >= 0
    # One voxel per (x, y) column, every column present.
    xy = coords[:, 1].long() * 300 + coords[:, 2].long()
    assert torch.equal(xy.sort().values, torch.arange(300 * 300))


def test_height_field_is_smooth_and_seeded() -> None:
    coords = height_field(120, seed=5)
    z = coords[:, 3].reshape(120, 120).long()
    assert int((z[1:] - z[:-1]).abs().max()) <= 2
    assert int((z[:, 1:] - z[:, :-1]).abs().max()) <= 2
    assert int(z.max()) > 0
    assert torch.equal(height_field(120, seed=5), coords)
    assert not torch.equal(height_field(120, seed=6), coords)


# ---------------------------------------------------------------------------------------
# voxel_coords
# ---------------------------------------------------------------------------------------


def test_voxel_coords_matches_floor_and_is_unique(room: SyntheticScene) -> None:
    coords, inverse = voxel_coords(room.points, 0.05, batch_index=3)
    assert coords.dtype == torch.int32 and inverse.dtype == torch.int64
    assert inverse.shape == (room.points.shape[0],)
    assert torch.unique(coords, dim=0).shape[0] == coords.shape[0]
    assert bool((coords[:, 0] == 3).all())
    expected = torch.floor(room.points.double() / 0.05).to(torch.int32)
    assert torch.equal(coords[inverse, 1:], expected)
    # Sorted by (x, y, z).
    key = (coords[:, 1].long() * 1000 + coords[:, 2].long()) * 1000 + coords[:, 3].long()
    assert bool((key[1:] > key[:-1]).all())


def test_voxel_coords_edge_cases() -> None:
    coords, inverse = voxel_coords(torch.zeros(0, 3), 0.1)
    assert coords.shape == (0, 4) and inverse.shape == (0,)
    pts = torch.tensor([[0.05, 0.05, 0.05], [0.09, 0.01, 0.0], [0.1, 0.0, 0.0]])
    coords, inverse = voxel_coords(pts, 0.1)
    assert coords.tolist() == [[0, 0, 0, 0], [0, 1, 0, 0]]
    assert inverse.tolist() == [0, 0, 1]
    with pytest.raises(ValueError, match="points"):
        voxel_coords(torch.tensor([[-0.5, 0.0, 0.0]]), 0.1)
    with pytest.raises(ValueError, match="voxel_size"):
        voxel_coords(pts, 0.0)
    with pytest.raises(ValueError, match="points"):
        voxel_coords(torch.zeros(4, 2), 0.1)
    with pytest.raises(TypeError, match="points"):
        voxel_coords(torch.zeros(4, 3, dtype=torch.int64), 0.1)
