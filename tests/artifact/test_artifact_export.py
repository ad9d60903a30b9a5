"""save_lattice_model_artifact: the exact graph text, weight layouts, refusals, writing.

The expected graphs are written out here in the contract's text form
(lattice-contract 0.6.0 builder: attributes in schema order, every conv op with
``accumulation = "canonical_f32"``).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file
from torch import nn

import torch_lattice as tl
from torch_lattice.artifact import export as export_module
from torch_lattice.artifact import load_lattice_program, save_lattice_model_artifact
from torch_lattice.artifact.errors import ExportError
from torch_lattice.artifact.mlir_text import decimal_float
from torch_lattice.atomic_file import current_umask

SP = "!lattice.sparse_tensor<rank = 3, coord = batch_x_y_z, feature = row_channel, dtype = f32>"
DIGEST = "1380f1e819fc0eb1af587202ecec3c14ec2c981d249333c5061f0263f82072ad"
MAKE_ATTRS = "{stride = array<i64: 1, 1, 1>, coord_order = #lattice.coord<batch_x_y_z>}"
ACT_TAIL = "alpha = 0.01 : f32, beta = 1.0 : f32, threshold = 20.0 : f32"


def header(inputs: str, roles: str, outputs: str, out_roles: str) -> str:
    return (
        "module attributes {\n"
        "  lattice.ir_version = 2,\n"
        f'  lattice.schema_digest = "{DIGEST}",\n'
        f"  lattice.input_names = [{inputs}],\n"
        f"  lattice.input_roles = [{roles}],\n"
        f"  lattice.output_names = [{outputs}],\n"
        f"  lattice.output_roles = [{out_roles}],\n"
        '  lattice.weight_file = "weights.safetensors"\n'
        "} {\n"
    )


X_NAMES = '"x_coords", "x_features", "x_active"'
X_ROLES = '"sparse_coords", "sparse_features", "sparse_active"'


def x_signature(channels: int, result: str) -> str:
    return (
        "  func.func @forward(\n"
        "    %x_coords: tensor<?x4xi32>,\n"
        f"    %x_features: tensor<?x{channels}xf32>,\n"
        "    %x_active: tensor<1xi32>\n"
        f"  ) -> {result} {{\n"
        f"    %x = lattice.sparse.make %x_coords, %x_features, %x_active {MAKE_ATTRS} : "
        f"(tensor<?x4xi32>, tensor<?x{channels}xf32>, tensor<1xi32>) -> {SP}\n"
    )


def weight_line(key: str, layout: str, family: str, packing: str = "dense") -> str:
    sym = key.replace(".", "_")
    return (
        f'    %{sym} = lattice.weight @{sym} {{storage_key = "{key}", '
        f"layout = #lattice.weight_layout<{layout}>, packing = #lattice.packing<{packing}>}} : "
        f"!lattice.weight<{family}, f32>\n"
    )


def cloud(channels: int, batches: int = 1, stride: int = 1) -> tl.SparseTensor:
    g = torch.Generator().manual_seed(0)
    coords = torch.tensor(
        [[b, x, y, z] for b in range(batches) for x in range(4) for y in range(4) for z in (0, 3)]
    )
    return tl.SparseTensor(torch.randn(len(coords), channels, generator=g), coords, stride=stride)


class One(nn.Module):
    def __init__(self, conv: nn.Module) -> None:
        super().__init__()
        self.conv = conv

    def forward(self, x: tl.SparseTensor) -> tl.SparseTensor:
        return self.conv(x)


def export_text(tmp_path: Path, model: nn.Module, inputs: tuple[object, ...], **kw: object) -> str:
    save_lattice_model_artifact(model.eval(), tmp_path / "a", example_inputs=inputs, **kw)
    return (tmp_path / "a" / "graph.mlir").read_text()


def test_golden_submanifold_convolution(tmp_path: Path) -> None:
    text = export_text(tmp_path, One(tl.nn.SubmConv3d(1, 1, (3, 1, 5))), (cloud(1),))
    expected = (
        header(X_NAMES, X_ROLES, '"output"', '"sparse_tensor"')
        + x_signature(1, SP)
        + weight_line("conv.weight", "conv3d_o_xyz_i", "conv3d")
        + "    %conv = lattice.subm_conv3d %x, %conv_weight {kernel_size = array<i64: 3, 1, 5>, "
        'dilation = array<i64: 1, 1, 1>, accumulation = "canonical_f32"} : '
        f"({SP}, !lattice.weight<conv3d, f32>) -> {SP}\n"
        f"    return %conv : {SP}\n"
        "  }\n"
        "}\n"
    )
    assert text == expected


class Classifier(nn.Module):
    def __init__(self, quantized: bool = False) -> None:
        super().__init__()
        self.stem = tl.nn.Conv3d(3, 4, 1, bias=True)
        self.norm = tl.nn.BatchNorm(4)
        self.act = tl.nn.ReLU() if not quantized else tl.nn.SiLU()
        self.pool = tl.nn.AvgPool3d(1)
        self.global_pool = tl.nn.GlobalAvgPool()
        self.head = nn.Linear(4, 2)

    def forward(self, x: tl.SparseTensor) -> torch.Tensor:
        return self.head(self.global_pool(self.pool(self.act(self.norm(self.stem(x))))))


def _decomposed(stem: str, name: str) -> str:
    return (
        f"    %{name}, %{stem}_features_in, %{stem}_active = lattice.sparse.decompose %"
        + {"norm": "stem", "act": "norm"}[stem]
        + f" : {SP} -> (tensor<?x4xi32>, tensor<?x4xf32>, tensor<1xi32>)\n"
    )


def classifier_text(packing: str, kind: str) -> str:
    stem_op = (
        "    %stem = lattice.conv3d %x, %stem_weight, %stem_bias {kernel_size = "
        "array<i64: 1, 1, 1>, stride = array<i64: 1, 1, 1>, padding = array<i64: 0, 0, 0>, "
        'dilation = array<i64: 1, 1, 1>, accumulation = "canonical_f32"} : '
        f"({SP}, !lattice.weight<conv3d, f32>, !lattice.weight<bias, f32>) -> {SP}\n"
    )
    f4 = "tensor<?x4xf32>"
    return (
        header(X_NAMES, X_ROLES, '"output"', '"tensor"')
        + x_signature(3, "tensor<?x2xf32>")
        + weight_line("stem.weight", "conv3d_o_xyz_i", "conv3d", packing)
        + weight_line("stem.bias", "bias_c", "bias")
        + stem_op
        + _decomposed("norm", "sparse_decompose")
        + weight_line("norm.weight", "channel_c", "channel")
        + weight_line("norm.bias", "bias_c", "bias")
        + weight_line("norm.running_mean", "channel_c", "channel")
        + weight_line("norm.running_var", "channel_c", "channel")
        + "    %norm_features = lattice.batch_norm %norm_features_in, %norm_weight, %norm_bias, "
        "%norm_running_mean, %norm_running_var {eps = 0.00001 : f32} : "
        f"({f4}, !lattice.weight<channel, f32>, !lattice.weight<bias, f32>, "
        f"!lattice.weight<channel, f32>, !lattice.weight<channel, f32>) -> {f4}\n"
        f"    %norm = lattice.sparse.with_features %stem, %norm_features  : ({SP}, {f4}) -> {SP}\n"
        + _decomposed("act", "sparse_decompose1")
        + f"    %act_features = lattice.activation %act_features_in {{kind = "
        f"#lattice.activation<{kind}>, approximate = #lattice.gelu_approx<none>, {ACT_TAIL}}} : "
        f"({f4}) -> {f4}\n"
        f"    %act = lattice.sparse.with_features %norm, %act_features  : ({SP}, {f4}) -> {SP}\n"
        "    %pool = lattice.pool3d %act {mode = #lattice.pool_mode<avg>, kernel_size = "
        "array<i64: 1, 1, 1>, stride = array<i64: 1, 1, 1>, padding = array<i64: 0, 0, 0>, "
        f"dilation = array<i64: 1, 1, 1>}} : ({SP}) -> {SP}\n"
        "    %global_pool = lattice.global_pool %pool {mode = #lattice.pool_mode<avg>, "
        f"batch_size = 2}} : ({SP}) -> {f4}\n"
        + weight_line("head.weight", "linear_o_i", "linear", packing)
        + weight_line("head.bias", "bias_c", "bias")
        + "    %head = lattice.linear %global_pool, %head_weight, %head_bias  : "
        f"({f4}, !lattice.weight<linear, f32>, !lattice.weight<bias, f32>) -> tensor<?x2xf32>\n"
        "    return %head : tensor<?x2xf32>\n"
        "  }\n"
        "}\n"
    )


def test_golden_classifier(tmp_path: Path) -> None:
    text = export_text(tmp_path, Classifier(), (cloud(3, batches=2),))
    assert text == classifier_text("dense", "relu")


def test_golden_quantized_classifier(tmp_path: Path) -> None:
    text = export_text(tmp_path, Classifier(True), (cloud(3, batches=2),), quantize_bits=4)
    # float32 scales: the graph computes in float32
    packed = "int4, group_size = 32, scale_dtype = f32, mode = affine"
    assert text == classifier_text(packed, "silu")
    weights = load_file(tmp_path / "a" / "weights.safetensors")
    assert weights["stem.weight.weight"].shape == (1, 4, 4)  # (1, O, words): 32 / 8 words
    assert weights["stem.weight.scales"].dtype == torch.float32
    assert weights["head.weight.biases"].shape == (1, 2, 1)
    assert "stem.weight" not in weights and weights["stem.bias"].dtype == torch.float32


def test_golden_two_inputs_target_transpose_and_names(tmp_path: Path) -> None:
    class Up(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.up = tl.nn.NormalizedConvTranspose3d(
                2, 3, (3, 1, 1), (2, 1, 1), padding=(1, 0, 0), bias=True
            )

        def forward(self, source: tl.SparseTensor, target: tl.SparseTensor) -> tl.SparseTensor:
            return self.up(source, target)

    src = tl.SparseTensor(torch.ones(2, 2), torch.tensor([[0, 0, 0, 0], [0, 1, 0, 0]]), (2, 1, 1))
    tgt = tl.SparseTensor(
        torch.ones(3, 1), torch.tensor([[0, 0, 0, 0], [0, 1, 0, 0], [0, 2, 0, 0]])
    )
    text = export_text(tmp_path, Up(), (src, tgt), output_names=["dense_up"])
    assert 'lattice.input_names = ["source_coords", "source_features", "source_active", ' in text
    assert '"target_coords", "target_features", "target_active"]' in text
    assert 'lattice.output_names = ["dense_up"]' in text
    assert (
        "    %source = lattice.sparse.make %source_coords, %source_features, %source_active "
        "{stride = array<i64: 2, 1, 1>, " in text
    )
    assert "    %target_coords: tensor<?x4xi32>,\n    %target_features: tensor<?x1xf32>," in text
    assert (
        "    %up = lattice.target_normalized_conv_transpose3d %source, %target, %up_weight, "
        "%up_bias {kernel_size = array<i64: 3, 1, 1>, stride = array<i64: 2, 1, 1>, "
        "padding = array<i64: 1, 0, 0>, dilation = array<i64: 1, 1, 1>, "
        'accumulation = "canonical_f32", eps = 0.00000001 : f32} : '
    ) in text


def test_every_conv_op_declares_canonical_f32_accumulation(tmp_path: Path) -> None:
    class Many(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.a = tl.nn.SubmConv3d(2, 2, 3)
            self.b = tl.nn.Conv3d(2, 2, 2, stride=2)
            self.c = tl.nn.ConvTranspose3d(2, 2, 2, stride=2)
            self.d = tl.nn.GenerativeConvTranspose3d(2, 2, 2, stride=2)
            self.e = tl.nn.NormalizedSubmConv3d(2, 2, 3)

        def forward(self, x: tl.SparseTensor) -> tuple[tl.SparseTensor, tl.SparseTensor]:
            h = self.b(self.a(x))
            return self.e(self.c(h)), self.d(h)

    text = export_text(tmp_path, Many(), (cloud(2),))
    conv_lines = [line for line in text.splitlines() if "conv" in line and "= lattice." in line]
    conv_lines = [line for line in conv_lines if "= lattice.weight @" not in line]
    assert len(conv_lines) == 5
    assert all('accumulation = "canonical_f32"' in line for line in conv_lines)
    assert (
        "%d = lattice.generative_conv_transpose3d %b, %d_weight "
        "{kernel_size = array<i64: 2, 2, 2>, stride = array<i64: 2, 2, 2>, "
        'accumulation = "canonical_f32"}'
    ) in text


def test_conv_weight_layout_follows_kernel_positions(tmp_path: Path) -> None:
    conv = tl.nn.SubmConv3d(2, 3, (3, 1, 5), bias=True)
    k = conv.weight.shape[0]
    with torch.no_grad():  # weight[n, i, o] = 100 n + 10 i + o
        conv.weight.copy_(
            torch.arange(k).view(k, 1, 1) * 100.0
            + torch.arange(2).view(1, 2, 1) * 10.0
            + torch.arange(3).view(1, 1, 3)
        )
    export_text(tmp_path, One(conv), (cloud(2),))
    path = tmp_path / "a" / "weights.safetensors"
    with safe_open(path, "pt") as f:
        assert f.metadata() == {"format": "torch"}
        assert sorted(f.keys()) == ["conv.bias", "conv.weight"]  # no kernel_positions
        stored = f.get_tensor("conv.weight")
        bias = f.get_tensor("conv.bias")
    assert stored.shape == (3, 3, 1, 5, 2)  # (C_out, Kx, Ky, Kz, C_in)
    for n, (rx, ry, rz) in enumerate(conv.kernel_positions.tolist()):
        for i in range(2):
            for o in range(3):
                assert stored[o, rx, ry, rz, i] == 100 * n + 10 * i + o
    assert torch.equal(bias, conv.bias.detach())


def test_linear_and_batch_norm_weights_keep_their_tensors(tmp_path: Path) -> None:
    model = Classifier().eval()
    export_text(tmp_path, model, (cloud(3, batches=2),))
    weights = load_file(tmp_path / "a" / "weights.safetensors")
    assert torch.equal(weights["head.weight"], model.head.weight.detach())  # linear_o_i
    for key in ("weight", "bias", "running_mean", "running_var"):
        assert torch.equal(weights[f"norm.{key}"], getattr(model.norm, key).detach())
    assert "norm.num_batches_tracked" not in weights


def test_module_called_twice_declares_its_weights_once(tmp_path: Path) -> None:
    class Twice(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.conv = tl.nn.SubmConv3d(2, 2, 3)

        def forward(self, x: tl.SparseTensor) -> tl.SparseTensor:
            return self.conv(self.conv(x))

    text = export_text(tmp_path, Twice(), (cloud(2),))
    assert text.count("lattice.weight @conv_weight") == 1
    assert "lattice.subm_conv3d %conv, %conv_weight " in text


# --- refusals: each raises before anything is written --------------------------


def _listing(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*"))


def refuse(
    tmp_path: Path, model: nn.Module, inputs: object, exc: type, match: str, **kw: object
) -> None:
    before = _listing(tmp_path)
    with pytest.raises(exc, match=match):
        save_lattice_model_artifact(model, tmp_path / "a", example_inputs=inputs, **kw)
    assert _listing(tmp_path) == before


def test_refuses_training_mode(tmp_path: Path) -> None:
    model = Classifier()
    refuse(tmp_path, model.train(), (cloud(3),), ExportError, "eval mode.*norm")


def test_refuses_unsupported_module_naming_the_node(tmp_path: Path) -> None:
    class WithLayerNorm(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.ln = nn.LayerNorm(2)

        def forward(self, x: tl.SparseTensor) -> tl.SparseTensor:
            return x.replace(self.ln(x.feats))

    refuse(tmp_path, WithLayerNorm().eval(), (cloud(2),), ExportError, "node 'ln'.*LayerNorm")


def test_refuses_unsupported_function_naming_the_node(tmp_path: Path) -> None:
    class Doubler(nn.Module):
        def forward(self, x: tl.SparseTensor) -> tl.SparseTensor:
            return x.replace(torch.cat([x.feats, x.feats], dim=1))

    refuse(tmp_path, Doubler().eval(), (cloud(2),), ExportError, "node 'cat'.*torch.*cat")


def test_refuses_untraceable_forward(tmp_path: Path) -> None:
    class Branchy(nn.Module):
        def forward(self, x: tl.SparseTensor) -> tl.SparseTensor:
            if x.feats.sum() > 0:
                return x
            return x.replace(-x.feats)

    refuse(tmp_path, Branchy().eval(), (cloud(2),), ExportError, "not traceable by torch.fx")


class ScaledConv(tl.nn.SubmConv3d):
    """A user's subclass whose forward does more than its base: exported as the base it
    computed other numbers."""

    def forward(self, x: tl.SparseTensor) -> tl.SparseTensor:
        y = super().forward(x)
        return y.replace(y.feats * 2 + 100)


class Negated(tl.nn.ReLU):
    def forward(self, x: tl.SparseTensor) -> tl.SparseTensor:
        return x.replace(-x.feats)


class WithDefaults(tl.nn.SubmConv3d):
    """Only construction, initialisation and printing differ: the base's lowering is this
    module's."""

    def __init__(self, channels: int) -> None:
        super().__init__(channels, channels, 3, bias=True)

    def reset_parameters(self) -> None:
        super().reset_parameters()
        with torch.no_grad():
            self.weight.mul_(0.5)

    def extra_repr(self) -> str:
        return "with defaults"


