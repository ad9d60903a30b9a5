"""graph.mlir parsing: the contract's text form, and refusals with line numbers."""

from __future__ import annotations

import pytest

from torch_lattice.artifact.mlir_parse import MlirSyntaxError, Packing
from torch_lattice.artifact.validation import load_module

try:
    import artifact_replay_helpers as h
except ImportError:  # tests/ may become a package
    from tests import artifact_replay_helpers as h


def _conv_graph(attrs: str = "", packing: str = "#lattice.packing<dense>") -> str:
    g = h.Graph()
    g.sparse_input("x", 2, (2, 1, 1))
    g.weight("w", "conv.weight", "conv3d", packing)
    g.weight("b", "conv.bias", "bias")
    attrs = attrs or (f"{h.triple('kernel_size', (3, 1, 5))}, {h.triple('dilation', (1, 1, 1))}, "
                      'accumulation = "canonical_f32"')
    g.op("y", "subm_conv3d", ["x", "w", "b"], [h.SP, h.weight_type("conv3d"),
                                                 h.weight_type("bias")], attrs, h.SP)
    g.output("y", h.SP)
    return g.text()


def _line_of(text: str, needle: str) -> int:
    return next(i for i, line in enumerate(text.splitlines(), 1) if needle in line)


def test_parses_module_signature_and_ops() -> None:
    m = load_module(_conv_graph(packing="#lattice.packing<int4, group_size = 32, "
                                         "scale_dtype = f16, mode = affine>"))
    assert m.attributes["lattice.ir_version"] == 2
    assert [a.name for a in m.arguments] == ["x_coords", "x_features", "x_active"]
    assert m.arguments[1].type.shape == (None, 2) and m.arguments[1].type.dtype == "f32"
    make, w, _, conv = m.operations
    assert make.attributes == {"stride": (2, 1, 1), "coord_order": "batch_x_y_z"}
    assert w.symbol == "w" and w.attributes["packing"] == Packing("int4", 32, "f16", "affine")
    assert w.result_types[0].family == "conv3d"
    assert conv.attributes == {"kernel_size": (3, 1, 5), "dilation": (1, 1, 1),
                               "accumulation": "canonical_f32"}
    assert conv.operands == ("x", "w", "b") and m.returns == ("y",)


def test_float_attributes_in_both_spellings() -> None:
    g = h.Graph()
    g.sparse_input("s", 2)
    g.sparse_input("t", 1)
    g.op("r", "sparse.reindex", ["s", "t"], [h.SP, h.SP], "fill = -7.5e-01 : f32", h.SP)
    g.output("r", h.SP)
    assert load_module(g.text()).operations[-1].attributes["fill"] == -0.75


def test_unknown_op_names_it_with_line() -> None:
    text = _conv_graph().replace("lattice.subm_conv3d", "lattice.magic_conv3d")
    line = _line_of(text, "magic_conv3d")
    with pytest.raises(MlirSyntaxError, match=rf"line {line}: unknown op 'lattice\.magic_conv3d'"):
        load_module(text)


def test_unknown_attribute_is_refused() -> None:
    text = _conv_graph().replace('accumulation = "canonical_f32"',
                                 'accumulation = "canonical_f32", groups = 2')
    with pytest.raises(MlirSyntaxError, match=r"unknown attribute 'groups' on lattice\.subm_conv"):
        load_module(text)


def test_missing_required_attribute_is_refused() -> None:
    attrs = f"{h.triple('kernel_size', (3, 3, 3))}, accumulation = \"canonical_f32\""
    with pytest.raises(MlirSyntaxError, match="missing required attribute 'dilation'"):
        load_module(_conv_graph(attrs))


def test_bad_values_are_refused() -> None:
    base = _conv_graph()
    cases = {
        "array<i64: 3, 1, 5>": ("array<i64: 3, 1>", "array<i64: a, b, c>"),
        "#lattice.coord<batch_x_y_z>": ("#lattice.coord<x_y_z_batch>", "not one of batch_x_y_z"),
        "#lattice.packing<dense>": ("#lattice.packing<int3>", "packing kind 'int3'"),
        '"canonical_f32"': ("7", "must be a string"),
    }
    for old, (new, message) in cases.items():
        with pytest.raises(MlirSyntaxError, match=message):
            load_module(base.replace(old, new, 1))


def test_operand_rules() -> None:
    base = _conv_graph()
    with pytest.raises(MlirSyntaxError, match="used before it is defined"):
        load_module(base.replace("%x, %w, %b {", "%x, %w, %nope {"))
    one = base.replace("%x, %w, %b {", "%x {").replace(
        f"({h.SP}, {h.weight_type('conv3d')}, {h.weight_type('bias')})", f"({h.SP})")
    with pytest.raises(MlirSyntaxError, match=r"takes operands \(input, weight, bias\?\), got 1"):
        load_module(one)
    with pytest.raises(MlirSyntaxError, match="operand 'weight' must be a weight"):
        load_module(base.replace("%x, %w, %b {", "%x, %x, %b {").replace(
            f"({h.SP}, {h.weight_type('conv3d')},", f"({h.SP}, {h.SP},"))


def test_syntax_errors_carry_line_numbers() -> None:
    base = _conv_graph()
    line = _line_of(base, "lattice.subm_conv3d")
    with pytest.raises(MlirSyntaxError, match=rf"line {line}: unexpected character"):
        load_module(base.replace("lattice.subm_conv3d %x", "lattice.subm_conv3d ^%x"))
    with pytest.raises(MlirSyntaxError, match=r"unknown module attribute 'lattice\.author'"):
        load_module(base.replace("lattice.ir_version", 'lattice.author = "me",\n  '
                                                        "lattice.ir_version"))
    with pytest.raises(MlirSyntaxError, match="without 'return'"):
        load_module(base[: base.index("    return")])
