"""The conversion manifest (JSON, sorted keys).

The fields of the published torch-lattice manifest (schema
``lattice-checkpoint-conversion/v2``) are kept with their meanings, and a few are
added: ``source_sha256``, ``source_container``, ``ignored_source_keys``, per-kernel
``source_shape`` and ``kernel_positions_key``, and a ``tensors`` list recording, for
*every* output tensor, its source key, source layout and row permutation (``null``
where the tensor was copied unchanged or generated).
"""

from __future__ import annotations

import json
from typing import Any

from torch_lattice.migration.convert import ConversionResult
from torch_lattice.migration.loading import LegacyCheckpoint

__all__ = [
    "MANIFEST_SCHEMA",
    "SOURCE_LAYOUT_POLICY",
    "TARGET_ARTIFACT_WEIGHT_LAYOUT",
    "TARGET_KERNEL_LAYOUT",
    "build_manifest",
    "manifest_text",
]

MANIFEST_SCHEMA = "lattice-checkpoint-conversion/v2"
SOURCE_LAYOUT_POLICY = "torchsparse_k_i_o_volume_parity"
TARGET_KERNEL_LAYOUT = "lattice_k_i_o_z_fastest"
TARGET_ARTIFACT_WEIGHT_LAYOUT = "conv3d_o_xyz_i"


def _tensor_records(result: ConversionResult) -> list[dict[str, Any]]:
    by_target = {k.target_key: k for k in result.kernels}
    by_positions = {k.positions_key: k for k in result.kernels}
    records = []
    for key, value in result.state_dict.items():
        kernel = by_target.get(key)
        generated = by_positions.get(key)
        record: dict[str, Any] = {
            "target_key": key,
            "shape": list(value.shape),
            "dtype": str(value.dtype).removeprefix("torch."),
        }
        if kernel is not None:
            record.update(
                action="kernel",
                source_key=kernel.source_key,
                source_layout=kernel.source_layout,
                row_permutation=list(kernel.row_permutation),
            )
        elif generated is not None:
            record.update(
                action="generated_kernel_positions",
                source_key=None,
                source_layout=None,
                row_permutation=None,
            )
        else:
            record.update(
                action="unchanged", source_key=key, source_layout=None, row_permutation=None
            )
        records.append(record)
    return records


def build_manifest(
    source: str, checkpoint: LegacyCheckpoint, result: ConversionResult
) -> dict[str, Any]:
    """The manifest of one conversion.

    Args:
        source: the source checkpoint path as given.
        checkpoint: what was read (container, ignored keys, sha256).
        result: the conversion.
    """
    kernels = [
        {
            "source_key": k.source_key,
            "target_key": k.target_key,
            "kernel_size": list(k.kernel_size),
            "source_layout": k.source_layout,
            "row_permutation": list(k.row_permutation),
            "source_shape": list(k.source_shape),
            "kernel_positions_key": k.positions_key,
        }
        for k in result.kernels
    ]
    return {
        "schema": MANIFEST_SCHEMA,
        "source_checkpoint": source,
        "source_sha256": checkpoint.sha256,
        "source_container": checkpoint.container,
        "ignored_source_keys": list(checkpoint.ignored_keys),
        "source_kernel_layout_policy": SOURCE_LAYOUT_POLICY,
        "target_kernel_layout": TARGET_KERNEL_LAYOUT,
        "target_artifact_weight_layout": TARGET_ARTIFACT_WEIGHT_LAYOUT,
        "tensor_count": len(result.state_dict),
        "kernels": kernels,
        "tensors": _tensor_records(result),
    }


def manifest_text(manifest: dict[str, Any]) -> str:
    """Serialized form: 2-space indent, sorted keys, trailing newline."""
    return json.dumps(manifest, indent=2, sort_keys=True) + "\n"
