"""The textual MLIR of an artifact's ``graph.mlir``, written exactly as the
lattice-contract 0.6.0 builder writes it.

:class:`ModuleText` collects function arguments, ops and returns and renders
one ``module attributes {...} { func.func @forward(...) {...} }``.  Op names,
operand order and attribute order come from :mod:`torch_lattice.artifact.schema`;
this module only knows the text form (spacing, quoting, number formats).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from torch_lattice.artifact import schema

__all__ = [
    "DENSE_PACKING",
    "ModuleText",
    "Packing",
    "Value",
    "decimal_float",
    "sparse_type",
    "tensor_type",
    "weight_type",
]


def sparse_type(dtype: str) -> str:
    """``!lattice.sparse_tensor<...>`` with features of ``dtype`` (``f32``/``f16``)."""
    return (
        "!lattice.sparse_tensor<rank = 3, coord = batch_x_y_z, feature = row_channel, "
        f"dtype = {dtype}>"
    )


def tensor_type(dims: Sequence[int | None], dtype: str) -> str:
    """``tensor<?x4xi32>``-style type; ``None`` is a dynamic dimension."""
    parts = ["?" if d is None else str(int(d)) for d in dims]
    return f"tensor<{'x'.join([*parts, dtype])}>"


def weight_type(family: str, dtype: str) -> str:
    return f"!lattice.weight<{family}, {dtype}>"


@dataclass(frozen=True)
class Packing:
    """``#lattice.packing<...>``: ``dense`` or affine ``int4`` / ``int8`` per group."""

    kind: str = "dense"
    group_size: int = 0
    scale_dtype: str = "f16"  # of the stored scales and biases: f32 or f16

    def text(self) -> str:
        if self.kind == "dense":
            return "#lattice.packing<dense>"
        return (
            f"#lattice.packing<{self.kind}, group_size = {self.group_size}, "
            f"scale_dtype = {self.scale_dtype}, mode = affine>"
        )


DENSE_PACKING = Packing()


@dataclass(frozen=True)
class Value:
    """An SSA value: its name (without ``%``) and its type text."""

    name: str
    type: str

    @property
    def ref(self) -> str:
        return f"%{self.name}"


def decimal_float(value: float) -> str:
    """The contract's ``f32`` attribute number: fixed point, 12 decimals, trailing zeros cut.

    Raises:
        ValueError: a non-zero value that this form would write as 0 (below
            5e-13 in magnitude), or a non-finite value.
    """
    v = float(value)
    if v != v or v in (float("inf"), float("-inf")):
        raise ValueError(f"attribute value {value!r} is not finite")
    text = f"{v:.12f}".rstrip("0").rstrip(".")
    if text in ("", "-0", "0"):
        if v != 0.0:
            raise ValueError(
                f"attribute value {value!r} is too small for the contract's 12-decimal form"
            )
        return "0.0"
    return text if "." in text else f"{text}.0"


def _triple(value: Any, kind: str) -> str:
    items = tuple(value) if isinstance(value, (tuple, list)) else (value,) * 3
    if len(items) != 3:
        raise ValueError(f"a {kind} attribute needs 3 values, got {value!r}")
    if kind == "i64_triple":
        return "array<i64: {}, {}, {}>".format(*(int(v) for v in items))
    return "array<f64: {}, {}, {}>".format(*(float(v) for v in items))


def _attr(kind: str, value: Any) -> str:
    if kind == "packing":
        assert isinstance(value, Packing)
        return value.text()
    if kind in schema.ENUM_ATTRIBUTES:
        allowed = schema.ENUM_ATTRIBUTES[kind].values
        if value not in allowed:
            raise ValueError(f"#lattice.{kind} value must be one of {allowed}, got {value!r}")
        return f"#lattice.{kind}<{value}>"
    if kind in ("i64_triple", "f64_triple"):
        return _triple(value, kind)
    if kind == "i64":
        return str(int(value))
    if kind == "f32":
        return f"{decimal_float(value)} : f32"
    if kind == "str":
        return f'"{value}"'
    raise ValueError(f"unknown attribute kind {kind!r}")


def _string_array(values: Iterable[str]) -> str:
    escaped = (v.replace("\\", "\\\\").replace('"', '\\"') for v in values)
    return "[" + ", ".join(f'"{v}"' for v in escaped) + "]"


