"""Export is exact or refuses: a grid of forward, target, pooling and transposed layers.

Every configuration is built eagerly, exported and replayed under the consumer's
semantics (the replay reproduces the recorded MLX Lattice fixtures, see
test_mlx_runtime_fixtures.py). Each case either equals the eager layer (coordinates
exactly, features to float32 tolerance) or is refused at export with an
ExportError naming the layer; none silently differs. Kernel sizes 1-5 (odd, even,
anisotropic), strides 1-3, paddings 0-2, dilations 1-2.
"""

from __future__ import annotations

from collections.abc import Callable
from itertools import product
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

import torch_lattice as tl
from torch_lattice.artifact import ExportError, load_lattice_program, save_lattice_model_artifact

try:
    from artifact_export_helpers import abi_inputs, assert_same
except ImportError:  # tests/ may become a package; then it is imported through it
    from tests.artifact_export_helpers import abi_inputs, assert_same

KERNELS: list[tuple[int, int, int]] = [(1, 1, 1), (2, 2, 2), (3, 3, 3), (4, 4, 4), (5, 5, 5),
                                       (3, 1, 2), (2, 3, 1)]
STRIDES = [1, 2, 3]
PADDINGS = [0, 1, 2]
DILATIONS = [1, 2]
RANGE = 24  # a spatial range past every reachable output cell: no row is dropped eagerly


def points(n: int, extent: int, seed: int, stride: int = 1, channels: int = 3
           ) -> tl.SparseTensor:
    g = torch.Generator().manual_seed(seed)
    rows = torch.cat([torch.randint(0, 2, (3 * n, 1), generator=g),
                      torch.randint(0, extent, (3 * n, 3), generator=g)], dim=1)
    coords = torch.unique(rows, dim=0)[:n]
    feats = torch.randn(len(coords), channels, generator=g)
    return tl.SparseTensor(feats, coords, stride=stride, spatial_range=(2, RANGE, RANGE, RANGE))


class Layer(nn.Module):
    """``layer(x)`` or ``layer(x, coordinates=target)``."""

    def __init__(self, layer: nn.Module) -> None:
        super().__init__()
        self.layer = layer

    def forward(self, x: tl.SparseTensor, target: tl.SparseTensor | None = None
                ) -> tl.SparseTensor:
        return self.layer(x) if target is None else self.layer(x, coordinates=target)


class DownUp(nn.Module):
    """A Conv3d and the ConvTranspose3d back onto its input support."""

    def __init__(self, **geometry: Any) -> None:
        super().__init__()
        self.down = tl.nn.Conv3d(3, 4, **geometry, bias=True)
        self.up = tl.nn.ConvTranspose3d(4, 2, **geometry, bias=True)

    def forward(self, x: tl.SparseTensor) -> tl.SparseTensor:
        return self.up(self.down(x))


def outcome(tmp_path: Path, model: nn.Module, inputs: tuple[Any, ...]) -> str:
    """'eager-refuses', 'refused' or 'exact'; raises if the artifact differs from eager."""
    torch.manual_seed(0)
    for p in model.parameters():
        with torch.no_grad():
            p.uniform_(-0.5, 0.5)
    model.eval()
    try:
        with torch.no_grad():
            ref = model(*inputs)
    except ValueError:
        return "eager-refuses"  # not a layer a user can build
    art = tmp_path / "artifact"
    try:
        save_lattice_model_artifact(model, art, example_inputs=inputs)
    except ExportError as exc:
        assert "node '" in str(exc) and ("no exact artifact form" in str(exc)), str(exc)
        return "refused"
    got = load_lattice_program(art)(**abi_inputs(model, inputs))
    assert_same(ref, got["output"], atol=1e-4)
    return "exact"


def run_grid(tmp_path: Path, build: Callable[[int, int, int], tuple[nn.Module, tuple[Any, ...]]]
             ) -> dict[tuple[int, int, int], str]:
    results = {}
    for s, p, d in product(STRIDES, PADDINGS, DILATIONS):
        model, inputs = build(s, p, d)
        results[(s, p, d)] = outcome(tmp_path, model, inputs)
    return results


@pytest.mark.parametrize("k", KERNELS, ids=str)
def test_conv3d_without_target(tmp_path: Path, k: tuple[int, int, int]) -> None:
    x = points(50, 8, seed=1)
    results = run_grid(tmp_path, lambda s, p, d: (
        Layer(tl.nn.Conv3d(3, 4, k, stride=s, padding=p, dilation=d, bias=True)), (x,)))
    # padding = kernel - stride (stride 1: (kernel - 1) * dilation) regenerates the support
    must = {(2, 2, 2): [(2, 0, 1)], (3, 3, 3): [(2, 1, 1), (1, 2, 1)], (4, 4, 4): [(2, 2, 1)],
            (1, 1, 1): [(1, 0, 1), (1, 0, 2)], (5, 5, 5): [(3, 2, 1)]}
    for case in must.get(k, []):
        assert results[case] == "exact", (case, results[case])


