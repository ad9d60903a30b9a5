"""Converted legacy weights reproduce the legacy computation.

A MinkUNet-like legacy model (stem: two 3x3x3 subm convs; k2 s2 down; one (3, 1, 5)
subm block; transposed k2 s2 up; skip concat; pointwise head with a 2-D kernel) is
run by ``legacy_reference`` (an independent model of FACTS.md's legacy semantics) on
its legacy-layout state dict. The state dict is saved as a legacy checkpoint,
converted (API and console script), loaded with ``strict=True`` into the Torch
Lattice twin, and both forwards must agree in float64 to 1e-10:

    twin(converted(legacy_state))(x) == legacy_forward(legacy_state, x)
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from torch import nn

import torch_lattice as tl
from torch_lattice import migration
from torch_lattice.migration import cli

try:
    import legacy_reference as legacy
except ImportError:  # tests/ may become a package
    from tests import legacy_reference as legacy

F64 = torch.float64
CIN, C, CLASSES = 3, 4, 5
BLOCK_KERNEL = (3, 1, 5)
SPEC = {
    "stem.0.kernel": [3, 3, 3],
    "stem.3.kernel": [3, 3, 3],
    "down.0.kernel": [2, 2, 2],
    "block.0.kernel": list(BLOCK_KERNEL),
    "up.0.kernel": [2, 2, 2],
    "head.kernel": [1, 1, 1],
}


# ---------------------------------------------------------------- Torch Lattice twin


class FeatBatchNorm(nn.BatchNorm1d):
    """``torch.nn.BatchNorm1d`` on a SparseTensor's features (same state-dict keys)."""

    def forward(self, x: tl.SparseTensor) -> tl.SparseTensor:  # type: ignore[override]
        return x.replace(super().forward(x.feats))


class FeatReLU(nn.Module):
    def forward(self, x: tl.SparseTensor) -> tl.SparseTensor:
        return x.replace(torch.relu(x.feats))


def _bn_relu(c: int) -> list[nn.Module]:
    return [FeatBatchNorm(c), FeatReLU()]


class TwinUNet(nn.Module):
    """The Torch Lattice model equivalent to the legacy one."""

    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Sequential(
            tl.nn.SubmConv3d(CIN, C, 3),
            *_bn_relu(C),
            tl.nn.SubmConv3d(C, C, 3),
            *_bn_relu(C),
        )
        self.down = nn.Sequential(tl.nn.Conv3d(C, 2 * C, 2, stride=2), *_bn_relu(2 * C))
        self.block = nn.Sequential(
            tl.nn.SubmConv3d(2 * C, 2 * C, BLOCK_KERNEL, bias=True), *_bn_relu(2 * C)
        )
        self.up = nn.Sequential(tl.nn.ConvTranspose3d(2 * C, C, 2, stride=2), *_bn_relu(C))
        self.head = tl.nn.Conv3d(2 * C, CLASSES, kernel_size=1, bias=True)

    def forward(self, x: tl.SparseTensor) -> tl.SparseTensor:
        x0 = self.stem(x)
        u = self.up(self.block(self.down(x0)))
        assert torch.equal(u.coords, x0.coords)
        return self.head(x0.replace(torch.cat([u.feats, x0.feats], dim=1)))


# ---------------------------------------------------------------- legacy model


def legacy_state(seed: int = 0) -> dict[str, torch.Tensor]:
    """Random weights in legacy layout (.kernel keys, legacy row order)."""
    gen = torch.Generator().manual_seed(seed)

    def w(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=gen, dtype=F64) / 3

    def bn(prefix: str, c: int) -> dict[str, torch.Tensor]:
        return legacy.random_batch_norm_state(prefix, c, gen, batches_tracked=7)

    state = {"stem.0.kernel": w(27, CIN, C)}
    state |= bn("stem.1.", C)
    state["stem.3.kernel"] = w(27, C, C)
    state |= bn("stem.4.", C)
    state["down.0.kernel"] = w(8, C, 2 * C)
    state |= bn("down.1.", 2 * C)
    state["block.0.kernel"] = w(15, 2 * C, 2 * C)
    state["block.0.bias"] = w(2 * C)
    state |= bn("block.1.", 2 * C)
    state["up.0.kernel"] = w(8, 2 * C, C)
    state |= bn("up.1.", C)
    state["head.kernel"] = w(2 * C, CLASSES)  # pointwise: 2-D
    state["head.bias"] = w(CLASSES)
    return state


