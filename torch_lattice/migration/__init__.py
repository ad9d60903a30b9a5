"""Migration of legacy TorchSparse checkpoints to Torch Lattice (docs/migration.md).

Command line: ``convert-checkpoint SOURCE OUTPUT --kernel-spec SPEC.json``. Python::

    from torch_lattice import migration
    result = migration.convert_state_dict(legacy_state, {"stem.0.kernel": [3, 3, 3]})
    migration.load_state_dict_strict(model, result.state_dict)

Porting helpers: ``legacy_coords`` (legacy coordinate rows to ``[b, x, y, z]``
logical rows) and ``legacy_strided_support`` (the rows a legacy strided conv
generates), per TorchSparse version.
"""

from torch_lattice.migration.checkpoint import (
    CheckpointConversion,
    convert_checkpoint,
    default_manifest_path,
)
from torch_lattice.migration.convert import (
    ConversionResult,
    ConvertedKernel,
    convert_kernel,
    convert_state_dict,
)
from torch_lattice.migration.errors import (
    ConversionError,
    OptimizerStateError,
    StateDictMismatchError,
    UnsafeCheckpointError,
)
from torch_lattice.migration.kernel_spec import (
    KernelSpec,
    load_kernel_spec,
    parse_kernel_spec,
    row_permutation,
)
from torch_lattice.migration.legacy import (
    SUPPORTED_VERSIONS,
    legacy_coords,
    legacy_strided_support,
)
from torch_lattice.migration.loading import (
    LegacyCheckpoint,
    extract_model_state,
    load_converted,
    load_state_dict_strict,
    read_legacy_checkpoint,
)
from torch_lattice.migration.manifest import build_manifest

__all__ = [
    "SUPPORTED_VERSIONS",
    "CheckpointConversion",
    "ConversionError",
    "ConversionResult",
    "ConvertedKernel",
    "KernelSpec",
    "LegacyCheckpoint",
    "OptimizerStateError",
    "StateDictMismatchError",
    "UnsafeCheckpointError",
    "build_manifest",
    "convert_checkpoint",
    "convert_kernel",
    "convert_state_dict",
    "default_manifest_path",
    "extract_model_state",
    "legacy_coords",
    "legacy_strided_support",
    "load_converted",
    "load_kernel_spec",
    "load_state_dict_strict",
    "parse_kernel_spec",
    "read_legacy_checkpoint",
    "row_permutation",
]
