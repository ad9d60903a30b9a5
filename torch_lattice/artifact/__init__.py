"""MLX Lattice artifacts (lattice-contract 0.6.0, IR version 2).

- :mod:`~torch_lattice.artifact.schema`: the dialect table shared by the parser,
  the replay runtime and the exporter.
- :func:`load_lattice_program`: check an artifact directory and replay it with
  Torch Lattice kernels (``python -m torch_lattice.artifact replay DIR``).
"""

from torch_lattice.artifact import schema
from torch_lattice.artifact.export import ArtifactFiles, ExportError, save_lattice_model_artifact
from torch_lattice.artifact.program import (
    LatticeProgram,
    SparseInput,
    SparseOutput,
    load_lattice_program,
)

__all__ = [
    "ArtifactFiles",
    "ExportError",
    "LatticeProgram",
    "SparseInput",
    "SparseOutput",
    "load_lattice_program",
    "save_lattice_model_artifact",
    "schema",
]
