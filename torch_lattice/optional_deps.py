"""Optional dependencies: the packages only some entry points need, and how to get them.

The core install needs torch, numpy and safetensors only. Plotting (the training demo,
the benchmark reports, the docs' figures) needs matplotlib, which comes with the
``demo``, ``benchmarks``, ``docs`` and ``test`` extras. An entry point that plots calls
:func:`require_matplotlib` before doing any work, so a missing package is reported at
once, with the command that installs it, instead of as a bare ``ModuleNotFoundError``
after a long run.
"""

from __future__ import annotations

import sys
from types import ModuleType

__all__ = ["PLOTTING_EXTRAS", "require_matplotlib"]

# The extras of pyproject.toml that carry matplotlib.
PLOTTING_EXTRAS = ("demo", "benchmarks", "docs", "test")


def require_matplotlib(extra: str, *, purpose: str = "plotting") -> ModuleType:
    """``matplotlib.pyplot``, drawing to files (Agg backend), or a clear ImportError.

    Args:
        extra: the extra of ``torch-lattice`` that provides matplotlib for the caller
            (one of :data:`PLOTTING_EXTRAS`); named in the error message.
        purpose: what needs it, for the message (for example ``"the training demo"``).

    Returns:
        The ``matplotlib.pyplot`` module. When pyplot was not imported yet the backend is
        set to Agg (no display needed); an application that already chose a backend
        keeps it, since saving figures works with any.

    Raises:
        ValueError: ``extra`` is not one of :data:`PLOTTING_EXTRAS`.
        ImportError: matplotlib is not installed; the message says
            ``pip install 'torch-lattice[<extra>]'``.
    """
    if extra not in PLOTTING_EXTRAS:
        raise ValueError(
            f"require_matplotlib: extra must be one of {', '.join(PLOTTING_EXTRAS)}; got {extra!r}"
        )
    try:
        import matplotlib
    except ImportError as e:
        raise ImportError(
            f"{purpose} needs matplotlib: pip install 'torch-lattice[{extra}]' "
            "(or pip install 'matplotlib>=3.7')"
        ) from e
    if "matplotlib.pyplot" not in sys.modules:
        matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt
