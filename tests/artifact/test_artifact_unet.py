"""SparseResUNet42 as an MLX Lattice artifact: export, replay, compare with the model.

The backbone pads its input's range and puts its output back on the input's
support in two leaf helpers (``padded_range``, ``on_input_support``) that the
exporter lowers; everything between them is ordinary exportable layers.
"""

from __future__ import annotations

import copy
import re
from pathlib import Path

import pytest
import torch
from torch import nn

import torch_lattice as tl
from torch_lattice.artifact import (
    ExportError,
    load_lattice_program,
    save_lattice_model_artifact,
    schema,
)
from torch_lattice.artifact.packing import pack_weight, unpack_weight
from torch_lattice.artifact.weights import conv_weight_to_artifact
from torch_lattice.backbones.unet import on_input_support
from torch_lattice.data.synthetic import lidar_scan
from torch_lattice.nn.modules.conv import ConvBase


def lidar_batch(seeds: tuple[int, ...]) -> tl.SparseTensor:
    """Small LiDAR sweeps voxelized at 0.4 m, one batch entry per seed, rows shuffled.

    Features are the mean point position and a constant channel.
    """
    points, batch = [], []
    for b, seed in enumerate(seeds):
        scan = lidar_scan(seed, extent=12.0, num_beams=16, points_per_beam=256)
        points.append(scan.points)
        batch.append(torch.full((len(scan.points),), b, dtype=torch.int64))
    p = torch.cat(points)
    feats = torch.cat([p, torch.ones(len(p), 1)], dim=1)
    x = tl.voxelize(p, feats, batch_indices=torch.cat(batch), voxel_size=0.4)
    perm = torch.randperm(len(x), generator=torch.Generator().manual_seed(1))
    return tl.SparseTensor(x.feats[perm], x.coords[perm])


def random_cloud(extent: tuple[int, int, int], n: int, seed: int) -> tl.SparseTensor:
    """``n`` random unique voxels of one scene, ranges that 16 does not divide."""
    g = torch.Generator().manual_seed(seed)
    rows = torch.stack([torch.randint(0, e, (4 * n,), generator=g) for e in extent], 1)
    xyz = torch.unique(rows, dim=0)
    xyz = xyz[torch.randperm(len(xyz), generator=g)[:n]]
    coords = torch.cat([torch.zeros(len(xyz), 1, dtype=torch.int64), xyz], 1)
    return tl.SparseTensor(torch.randn(len(xyz), 2, generator=g), coords)


def trained_looking(net: nn.Module, x: tl.SparseTensor, seed: int) -> nn.Module:
    """``net`` in eval mode with BatchNorm statistics measured on ``x`` and random
    affine terms.

    Fresh statistics (mean 0, variance 1) let the activations shrink level by
    level, so the deep levels would hardly reach the output; measured ones keep
    every level's contribution visible, and random scales and shifts would show
    a lowering that swaps or drops any of the four.
    """
    g = torch.Generator().manual_seed(seed)
    norms = [m for m in net.modules() if isinstance(m, tl.nn.BatchNorm)]
    for m in norms:
        m.momentum = 1.0  # running statistics = the statistics of this one batch
    with torch.no_grad():
        net.train()(x)
        for m in norms:
            c = m.num_features
            m.weight.copy_(0.8 + 0.4 * torch.rand(c, generator=g))
            m.bias.copy_(0.1 * torch.randn(c, generator=g))
    return net.eval()


def export_and_replay(
    tmp_path: Path, net: nn.Module, x: tl.SparseTensor
) -> tuple[tl.SparseTensor, object, str]:
    art = tmp_path / "unet.lattice"
    save_lattice_model_artifact(net, art, example_inputs=(x,))
    program = load_lattice_program(art)
    assert program.input_names == ("x_coords", "x_features", "x_active")
    # A stride-1 input: physical and logical coordinates are the same.
    got = program(
        x_coords=x.coords.to(torch.int32),
        x_features=x.feats,
        x_active=torch.tensor([len(x)], dtype=torch.int32),
    )["output"]
    with torch.no_grad():
        ref = net(x)
    return ref, got, (art / "graph.mlir").read_text()


def assert_replayed(ref: tl.SparseTensor, got: object) -> None:
    # Rows and their order are the model's (the input's own order).
    assert torch.equal(got.coords, ref.coords.to(torch.int32))  # type: ignore[attr-defined]
    assert int(got.active[0]) == len(ref)  # type: ignore[attr-defined]
    scale = float(ref.feats.abs().max())
    assert scale > 0
    torch.testing.assert_close(
        got.features,  # type: ignore[attr-defined]
        ref.feats,
        atol=1e-5 * max(1.0, scale),
        rtol=1e-4,
    )


def test_unet_on_lidar_scans_replays_the_model(tmp_path: Path) -> None:
    torch.manual_seed(0)
    x = lidar_batch((0, 1))
    assert len(x) > 500 and int(x.coords[:, 0].max()) == 1
    net = trained_looking(tl.backbones.SparseResUNet42(4, 5, width=0.125), x, seed=2)
    ref, got, graph = export_and_replay(tmp_path, net, x)
    assert_replayed(ref, got)
    # The four k2 s2 downs keep the contract's generated form; the four ups name
    # the encoder support they return to (the input itself for the last one).
    assert graph.count("lattice.conv3d ") == 4 + 4 + 1  # downs, block shortcuts, head
    assert graph.count("lattice.target_conv_transpose3d ") == 4
    assert "lattice.target_conv_transpose3d %decoder_2_1_relu, %x," in graph


@pytest.mark.parametrize("extent", [(21, 19, 13), (30, 25, 1)], ids=["odd_ranges", "flat_scene"])
def test_unet_on_ranges_the_strides_do_not_divide(tmp_path: Path, extent: tuple[int, ...]) -> None:
    # padded_range is what keeps every row at each halving; the exporter's
    # dropped-row check would refuse the k2 s2 convolutions without it.
    torch.manual_seed(0)
    x = random_cloud(extent, 300, seed=3)  # type: ignore[arg-type]
    net = trained_looking(tl.backbones.SparseResUNet42(2, 3, width=0.125), x, seed=4)
    ref, got, _ = export_and_replay(tmp_path, net, x)
    assert ref.support is x.support
    assert_replayed(ref, got)


class _OtherRows(nn.Module):
    """Misuses on_input_support on a strided result (fewer rows than its input)."""

    def __init__(self) -> None:
        super().__init__()
        self.down = tl.nn.Conv3d(2, 2, kernel_size=2, stride=2)

    def forward(self, x: tl.SparseTensor) -> tl.SparseTensor:
        return on_input_support(self.down(x), x)


def test_on_input_support_refuses_rows_that_are_not_the_inputs(tmp_path: Path) -> None:
    x = random_cloud((16, 16, 16), 200, seed=5)
    # from_support refuses the 177 rows of the k2 s2 result for x's 200 as the node runs
    # on the example; rows of the same count in another order reach the lowering's check
    with pytest.raises(ExportError, match="feats must have one row per coordinate"):
        save_lattice_model_artifact(
            _OtherRows().eval(), tmp_path / "bad.lattice", example_inputs=(x,)
        )
    assert not (tmp_path / "bad.lattice").exists()


class _Downs(nn.Module):
    """A k2 s2 convolution and a k2 s2 max pooling, both generating their rows."""

    def __init__(self) -> None:
        super().__init__()
        self.down = tl.nn.Conv3d(2, 3, kernel_size=2, stride=2)
        self.pool = tl.nn.MaxPool3d(kernel_size=2, stride=2)

    def forward(self, x: tl.SparseTensor) -> tuple[tl.SparseTensor, tl.SparseTensor]:
        return self.down(x), self.pool(x)


