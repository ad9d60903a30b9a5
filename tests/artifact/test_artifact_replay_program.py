"""load_lattice_program: strict loading, the coordinate boundary, active rows, the CLI."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from torch_lattice.artifact import SparseOutput, load_lattice_program
from torch_lattice.artifact.__main__ import main as cli_main
from torch_lattice.nn import functional as F
from torch_lattice.tensor import SparseTensor

try:
    import artifact_replay_helpers as h
except ImportError:  # tests/ may become a package
    from tests import artifact_replay_helpers as h

KS = (2, 2, 2)


def _strided_conv(g: h.Graph, stride: tuple[int, int, int] = (1, 1, 1)) -> h.Graph:
    """x (stride ``stride``, 2 channels) -> conv3d k2 s2 with bias -> 3 channels."""
    g.sparse_input("x", 2, stride)
    g.weight("w", "down.weight", "conv3d")
    g.weight("b", "down.bias", "bias")
    attrs = (f"{h.triple('kernel_size', KS)}, {h.triple('stride', (2, 2, 2))}, "
             f"{h.triple('padding', (0, 0, 0))}, {h.triple('dilation', (1, 1, 1))}, "
             'accumulation = "canonical_f32"')
    g.op("y", "conv3d", ["x", "w", "b"], [h.SP, h.weight_type("conv3d"), h.weight_type("bias")],
         attrs, h.SP)
    g.output("y", h.SP)
    return g


def _weights(seed: int = 0) -> tuple[torch.Tensor, torch.Tensor, dict[str, torch.Tensor]]:
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(8, 2, 3, generator=g)
    b = torch.randn(3, generator=g)
    return w, b, {"down.weight": h.artifact_weight(w, KS), "down.bias": b}


@pytest.fixture
def conv_artifact(tmp_path: Path) -> Path:
    return h.write_artifact(tmp_path / "conv", _strided_conv(h.Graph()), _weights()[2])


def test_replay_matches_library_and_scales_output_coords(conv_artifact: Path) -> None:
    coords = h.random_coords(30, 6)
    feats = torch.randn(30, 2)
    w, b, _ = _weights()
    ref = F.conv3d(SparseTensor(feats, coords), w, b, KS, 2)
    program = load_lattice_program(conv_artifact)
    assert program.input_names == ("x_coords", "x_features", "x_active")
    assert program.output_names == ("output",) and program.output_roles == ("sparse_tensor",)
    out = program(**h.sparse_inputs("x", coords, feats))["output"]
    assert isinstance(out, SparseOutput)
    # Output stride is 2: physical boundary coordinates are logical x 2.
    assert torch.equal(out.coords[:, 0], ref.coords[:, 0])
    assert torch.equal(out.coords[:, 1:], ref.coords[:, 1:] * 2)
    torch.testing.assert_close(out.features, ref.feats)
    assert out.active.dtype == torch.int32 and out.active.tolist() == [ref.coords.shape[0]]
    logical = load_lattice_program(conv_artifact, coordinates="logical")
    assert torch.equal(logical(**h.sparse_inputs("x", coords, feats))["output"].coords, ref.coords)


def test_padding_rows_beyond_active_are_ignored(conv_artifact: Path) -> None:
    coords = h.random_coords(20, 5)
    feats = torch.randn(20, 2)
    padded = torch.cat([coords, torch.full((5, 4), -9, dtype=torch.int32)])
    pfeats = torch.cat([feats, torch.full((5, 2), float("nan"))])
    program = load_lattice_program(conv_artifact)
    a = program(**h.sparse_inputs("x", coords, feats))["output"]
    b = program(**h.sparse_inputs("x", padded, pfeats, active=20))["output"]
    assert torch.equal(a.coords, b.coords) and torch.equal(a.features, b.features)
    with pytest.raises(ValueError, match=r"%x_active = 26 is outside \[0, 25\]"):
        program(**h.sparse_inputs("x", padded, pfeats, active=26))


def test_physical_input_coordinates_must_divide_by_stride(tmp_path: Path) -> None:
    art = h.write_artifact(tmp_path / "s2", _strided_conv(h.Graph(), (2, 1, 1)), _weights()[2])
    coords = torch.tensor([[0, 0, 0, 0], [0, 2, 1, 0], [0, 4, 0, 3]], dtype=torch.int32)
    feats = torch.randn(3, 2)
    physical = load_lattice_program(art)(**h.sparse_inputs("x", coords, feats))["output"]
    halved = coords.clone()
    halved[:, 1] //= 2
    logical = load_lattice_program(art, coordinates="logical")(
        **h.sparse_inputs("x", halved, feats))["output"]
    torch.testing.assert_close(physical.features, logical.features)
    # stride (2,1,1) in, conv stride 2: output stride (4, 2, 2)
    assert torch.equal(physical.coords[:, 1:], logical.coords[:, 1:] * torch.tensor([4, 2, 2]))
    odd = coords.clone()
    odd[1, 1] = 3
    with pytest.raises(ValueError, match=r"row 1 = \[0, 3, 1, 0\] is not divisible by the "
                                         r"declared stride \(2, 1, 1\).*coordinates='logical'"):
        load_lattice_program(art)(**h.sparse_inputs("x", odd, feats))


def _rewrite(art: Path, old: str, new: str) -> None:
    path = art / "graph.mlir"
    text = path.read_text()
    assert old in text
    path.write_text(text.replace(old, new, 1))


@pytest.mark.parametrize(
    ("old", "new", "message"),
    [
        ("lattice.ir_version = 2", "lattice.ir_version = 1", "ir_version = 1; this runtime reads "
                                                             "IR version 2"),
        ("schema_digest = \"1380", "schema_digest = \"2380", "schema_digest '2380"),
        ('storage_key = "down.bias"', 'storage_key = "down.beta"',
         "has no tensor down.beta"),
        ("#lattice.weight_layout<bias_c>", "#lattice.weight_layout<channel_c>",
         "a bias weight must use layout bias_c"),
        ('"canonical_f32"', '"fast_f16"', "accumulation must be 'canonical_f32'"),
        ('lattice.output_roles = ["sparse_tensor"]', 'lattice.output_roles = ["tensor"]',
         "output 'output' has role 'tensor' but returns a sparse_tensor"),
        ('"x_coords", "x_features"', '"x_coords", "x_feats"', "must match the @forward"),
    ],
)
def test_refusals(conv_artifact: Path, old: str, new: str, message: str) -> None:
    _rewrite(conv_artifact, old, new)
    coords = h.random_coords(10, 4)
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        load_lattice_program(conv_artifact)(**h.sparse_inputs("x", coords, torch.randn(10, 2)))


def test_file_set_and_weight_file_refusals(conv_artifact: Path, tmp_path: Path) -> None:
    (conv_artifact / "notes.txt").write_text("x")
    with pytest.raises(ValueError, match=r"1 unexpected other entry") as info:
        load_lattice_program(conv_artifact)
    assert "notes.txt" not in str(info.value)  # a refusal never lists a folder's contents
    os.remove(conv_artifact / "notes.txt")
    os.remove(conv_artifact / "weights.safetensors")
    with pytest.raises(ValueError, match=r"missing \['weights.safetensors'\]"):
        load_lattice_program(conv_artifact)
    extra = dict(_weights()[2], unused=torch.zeros(2))
    save_file(extra, str(conv_artifact / "weights.safetensors"))
    with pytest.raises(ValueError, match=r"tensors no lattice.weight names: \['unused'\]"):
        load_lattice_program(conv_artifact)
    with pytest.raises(ValueError, match="not a directory"):
        load_lattice_program(tmp_path / "nowhere")
    with pytest.raises(ValueError, match="coordinates must be 'physical' or 'logical'"):
        load_lattice_program(conv_artifact, coordinates="raw")


def test_wrong_weight_shape_is_refused_when_run(tmp_path: Path) -> None:
    w = _weights()[2]
    w["down.weight"] = w["down.weight"][:, :1]  # kernel 1x2x2 instead of 2x2x2
    art = h.write_artifact(tmp_path / "bad", _strided_conv(h.Graph()), w)
    program = load_lattice_program(art)
    with pytest.raises(ValueError, match=r"kernel_size \(2, 2, 2\) on 2 input channels needs"):
        program(**h.sparse_inputs("x", h.random_coords(5, 3), torch.randn(5, 2)))


def test_input_names_and_types_are_checked(conv_artifact: Path) -> None:
    program = load_lattice_program(conv_artifact)
    inputs = h.sparse_inputs("x", h.random_coords(5, 3), torch.randn(5, 2))
    with pytest.raises(ValueError, match=r"missing \['x_active'\], unexpected \['y'\]"):
        program(x_coords=inputs["x_coords"], x_features=inputs["x_features"], y=inputs["x_active"])
    with pytest.raises(ValueError, match="input 'x_features' must have shape \\?x2"):
        program(**dict(inputs, x_features=torch.randn(5, 3)))
    with pytest.raises(TypeError, match="input 'x_coords' must be i32"):
        program(**dict(inputs, x_coords=inputs["x_coords"].float()))


def test_cli_replays_a_manifest(conv_artifact: Path, tmp_path: Path,
                                capsys: pytest.CaptureFixture[str]) -> None:
    root = tmp_path
    coords, feats = h.random_coords(12, 4), torch.randn(12, 2)
    inputs = h.sparse_inputs("x", coords, feats)
    out = load_lattice_program(conv_artifact)(**inputs)["output"]
    save_file(inputs, str(conv_artifact / "inputs.safetensors"))
    expected = {"output.coords": out.coords.flip(0), "output.features": out.features.flip(0),
                "output.active": out.active}  # row order is not part of the contract
    save_file(expected, str(conv_artifact / "expected.safetensors"))
    (root / "manifest.json").write_text(json.dumps({"cases": [
        {"name": "conv", "rtol": 1e-6, "atol": 1e-6}]}))
    assert cli_main(["replay", str(root)]) == 0
    assert "1/1 cases match (physical coordinates)" in capsys.readouterr().out
    (root / "manifest.json").write_text(json.dumps({
        "schema": "torch_lattice_e2e_fixtures/v1",  # torch-lattice 0.5: logical coordinates
        "cases": [{"name": "conv", "rtol": 1e-6, "atol": 1e-6}]}))
    assert cli_main(["replay", str(root)]) == 1  # the expected file holds physical coordinates
    assert "coordinate sets differ" in capsys.readouterr().out
    logical = load_lattice_program(conv_artifact, coordinates="logical")(**inputs)["output"]
    save_file({"output.coords": logical.coords, "output.features": logical.features,
               "output.active": logical.active}, str(conv_artifact / "expected.safetensors"))
    assert cli_main(["replay", str(root)]) == 0
    assert "1/1 cases match (logical coordinates)" in capsys.readouterr().out
    expected = {"output.coords": logical.coords, "output.active": logical.active,
                "output.features": logical.features + 1e-3}
    save_file(expected, str(conv_artifact / "expected.safetensors"))
    assert cli_main(["replay", str(conv_artifact)]) == 1
    assert "output FAIL" in capsys.readouterr().out


def test_version_is_refused_before_the_body_is_read(conv_artifact: Path) -> None:
    """An IR v1 graph may use ops and layouts v2 lacks: the version error comes first."""
    _rewrite(conv_artifact, "lattice.ir_version = 2", "lattice.ir_version = 1")
    _rewrite(conv_artifact, "lattice.conv3d", "lattice.legacy_conv3d")
    with pytest.raises(ValueError, match="ir_version = 1; this runtime reads IR version 2"):
        load_lattice_program(conv_artifact)


def test_elementwise_kind_is_checked_at_load(tmp_path: Path) -> None:
    g = h.Graph()
    g.tensor_input("v", "tensor<?x3xf32>")
    g.op("y", "elementwise", ["v"], ["tensor<?x3xf32>"], 'kind = "log"', "tensor<?x3xf32>")
    g.output("y", "tensor<?x3xf32>")
    art = h.write_artifact(tmp_path / "e", g, {})
    with pytest.raises(ValueError, match="elementwise kind must be one of exp, round, got 'log'"):
        load_lattice_program(art)


def test_bad_input_coordinates_name_the_input(conv_artifact: Path) -> None:
    program = load_lattice_program(conv_artifact)
    dup = torch.tensor([[0, 1, 1, 1], [0, 2, 2, 2], [0, 1, 1, 1]], dtype=torch.int32)
    with pytest.raises(ValueError, match=r"lattice\.sparse\.make: %x_coords: .*unique"):
        program(**h.sparse_inputs("x", dup, torch.randn(3, 2)))
    neg = torch.tensor([[0, -1, 0, 0]], dtype=torch.int32)
    with pytest.raises(ValueError, match=r"%x_coords: .*non-negative"):
        program(**h.sparse_inputs("x", neg, torch.randn(1, 2)))


# --- SparseTensor arguments (issue 25) ---------------------------------------------------


def test_sparse_tensor_positional_and_by_name_equal_the_abi_form(tmp_path: Path) -> None:
    """program(x) and program(x=x) map x to x_coords (physical: logical x stride),
    x_features and x_active, and give exactly what the named ABI tensors give."""
    art = h.write_artifact(tmp_path / "s2", _strided_conv(h.Graph(), (2, 1, 1)), _weights()[2])
    logical_rows = torch.tensor([[0, 0, 0, 0], [0, 1, 1, 0], [0, 2, 0, 3], [1, 3, 2, 1]],
                                dtype=torch.int32)
    feats = torch.randn(4, 2)
    x = SparseTensor(feats, logical_rows, stride=(2, 1, 1))
    program = load_lattice_program(art)
    assert [(s.name, s.coords, s.features, s.active, s.stride) for s in program.sparse_inputs] == [
        ("x", "x_coords", "x_features", "x_active", (2, 1, 1))
    ]
    physical = logical_rows * torch.tensor([1, 2, 1, 1], dtype=torch.int32)
    want = program(**h.sparse_inputs("x", physical, feats))["output"]
    for got in (program(x)["output"], program(x=x)["output"]):
        assert isinstance(got, SparseOutput)
        assert torch.equal(got.coords, want.coords) and torch.equal(got.active, want.active)
        assert torch.equal(got.features, want.features)
    # Loaded with coordinates="logical", the boundary takes the logical rows as they are.
    logical = load_lattice_program(art, coordinates="logical")
    want_logical = logical(**h.sparse_inputs("x", logical_rows, feats))["output"]
    assert torch.equal(logical(x)["output"].coords, want_logical.coords)
    assert torch.equal(logical(x)["output"].features, want.features)


def test_sparse_tensor_arguments_are_checked(conv_artifact: Path) -> None:
    program = load_lattice_program(conv_artifact)
    coords, feats = h.random_coords(5, 3), torch.randn(5, 2)
    x = SparseTensor(feats, coords)
    abi = h.sparse_inputs("x", coords, feats)
    with pytest.raises(ValueError, match=r"input 'x' must have stride \(1, 1, 1\) \(as the "
                                         r"artifact declares\), got \(2, 2, 2\)"):
        program(SparseTensor(feats, coords, stride=2))
    with pytest.raises(TypeError, match=r"input 'x' must be a SparseTensor \(or pass 'x_coords', "
                                        r"'x_features' and 'x_active' by name\), got Tensor"):
        program(feats)
    with pytest.raises(TypeError, match=r"program takes 1 positional input\(s\) \['x'\], got 2"):
        program(x, x)
    with pytest.raises(TypeError, match="program got multiple values for input 'x'"):
        program(x, x=x)
    with pytest.raises(TypeError, match="program got 'x_coords' both by name and inside 'x'"):
        program(x, x_coords=abi["x_coords"])
    # The named ABI form is unchanged, and mixing it with a missing name still says which.
    assert torch.equal(program(**abi)["output"].features, program(x)["output"].features)
    with pytest.raises(ValueError, match=r"missing \['x_active'\]"):
        program(x_coords=abi["x_coords"], x_features=abi["x_features"])


def test_positional_order_follows_the_arguments(tmp_path: Path) -> None:
    """A dense input between two sparse ones keeps its place; each sparse input is one
    positional SparseTensor, and every input can also be given by name."""
    g = h.Graph()
    g.sparse_input("a", 2)
    g.tensor_input("t", "tensor<?x3xf32>")
    g.sparse_input("b", 2, (2, 2, 2))
    g.output("b", h.SP, "b_out")
    g.output("t", "tensor<?x3xf32>", "t_out")
    art = h.write_artifact(tmp_path / "three", g, {})
    program = load_lattice_program(art)
    assert [s.name for s in program.sparse_inputs] == ["a", "b"]
    a = SparseTensor(torch.randn(3, 2), h.random_coords(3, 4))
    b = SparseTensor(torch.randn(4, 2), h.random_coords(4, 4, seed=1), stride=2)
    t = torch.randn(7, 3)
    for out in (program(a, t, b), program(a, t=t, b=b), program(b=b, a=a, t=t)):
        assert torch.equal(out["t_out"], t)
        b_out = out["b_out"]
        assert isinstance(b_out, SparseOutput)
        assert torch.equal(b_out.coords, b.coords * torch.tensor([1, 2, 2, 2], dtype=torch.int32))
        assert torch.equal(b_out.features, b.feats)


def test_sparse_inputs_without_a_common_stem_or_with_a_taken_name(tmp_path: Path) -> None:
    """Names without the _coords/_features/_active stem: the SparseTensor goes by its
    coordinates' name.  A stem that another input already has: named ABI form only."""
    g = h.Graph()
    g.args += [("pts", "tensor<?x4xi32>", "sparse_coords"),
               ("f", "tensor<?x2xf32>", "sparse_features"),
               ("n", "tensor<1xi32>", "sparse_active")]
    g.body.append(
        f"%s = lattice.sparse.make %pts, %f, %n {{{h.triple('stride', (1, 1, 1))}, "
        f"coord_order = #lattice.coord<batch_x_y_z>}} : "
        f"(tensor<?x4xi32>, tensor<?x2xf32>, tensor<1xi32>) -> {h.SP}"
    )
    g.output("s", h.SP)
    program = load_lattice_program(h.write_artifact(tmp_path / "plain", g, {}))
    assert [s.name for s in program.sparse_inputs] == ["pts"]
    x = SparseTensor(torch.randn(3, 2), h.random_coords(3, 4))
    for out in (program(x), program(pts=x)):
        got = out["output"]
        assert isinstance(got, SparseOutput) and torch.equal(got.features, x.feats)

    taken = h.Graph()
    taken.args += [("x_coords", "tensor<?x4xi32>", "sparse_coords"),
                   ("x_features", "tensor<?x2xf32>", "sparse_features"),
                   ("x_active", "tensor<1xi32>", "sparse_active")]
    make = g.body[0].replace("%s = ", "%sx = ")
    taken.body.append(make.replace("%pts, %f, %n", "%x_coords, %x_features, %x_active"))
    taken.tensor_input("x", "tensor<?x3xf32>")
    taken.output("x", "tensor<?x3xf32>", "dense")
    program = load_lattice_program(h.write_artifact(tmp_path / "taken", taken, {}))
    assert program.sparse_inputs == ()
    with pytest.raises(TypeError, match=r"takes 4 positional input\(s\) \['x_coords', "
                                        r"'x_features', 'x_active', 'x'\], got 5"):
        program(x, x, x, x, x)


def test_ctrl_c_during_replay_is_one_line_and_exit_130(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    import torch_lattice.artifact.__main__ as cli

    def interrupted(args: object) -> int:
        raise KeyboardInterrupt

    monkeypatch.setattr(cli, "_run", interrupted)
    assert cli_main(["replay", str(tmp_path)]) == 130
    assert capsys.readouterr().err == "error: interrupted (Ctrl-C)\n"
