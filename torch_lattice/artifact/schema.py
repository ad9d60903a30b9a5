"""The MLX Lattice artifact contract (lattice-contract 0.6.0, IR version 2) as data.

One table of every type, attribute and op the ``lattice`` dialect names, in the
contract's own order. The artifact parser, the replay runtime and the exporter all
read it; nothing else spells an op name or an attribute list.

The schema digest written into every ``graph.mlir`` is the SHA-256 of a canonical
JSON rendering of this table (:func:`schema_fingerprint`). ``SCHEMA_DIGEST`` is
the published value; the tests recompute it from the table, so a wrong or missing
entry here cannot go unnoticed.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Any

__all__ = [
    "ATTRIBUTES",
    "ATTR_KINDS",
    "CONTRACT_VERSION",
    "ENUM_ATTRIBUTES",
    "GRAPH_FILE",
    "INPUT_ROLES",
    "IR_VERSION",
    "NAMESPACE",
    "OPS",
    "OUTPUT_ROLES",
    "SCHEMA_DIGEST",
    "TYPES",
    "WEIGHT_FAMILY_LAYOUTS",
    "WEIGHT_FILE",
    "AttrSpec",
    "OpAttrSpec",
    "OpSpec",
    "OperandSpec",
    "TypeSpec",
    "op_spec",
    "schema_fingerprint",
]

#: The IR version this runtime reads and the exporter writes (``lattice.ir_version``).
IR_VERSION = 2
#: The lattice-contract release whose schema this table reproduces.
CONTRACT_VERSION = "0.6.0"
#: The dialect namespace every op name carries (``lattice.conv3d``).
NAMESPACE = "lattice"
#: SHA-256 of the contract schema (``lattice.schema_digest``); see :func:`schema_fingerprint`.
SCHEMA_DIGEST = "1380f1e819fc0eb1af587202ecec3c14ec2c981d249333c5061f0263f82072ad"
#: The graph file of an artifact directory.
GRAPH_FILE = "graph.mlir"
#: The weight file of an artifact directory (``lattice.weight_file``).
WEIGHT_FILE = "weights.safetensors"

#: Roles a ``lattice.input_roles`` entry may name.
INPUT_ROLES = ("tensor", "sparse_coords", "sparse_features", "sparse_active")
#: Roles a ``lattice.output_roles`` entry may name.
OUTPUT_ROLES = ("tensor", "sparse_tensor")

#: Weight family (``!lattice.weight<family, dtype>``) to its one storage layout.
WEIGHT_FAMILY_LAYOUTS: dict[str, str] = {
    "conv3d": "conv3d_o_xyz_i",
    "linear": "linear_o_i",
    "channel": "channel_c",
    "bias": "bias_c",
    "embedding": "embedding_n_c",
}


@dataclass(frozen=True)
class TypeSpec:
    """A dialect type: ``!lattice.<mnemonic><params...>``."""

    name: str
    mnemonic: str
    parameters: tuple[tuple[str, str], ...]  # (name, kind)


@dataclass(frozen=True)
class AttrSpec:
    """A dialect attribute: ``#lattice.<mnemonic><value>`` with its allowed values."""

    name: str
    mnemonic: str
    parameters: tuple[tuple[str, str], ...]  # (name, kind)
    values: tuple[str, ...]


@dataclass(frozen=True)
class OperandSpec:
    """One op operand. ``type`` is ``sparse_tensor``, ``tensor``, ``weight`` or ``symbol``."""

    name: str
    type: str
    kind: str = "ssa"  # "ssa" or "symbol"
    optional: bool = False


@dataclass(frozen=True)
class OpAttrSpec:
    """One op attribute; ``kind`` is an enum mnemonic or a scalar kind (ATTR_KINDS)."""

    name: str
    kind: str
    required: bool = True


@dataclass(frozen=True)
class OpSpec:
    """One ``lattice.<name>`` op: operands, results and attributes in schema order."""

    name: str
    operands: tuple[OperandSpec, ...]
    results: tuple[tuple[str, str], ...]  # (name, type)
    attributes: tuple[OpAttrSpec, ...] = ()
    assembly: str = "functional"  # text form: "functional", "weight" or "decompose"

    @property
    def python_name(self) -> str:
        return self.name.replace(".", "_")

    @property
    def qualified_name(self) -> str:
        return f"{NAMESPACE}.{self.name}"

    def attribute(self, name: str) -> OpAttrSpec | None:
        for attr in self.attributes:
            if attr.name == name:
                return attr
        return None


