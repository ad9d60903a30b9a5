"""Every check of the lattice contract on a parsed artifact, in one place.

:mod:`~torch_lattice.artifact.mlir_parse` only parses the text; this module says
whether the parsed module is one the contract (lattice-contract 0.6.0, IR v2)
and MLX Lattice accept: the IR version and schema digest, module attributes,
each op's operands, results and attribute ranges, the inputs' and outputs' names
and roles, the header, and packed weights. The loader, the exporter's pre-write
check and the graph fuzzer all run :func:`load_module`.
"""

from __future__ import annotations

import math
import struct
from typing import Any

import torch

from torch_lattice.artifact import schema
from torch_lattice.artifact.mlir_parse import (
    Argument,
    MlirSyntaxError,
    Module,
    Operation,
    Packing,
    TypeRef,
    parse_module,
    read_header,
    show_type,
)
from torch_lattice.artifact.packing import GROUP_SIZES

__all__ = [
    "MAX_BATCH_SIZE",
    "MAX_GEOMETRY",
    "MAX_KERNEL_VOLUME",
    "check_module",
    "check_packed",
    "check_version",
    "load_module",
]

# Kernel rows a convolution or pooling may have (32^3); a kernel map holds rows x K entries.
MAX_KERNEL_VOLUME = 2**15
MAX_GEOMETRY = 2**20  # any kernel_size / stride / dilation / padding entry
MAX_BATCH_SIZE = 2**20  # global_pool batch_size (its output has that many rows)
_PACKABLE = ("conv3d", "linear")
_FLOAT = {"f16": torch.float16, "f32": torch.float32}


def load_module(text: str) -> Module:
    """``graph.mlir`` text, parsed and checked: the IR version and digest first (an
    artifact of another version is refused before its body is parsed), then the rest.

    Raises:
        ValueError: the broken rule, with the line where there is one.
    """
    check_version(read_header(text))
    module = parse_module(text)
    check_module(module)
    return module


def check_module(module: Module) -> None:
    """Everything but the version: attributes, arguments, each op in order, the
    return, the header, the inputs and outputs."""
    check_module_attributes(module.attributes, module.attribute_lines)
    types: dict[str, TypeRef] = {}
    for arg in module.arguments:
        if arg.type.kind == "weight":
            raise MlirSyntaxError(arg.line, f"argument %{arg.name} cannot be a weight")
        if arg.name in types:
            raise MlirSyntaxError(arg.line, f"argument %{arg.name} is declared twice")
        types[arg.name] = arg.type
    symbols: set[str] = set()
    for op in module.operations:
        check_op_signature(op, types)
        check_ranges(op)
        if op.symbol:
            if op.symbol in symbols:
                raise MlirSyntaxError(op.line, f"weight symbol @{op.symbol} is declared twice")
            symbols.add(op.symbol)
    check_returns(module, types)
    check_header(module)
    check_io(module)


def check_returns(module: Module, types: dict[str, TypeRef]) -> None:
    """The return names defined values whose types the return and the function declare."""
    line = module.return_line
    for name in module.returns:
        if name not in types:
            raise MlirSyntaxError(line, f"return of undefined value %{name}")
    returns, declared_types = module.returns, module.return_types
    if len(declared_types) != len(returns) or len(returns) != len(module.result_types):
        raise MlirSyntaxError(line, "return values do not match the function's result types")
    for name, declared, result in zip(returns, declared_types, module.result_types, strict=True):
        if not types[name] == declared == result:
            raise MlirSyntaxError(
                line, f"return %{name} is {show_type(types[name])}; the return and the "
                f"function declare {show_type(declared)} and {show_type(result)}"
            )


def _positive_f32(value: float) -> bool:
    """``value`` stays a positive finite number in float32 (1e-50 rounds to 0 there)."""
    try:
        (rounded,) = struct.unpack("<f", struct.pack("<f", value))
    except (OverflowError, struct.error):  # beyond float32's largest finite value
        return False
    return math.isfinite(rounded) and rounded > 0