def test_replayed_strided_layers_keep_rows_of_a_last_partial_window(tmp_path: Path) -> None:
    # The example declares a range of 16, but the artifact only carries rows, and
    # the largest coordinates are 14 (x) and 0 (z): replay sees ranges 15 and 1.
    # The contract's rows are unique(floor(c / 2)), so x = 14 gives row 7 and the
    # flat z axis row 0; none may be dropped or refused.
    coords = torch.tensor([[0, 0, 0, 0], [0, 14, 3, 0], [0, 13, 2, 0], [0, 5, 5, 0]])
    x = tl.SparseTensor(torch.randn(4, 2), coords, spatial_range=(1, 16, 16, 16))
    model = _Downs().eval()
    art = tmp_path / "downs.lattice"
    save_lattice_model_artifact(model, art, example_inputs=(x,))
    got = load_lattice_program(art)(
        x_coords=coords.to(torch.int32), x_features=x.feats, x_active=torch.tensor([4])
    )
    with torch.no_grad():
        refs = model(x)
    for ref, name in zip(refs, ("output_0", "output_1"), strict=True):
        want = ref.coords.clone()
        want[:, 1:] *= 2  # physical coordinates of the stride-2 result
        assert torch.equal(got[name].coords, want.to(torch.int32))
        torch.testing.assert_close(got[name].features, ref.feats, atol=1e-6, rtol=1e-5)
    assert {tuple(r) for r in refs[0].coords.tolist()} == {
        (0, 0, 0, 0),
        (0, 7, 1, 0),
        (0, 6, 1, 0),
        (0, 2, 2, 0),
    }


def test_quantized_unet_packs_only_ops_the_consumer_runs_packed(tmp_path: Path) -> None:
    torch.manual_seed(0)
    x = lidar_batch((0,))
    net = trained_looking(tl.backbones.SparseResUNet42(4, 5, width=0.25), x, seed=3)
    art = tmp_path / "unet_int8.lattice"
    files = save_lattice_model_artifact(net, art, example_inputs=(x,), quantize_bits=8,
                                        quantize_group_size=64)
    graph = files.graph_path.read_text()
    packed = set(re.findall(r"%(\w+) = lattice\.weight @\w+ \{[^}]*packing = #lattice\.packing"
                            r"<int8, group_size = 64, scale_dtype = f32", graph))
    assert len(packed) > 20
    ops_with_packed = set()
    for op, operands in re.findall(r"= lattice\.([\w.]+) ([^{\n]*)", graph):
        if packed & set(re.findall(r"%(\w+)", operands)):
            ops_with_packed.add(op)
    assert ops_with_packed and ops_with_packed <= schema.PACKED_WEIGHT_OPS
    # the four inverse transposes stay float, and the export says so
    assert len(files.float_layers) == 4
    assert all("target transposes" in why for why in files.float_layers.values())
    # the replay (which refuses packed weights where MLX Lattice does) runs it and
    # computes the model with the dequantized weights
    dequantized = copy.deepcopy(net)
    with torch.no_grad():
        for name, m in dequantized.named_modules():
            if isinstance(m, ConvBase) and name not in files.float_layers:
                w = conv_weight_to_artifact(m.weight, m.kernel_size)
                back = unpack_weight(*pack_weight(w, bits=8, group_size=64).astuple(), bits=8,
                                     group_size=64, in_channels=m.weight.shape[1],
                                     kernel_size=m.kernel_size)
                m.weight.copy_(back.permute(1, 2, 3, 4, 0).reshape(m.weight.shape))
    got = load_lattice_program(art)(
        x_coords=x.coords.to(torch.int32), x_features=x.feats,
        x_active=torch.tensor([len(x)], dtype=torch.int32))["output"]
    with torch.no_grad():
        assert_replayed(dequantized(x), got)
        assert not torch.allclose(net(x).feats, dequantized(x).feats)  # packing was real


def test_the_exporter_imports_no_model() -> None:
    """The backbone marks its helpers (torch_lattice.export_hints); the artifact package
    lowers them by role and imports no model itself."""
    import ast

    package = Path(tl.artifact.__file__).parent
    for path in sorted(package.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                     else [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            assert not any("backbones" in n for n in names), (path.name, names)