def _enum(name: str, mnemonic: str, values: tuple[str, ...]) -> AttrSpec:
    return AttrSpec(name, mnemonic, (("value", "string"),), values)


#: The dialect types (``!lattice.sparse_tensor<...>``, ``!lattice.weight<...>``), with parameters.
TYPES: tuple[TypeSpec, ...] = (
    TypeSpec(
        "SparseTensor",
        "sparse_tensor",
        (("rank", "unsigned"), ("coord", "string"), ("feature", "string"), ("dtype", "type")),
    ),
    TypeSpec("Weight", "weight", (("family", "string"), ("dtype", "type"))),
)

#: The dialect attributes (``#lattice.<mnemonic><...>``) and their allowed values.
ATTRIBUTES: tuple[AttrSpec, ...] = (
    _enum("Coord", "coord", ("batch_x_y_z",)),
    _enum("FeatureLayout", "feature_layout", ("row_channel",)),
    _enum(
        "WeightLayout",
        "weight_layout",
        ("conv3d_o_xyz_i", "linear_o_i", "embedding_n_c", "channel_c", "bias_c"),
    ),
    AttrSpec(
        "Packing",
        "packing",
        (("kind", "string"), ("group_size", "unsigned"), ("scale_dtype", "type"),
         ("mode", "string")),
        ("dense", "int4", "int8"),
    ),
    _enum(
        "Activation",
        "activation",
        ("relu", "sigmoid", "gelu", "silu", "leaky_relu", "tanh", "softplus"),
    ),
    _enum("GeluApprox", "gelu_approx", ("none", "precise", "tanh", "fast")),
    _enum("Join", "join", ("inner", "left", "right", "outer")),
    _enum("BinaryOp", "binary_op", ("add", "sub", "mul", "maximum", "minimum")),
    _enum("PoolMode", "pool_mode", ("sum", "max", "avg")),
    _enum("VoxelReduction", "voxel_reduction", ("sum", "mean")),
    _enum("PointInterpolation", "point_interpolation", ("nearest", "linear")),
)

#: Dialect attributes by mnemonic (the kind an op attribute names), e.g. ``"pool_mode"``.
ENUM_ATTRIBUTES: dict[str, AttrSpec] = {attr.mnemonic: attr for attr in ATTRIBUTES}

# Scalar attribute kinds and their text forms:
#   i64_triple  array<i64: 1, 2, 3>      f64_triple  array<f64: 1.0, 1.0, 1.0>
#   i64         2                        f32         1.0e-08 : f32 (or 0.00000001 : f32)
#   str         "canonical_f32"
SCALAR_ATTR_KINDS = ("i64_triple", "f64_triple", "i64", "f32", "str")
#: Every attribute kind an op attribute may have (dialect mnemonics, then scalar kinds).
ATTR_KINDS = (*(attr.mnemonic for attr in ATTRIBUTES), *SCALAR_ATTR_KINDS)


def _in(name: str, type_: str = "sparse_tensor", *, optional: bool = False) -> OperandSpec:
    return OperandSpec(name, type_, "ssa", optional)


def _a(name: str, kind: str) -> OpAttrSpec:
    return OpAttrSpec(name, kind)


_SPARSE_RESULT = (("result", "sparse_tensor"),)
_TENSOR_RESULT = (("result", "tensor"),)
_KERNEL = (_a("kernel_size", "i64_triple"), _a("stride", "i64_triple"),
           _a("padding", "i64_triple"), _a("dilation", "i64_triple"))
_ACC = _a("accumulation", "str")
_EPS = _a("eps", "f32")
_CONV = (*_KERNEL, _ACC)
_W = (_in("weight", "weight"), _in("bias", "weight", optional=True))
_X = (_in("input"),)
_XT = (_in("input"), _in("target"))


def _conv(name: str, operands: tuple[OperandSpec, ...], attrs: tuple[OpAttrSpec, ...]) -> OpSpec:
    return OpSpec(name, (*operands, *_W), _SPARSE_RESULT, attrs)


