"""Synthetic, download-free data for tests, examples and benchmarks."""

from torch_lattice.data.synthetic import (
    INDOOR_CLASSES,
    LIDAR_CLASSES,
    SyntheticScene,
    height_field,
    indoor_room,
    lidar_scan,
    voxel_coords,
)

__all__ = [
    "INDOOR_CLASSES",
    "LIDAR_CLASSES",
    "SyntheticScene",
    "height_field",
    "indoor_room",
    "lidar_scan",
    "voxel_coords",
]
