"""How a model's own Python helpers appear in an exported artifact.

A model may wrap its layers in helpers that only relabel supports (pad the declared
range, put the output back on the input's support object). The artifact exporter
records such a helper as one call and lowers it by its role, so the exporter never
imports a model: the model marks its helpers here, with no dependency on
:mod:`torch_lattice.artifact`.

Roles:

- ``same_rows``: returns its first argument's rows, row order and features; only
  metadata the contract does not carry (the declared ``spatial_range``) may change.
  Lowered to that argument's value.
- ``relabel``: ``fn(y, x)`` returns ``y``'s features on ``x``'s support, whose rows
  are ``y``'s (checked on the example). Lowered to ``y``'s value.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

__all__ = ["EXPORT_ROLES", "export_as_relabel", "export_as_same_rows"]

F = TypeVar("F", bound=Callable[..., object])

# The marked helpers and their roles (filled when the modules defining them import).
EXPORT_ROLES: dict[Callable[..., object], str] = {}


def export_as_same_rows(fn: F) -> F:
    """Marks ``fn`` as returning its first argument's rows and features unchanged."""
    EXPORT_ROLES[fn] = "same_rows"
    return fn


def export_as_relabel(fn: F) -> F:
    """Marks ``fn(y, x)`` as returning ``y``'s features on ``x``'s (equal) rows."""
    EXPORT_ROLES[fn] = "relabel"
    return fn