class ModuleText:
    """Builds one artifact module: arguments, ops in order, returns."""

    def __init__(self) -> None:
        self._args: list[tuple[Value, str]] = []  # (value, role)
        self._lines: list[str] = []
        self._counts: dict[str, int] = {}
        self._returns: list[tuple[Value, str, str]] = []  # (value, name, role)

    def unique(self, stem: str) -> str:
        """A fresh SSA name: ``stem``, then ``stem1``, ``stem2``... (dots become ``_``)."""
        base = stem.replace(".", "_")
        count = self._counts.get(base, 0)
        self._counts[base] = count + 1
        return base if count == 0 else f"{base}{count}"

    def argument(self, name: str, type_: str, role: str) -> Value:
        if role not in schema.INPUT_ROLES:
            raise ValueError(f"input role must be one of {schema.INPUT_ROLES}, got {role!r}")
        value = Value(self.unique(name), type_)
        self._args.append((value, role))
        return value

    def op(
        self,
        name: str,
        operands: Mapping[str, Value | None],
        attrs: Mapping[str, Any],
        result_type: str,
        result: str,
    ) -> Value:
        """Emits ``lattice.<name>`` with operands and attributes in schema order.

        Optional operands may be ``None`` (left out).  Every schema attribute
        must be given, except ``accumulation``, which is ``"canonical_f32"``.
        """
        spec = schema.OPS[name]
        unknown = set(operands) - {o.name for o in spec.operands}
        unknown |= set(attrs) - {a.name for a in spec.attributes}
        if unknown:
            raise ValueError(f"lattice.{name} has no operand or attribute {sorted(unknown)}")
        values: list[Value] = []
        for operand in spec.operands:
            v = operands.get(operand.name)
            if v is None:
                if not operand.optional:
                    raise ValueError(f"lattice.{name} needs operand {operand.name!r}")
                continue
            values.append(v)
        parts = []
        for attr in spec.attributes:
            if attr.name in attrs:
                parts.append(f"{attr.name} = {_attr(attr.kind, attrs[attr.name])}")
            elif attr.name == "accumulation":
                parts.append('accumulation = "canonical_f32"')
            else:
                raise ValueError(f"lattice.{name} needs attribute {attr.name!r}")
        attr_text = "{" + ", ".join(parts) + "}" if spec.attributes else ""
        out = Value(self.unique(result), result_type)
        refs = ", ".join(v.ref for v in values)
        types = ", ".join(v.type for v in values)
        self._lines.append(
            f"{out.ref} = {spec.qualified_name} {refs} {attr_text} : ({types}) -> {out.type}"
        )
        return out

    def weight(self, key: str, layout: str, packing: Packing, family: str, dtype: str) -> Value:
        """Emits ``lattice.weight @sym {storage_key, layout, packing}`` for storage ``key``."""
        name = self.unique(safe_name(key))
        out = Value(name, weight_type(family, dtype))
        attrs = (
            f'{{storage_key = "{key}", layout = {_attr("weight_layout", layout)}, '
            f"packing = {packing.text()}}}"
        )
        self._lines.append(f"{out.ref} = lattice.weight @{name} {attrs} : {out.type}")
        return out

    def decompose(
        self, input: Value, types: Sequence[str], names: Sequence[str]
    ) -> tuple[Value, ...]:
        """Emits ``lattice.sparse.decompose``; ``names`` for the features and active results."""
        results = (
            Value(self.unique("sparse.decompose"), types[0]),
            Value(self.unique(names[0]), types[1]),
            Value(self.unique(names[1]), types[2]),
        )
        self._lines.append(
            f"{', '.join(r.ref for r in results)} = lattice.sparse.decompose {input.ref} : "
            f"{input.type} -> ({', '.join(r.type for r in results)})"
        )
        return results

    def add_return(self, value: Value, name: str, role: str) -> None:
        if role not in schema.OUTPUT_ROLES:
            raise ValueError(f"output role must be one of {schema.OUTPUT_ROLES}, got {role!r}")
        self._returns.append((value, name, role))

    def render(self) -> str:
        """The whole ``graph.mlir`` text."""
        if not self._returns:
            raise ValueError("the artifact graph returns nothing")
        rets = [v for v, _, _ in self._returns]
        types = ", ".join(v.type for v in rets)
        result_types = types if len(rets) == 1 else f"({types})"
        args = ",\n    ".join(f"{v.ref}: {v.type}" for v, _ in self._args)
        body = "\n".join(f"    {line}" for line in self._lines)
        return (
            "module attributes {\n"
            f"  lattice.ir_version = {schema.IR_VERSION},\n"
            f'  lattice.schema_digest = "{schema.SCHEMA_DIGEST}",\n'
            f"  lattice.input_names = {_string_array(v.name for v, _ in self._args)},\n"
            f"  lattice.input_roles = {_string_array(r for _, r in self._args)},\n"
            f"  lattice.output_names = {_string_array(n for _, n, _ in self._returns)},\n"
            f"  lattice.output_roles = {_string_array(r for _, _, r in self._returns)},\n"
            f'  lattice.weight_file = "{schema.WEIGHT_FILE}"\n'
            "} {\n"
            "  func.func @forward(\n"
            f"    {args}\n"
            f"  ) -> {result_types} {{\n"
            f"{body}\n"
            f"    return {', '.join(v.ref for v in rets)} : {types}\n"
            "  }\n"
            "}\n"
        )


def safe_name(text: str) -> str:
    """An SSA-safe name: runs of other characters become ``_``; a leading digit gets ``v_``."""
    out = re.sub(r"[^0-9A-Za-z_]+", "_", text).strip("_")
    if not out:
        return "value"
    return f"v_{out}" if out[0].isdigit() else out
