"""The artifact contract table: its digest, and the facts the runtime relies on."""

import pytest

from torch_lattice.artifact import schema


def test_table_reproduces_published_schema_digest() -> None:
    # The digest is a SHA-256 over every type, attribute and op in order: one wrong
    # operand, attribute or enum value changes it.
    assert schema.schema_fingerprint() == schema.SCHEMA_DIGEST
    assert schema.IR_VERSION == 2
    assert schema.CONTRACT_VERSION == "0.6.0"


def test_conv_ops_carry_accumulation_and_optional_bias() -> None:
    convs = [op for op in schema.OPS_IN_ORDER if "conv" in op.name]
    assert len(convs) == 10
    for op in convs:
        assert op.attributes[-1].name in ("accumulation", "eps")
        assert op.attribute("accumulation") is not None
        assert op.operands[-1].name == "bias" and op.operands[-1].optional
    subm = schema.OPS["subm_conv3d"]
    assert [a.name for a in subm.attributes] == ["kernel_size", "dilation", "accumulation"]


def test_enum_values_and_lookup() -> None:
    assert schema.ENUM_ATTRIBUTES["join"].values == ("inner", "left", "right", "outer")
    assert schema.ENUM_ATTRIBUTES["activation"].values[-1] == "softplus"
    assert schema.op_spec("lattice.sparse.cat").name == "sparse.cat"
    with pytest.raises(ValueError, match=r"unknown op 'lattice\.nonexistent'"):
        schema.op_spec("lattice.nonexistent")


def test_every_convolution_op_has_its_traits_and_an_executor() -> None:
    from torch_lattice.artifact.replay_ops import EXECUTORS

    convs = {name for name, op in schema.OPS.items()
             if any(o.name == "weight" for o in op.operands) and "conv" in name}
    assert convs == set(schema.CONV_OPS)
    assert set(schema.CONV_OPS) <= set(EXECUTORS)
    assert schema.CONV_OPS["target_normalized_conv_transpose3d"] == schema.ConvTraits(
        "conv_transpose3d", True, True)
    assert schema.CONV_OPS["normalized_generative_conv_transpose3d"].transposed
    assert not schema.CONV_OPS["target_conv3d"].transposed