@pytest.mark.parametrize("k", KERNELS, ids=str)
def test_target_conv3d(tmp_path: Path, k: tuple[int, int, int]) -> None:
    x = points(50, 8, seed=2)

    def build(s: int, p: int, d: int) -> tuple[nn.Module, tuple[Any, ...]]:
        target = points(30, 8 // s + 1, seed=3, stride=s, channels=1)
        return Layer(tl.nn.Conv3d(3, 4, k, stride=s, padding=p, dilation=d, bias=True)), (x, target)

    results = run_grid(tmp_path, build)
    # a target conv exports whenever the padding covers the centring of the odd axes
    for (s, p, d), result in results.items():
        need = max(((kk // 2) * d for kk in k if kk % 2), default=0)
        if p >= need:
            assert result == "exact", ((s, p, d), result)
        else:
            assert result == "refused", ((s, p, d), result)


@pytest.mark.parametrize("mode", ["max", "avg", "sum"])
@pytest.mark.parametrize("k", KERNELS, ids=str)
def test_pooling(tmp_path: Path, mode: str, k: tuple[int, int, int]) -> None:
    x = points(50, 8, seed=4)
    cls = {"max": tl.nn.MaxPool3d, "avg": tl.nn.AvgPool3d, "sum": tl.nn.SumPool3d}[mode]
    results = run_grid(tmp_path, lambda s, p, d: (Layer(cls(k, s, p, d)), (x,)))
    if k in ((2, 2, 2), (1, 1, 1)):
        assert results[(k[0], 0, 1)] == "exact"


@pytest.mark.parametrize("k", KERNELS, ids=str)
def test_transposes(tmp_path: Path, k: tuple[int, int, int]) -> None:
    def target_transpose(s: int, p: int, d: int) -> tuple[nn.Module, tuple[Any, ...]]:
        x = points(30, 5, seed=5, stride=s)
        target = points(60, 5 * s + 2, seed=6, channels=1)
        layer = tl.nn.ConvTranspose3d(3, 4, k, stride=s, padding=p, dilation=d, bias=True)
        return Layer(layer), (x, target)

    results = run_grid(tmp_path, target_transpose)
    # transposes are never centred: every buildable target transpose is exact
    assert set(results.values()) <= {"exact", "eager-refuses"}
    assert "exact" in results.values()
    inverse = run_grid(tmp_path, lambda s, p, d: (
        DownUp(kernel_size=k, stride=s, padding=p, dilation=d), (points(50, 8, seed=7),)))
    if k in ((2, 2, 2), (3, 3, 3), (4, 4, 4)):  # k2 s2 p0, k3 s2 p1, k4 s2 p2: exact
        assert inverse[(2, k[0] - 2, 1)] == "exact", inverse[(2, k[0] - 2, 1)]


@pytest.mark.parametrize("k,s,p,d", [((3, 1, 3), (2, 1, 2), (1, 0, 1), (1, 1, 1)),
                                     ((2, 3, 1), (2, 1, 1), (0, 2, 0), (1, 1, 1)),
                                     ((3, 1, 5), (1, 1, 2), (2, 0, 3), (1, 1, 1)),
                                     ((3, 2, 1), (1, 2, 1), (4, 0, 0), (2, 1, 1))])
def test_anisotropic_forward_layers_export_exactly(tmp_path: Path, k: tuple[int, int, int],
                                                   s: tuple[int, int, int],
                                                   p: tuple[int, int, int],
                                                   d: tuple[int, int, int]) -> None:
    # per axis padding = kernel - stride (stride 1: (kernel - 1) * dilation)
    x = points(50, 8, seed=9)
    conv = tl.nn.Conv3d(3, 4, k, stride=s, padding=p, dilation=d, bias=True)
    assert outcome(tmp_path, Layer(conv), (x,)) == "exact"
    assert outcome(tmp_path, DownUp(kernel_size=k, stride=s, padding=p, dilation=d), (x,)) == (
        "exact")


@pytest.mark.parametrize("k", KERNELS, ids=str)
def test_generative_transposes(tmp_path: Path, k: tuple[int, int, int]) -> None:
    results = {}
    for s, normalized in product(STRIDES, (False, True)):
        cls = (tl.nn.NormalizedGenerativeConvTranspose3d if normalized
               else tl.nn.GenerativeConvTranspose3d)
        x = points(20, 5, seed=8, stride=s)
        results[(s, normalized)] = outcome(tmp_path, Layer(cls(3, 4, k, s, bias=True)), (x,))
    # the consumer merges overlapping generated rows and sums them, as the library does
    assert set(results.values()) <= {"exact", "eager-refuses"}
    assert "exact" in results.values()
