"""Seeded, download-free synthetic scenes for tests, examples and benchmarks.

Every generator here is a pure function of its arguments: the same seed gives the same
tensors on every run, and nothing is read from disk or the network. All work is done
with vectorised torch operations on the CPU; the only Python loops run over scene
objects (a few dozen buildings, cars and trees) or over chunks of rays, never over points.

Three scenes are provided:

- :func:`lidar_scan`: one sweep of a spinning LiDAR in a street, ray-cast analytically
  against a ground plane, buildings, poles, vehicles and trees. Its point density falls
  off with range as in a real scan.
- :func:`indoor_room`: area-uniform surface samples of a furnished room.
- :func:`height_field`: voxel coordinates of a smooth 2.5D surface, one voxel per column.

:func:`voxel_coords` quantises points into unique ``[batch, x, y, z]`` rows.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from torch_lattice.memory_budget import check_allocation

__all__ = [
    "INDOOR_CLASSES",
    "LIDAR_CLASSES",
    "SyntheticScene",
    "height_field",
    "indoor_room",
    "lidar_scan",
    "voxel_coords",
]

LIDAR_CLASSES: tuple[str, ...] = ("ground", "building", "pole", "vehicle", "vegetation")
"""Class names of :func:`lidar_scan`, indexed by label id."""

INDOOR_CLASSES: tuple[str, ...] = ("floor", "wall", "ceiling", "furniture")
"""Class names of :func:`indoor_room`, indexed by label id."""

_GROUND, _BUILDING, _POLE, _VEHICLE, _VEGETATION = range(5)
_FLOOR, _WALL, _CEILING, _FURNITURE = range(4)

# Rays are cast in chunks so that the (rays x primitives) intersection tables stay small
# (a few tens of MB) whatever the scan resolution.
_RAY_CHUNK = 16_384

# Largest coordinate that fits the int32 rows used by SparseTensor.
_INT32_MAX = 2**31 - 1


@dataclass(frozen=True)
class SyntheticScene:
    """A labelled point cloud.

    Attributes:
        points: ``(P, 3)`` float32 positions in metres, every coordinate ``>= 0``.
        labels: ``(P,)`` int64 class ids, indices into ``class_names``.
        class_names: Name of each class id.
    """

    points: torch.Tensor
    labels: torch.Tensor
    class_names: tuple[str, ...]

    @property
    def num_classes(self) -> int:
        """Number of classes, ``len(class_names)``."""
        return len(self.class_names)


# ---------------------------------------------------------------------------------------
# Small seeded helpers
# ---------------------------------------------------------------------------------------


def _uniform(g: torch.Generator, lo: float, hi: float, n: int = 1) -> torch.Tensor:
    """``(n,)`` float64 samples from ``U(lo, hi)``."""
    return lo + (hi - lo) * torch.rand(n, generator=g, dtype=torch.float64)


def _scalar(g: torch.Generator, lo: float, hi: float) -> float:
    """One Python float from ``U(lo, hi)``."""
    return float(_uniform(g, lo, hi)[0])


def _check_seed(seed: int) -> None:
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise TypeError(f"seed: expected an int, got {type(seed).__name__}")
    if not 0 <= seed < 2**64:  # torch.Generator's seeds
        raise ValueError(f"seed: must be in [0, 2^64), got {seed}")


# Peak bytes per ray of lidar_scan, per point of indoor_room and per column of height_field
# (about 800, 72 and 117 measured).
_BYTES_PER_RAY = 1024
_BYTES_PER_ROOM_POINT = 96
_BYTES_PER_COLUMN = 128

# Distances, in metres, up to which the scenes are drawn: the street's layout places an
# object every few metres up to its extent (at 1e18 a step of 40 m no longer moves x), and
# room sizes enter areas whose products must stay finite.
_MAX_METRES = 10_000.0
# The smallest room side: the face areas that weight the samples are products of two
# sides (squared inside the norm), so sides of 1e-160 m made every area 0 and sampling
# failed inside torch.multinomial; at 1 mm the smallest area is 1e-6 m^2.
_MIN_ROOM_METRES = 1e-3


def _check_positive(name: str, value: float) -> None:
    if not math.isfinite(value) or not 0 < value <= _MAX_METRES:
        raise ValueError(
            f"{name}: must be a number in (0, {_MAX_METRES:g}] (metres), got {value}"
        )


# ---------------------------------------------------------------------------------------
# LiDAR street scene
# ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Street:
    """Analytic primitives of a street scene, in the sensor-centred world frame.

    The road runs along x through the sensor; ground height is ``z = sx*x + sy*y``.

    Attributes:
        slope: ``(2,)`` ground slope ``(sx, sy)``.
        boxes: ``(B, 6)`` axis-aligned boxes ``[x0, y0, z0, x1, y1, z1]``.
        box_labels: ``(B,)`` class of each box (building or vehicle).
        cylinders: ``(C, 5)`` vertical cylinders ``[cx, cy, radius, z0, z1]``.
        cylinder_labels: ``(C,)`` class of each cylinder (pole or vegetation).
        spheres: ``(S, 4)`` spheres ``[cx, cy, cz, radius]`` (all vegetation).
    """

    slope: torch.Tensor
    boxes: torch.Tensor
    box_labels: torch.Tensor
    cylinders: torch.Tensor
    cylinder_labels: torch.Tensor
    spheres: torch.Tensor


def _ground_z(slope: torch.Tensor, x: float, y: float) -> float:
    return float(slope[0]) * x + float(slope[1]) * y


def _add_tree(
    g: torch.Generator,
    slope: torch.Tensor,
    x: float,
    y: float,
    crown: float,
    cylinders: list[list[float]],
    cylinder_labels: list[int],
    spheres: list[list[float]],
) -> None:
    """Appends a tree (trunk cylinder + crown sphere of radius ``crown``) at ``(x, y)``."""
    base = _ground_z(slope, x, y)
    trunk = _scalar(g, 1.8, 3.5)
    cylinders.append([x, y, _scalar(g, 0.1, 0.25), base - 0.5, base + trunk])
    cylinder_labels.append(_VEGETATION)
    spheres.append([x, y, base + trunk + 0.7 * crown, crown])


def _street_layout(g: torch.Generator, extent: float) -> _Street:
    """Draws a random street of half-length ``extent`` around the sensor."""
    slope = _uniform(g, -0.015, 0.015, 2)
    road = _scalar(g, 3.5, 6.0)  # half-width of the carriageway
    curb = road + _scalar(g, 2.0, 4.5)  # building line
    boxes: list[list[float]] = []
    box_labels: list[int] = []
    cylinders: list[list[float]] = []
    cylinder_labels: list[int] = []
    spheres: list[list[float]] = []

    for side in (-1.0, 1.0):
        # Buildings: a front row of blocks with gaps (side streets, driveways, open
        # lots) and a taller back row that catches the near-horizontal beams.
        for near, far, tallest, built in ((0.0, 12.0, 25.0, 0.65), (25.0, 45.0, 35.0, 0.7)):
            x = -extent - _scalar(g, 0.0, 10.0)
            while x < extent:
                length = _scalar(g, 8.0, 28.0)
                depth = _scalar(g, 8.0, 16.0)
                height = _scalar(g, 5.0, tallest)
                setback = curb + _scalar(g, near, far)
                y0, y1 = sorted((side * setback, side * (setback + depth)))
                base = _ground_z(slope, x + length / 2, side * setback) - 1.0
                if _scalar(g, 0.0, 1.0) < built:
                    boxes.append([x, y0, base, x + length, y1, base + 1.0 + height])
                    box_labels.append(_BUILDING)
                x += length + _scalar(g, 1.0, 12.0)

        # Poles (street lights, signs) just outside the carriageway.
        x = -extent + _scalar(g, 0.0, 12.0)
        while x < extent:
            y = side * (road + _scalar(g, 0.3, 0.8))
            base = _ground_z(slope, x, y) - 0.5
            radius = _scalar(g, 0.07, 0.2)
            cylinders.append([x, y, radius, base, base + 0.5 + _scalar(g, 3.5, 9.0)])
            cylinder_labels.append(_POLE)
            x += _scalar(g, 10.0, 25.0)

        # Trees (trunk + crown) and bushes on the pavement, and groves further out.
        x = -extent + _scalar(g, 0.0, 10.0)
        while x < extent:
            y = side * _scalar(g, road + 1.0, curb - 0.5)
            if _scalar(g, 0.0, 1.0) < 0.6:
                crown = _scalar(g, 1.2, min(3.0, curb - road))
                _add_tree(g, slope, x, y, crown, cylinders, cylinder_labels, spheres)
            else:
                radius = _scalar(g, 0.5, 1.3)
                spheres.append([x, y, _ground_z(slope, x, y) + 0.4 * radius, radius])
            x += _scalar(g, 6.0, 20.0)
        for _ in range(int(torch.randint(2, 6, (1,), generator=g))):
            x = _scalar(g, -extent, extent)
            y = side * _scalar(g, curb + 12.0, curb + 30.0)
            for _ in range(int(torch.randint(3, 9, (1,), generator=g))):
                crown = _scalar(g, 1.5, 4.0)
                tx, ty = x + _scalar(g, -8.0, 8.0), y + _scalar(g, -5.0, 5.0)
                _add_tree(g, slope, tx, ty, crown, cylinders, cylinder_labels, spheres)

        # Vehicles: driving in the lane or parked at the curb.
        x = -extent + _scalar(g, 0.0, 15.0)
        while x < extent:
            length, width = _scalar(g, 3.8, 5.2), _scalar(g, 1.7, 2.0)
            driving = _scalar(g, 0.0, 1.0) < 0.5
            lane = road / 2 if driving else road - width / 2 - 0.2
            y = side * lane
            base = _ground_z(slope, x + length / 2, y) + 0.25
            height = _scalar(g, 1.2, 1.8)
            # Keep the sensor's own surroundings clear: a car right beside it would
            # shadow half of the sweep and make scans very different from one another.
            if abs(x + length / 2) > 7.0:
                boxes.append([x, y - width / 2, base, x + length, y + width / 2, base + height])
                box_labels.append(_VEHICLE)
            x += length + _scalar(g, 4.0, 30.0)

    def table(rows: list[list[float]], width: int) -> torch.Tensor:
        return torch.tensor(rows, dtype=torch.float64).reshape(-1, width)

    return _Street(
        slope=slope,
        boxes=table(boxes, 6),
        box_labels=torch.tensor(box_labels, dtype=torch.int64),
        cylinders=table(cylinders, 5),
        cylinder_labels=torch.tensor(cylinder_labels, dtype=torch.int64),
        spheres=table(spheres, 4),
    )


def _hit_plane(o: torch.Tensor, d: torch.Tensor, slope: torch.Tensor) -> torch.Tensor:
    """Distance along each ray to the plane ``z = sx*x + sy*y``.

    Args:
        o: ``(3,)`` ray origin.
        d: ``(R, 3)`` unit ray directions.
        slope: ``(2,)`` plane slope ``(sx, sy)``.

    Returns:
        ``(R, 1)`` distances, ``inf`` where the ray does not hit the plane ahead.
    """
    normal = torch.stack([-slope[0], -slope[1], torch.ones_like(slope[0])])
    denom = d @ normal
    t = -(o @ normal) / denom
    hit = (denom < 0) & (t > 0)
    return torch.where(hit, t, torch.inf).unsqueeze(1)


def _hit_boxes(o: torch.Tensor, d: torch.Tensor, boxes: torch.Tensor) -> torch.Tensor:
    """Slab-method ray/box intersection.

    Args:
        o: ``(3,)`` ray origin, outside every box.
        d: ``(R, 3)`` unit ray directions.
        boxes: ``(B, 6)`` boxes ``[x0, y0, z0, x1, y1, z1]``.

    Returns:
        ``(R, B)`` entry distances, ``inf`` where the ray misses.
    """
    # Axis-parallel components get a tiny stand-in so that 1/d stays finite; the slab
    # test then still gives the right answer for rays parallel to a face.
    safe = torch.where(d.abs() < 1e-12, torch.full_like(d, 1e-12), d)
    inv = (1.0 / safe).unsqueeze(1)  # (R, 1, 3)
    t0 = (boxes[:, :3] - o) * inv  # (R, B, 3)
    t1 = (boxes[:, 3:] - o) * inv
    near = torch.minimum(t0, t1).amax(dim=2)
    far = torch.maximum(t0, t1).amin(dim=2)
    hit = (near <= far) & (near > 0)
    return torch.where(hit, near, torch.inf)


def _hit_cylinders(o: torch.Tensor, d: torch.Tensor, cyl: torch.Tensor) -> torch.Tensor:
    """Ray intersection with the side of finite vertical cylinders.

    Args:
        o: ``(3,)`` ray origin, outside every cylinder.
        d: ``(R, 3)`` unit ray directions.
        cyl: ``(C, 5)`` cylinders ``[cx, cy, radius, z0, z1]``.

    Returns:
        ``(R, C)`` entry distances, ``inf`` where the ray misses.
    """
    fx = o[0] - cyl[:, 0]
    fy = o[1] - cyl[:, 1]
    dx, dy, dz = d[:, 0:1], d[:, 1:2], d[:, 2:3]
    a = (dx * dx + dy * dy).clamp_min(1e-12)
    b = 2.0 * (dx * fx + dy * fy)
    c = fx * fx + fy * fy - cyl[:, 2] ** 2
    disc = b * b - 4.0 * a * c
    t = (-b - disc.clamp_min(0).sqrt()) / (2.0 * a)
    z = o[2] + t * dz
    hit = (disc >= 0) & (t > 0) & (z >= cyl[:, 3]) & (z <= cyl[:, 4])
    return torch.where(hit, t, torch.inf)


def _hit_spheres(o: torch.Tensor, d: torch.Tensor, spheres: torch.Tensor) -> torch.Tensor:
    """Ray/sphere intersection.

    Args:
        o: ``(3,)`` ray origin, outside every sphere.
        d: ``(R, 3)`` unit ray directions.
        spheres: ``(S, 4)`` spheres ``[cx, cy, cz, radius]``.

    Returns:
        ``(R, S)`` entry distances, ``inf`` where the ray misses.
    """
    f = o - spheres[:, :3]  # (S, 3)
    b = 2.0 * (d @ f.T)  # (R, S)
    c = (f * f).sum(dim=1) - spheres[:, 3] ** 2
    disc = b * b - 4.0 * c
    t = (-b - disc.clamp_min(0).sqrt()) / 2.0
    hit = (disc >= 0) & (t > 0)
    return torch.where(hit, t, torch.inf)


def _cast(o: torch.Tensor, d: torch.Tensor, street: _Street) -> tuple[torch.Tensor, torch.Tensor]:
    """First hit of every ray against every primitive of ``street``.

    Args:
        o: ``(3,)`` float64 ray origin.
        d: ``(R, 3)`` float64 unit ray directions.
        street: The scene.

    Returns:
        ``(R,)`` float64 hit distances (``inf`` for no hit) and ``(R,)`` int64 labels.
    """
    labels = torch.cat(
        [
            torch.tensor([_GROUND]),
            street.box_labels,
            street.cylinder_labels,
            torch.full((street.spheres.shape[0],), _VEGETATION),
        ]
    )
    dists, ids = [], []
    for chunk in torch.split(d, _RAY_CHUNK):
        t = torch.cat(
            [
                _hit_plane(o, chunk, street.slope),
                _hit_boxes(o, chunk, street.boxes),
                _hit_cylinders(o, chunk, street.cylinders),
                _hit_spheres(o, chunk, street.spheres),
            ],
            dim=1,
        )
        best, idx = t.min(dim=1)
        dists.append(best)
        ids.append(labels[idx])
    return torch.cat(dists), torch.cat(ids)


def _beam_directions(g: torch.Generator, num_beams: int, points_per_beam: int) -> torch.Tensor:
    """``(num_beams * points_per_beam, 3)`` float64 unit directions of one sweep.

    Elevations span +2 to -24.8 degrees with a little per-beam calibration jitter;
    azimuths are uniform with a per-beam phase offset.
    """
    # Like a 64-beam automotive sensor: the upper half of the beams is packed into the
    # 10 degrees below the horizon, the lower half spreads over the next 15.
    upper = num_beams // 2
    elevation = torch.cat(
        [
            torch.linspace(2.0, -8.33, upper, dtype=torch.float64),
            torch.linspace(-8.83, -24.8, num_beams - upper, dtype=torch.float64),
        ]
    )
    elevation = elevation + 0.05 * torch.randn(num_beams, generator=g, dtype=torch.float64)
    elevation = torch.deg2rad(elevation).unsqueeze(1)
    step = 2.0 * math.pi / points_per_beam
    phase = step * torch.rand(num_beams, 1, generator=g, dtype=torch.float64)
    azimuth = phase + step * torch.arange(points_per_beam, dtype=torch.float64)
    cos_el = torch.cos(elevation)
    d = torch.stack(
        [
            cos_el * torch.cos(azimuth),
            cos_el * torch.sin(azimuth),
            torch.sin(elevation).expand_as(azimuth),
        ],
        dim=-1,
    )
    return d.reshape(-1, 3)


def lidar_scan(
    seed: int = 0,
    *,
    extent: float = 80.0,
    num_beams: int = 64,
    points_per_beam: int = 2048,
    sensor_height: float = 1.8,
) -> SyntheticScene:
    """Simulates one sweep of a spinning LiDAR on a street.

    A random street (road along x, buildings along both sides, poles, parked and
    driving vehicles, trees and bushes, a gently sloped and slightly bumpy ground) is
    ray-cast analytically with ``num_beams * points_per_beam`` rays from a sensor at
    ``sensor_height`` above the road. Each return gets range noise, vegetation returns
    scatter into the crown, and returns drop out more often at long range. Because rays
    spread out with distance, point density falls off roughly with the square of the
    range, as in a real scan.

    The sensor sits at ``(extent, extent, z_s)`` in the returned frame: points are
    shifted by ``+extent`` in x and y (only returns within ``extent`` metres
    horizontally are kept, so x and y are in ``[0, 2*extent]``) and by a per-scan
    amount in z that puts the lowest point at 0.

    With the defaults a scan has about 100k points and gives roughly 50k to 200k unique
    voxels at 0.1 m.

    Args:
        seed: Seed of the scene layout and of the sensor noise.
        extent: Maximum horizontal range in metres; also the half-length of the street.
        num_beams: Number of laser beams (rows of the range image).
        points_per_beam: Rays per beam per revolution (columns of the range image).
        sensor_height: Height of the sensor above the road, in metres.

    Returns:
        A :class:`SyntheticScene` with ``points`` ``(P, 3)`` float32 and ``labels``
        ``(P,)`` int64 in ``LIDAR_CLASSES``: 0 ground, 1 building, 2 pole, 3 vehicle,
        4 vegetation.

    Raises:
        TypeError: If ``seed`` is not an int.
        ValueError: If a size or distance is not positive.
    """
    _check_seed(seed)
    _check_positive("extent", extent)
    _check_positive("sensor_height", sensor_height)
    for name, value in (("num_beams", num_beams), ("points_per_beam", points_per_beam)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name}: must be an int >= 1, got {value!r}")
    check_allocation(f"lidar_scan of {num_beams} x {points_per_beam} rays",
                     num_beams * points_per_beam * _BYTES_PER_RAY)

    g = torch.Generator().manual_seed(seed)
    street = _street_layout(g, extent)
    origin = torch.tensor([0.0, 0.0, sensor_height], dtype=torch.float64)
    dirs = _beam_directions(g, num_beams, points_per_beam)
    t, labels = _cast(origin, dirs, street)

    hit = torch.isfinite(t)
    t, labels, dirs = t[hit], labels[hit], dirs[hit]
    n = t.shape[0]
    # Range noise of a few centimetres; vegetation returns come from inside the crown.
    t = t + 0.02 * torch.randn(n, generator=g, dtype=torch.float64)
    veg = labels == _VEGETATION
    t = t + veg * 0.35 * torch.rand(n, generator=g, dtype=torch.float64)
    points = origin + t.unsqueeze(1) * dirs
    jitter = 0.06 * torch.randn(n, 3, generator=g, dtype=torch.float64)
    points = points + veg.unsqueeze(1) * jitter
    # Small bumps on the ground (asphalt, kerbs, potholes).
    ground = labels == _GROUND
    x, y = points[:, 0], points[:, 1]
    phase = 2.0 * math.pi * torch.rand(2, generator=g, dtype=torch.float64)
    bumps = 0.04 * torch.sin(x / 3.1 + phase[0]) * torch.cos(y / 2.3 + phase[1])
    bumps = bumps + 0.01 * torch.randn(n, generator=g, dtype=torch.float64)
    points[:, 2] += ground * bumps

    # Drop-outs: dark or grazing surfaces return less often far away.
    horizontal = torch.hypot(points[:, 0], points[:, 1])
    keep_prob = 0.97 - 0.3 * (horizontal / extent).clamp(max=1.0) ** 2
    keep = (torch.rand(n, generator=g, dtype=torch.float64) < keep_prob) & (horizontal <= extent)
    points, labels = points[keep], labels[keep]

    shift = torch.tensor([extent, extent, 0.0], dtype=torch.float64)
    if points.shape[0] > 0:
        shift[2] = -points[:, 2].min()
    points = (points + shift).clamp_min(0.0).to(torch.float32)
    return SyntheticScene(points=points, labels=labels, class_names=LIDAR_CLASSES)


# ---------------------------------------------------------------------------------------
# Indoor room
# ---------------------------------------------------------------------------------------


def _box_faces(lo: list[float], hi: list[float]) -> list[list[list[float]]]:
    """The five visible faces (top and four sides) of a box on the floor.

    Returns:
        Five ``[origin, u, v]`` parallelograms, each a list of three 3-vectors.
    """
    (x0, y0, z0), (x1, y1, z1) = lo, hi
    dx, dy, dz = x1 - x0, y1 - y0, z1 - z0
    return [
        [[x0, y0, z1], [dx, 0, 0], [0, dy, 0]],  # top
        [[x0, y0, z0], [dx, 0, 0], [0, 0, dz]],  # -y side
        [[x0, y1, z0], [dx, 0, 0], [0, 0, dz]],  # +y side
        [[x0, y0, z0], [0, dy, 0], [0, 0, dz]],  # -x side
        [[x1, y0, z0], [0, dy, 0], [0, 0, dz]],  # +x side
    ]


def _furniture(g: torch.Generator, size: tuple[float, float, float]) -> list[list[list[float]]]:
    """Faces of 3 to 6 random cabinets and tables (a table is a top and four legs)."""
    sx, sy, sz = size
    faces: list[list[list[float]]] = []
    count = int(torch.randint(3, 7, (1,), generator=g))
    for _ in range(count):
        w = _scalar(g, 0.15, 0.35) * sx
        d = _scalar(g, 0.15, 0.35) * sy
        x0 = _scalar(g, 0.0, sx - w)
        y0 = _scalar(g, 0.0, sy - d)
        if _scalar(g, 0.0, 1.0) < 0.5:  # cabinet / box
            h = _scalar(g, 0.4, 0.7) * sz
            faces += _box_faces([x0, y0, 0.0], [x0 + w, y0 + d, h])
            continue
        h = min(_scalar(g, 0.7, 0.78), 0.9 * sz)  # table
        faces += _box_faces([x0, y0, h - 0.04], [x0 + w, y0 + d, h])
        leg = 0.05
        for lx in (x0, x0 + w - leg):
            for ly in (y0, y0 + d - leg):
                faces += _box_faces([lx, ly, 0.0], [lx + leg, ly + leg, h - 0.04])
    return faces


def indoor_room(
    seed: int = 0,
    *,
    size: tuple[float, float, float] = (8.0, 6.0, 3.0),
    points: int = 300_000,
) -> SyntheticScene:
    """Samples the surfaces of a furnished box-shaped room.

    Points are spread uniformly by area over the floor, the four walls, the ceiling and
    the visible faces of 3 to 6 cabinets and tables, then jittered by 5 mm and clamped
    into the room. The room spans ``[0, size]`` on every axis.

    Args:
        seed: Seed of the furniture layout and of the samples.
        size: Room extent ``(x, y, z)`` in metres, each in [0.001, 10000].
        points: Number of points to draw.

    Returns:
        A :class:`SyntheticScene` with ``points`` ``(points, 3)`` float32 and ``labels``
        ``(points,)`` int64 in ``INDOOR_CLASSES``: 0 floor, 1 wall, 2 ceiling,
        3 furniture.

    Raises:
        TypeError: If ``seed`` is not an int.
        ValueError: If a ``size`` entry is outside [0.001, 10000] metres or ``points < 1``.
    """
    _check_seed(seed)
    if len(size) != 3:
        raise ValueError(f"size: expected 3 values (x, y, z), got {size!r}")
    for axis, value in zip("xyz", size, strict=True):
        _check_positive(f"size[{axis}]", float(value))
        if float(value) < _MIN_ROOM_METRES:
            raise ValueError(
                f"size[{axis}]: must be a number in [{_MIN_ROOM_METRES:g}, {_MAX_METRES:g}] "
                f"(metres), got {float(value)}"
            )
    if isinstance(points, bool) or not isinstance(points, int) or points < 1:
        raise ValueError(f"points: must be an int >= 1, got {points!r}")
    check_allocation(f"indoor_room of {points} points", points * _BYTES_PER_ROOM_POINT)

    g = torch.Generator().manual_seed(seed)
    sx, sy, sz = (float(v) for v in size)
    shell = [
        ([[0, 0, 0], [sx, 0, 0], [0, sy, 0]], _FLOOR),
        ([[0, 0, sz], [sx, 0, 0], [0, sy, 0]], _CEILING),
        ([[0, 0, 0], [sx, 0, 0], [0, 0, sz]], _WALL),
        ([[0, sy, 0], [sx, 0, 0], [0, 0, sz]], _WALL),
        ([[0, 0, 0], [0, sy, 0], [0, 0, sz]], _WALL),
        ([[sx, 0, 0], [0, sy, 0], [0, 0, sz]], _WALL),
    ]
    furniture = _furniture(g, (sx, sy, sz))
    faces = torch.tensor(
        [f for f, _ in shell] + furniture, dtype=torch.float64
    )  # (F, 3, 3): origin, u, v
    face_labels = torch.tensor(
        [c for _, c in shell] + [_FURNITURE] * len(furniture), dtype=torch.int64
    )

    area = torch.linalg.cross(faces[:, 1], faces[:, 2]).norm(dim=1)
    face = torch.multinomial(area, points, replacement=True, generator=g)
    st = torch.rand(points, 2, 1, generator=g, dtype=torch.float64)
    chosen = faces[face]
    xyz = chosen[:, 0] + st[:, 0] * chosen[:, 1] + st[:, 1] * chosen[:, 2]
    xyz = xyz + 0.005 * torch.randn(points, 3, generator=g, dtype=torch.float64)
    upper = torch.tensor([sx, sy, sz], dtype=torch.float64)
    xyz = torch.minimum(xyz.clamp_min(0.0), upper).to(torch.float32)
    return SyntheticScene(points=xyz, labels=face_labels[face], class_names=INDOOR_CLASSES)


# ---------------------------------------------------------------------------------------
# Height field
# ---------------------------------------------------------------------------------------


def height_field(side: int = 300, seed: int = 0) -> torch.Tensor:
    """Voxel coordinates of a smooth random 2.5D surface.

    The height ``z(x, y)`` is a sum of four random plane waves with wavelengths between
    ``side / 3`` and ``side`` and a total amplitude near ``side / 20``, rounded to the
    grid and shifted so that its minimum is 0. Neighbouring columns rarely differ by
    more than one voxel, so the surface is (almost) 26-connected.

    Args:
        side: Number of columns along x and along y.
        seed: Seed of the wave directions, frequencies and phases.

    Returns:
        ``(side * side, 4)`` int32 rows ``[0, x, y, z]``, sorted by ``(x, y)``, one row
        per column, so rows are unique. All entries are ``>= 0``.

    Raises:
        TypeError: If ``seed`` is not an int.
        ValueError: If ``side < 1``.
    """
    _check_seed(seed)
    if isinstance(side, bool) or not isinstance(side, int) or side < 1:
        raise ValueError(f"side: must be an int >= 1, got {side!r}")
    check_allocation(f"height_field of {side} x {side} columns", side * side * _BYTES_PER_COLUMN)
    g = torch.Generator().manual_seed(seed)
    waves = 4
    freq = torch.randint(1, 4, (waves, 2), generator=g).to(torch.float64)
    sign = torch.where(torch.rand(waves, generator=g) < 0.5, -1.0, 1.0)
    freq[:, 1] *= sign.to(torch.float64)
    phase = 2.0 * math.pi * torch.rand(waves, generator=g, dtype=torch.float64)
    amp = side / 80.0 * (0.5 + torch.rand(waves, generator=g, dtype=torch.float64))

    axis = torch.arange(side, dtype=torch.float64)
    gx, gy = torch.meshgrid(axis, axis, indexing="ij")
    angle = (2.0 * math.pi / side) * (
        freq[:, 0, None, None] * gx + freq[:, 1, None, None] * gy
    ) + phase[:, None, None]
    z = (amp[:, None, None] * torch.sin(angle)).sum(dim=0)
    z = torch.round(z - z.min())
    coords = torch.stack([torch.zeros_like(gx), gx, gy, z], dim=-1).reshape(-1, 4)
    return coords.to(torch.int32)


# ---------------------------------------------------------------------------------------
# Voxelization helper
# ---------------------------------------------------------------------------------------


def voxel_coords(
    points: torch.Tensor, voxel_size: float, batch_index: int = 0
) -> tuple[torch.Tensor, torch.Tensor]:
    """Quantises points into unique voxel rows.

    Voxel ``v`` of a point ``p`` is ``floor(p / voxel_size)``. Rows come back sorted by
    ``(x, y, z)`` (the batch column is constant), matching the order of
    ``torch.unique``. This is a plain-torch helper; ``tl.voxelize`` is the library's
    version with feature reductions.

    Args:
        points: ``(P, 3)`` floating positions, every coordinate ``>= 0``.
        voxel_size: Edge length of a voxel, ``> 0``.
        batch_index: Value written into the batch column, ``>= 0``.

    Returns:
        ``coords`` ``(M, 4)`` int32 unique rows ``[batch_index, x, y, z]`` and
        ``inverse`` ``(P,)`` int64 with ``coords[inverse[i]]`` the voxel of point ``i``.

    Raises:
        TypeError: If ``points`` is not a floating tensor.
        ValueError: On a bad shape, a negative or non-finite coordinate, a non-positive
            ``voxel_size``, a negative ``batch_index`` or coordinates beyond int32.
    """
    if not isinstance(points, torch.Tensor) or not points.is_floating_point():
        raise TypeError("points: expected a floating torch.Tensor of shape (P, 3)")
    if points.dim() != 2 or points.shape[1] != 3:
        raise ValueError(f"points: expected shape (P, 3), got {tuple(points.shape)}")
    _check_positive("voxel_size", float(voxel_size))
    if isinstance(batch_index, bool) or not isinstance(batch_index, int):
        raise TypeError("batch_index: expected an int")
    if not 0 <= batch_index <= _INT32_MAX:
        raise ValueError(f"batch_index: must be in [0, 2**31 - 1], got {batch_index}")
    if not bool(torch.isfinite(points).all()):
        raise ValueError("points: every coordinate must be finite")

    device = points.device
    if points.shape[0] == 0:
        empty = torch.zeros((0, 4), dtype=torch.int32, device=device)
        return empty, torch.zeros((0,), dtype=torch.int64, device=device)
    grid = torch.floor(points.double() / float(voxel_size))
    if bool((grid < 0).any()):
        raise ValueError("points: coordinates must be >= 0 (shift the cloud first)")
    if float(grid.max()) > _INT32_MAX:
        raise ValueError("points: voxel coordinates exceed the int32 range")
    grid = grid.to(torch.int64)

    # One int64 key per point (x-major, z fastest) makes unique a fast 1-D sort; the
    # extents are at most 2**31 each, so fall back to row-unique if they cannot fit.
    ext = [int(v) + 1 for v in grid.amax(dim=0)]
    if ext[0] * ext[1] * ext[2] < 2**62:
        key = (grid[:, 0] * ext[1] + grid[:, 1]) * ext[2] + grid[:, 2]
        uniq, inverse = torch.unique(key, sorted=True, return_inverse=True)
        z = uniq % ext[2]
        y = (uniq // ext[2]) % ext[1]
        x = uniq // (ext[1] * ext[2])
        xyz = torch.stack([x, y, z], dim=1)
    else:
        xyz, inverse = torch.unique(grid, dim=0, sorted=True, return_inverse=True)
    batch = torch.full((xyz.shape[0], 1), batch_index, dtype=torch.int64, device=device)
    coords = torch.cat([batch, xyz], dim=1).to(torch.int32)
    return coords, inverse
