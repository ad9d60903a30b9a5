"""One-shot conversion of a legacy checkpoint file (what ``convert-checkpoint`` runs)."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from torch_lattice.migration.convert import ConversionResult, convert_state_dict
from torch_lattice.migration.errors import ConversionError
from torch_lattice.migration.kernel_spec import load_kernel_spec, parse_kernel_spec
from torch_lattice.migration.loading import read_legacy_checkpoint
from torch_lattice.migration.manifest import MANIFEST_SCHEMA, build_manifest, manifest_text
from torch_lattice.migration.writing import check_output_paths, write_outputs
from torch_lattice.regular_file import names_a_folder, nul_byte_error

__all__ = ["CheckpointConversion", "convert_checkpoint", "default_manifest_path"]


@dataclass(frozen=True)
class CheckpointConversion:
    """Where a conversion wrote and what it did.

    Attributes:
        output: the safetensors file.
        manifest_path: the manifest JSON file.
        manifest: the manifest as written.
        result: converted tensors and per-kernel records.
    """

    output: Path
    manifest_path: Path
    manifest: dict[str, Any]
    result: ConversionResult


def default_manifest_path(output: str | Path) -> Path:
    """``OUTPUT`` with its suffix replaced by ``.json`` (the published default)."""
    return Path(output).with_suffix(".json")


def convert_checkpoint(
    source: str | Path,
    output: str | Path,
    kernel_spec: str | Path | Mapping[str, Any],
    *,
    manifest: str | Path | None = None,
    force: bool = False,
) -> CheckpointConversion:
    """Converts a legacy TorchSparse checkpoint to safetensors plus a manifest.

    Every check runs before anything is written; the outputs are then written
    atomically.

    Args:
        source: legacy checkpoint (bare state dict, ``{"model": sd}`` or
            ``{"state_dict": sd}``), read with ``weights_only=True``.
        output: safetensors file to write.
        kernel_spec: path of a kernel-spec JSON file, or the decoded mapping.
        manifest: manifest path; default ``output`` with a ``.json`` suffix.
        force: replace existing outputs (regular files only; a bool).

    Raises:
        TypeError: an argument of the wrong type (``force`` not a bool, a path that is
            not a str or os.PathLike, a ``kernel_spec`` neither a path nor a mapping).
        ConversionError: any refused input (spec, optimizer state, unsafe pickle,
            existing output without ``force``, ...). Nothing is written then.
    """
    if not isinstance(force, bool):
        raise TypeError(f"force must be a bool (True or False), got {force!r}")
    if not isinstance(kernel_spec, (str, os.PathLike, Mapping)):
        raise TypeError("kernel_spec must be a path (str or os.PathLike) or a mapping of "
                        f"'<module>.kernel' keys to sizes, got {type(kernel_spec).__name__}")
    paths = [("source", source), ("output", output), ("manifest", manifest)]
    if not isinstance(kernel_spec, Mapping):
        paths.append(("kernel_spec", kernel_spec))
    for name, value in paths:
        if value is None and name == "manifest":
            continue
        if not isinstance(value, (str, os.PathLike)):
            raise TypeError(f"{name} must be a path (str or os.PathLike), got {value!r}")
        if (nul := nul_byte_error(value, name)) is not None:
            raise ConversionError(nul)
    for name, value in (("output", output), ("manifest", manifest)):
        text = "" if value is None else os.fsdecode(os.fspath(value))
        if value is not None and not text:
            raise ConversionError(f"{name} is an empty path; name the file to write")
        if names_a_folder(text):  # Path() would turn "out/" into a file "out"
            raise ConversionError(f"{name} {text!r} ends with a path separator, so it names "
                                  "a folder; name the file to write")
    source_path, output_path = Path(source), Path(output)
    manifest_path = Path(manifest) if manifest is not None else default_manifest_path(output)
    if isinstance(kernel_spec, (str, os.PathLike)):
        specs = load_kernel_spec(kernel_spec)
    else:
        specs = parse_kernel_spec(kernel_spec)
    spec_inputs = []
    if isinstance(kernel_spec, (str, os.PathLike)):
        spec_inputs.append(("kernel spec", Path(kernel_spec)))
    check_output_paths(source_path, [output_path, manifest_path], force, spec_inputs)
    checkpoint = read_legacy_checkpoint(source_path)
    result = convert_state_dict(checkpoint.state_dict, specs)
    record = build_manifest(str(source_path), checkpoint, result)
    metadata = {
        "format": "pt",
        "converted_by": "torch_lattice.migration",
        "schema": MANIFEST_SCHEMA,
    }
    write_outputs(result.state_dict, output_path, manifest_text(record), manifest_path, metadata,
                  force=force)
    return CheckpointConversion(output_path, manifest_path, record, result)