OPS_IN_ORDER: tuple[OpSpec, ...] = (
    OpSpec(
        "weight",
        (OperandSpec("sym_name", "symbol", "symbol"),),
        (("result", "weight"),),
        (_a("storage_key", "str"), _a("layout", "weight_layout"), _a("packing", "packing")),
        assembly="weight",
    ),
    OpSpec(
        "sparse.make",
        (_in("coords", "tensor"), _in("features", "tensor"), _in("active", "tensor")),
        _SPARSE_RESULT,
        (_a("stride", "i64_triple"), _a("coord_order", "coord")),
    ),
    OpSpec(
        "sparse.decompose",
        _X,
        (("coords", "tensor"), ("features", "tensor"), ("active", "tensor")),
        assembly="decompose",
    ),
    OpSpec("sparse.with_features", (_in("input"), _in("features", "tensor")), _SPARSE_RESULT),
    OpSpec("sparse.reindex", _XT, _SPARSE_RESULT, (_a("fill", "f32"),)),
    _conv("conv3d", _X, _CONV),
    _conv("subm_conv3d", _X, (_a("kernel_size", "i64_triple"), _a("dilation", "i64_triple"), _ACC)),
    _conv(
        "normalized_subm_conv3d",
        _X,
        (_a("kernel_size", "i64_triple"), _a("dilation", "i64_triple"), _EPS, _ACC),
    ),
    _conv("target_conv3d", _XT, _CONV),
    _conv("conv_transpose3d", _X, _CONV),
    _conv("target_conv_transpose3d", _XT, _CONV),
    _conv("normalized_conv_transpose3d", _X, (*_CONV, _EPS)),
    _conv("target_normalized_conv_transpose3d", _XT, (*_CONV, _EPS)),
    _conv(
        "generative_conv_transpose3d",
        _X,
        (_a("kernel_size", "i64_triple"), _a("stride", "i64_triple"), _ACC),
    ),
    _conv(
        "normalized_generative_conv_transpose3d",
        _X,
        (_a("kernel_size", "i64_triple"), _a("stride", "i64_triple"), _EPS, _ACC),
    ),
    OpSpec("pool3d", _X, _SPARSE_RESULT, (_a("mode", "pool_mode"), *_KERNEL)),
    OpSpec(
        "pool_transpose3d", (_in("input"), _in("target", optional=True)), _SPARSE_RESULT, _KERNEL
    ),
    OpSpec(
        "trilinear_upsample3d",
        (_in("input"), _in("target", optional=True)),
        _SPARSE_RESULT,
        (_a("stride", "i64_triple"),),
    ),
    OpSpec("global_pool", _X, _TENSOR_RESULT, (_a("mode", "pool_mode"), _a("batch_size", "i64"))),
    OpSpec(
        "voxelize",
        (_in("points", "tensor"), _in("features", "tensor"), _in("batch_indices", "tensor"),
         _in("active_rows", "tensor")),
        _SPARSE_RESULT,
        (_a("voxel_size", "f64_triple"), _a("origin", "f64_triple"),
         _a("reduction", "voxel_reduction"), _a("stride", "i64_triple")),
    ),
    OpSpec(
        "devoxelize",
        (_in("points", "tensor"), _in("voxels"), _in("batch_indices", "tensor"),
         _in("point_active_rows", "tensor")),
        _TENSOR_RESULT,
        (_a("voxel_size", "f64_triple"), _a("origin", "f64_triple"),
         _a("interpolation", "point_interpolation")),
    ),
    OpSpec("linear", (_in("input", "tensor"), *_W), _TENSOR_RESULT),
    OpSpec("embedding_lookup", (_in("input", "tensor"), _in("weight", "weight")), _TENSOR_RESULT),
    OpSpec("elementwise", (_in("input", "tensor"),), _TENSOR_RESULT, (_a("kind", "str"),)),
    OpSpec("softmax", (_in("input", "tensor"),), _TENSOR_RESULT, (_a("axis", "i64"),)),
    OpSpec(
        "activation",
        (_in("input", "tensor"),),
        _TENSOR_RESULT,
        (_a("kind", "activation"), _a("approximate", "gelu_approx"), _a("alpha", "f32"),
         _a("beta", "f32"), _a("threshold", "f32")),
    ),
    OpSpec(
        "batch_norm",
        (_in("input", "tensor"), _in("scale", "weight"), _in("bias", "weight"),
         _in("mean", "weight"), _in("var", "weight")),
        _TENSOR_RESULT,
        (_EPS,),
    ),
    OpSpec(
        "layer_norm",
        (_in("input", "tensor"), _in("scale", "weight"), _in("bias", "weight")),
        _TENSOR_RESULT,
        (_EPS,),
    ),
    OpSpec("rms_norm", (_in("input", "tensor"), _in("scale", "weight")), _TENSOR_RESULT, (_EPS,)),
    OpSpec(
        "sparse.binary",
        (_in("lhs"), _in("rhs")),
        _SPARSE_RESULT,
        (_a("op", "binary_op"), _a("join", "join"), _a("lhs_fill", "f32"), _a("rhs_fill", "f32")),
    ),
    OpSpec("sparse.cat", (_in("lhs"), _in("rhs")), _SPARSE_RESULT, (_a("join", "join"),)),
)