class Doubled(nn.Linear):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return super().forward(x) * 2


def test_refuses_a_subclass_that_overrides_what_its_lowering_exports(tmp_path: Path) -> None:
    rule = r"subclasses torch_lattice's {} and overrides {}\.forward; the artifact would compute"
    refuse(tmp_path, One(ScaledConv(2, 2, 3)).eval(), (cloud(2),), ExportError,
           "node 'conv'.*" + rule.format("SubmConv3d", "ScaledConv"))
    refuse(tmp_path, ScaledConv(2, 2, 3).eval(), (cloud(2),), ExportError,
           "model: ScaledConv " + rule.format("SubmConv3d", "ScaledConv"))
    refuse(tmp_path, nn.Sequential(Negated()).eval(), (cloud(2),), ExportError,
           rule.format("ReLU", "Negated"))

    class Head(nn.Module):  # torch's own modules too (it raised StopIteration)
        def __init__(self) -> None:
            super().__init__()
            self.fc = Doubled(2, 3)

        def forward(self, x: tl.SparseTensor) -> tl.SparseTensor:
            return x.replace(self.fc(x.feats))

    refuse(tmp_path, Head().eval(), (cloud(2),), ExportError,
           r"node 'fc'.*Doubled subclasses torch's Linear and overrides Doubled\.forward")
    model = One(WithDefaults(2)).eval()
    save_lattice_model_artifact(model, tmp_path / "ok", example_inputs=(cloud(2),))
    try:
        from artifact_export_helpers import abi_inputs, assert_same
    except ImportError:  # tests/ may become a package
        from tests.artifact_export_helpers import abi_inputs, assert_same
    program = load_lattice_program(tmp_path / "ok")
    got = program(**abi_inputs(model, (cloud(2),)))
    with torch.no_grad():
        assert_same(model(cloud(2)), got[program.output_names[0]], 1e-5)