def _bn_relu_legacy(f: torch.Tensor, s: dict[str, torch.Tensor], prefix: str) -> torch.Tensor:
    return torch.relu(legacy.batch_norm(f, s, prefix))


def legacy_forward(s: dict[str, torch.Tensor], coords: torch.Tensor, feats: torch.Tensor):
    """The legacy model, computed by the reference semantics."""
    f = legacy.subm_conv(coords, feats, s["stem.0.kernel"], (3, 3, 3))
    f = _bn_relu_legacy(f, s, "stem.1.")
    f = legacy.subm_conv(coords, f, s["stem.3.kernel"], (3, 3, 3))
    x0 = _bn_relu_legacy(f, s, "stem.4.")
    coarse, pairs = legacy.downsample_map(coords, (2, 2, 2), (2, 2, 2))
    g = legacy.strided_conv(x0, s["down.0.kernel"], coarse.shape[0], pairs)
    g = _bn_relu_legacy(g, s, "down.1.")
    g = legacy.subm_conv(coarse, g, s["block.0.kernel"], BLOCK_KERNEL, s["block.0.bias"])
    g = _bn_relu_legacy(g, s, "block.1.")
    u = legacy.transposed_conv(g, s["up.0.kernel"], coords.shape[0], pairs)
    u = _bn_relu_legacy(u, s, "up.1.")
    return legacy.pointwise(torch.cat([u, x0], dim=1), s["head.kernel"], s["head.bias"])


