"""The exporter's error type."""

from __future__ import annotations

__all__ = ["ExportError"]


class ExportError(ValueError):
    """A model, node or argument that cannot become an artifact (a ValueError)."""
