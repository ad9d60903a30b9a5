"""The dataflow names (their own module, so that the configuration and the autotuner,
which the configuration asks for a layer's choice, both import them)."""

from __future__ import annotations

import enum

__all__ = ["Dataflow"]


class Dataflow(enum.Enum):
    """Execution strategy of a sparse convolution (docs/kernel-maps.md)."""

    ImplicitGEMM = "implicit_gemm"
    FetchOnDemand = "fetch_on_demand"
    GatherScatter = "gather_scatter"
