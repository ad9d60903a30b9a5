"""Feeding an exported artifact and comparing its outputs inside tests (no tests here).

Shared by the export tests (artifact/test_artifact_export_replay.py and
artifact/test_artifact_export_grid.py): the artifact's inputs are physical coordinates
and row counts, and its sparse outputs come back in an order that is not part of the
contract.
"""

from __future__ import annotations

import inspect
from typing import Any

import torch
from torch import nn

import torch_lattice as tl


def abi_inputs(model: nn.Module, inputs: tuple[Any, ...]) -> dict[str, torch.Tensor]:
    """The artifact's named inputs for ``inputs``: physical coordinates, row counts."""
    names = list(inspect.signature(model.forward).parameters)[: len(inputs)]
    out: dict[str, torch.Tensor] = {}
    for name, value in zip(names, inputs, strict=True):
        if isinstance(value, tl.SparseTensor):
            out[f"{name}_coords"] = physical(value)
            out[f"{name}_features"] = value.feats
            out[f"{name}_active"] = torch.tensor([len(value)], dtype=torch.int32)
        else:
            out[name] = value
            if value.is_floating_point() and value.ndim == 2 and value.shape[1] == 3:
                out[f"{name}_active"] = torch.tensor([value.shape[0]], dtype=torch.int32)
    return out


def physical(x: tl.SparseTensor) -> torch.Tensor:
    c = x.coords.clone()
    c[:, 1:] *= torch.tensor(x.stride, dtype=c.dtype)
    return c


def _order(coords: torch.Tensor) -> torch.Tensor:
    """Row permutation sorting ``coords`` lexicographically."""
    rows = [tuple(r) for r in coords.tolist()]
    return torch.tensor(sorted(range(len(rows)), key=rows.__getitem__), dtype=torch.long)


def assert_same(ref: Any, got: Any, atol: float) -> None:
    if isinstance(ref, tl.SparseTensor):
        want = physical(ref)
        i, j = _order(want), _order(got.coords)
        assert torch.equal(want[i], got.coords[j].to(want.dtype))
        assert int(got.active[0]) == len(ref)
        torch.testing.assert_close(got.features[j], ref.feats[i], atol=atol, rtol=1e-4)
    else:
        torch.testing.assert_close(got, ref, atol=atol, rtol=1e-4)
