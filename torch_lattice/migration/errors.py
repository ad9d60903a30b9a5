"""Exceptions of the checkpoint migration workflow.

A :class:`ConversionError` means the *input* was refused (a spec problem, optimizer
state, an unsafe pickle, an existing output): the CLI prints it as one line and exits
with status 2, and nothing has been written.
"""

from __future__ import annotations

__all__ = [
    "ConversionError",
    "OptimizerStateError",
    "StateDictMismatchError",
    "UnsafeCheckpointError",
]


class ConversionError(ValueError):
    """A legacy checkpoint, kernel spec or output path was refused."""


class OptimizerStateError(ConversionError):
    """The checkpoint holds optimizer state, which this workflow does not convert."""


class UnsafeCheckpointError(ConversionError):
    """The checkpoint needs arbitrary pickle code to load, which is never run."""


class StateDictMismatchError(RuntimeError):
    """A converted state dict does not fit the destination model exactly.

    Attributes:
        missing: model keys with no value in the state dict.
        unexpected: state-dict keys the model does not have.
        mismatched: ``(key, state_shape, model_shape)`` for shape disagreements.
    """

    def __init__(
        self,
        missing: list[str],
        unexpected: list[str],
        mismatched: list[tuple[str, tuple[int, ...], tuple[int, ...]]],
    ) -> None:
        self.missing = missing
        self.unexpected = unexpected
        self.mismatched = mismatched
        parts = []
        if missing:
            parts.append(f"missing keys: {', '.join(missing)}")
        if unexpected:
            parts.append(f"unexpected keys: {', '.join(unexpected)}")
        if mismatched:
            shapes = [f"{k} (state {list(a)} vs model {list(b)})" for k, a, b in mismatched]
            parts.append(f"shape mismatches: {', '.join(shapes)}")
        super().__init__("state dict does not match the model; " + "; ".join(parts))