#: Every op by name without the namespace (``"conv3d"``, ``"sparse.make"``, ...), schema order.
OPS: dict[str, OpSpec] = {op.name: op for op in OPS_IN_ORDER}


# The scalar transforms lattice.elementwise names (its kind is a free string in the schema).
ELEMENTWISE_KINDS = ("exp", "round")


@dataclass(frozen=True)
class ConvTraits:
    """What a convolution op's name means: its relation family (``subm_conv3d``,
    ``conv3d``, ``conv_transpose3d``, ``generative_conv_transpose3d``), whether it
    takes an explicit target support, whether it normalizes by the weights, and
    whether its relation is a transposed one (never centred, see relations.py)."""

    family: str
    target: bool
    normalized: bool

    @property
    def transposed(self) -> bool:
        return self.family in ("conv_transpose3d", "generative_conv_transpose3d")


CONV_FAMILIES = ("subm_conv3d", "conv3d", "conv_transpose3d", "generative_conv_transpose3d")
CONV_OPS: dict[str, ConvTraits] = {
    "subm_conv3d": ConvTraits("subm_conv3d", False, False),
    "normalized_subm_conv3d": ConvTraits("subm_conv3d", False, True),
    "conv3d": ConvTraits("conv3d", False, False),
    "target_conv3d": ConvTraits("conv3d", True, False),
    "conv_transpose3d": ConvTraits("conv_transpose3d", False, False),
    "target_conv_transpose3d": ConvTraits("conv_transpose3d", True, False),
    "normalized_conv_transpose3d": ConvTraits("conv_transpose3d", False, True),
    "target_normalized_conv_transpose3d": ConvTraits("conv_transpose3d", True, True),
    "generative_conv_transpose3d": ConvTraits("generative_conv_transpose3d", False, False),
    "normalized_generative_conv_transpose3d": ConvTraits(
        "generative_conv_transpose3d", False, True),
}

# The ops MLX Lattice 0.6.3 runs with packed (int4/int8) weights; it refuses packed
# weights elsewhere ("target transpose convolution does not support packed weights.").
PACKED_WEIGHT_OPS = frozenset({
    "subm_conv3d", "conv3d", "target_conv3d", "conv_transpose3d",
    "generative_conv_transpose3d", "linear",
})


def op_spec(qualified_name: str) -> OpSpec:
    """Return the spec of ``lattice.<name>``; unknown names raise ``ValueError``."""
    prefix = NAMESPACE + "."
    if not qualified_name.startswith(prefix) or qualified_name[len(prefix):] not in OPS:
        raise ValueError(f"unknown op {qualified_name!r}: not in the {NAMESPACE} dialect schema")
    return OPS[qualified_name[len(prefix):]]


def _canonical() -> dict[str, Any]:
    # Field names and nesting follow the contract's canonical schema rendering.
    def params(items: tuple[tuple[str, str], ...]) -> list[dict[str, str]]:
        return [{"name": n, "kind": k} for n, k in items]

    return {
        "namespace": NAMESPACE,
        "types": [
            {"name": t.name, "mnemonic": t.mnemonic, "parameters": params(t.parameters)}
            for t in TYPES
        ],
        "attrs": [
            {"name": a.name, "mnemonic": a.mnemonic, "parameters": params(a.parameters),
             "values": list(a.values)}
            for a in ATTRIBUTES
        ],
        "ops": [
            {
                "name": op.name,
                "python_name": op.python_name,
                "operands": [
                    {"name": o.name, "type": o.type, "kind": o.kind, "optional": o.optional}
                    for o in op.operands
                ],
                "results": [{"name": n, "type": t} for n, t in op.results],
                "attributes": [
                    {"name": a.name, "kind": a.kind, "required": a.required} for a in op.attributes
                ],
                "assembly": op.assembly,
            }
            for op in OPS_IN_ORDER
        ],
    }


def schema_fingerprint() -> str:
    """SHA-256 of the table rendered as sorted, compact JSON (equals SCHEMA_DIGEST)."""
    payload = json.dumps(_canonical(), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(payload.encode("utf-8")).hexdigest()