def check_ranges(op: Operation) -> None:
    """Attribute values the op cannot run with (a kernel of 10^9 rows, a zero stride,
    a negative eps) are refused here, before anything is allocated."""
    a, where = op.attributes, op.spec.qualified_name
    for name in ("kernel_size", "stride", "dilation", "padding"):
        if name not in a:
            continue
        low = 0 if name == "padding" else 1
        if not all(low <= v <= MAX_GEOMETRY for v in a[name]):
            raise MlirSyntaxError(
                op.line, f"{where} {name} entries must lie in [{low}, {MAX_GEOMETRY}], "
                f"got {a[name]}"
            )
    if "kernel_size" in a:
        kx, ky, kz = a["kernel_size"]
        if kx * ky * kz > MAX_KERNEL_VOLUME:
            raise MlirSyntaxError(
                op.line, f"{where} kernel_size {a['kernel_size']} has {kx * ky * kz} rows; at "
                f"most {MAX_KERNEL_VOLUME} are replayed"
            )
    if op.spec.name == "trilinear_upsample3d" and "stride" in a:
        # Its relation is a (2s - 1)^3 kernel: the replay's kernel cap applies to it too.
        kx, ky, kz = (2 * v - 1 for v in a["stride"])
        if kx * ky * kz > MAX_KERNEL_VOLUME:
            raise MlirSyntaxError(
                op.line, f"{where} stride {a['stride']} implies a {kx}x{ky}x{kz} kernel of "
                f"{kx * ky * kz} rows; at most {MAX_KERNEL_VOLUME} are replayed"
            )
    if a.get("eps", 0.0) < 0:
        raise MlirSyntaxError(op.line, f"{where} eps must be >= 0, got {a['eps']}")
    if "voxel_size" in a and not all(_positive_f32(v) for v in a["voxel_size"]):
        raise MlirSyntaxError(op.line, f"{where} voxel_size must be positive and finite in "
                              "float32 (the replay divides in float32), got "
                              f"{a['voxel_size']}")
    if a.get("batch_size", 0) > MAX_BATCH_SIZE:
        raise MlirSyntaxError(op.line, f"{where} batch_size must be at most {MAX_BATCH_SIZE} "
                              f"(or negative: read from the data), got {a['batch_size']}")


def check_op_signature(op: Operation, types: dict[str, TypeRef]) -> None:
    """``op``'s operands and results against its spec and the values defined so far
    (``types``, by name); records its results in ``types``."""
    operand_types = op.operand_types
    spec, line = op.spec, op.line
    ssa = [o for o in spec.operands if o.kind == "ssa"]
    required = sum(1 for o in ssa if not o.optional)
    if not required <= len(op.operands) <= len(ssa):
        names = ", ".join(o.name + ("?" if o.optional else "") for o in ssa)
        raise MlirSyntaxError(
            line,
            f"{spec.qualified_name} takes operands ({names}), got {len(op.operands)}",
        )
    for value, operand in zip(op.operands, ssa[: len(op.operands)], strict=True):
        if value not in types:
            raise MlirSyntaxError(line, f"%{value} is used before it is defined")
        if types[value].kind != operand.type:
            raise MlirSyntaxError(
                line,
                f"{spec.qualified_name} operand {operand.name!r} must be a {operand.type}, "
                f"%{value} is a {types[value].kind}",
            )
    # The parser matched operand_types to the operands' count (empty: no types declared).
    for value, declared in zip(op.operands[: len(operand_types)], operand_types, strict=True):
        if types[value] != declared:
            raise MlirSyntaxError(
                line, f"{spec.qualified_name} declares %{value} as {show_type(declared)}, "
                f"but it is {show_type(types[value])}"
            )
    if len(op.results) != len(spec.results) or len(op.result_types) != len(spec.results):
        raise MlirSyntaxError(
            line, f"{spec.qualified_name} has {len(spec.results)} result(s), got {len(op.results)}"
        )
    for value, ty, (res_name, res_kind) in zip(op.results, op.result_types, spec.results,
                                               strict=True):
        if value in types:
            raise MlirSyntaxError(line, f"%{value} is defined twice")
        if ty.kind != res_kind:
            raise MlirSyntaxError(
                line, f"{spec.qualified_name} result {res_name!r} must be a {res_kind}, "
                f"declared {ty.kind}"
            )
        types[value] = ty


def check_module_attributes(raw: dict[str, Any], lines: dict[str, int]) -> None:
    """The ``module attributes`` the contract defines, each of its type, all present."""
    kinds = {
        "lattice.ir_version": int,
        "lattice.schema_digest": str,
        "lattice.input_names": list,
        "lattice.input_roles": list,
        "lattice.output_names": list,
        "lattice.output_roles": list,
        "lattice.weight_file": str,
    }
    for key, value in raw.items():
        if key not in kinds:
            raise MlirSyntaxError(lines[key], f"unknown module attribute {key!r}")
        if isinstance(value, bool) or not isinstance(value, kinds[key]):
            raise MlirSyntaxError(lines[key], f"module attribute {key!r} has the wrong type")
        if isinstance(value, list) and not all(isinstance(v, str) for v in value):
            raise MlirSyntaxError(lines[key], f"module attribute {key!r} must list strings")
    for key in kinds:
        if key not in raw:
            raise MlirSyntaxError(1, f"module is missing attribute {key!r}")


def check_version(attrs: dict[str, Any]) -> None:
    """IR version and schema digest, checked before the body is parsed."""
    version = attrs.get("lattice.ir_version")
    if version != schema.IR_VERSION:
        raise ValueError(
            f"graph.mlir has lattice.ir_version = {version}; this runtime reads IR version "
            f"{schema.IR_VERSION} only (lattice-contract {schema.CONTRACT_VERSION}); migrate "
            "the artifact explicitly"
        )
    digest = attrs.get("lattice.schema_digest")
    if digest != schema.SCHEMA_DIGEST:
        raise ValueError(
            f"graph.mlir lattice.schema_digest {digest!r} is not the lattice-contract "
            f"{schema.CONTRACT_VERSION} digest {schema.SCHEMA_DIGEST!r}"
        )


