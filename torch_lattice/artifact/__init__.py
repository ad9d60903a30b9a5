"""MLX Lattice artifacts (lattice-contract 0.6.0, IR version 2): schema and replay.

``schema`` holds the dialect table shared by the parser, the replay runtime and the
exporter.
"""

from torch_lattice.artifact import schema
from torch_lattice.artifact.export import save_lattice_model_artifact

__all__ = ["save_lattice_model_artifact", "schema"]