def test_refuses_a_weight_whose_packed_scale_is_not_finite(tmp_path: Path) -> None:
    conv = tl.nn.SubmConv3d(2, 2, 3)
    with torch.no_grad():
        conv.weight[13, :, 0] = torch.tensor([1.8e38, -1.8e38])  # finite; its range is not
    refuse(tmp_path, One(conv).eval(), (cloud(2),), ExportError,
           r"weight 'conv.weight': weight cannot be packed: a group's scale", quantize_bits=4)


def test_quantized_export_keeps_target_transposes_float(tmp_path: Path) -> None:
    class Net(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.sub = tl.nn.SubmConv3d(2, 2, 3)
            self.down = tl.nn.Conv3d(2, 4, 2, stride=2)
            self.up = tl.nn.ConvTranspose3d(4, 2, 2, stride=2)

        def forward(self, x: tl.SparseTensor) -> tl.SparseTensor:
            return self.up(self.down(self.sub(x)))

    files = save_lattice_model_artifact(Net().eval(), tmp_path / "a",
                                        example_inputs=(cloud(2),), quantize_bits=8)
    assert set(files.float_layers) == {"up"}
    assert "does not support packed weights" in files.float_layers["up"]
    with safe_open(str(files.weights_path), "pt") as f:
        assert json.loads(f.metadata()["torch_lattice.float_layers"]) == files.float_layers
        keys = set(f.keys())
    assert {"up.weight", "down.weight.weight", "down.weight.scales",
            "sub.weight.weight"} <= keys
    text = files.graph_path.read_text()
    assert text.count("#lattice.packing<int8, group_size = 32, scale_dtype = f32") == 2


@pytest.mark.parametrize("kernel_size", [3, 1])
@pytest.mark.parametrize("module", ["NormalizedSubmConv3d", "NormalizedConvTranspose3d"])
def test_a_normalized_convolution_refuses_packed_weights(tmp_path: Path, module: str,
                                                         kernel_size: int) -> None:
    """API.md: exporting a normalized module with packed weights raises (the spec
    rejects packed weights for the family: squaring them breaks the normalization)."""
    class Net(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.down = tl.nn.Conv3d(2, 2, 2, stride=2)
            stride = {} if module == "NormalizedSubmConv3d" else {"stride": 2}
            self.norm = getattr(tl.nn, module)(2, 2, kernel_size, **stride)

        def forward(self, x: tl.SparseTensor) -> tl.SparseTensor:
            y = self.down(x)
            return self.norm(y) if module == "NormalizedSubmConv3d" else self.norm(y, x)

    out = tmp_path / "a"
    with pytest.raises(ExportError, match="'norm': a normalized convolution cannot be exported "
                                          "with packed weights"):
        save_lattice_model_artifact(Net().eval(), out, example_inputs=(cloud(2),),
                                    quantize_bits=4)
    assert not out.exists()
    save_lattice_model_artifact(Net().eval(), out, example_inputs=(cloud(2),))  # float: fine


@pytest.mark.parametrize(
    ("kw", "exc", "match"),
    [
        ({"quantize_bits": 3}, ValueError, "quantize_bits"),
        ({"quantize_bits": "4"}, TypeError, "quantize_bits"),
        ({"quantize_bits": 4, "quantize_group_size": 12}, ValueError, "quantize_group_size"),
        ({"quantize_bits": 8, "quantize_group_size": 0}, ValueError, "quantize_group_size"),
        ({"output_names": ["a", "b"]}, ExportError, "output_names"),
        ({"output_names": "out"}, TypeError, "output_names"),
    ],
)
def test_refuses_bad_arguments(
    tmp_path: Path, kw: dict[str, object], exc: type, match: str
) -> None:
    refuse(tmp_path, One(tl.nn.SubmConv3d(2, 2, 3)).eval(), (cloud(2),), exc, match, **kw)


def test_refuses_bad_example_inputs(tmp_path: Path) -> None:
    model = One(tl.nn.SubmConv3d(2, 2, 3)).eval()
    refuse(tmp_path, model, cloud(2), TypeError, "example_inputs")
    refuse(tmp_path, model, (), ExportError, "example_inputs")
    refuse(tmp_path, model, (cloud(2), cloud(2)), ExportError, "takes 1 to 1")
    refuse(tmp_path, model, (cloud(2).double(),), ExportError, "float64")
    refuse(tmp_path, model, ("x",), ExportError, "input 'x'")


def test_refuses_points_without_batch_indices_and_max_voxels(tmp_path: Path) -> None:
    class Vox(nn.Module):
        def __init__(self, **kw: object) -> None:
            super().__init__()
            self.kw = kw

        def forward(self, points: torch.Tensor, feats: torch.Tensor) -> tl.SparseTensor:
            return tl.voxelize(points, feats, **self.kw)

    pts, feats = torch.rand(10, 3), torch.rand(10, 2)
    refuse(tmp_path, Vox().eval(), (pts, feats), ExportError, "node 'voxelize'.*batch_indices")
    refuse(tmp_path, Vox(reduction="max").eval(), (pts, feats), ExportError, "'max'")


@pytest.mark.parametrize(
    "layer,match",
    [
        # odd axes: the contract would need padding p - k//2 < 0
        (tl.nn.Conv3d(2, 2, 3), "centres odd kernel axes.*Nearest configuration that "
         r"exports: padding \(2, 2, 2\)"),
        (tl.nn.MaxPool3d(3, 3), "centres odd kernel axes"),
        # supports the contract's floor(c / stride) cannot regenerate
        (tl.nn.Conv3d(2, 2, 2, stride=2, dilation=2), r"unique\(floor"),
        (tl.nn.Conv3d(2, 2, 4, stride=2), r"unique\(floor.*exports: padding \(2, 2, 2\)"),
        (tl.nn.AvgPool3d(3, 2, 1), "pool3d.*takes no target"),
    ],
)
def test_refuses_forward_layers_the_contract_would_compute_otherwise(
    tmp_path: Path, layer: nn.Module, match: str
) -> None:
    refuse(tmp_path, One(layer).eval(), (cloud(2),), ExportError, f"node 'conv'.*{match}")


def test_refuses_a_strided_layer_that_drops_edge_rows_on_the_example(tmp_path: Path) -> None:
    # Rows at x = 0, 1, 2: a (2, 1, 1) stride-2 window never covers x = 2 in a range of 3,
    # while the contract keeps floor(2 / 2) = 1.
    model = One(tl.nn.Conv3d(2, 2, (2, 1, 1), stride=(2, 1, 1))).eval()
    coords = torch.tensor([[0, 0, 0, 0], [0, 1, 0, 0], [0, 2, 0, 0]])
    line = tl.SparseTensor(torch.ones(3, 2), coords)
    refuse(tmp_path, model, (line,), ExportError, "drops 1 rows at the upper edge")
    ranged = tl.SparseTensor(torch.ones(3, 2), coords, spatial_range=(1, 4, 1, 1))
    save_lattice_model_artifact(model, tmp_path / "a", example_inputs=(ranged,))


def test_refuses_batch_norm_without_running_stats(tmp_path: Path) -> None:
    model = One(tl.nn.BatchNorm(2, track_running_stats=False)).eval()
    refuse(tmp_path, model, (cloud(2),), ExportError, "node 'conv'.*running statistics")


def test_f32_attribute_too_small_for_the_text_form_raises() -> None:
    assert decimal_float(1e-8) == "0.00000001"
    assert decimal_float(0.0) == "0.0"
    assert decimal_float(20) == "20.0"
    with pytest.raises(ValueError, match="too small"):
        decimal_float(1e-13)


# --- writing -------------------------------------------------------------------


def test_existing_directory_rules(tmp_path: Path) -> None:
    model = One(tl.nn.SubmConv3d(2, 2, 3, bias=True)).eval()
    x = (cloud(2),)
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "notes.txt").write_text("keep me")
    refuse(tmp_path, model, x, FileExistsError, "not an artifact")
    assert (tmp_path / "a" / "notes.txt").read_text() == "keep me"
    (tmp_path / "a" / "notes.txt").unlink()
    save_lattice_model_artifact(model, tmp_path / "a", example_inputs=x)  # empty: allowed
    first = (tmp_path / "a" / "weights.safetensors").read_bytes()
    with torch.no_grad():
        model.conv.weight.add_(1.0)
    save_lattice_model_artifact(model, tmp_path / "a", example_inputs=x)  # artifact: replaced
    assert (tmp_path / "a" / "weights.safetensors").read_bytes() != first
    assert _listing(tmp_path) == ["a", "a/graph.mlir", "a/weights.safetensors"]
    (tmp_path / "file").write_text("x")
    with pytest.raises(FileExistsError, match="not a directory"):
        save_lattice_model_artifact(model, tmp_path / "file", example_inputs=x)
    with pytest.raises(ExportError, match="parent folder"):
        save_lattice_model_artifact(model, tmp_path / "no" / "a", example_inputs=x)


def test_failed_write_leaves_the_old_artifact_and_no_temporaries(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    model = One(tl.nn.SubmConv3d(2, 2, 3)).eval()
    save_lattice_model_artifact(model, tmp_path / "a", example_inputs=(cloud(2),))
    before = {p.name: p.read_bytes() for p in (tmp_path / "a").iterdir()}

    def broken(*args: object, **kwargs: object) -> None:
        raise OSError("disk full")

    monkeypatch.setattr(export_module, "save_file", broken)
    with pytest.raises(OSError, match="disk full"):
        save_lattice_model_artifact(model, tmp_path / "a", example_inputs=(cloud(2),))
    assert {p.name: p.read_bytes() for p in (tmp_path / "a").iterdir()} == before
    assert _listing(tmp_path) == ["a", "a/graph.mlir", "a/weights.safetensors"]


def test_written_files_get_the_umask_modes(tmp_path: Path) -> None:
    save_lattice_model_artifact(
        One(tl.nn.SubmConv3d(2, 2, 3)).eval(), tmp_path / "a", example_inputs=(cloud(2),)
    )
    umask = current_umask()
    assert os.stat(tmp_path / "a").st_mode & 0o777 == 0o777 & ~umask
    for name in ("graph.mlir", "weights.safetensors"):
        assert os.stat(tmp_path / "a" / name).st_mode & 0o777 == 0o666 & ~umask


def test_golden_feature_algebra_lines(tmp_path: Path) -> None:
    class Algebra(nn.Module):
        def forward(self, x: tl.SparseTensor, y: tl.SparseTensor) -> tl.SparseTensor:
            s = x + x
            moved = tl.reindex_sparse(s, y, fill=-0.75)
            both = tl.sparse_binary(moved, y, "maximum", join="left", lhs_fill=1.5)
            return tl.sparse_cat([tl.cat([s, x]), both], join="outer")

    y = tl.SparseTensor(torch.ones(2, 2), torch.tensor([[0, 0, 0, 0], [0, 9, 9, 9]]))
    text = export_text(tmp_path, Algebra(), (cloud(2), y))
    binary_types = f" : ({SP}, {SP}) -> {SP}\n"
    for line in (
        "    %add = lattice.sparse.binary %x, %x {op = #lattice.binary_op<add>, "
        "join = #lattice.join<outer>, lhs_fill = 0.0 : f32, rhs_fill = 0.0 : f32}",
        "    %reindex_sparse = lattice.sparse.reindex %add, %y {fill = -0.75 : f32}",
        "    %sparse_binary = lattice.sparse.binary %reindex_sparse, %y "
        "{op = #lattice.binary_op<maximum>, join = #lattice.join<left>, "
        "lhs_fill = 1.5 : f32, rhs_fill = 0.0 : f32}",
        "    %cat_1 = lattice.sparse.cat %add, %x {join = #lattice.join<inner>}",
        "    %sparse_cat_1 = lattice.sparse.cat %cat_1, %sparse_binary "
        "{join = #lattice.join<outer>}",
    ):
        assert line + binary_types in text


def test_golden_points_lines(tmp_path: Path) -> None:
    class Points(nn.Module):
        def forward(
            self, points: torch.Tensor, feats: torch.Tensor, batch: torch.Tensor
        ) -> torch.Tensor:
            v = tl.voxelize(points, feats, batch_indices=batch, voxel_size=0.5, reduction="sum")
            return tl.devoxelize(
                points,
                v,
                batch_indices=batch,
                voxel_size=0.5,
                origin=(0.0, 1.0, 0.0),
                interpolation="trilinear",
            )

    pts = torch.rand(20, 3) + torch.tensor([0.0, 1.0, 0.0])
    batch = torch.zeros(20, dtype=torch.int32)
    text = export_text(tmp_path, Points(), (pts, torch.rand(20, 2), batch))
    assert 'lattice.input_names = ["points", "feats", "batch", "points_active"]' in text
    assert 'lattice.input_roles = ["tensor", "tensor", "tensor", "tensor"]' in text
    assert (
        "    %voxelize = lattice.voxelize %points, %feats, %batch, %points_active "
        "{voxel_size = array<f64: 0.5, 0.5, 0.5>, origin = array<f64: 0.0, 0.0, 0.0>, "
        "reduction = #lattice.voxel_reduction<sum>, stride = array<i64: 1, 1, 1>} : "
        f"(tensor<?x3xf32>, tensor<?x2xf32>, tensor<?xi32>, tensor<1xi32>) -> {SP}\n"
    ) in text
    # Voxel centres: the contract's corner-based sampling is shifted by half a voxel.
    assert (
        "    %devoxelize = lattice.devoxelize %points, %voxelize, %batch, %points_active "
        "{voxel_size = array<f64: 0.5, 0.5, 0.5>, origin = array<f64: 0.25, 1.25, 0.25>, "
        "interpolation = #lattice.point_interpolation<linear>} : "
        f"(tensor<?x3xf32>, {SP}, tensor<?xi32>, tensor<1xi32>) -> tensor<?x2xf32>\n"
    ) in text


@pytest.mark.parametrize("default", [2.0, True, "relu", (1, 2)])
def test_a_forward_parameter_defaulting_to_a_value_is_refused_by_name(
        tmp_path: Path, default: object) -> None:
    """torch.fx guards such a constant with an `eq` node (reported as an unsupported
    function) or, for a tuple, generated code that did not compile (a bare SyntaxError)."""
    class Net(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.conv = tl.nn.SubmConv3d(2, 2, 3)

        def forward(self, x: tl.SparseTensor, extra: object = default) -> tl.SparseTensor:
            return self.conv(x)

    refuse(tmp_path, Net().eval(), (cloud(2),), ExportError,
           r"parameters \['extra'\] beyond example_inputs have defaults other than None")

    class NoneDefault(Net):
        def forward(self, x: tl.SparseTensor, extra: object = None) -> tl.SparseTensor:
            return self.conv(x)

    save_lattice_model_artifact(NoneDefault().eval(), tmp_path / "b", example_inputs=(cloud(2),))


def test_global_max_over_an_empty_batch_raises_in_the_replay(tmp_path: Path) -> None:
    """Eager GlobalMaxPool gives zeros for a batch without rows; the runtime's global_pool
    has no such case, so the replay raises naming the batch (docs/artifacts.md)."""
    class Net(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.pool = tl.nn.GlobalMaxPool()

        def forward(self, x: tl.SparseTensor) -> torch.Tensor:
            return self.pool(x)

    coords = torch.tensor([[0, 1, 1, 1], [0, 2, 3, 4], [2, 0, 0, 0], [2, 5, 5, 5]])
    x = tl.SparseTensor(torch.randn(4, 3), coords)
    assert torch.equal(Net()(x)[1], torch.zeros(3))
    files = save_lattice_model_artifact(Net().eval(), tmp_path / "a", example_inputs=(x,))
    with pytest.raises(ValueError, match="batch 1 of 3 has none"):
        load_lattice_program(files.graph_path.parent)(x)