def check_header(module: Module) -> None:
    """Weight file, function name, elementwise kinds and accumulation."""
    attrs = module.attributes
    if attrs["lattice.weight_file"] != schema.WEIGHT_FILE:
        raise ValueError(
            f"graph.mlir lattice.weight_file must be {schema.WEIGHT_FILE!r}, got "
            f"{attrs['lattice.weight_file']!r}"
        )
    if module.function != "forward":
        raise ValueError(f"graph.mlir must define func.func @forward, got @{module.function}")
    for op in module.operations:
        kind = op.attributes.get("kind")
        if op.spec.name == "elementwise" and kind not in schema.ELEMENTWISE_KINDS:
            raise ValueError(
                f"graph.mlir line {op.line}: lattice.elementwise kind must be one of "
                f"{', '.join(schema.ELEMENTWISE_KINDS)}, got {kind!r}"
            )
        acc = op.attributes.get("accumulation", "canonical_f32")
        if acc != "canonical_f32":  # the only accumulation the contract defines
            raise ValueError(
                f"graph.mlir line {op.line}: {op.spec.qualified_name} accumulation must be "
                f"'canonical_f32', got {acc!r}"
            )


def check_io(module: Module) -> None:
    """Input and output names and roles against the function's arguments and results."""
    attrs = module.attributes
    names, roles = attrs["lattice.input_names"], attrs["lattice.input_roles"]
    args = [a.name for a in module.arguments]
    if list(names) != args or len(roles) != len(args):
        raise ValueError(
            f"lattice.input_names {names} / input_roles {roles} must match the @forward "
            f"arguments {args} one for one"
        )
    for arg, role in zip(module.arguments, roles, strict=True):
        if arg.type.kind != "tensor":
            raise ValueError(f"argument %{arg.name} must be a tensor (sparse inputs enter as "
                             f"coords, features and active), not a {arg.type.kind}")
        if role not in schema.INPUT_ROLES:
            raise ValueError(f"input {arg.name!r} has unknown role {role!r} "
                             f"(allowed: {', '.join(schema.INPUT_ROLES)})")
        check_role_type(arg, role)
    outs, out_roles = attrs["lattice.output_names"], attrs["lattice.output_roles"]
    if len(outs) != len(module.returns) or len(out_roles) != len(module.returns):
        raise ValueError(
            f"lattice.output_names {outs} / output_roles {out_roles} must match the "
            f"{len(module.returns)} returned value(s)"
        )
    if len(set(outs)) != len(outs) or len(set(names)) != len(names):
        raise ValueError("input and output names must be unique")
    for name, role, ty in zip(outs, out_roles, module.result_types, strict=True):
        if role not in schema.OUTPUT_ROLES or role != ty.kind:
            raise ValueError(f"output {name!r} has role {role!r} but returns a {ty.kind}")


def check_role_type(arg: Argument, role: str) -> None:
    ty = arg.type
    rules = {
        "sparse_coords": (ty.shape[1:] == (4,) and len(ty.shape) == 2 and ty.dtype == "i32",
                          "tensor<?x4xi32>"),
        "sparse_features": (len(ty.shape) == 2 and ty.dtype in ("f32", "f16"),
                            "tensor<?xCxf32> or f16"),
        "sparse_active": (ty.shape == (1,) and ty.dtype == "i32", "tensor<1xi32>"),
    }
    if role in rules and not rules[role][0]:
        raise ValueError(f"input {arg.name!r} with role {role} must be {rules[role][1]}")


def check_packed(where: str, family: str, packing: Packing, w: torch.Tensor,
                 scales: torch.Tensor, biases: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """A packed weight's packing and stored tensors (codes, scales, biases)."""
    if family not in _PACKABLE:
        raise ValueError(f"{where}: only conv3d and linear weights may be packed, not {family}")
    if packing.mode != "affine":
        raise ValueError(f"{where}: packing mode must be affine, got {packing.mode!r}")
    if packing.scale_dtype not in _FLOAT:  # f16 is usual; torch-lattice 0.5 can write f32
        raise ValueError(
            f"{where}: packing scale_dtype must be f16 or f32, got {packing.scale_dtype!r}"
        )
    if packing.group_size not in GROUP_SIZES:  # as MLX Lattice refuses it
        raise ValueError(
            f"{where}: packing group_size must be 32, 64 or 128 (the sizes MLX Lattice runs), "
            f"got {packing.group_size}"
        )
    if w.dtype not in (torch.uint32, torch.int32) or w.ndim != 3:
        raise ValueError(f"{where}: packed codes must be a 3-D uint32 tensor, got {w.dtype} "
                         f"{tuple(w.shape)}")
    for label, t in (("scales", scales), ("biases", biases)):
        if t.dtype != _FLOAT[packing.scale_dtype] or t.ndim != 3:
            raise ValueError(f"{where}: packed {label} must be a 3-D {packing.scale_dtype} "
                             f"tensor, got {t.dtype} {tuple(t.shape)}")
    return (w, scales, biases)