def scene(seed: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    """Two batches, ~35% of an 8^3 grid each (an even range: no stride-2 clipping)."""
    gen = torch.Generator().manual_seed(seed)
    rows = []
    for b in range(2):
        cells = torch.nonzero(torch.rand(8, 8, 8, generator=gen) < 0.35)
        rows.append(torch.cat([torch.full((cells.shape[0], 1), b), cells], dim=1))
    coords = torch.cat(rows)
    coords = coords[torch.randperm(coords.shape[0], generator=gen)]  # unsorted input
    feats = torch.randn(coords.shape[0], CIN, generator=gen, dtype=F64)
    return coords, feats


def twin_forward(state: dict[str, torch.Tensor], coords: torch.Tensor, feats: torch.Tensor):
    model = TwinUNet().double().eval()
    migration.load_state_dict_strict(model, state)
    x = tl.SparseTensor(feats, coords, spatial_range=(2, 8, 8, 8))
    with torch.no_grad():
        out = model(x)
    assert torch.equal(out.coords, x.coords)
    return out.feats


# ---------------------------------------------------------------- tests


def test_legacy_reference_is_not_trivial() -> None:
    """Guard: the scene has real neighbourhoods and every kernel row is exercised."""
    coords, _ = scene()
    _, pairs = legacy.downsample_map(coords, (2, 2, 2), (2, 2, 2))
    assert all(len(pl) > 0 for pl in pairs.values())
    ones = torch.ones(coords.shape[0], 1, dtype=F64)
    counts = legacy.subm_conv(coords, ones, torch.ones(27, 1, 1, dtype=F64), (3, 3, 3))
    assert float(counts.min()) >= 1 and float(counts.mean()) > 3  # self plus neighbours


def test_converted_unet_matches_legacy_forward() -> None:
    state = legacy_state()
    coords, feats = scene()
    expected = legacy_forward(state, coords, feats)
    result = migration.convert_state_dict(state, SPEC)
    got = twin_forward(result.state_dict, coords, feats)
    torch.testing.assert_close(got, expected, rtol=1e-10, atol=1e-10)


def test_unconverted_weights_do_not_match() -> None:
    """The row permutation matters: loading legacy rows as-is gives other outputs."""
    state = legacy_state()
    coords, feats = scene()
    expected = legacy_forward(state, coords, feats)
    wrong = migration.convert_state_dict(
        state, SPEC | {"stem.0.kernel": {"kernel_size": [3, 3, 3], "row_order": "z_fastest"}}
    )
    got = twin_forward(wrong.state_dict, coords, feats)
    assert not torch.allclose(got, expected, rtol=1e-6, atol=1e-6)


def _console_script() -> Path:
    return Path(sys.executable).parent / "convert-checkpoint"


@pytest.mark.parametrize(
    ("container", "installed"), [("model", True), ("bare", False), ("state_dict", False)]
)
def test_cli_converted_checkpoint_reproduces_legacy(
    tmp_path: Path, container: str, installed: bool
) -> None:
    """The installed console script (once) and the in-process CLI, per container."""
    state = legacy_state(seed=3)
    coords, feats = scene(seed=4)
    expected = legacy_forward(state, coords, feats)
    source = tmp_path / "legacy.pt"
    torch.save(state if container == "bare" else {container: state, "epoch": 12}, source)
    spec = tmp_path / "legacy-kernels.json"
    spec.write_text(json.dumps(SPEC))
    out = tmp_path / "weights.safetensors"
    args = [str(source), str(out), "--kernel-spec", str(spec)]
    if installed:
        run = subprocess.run(
            [str(_console_script()), *args], capture_output=True, text=True, check=False
        )
        assert run.returncode == 0, run.stderr
    else:
        assert cli.main(args) == 0
    model = TwinUNet().double().eval()
    model.load_state_dict(load_file(str(out)), strict=True)
    x = tl.SparseTensor(feats, coords, spatial_range=(2, 8, 8, 8))
    with torch.no_grad():
        got = model(x).feats
    torch.testing.assert_close(got, expected, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize(
    ("kernel_size", "row_order"),
    [((3, 3, 3), "z_fastest"), ((3, 1, 5), "z_fastest"), ((3, 3, 3), "x_fastest")],
)
def test_explicit_row_order_subm(kernel_size: tuple[int, int, int], row_order: str) -> None:
    """Per-key row order (v1.2/v1.3 tuple kernels: z fastest at odd volume)."""
    coords, feats = scene(seed=5)
    k = kernel_size[0] * kernel_size[1] * kernel_size[2]
    kernel = torch.randn(k, CIN, 2, dtype=F64, generator=torch.Generator().manual_seed(6))
    expected = legacy.subm_conv(coords, feats, kernel, kernel_size, row_order=row_order)
    spec = {"conv.kernel": {"kernel_size": list(kernel_size), "row_order": row_order}}
    state = migration.convert_state_dict({"conv.kernel": kernel}, spec).state_dict
    conv = nn.ModuleDict({"conv": tl.nn.SubmConv3d(CIN, 2, kernel_size)}).double()
    migration.load_state_dict_strict(conv, state)
    got = conv["conv"](tl.SparseTensor(feats, coords)).feats
    torch.testing.assert_close(got, expected, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("row_order", [None, "x_fastest", "z_fastest"])
def test_explicit_row_order_downsample(row_order: str | None) -> None:
    """Even volume: TorchSparse z fastest by default; MinkowskiEngine states x fastest."""
    coords, feats = scene(seed=7)
    kernel = torch.randn(8, CIN, 2, dtype=F64, generator=torch.Generator().manual_seed(8))
    out_coords, pairs = legacy.downsample_map(coords, (2, 2, 2), (2, 2, 2), row_order=row_order)
    expected = legacy.strided_conv(feats, kernel, out_coords.shape[0], pairs)
    entry = {"kernel_size": [2, 2, 2]} | ({"row_order": row_order} if row_order else {})
    state = migration.convert_state_dict({"down.kernel": kernel}, {"down.kernel": entry})
    conv = nn.ModuleDict({"down": tl.nn.Conv3d(CIN, 2, 2, stride=2)}).double()
    migration.load_state_dict_strict(conv, state.state_dict)
    y = conv["down"](tl.SparseTensor(feats, coords, spatial_range=(2, 8, 8, 8)))
    assert torch.equal(y.coords.long(), out_coords)  # both sorted by (b, x, y, z)
    torch.testing.assert_close(y.feats, expected, rtol=1e-10, atol=1e-10)
