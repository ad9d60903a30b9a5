"""Parser for the textual MLIR of a lattice artifact (``graph.mlir``, IR version 2).

It reads exactly the form the lattice-contract builder writes::

    module attributes {lattice.ir_version = 2, ...} {
      func.func @forward(%x_coords: tensor<?x4xi32>, ...) -> <type or (types)> {
        %w = lattice.weight @w {storage_key = "...", layout = ..., packing = ...} : <weight type>
        %a, %b, %c = lattice.sparse.decompose %x : <type> -> (<types>)
        %y = lattice.<op> %x, %w {attr = value, ...} : (<types>) -> <type>
        return %y : <type>
      }
    }

and checks every op against :mod:`torch_lattice.artifact.schema`: unknown ops,
unknown or missing attributes, values outside an enum, wrong operand counts or
kinds, undefined or redefined values all raise ``ValueError`` with the line.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from torch_lattice.artifact import schema

__all__ = [
    "MAX_GRAPH_CHARS",
    "Argument",
    "EnumValue",
    "MlirSyntaxError",
    "Module",
    "Operation",
    "Packing",
    "TypeRef",
    "parse_module",
    "read_header",
    "show_type",
]


# Bounds on hostile input: the largest real graphs are a few hundred kilobytes.
MAX_GRAPH_CHARS = 16 * 2**20
MAX_TOKEN_CHARS = 4096
MAX_NESTING = 8  # attribute lists ([...]) inside each other
TENSOR_DTYPES = ("f32", "f16", "i32", "i64")
_I64_MIN, _I64_MAX = -(2**63), 2**63 - 1
_F32_MAX = 3.4028234663852886e38


class MlirSyntaxError(ValueError):
    """A ``graph.mlir`` that does not follow the contract's text form or schema."""

    def __init__(self, line: int, message: str) -> None:
        super().__init__(f"graph.mlir line {line}: {message}")
        self.line = line


@dataclass(frozen=True)
class TypeRef:
    """A value type: ``tensor<...>``, ``!lattice.sparse_tensor<...>`` or ``!lattice.weight<...>``.

    ``shape`` holds ``None`` for ``?`` dims (tensors only); ``family`` is set for weights.
    """

    kind: str  # "tensor", "sparse_tensor" or "weight"
    dtype: str
    shape: tuple[int | None, ...] = ()
    family: str = ""


@dataclass(frozen=True)
class EnumValue:
    """``#lattice.<mnemonic><value>``."""

    mnemonic: str
    value: str


@dataclass(frozen=True)
class Packing:
    """``#lattice.packing<dense>`` or ``<int4|int8, group_size = G, scale_dtype = T, mode = M>``."""

    kind: str
    group_size: int = 0
    scale_dtype: str = ""
    mode: str = ""


@dataclass(frozen=True)
class Argument:
    name: str
    type: TypeRef
    line: int = 0


@dataclass(frozen=True)
class Operation:
    """One op of the function body, with attributes already checked against the schema.

    ``attributes`` maps names to Python values: ints, floats, strings, 3-tuples,
    :class:`EnumValue` values reduced to their string, or :class:`Packing`.
    """

    line: int
    spec: schema.OpSpec
    results: tuple[str, ...]
    operands: tuple[str, ...]
    attributes: dict[str, Any]
    result_types: tuple[TypeRef, ...]
    symbol: str = ""
    operand_types: tuple[TypeRef, ...] = ()  # as the text declares them (may be empty)


@dataclass
class Module:
    attributes: dict[str, Any]
    function: str
    arguments: tuple[Argument, ...]
    result_types: tuple[TypeRef, ...]
    operations: list[Operation] = field(default_factory=list)
    returns: tuple[str, ...] = ()
    return_types: tuple[TypeRef, ...] = ()  # as the return statement declares them
    return_line: int = 0
    attribute_lines: dict[str, int] = field(default_factory=dict)


# --- tokens -------------------------------------------------------------------

_TOKEN = re.compile(
    r"""
    (?P<ws>[ \t\r]+|//[^\n]*)
  | (?P<nl>\n)
  | (?P<arrow>->)
  | (?P<string>"(?:[^"\\\n]|\\.)*")
  | (?P<value>%[A-Za-z0-9_$.]+)
  | (?P<symbol>@[A-Za-z0-9_$.]+)
  | (?P<attr>\#[A-Za-z_][\w.]*)
  | (?P<type>![A-Za-z_][\w.]*)
  | (?P<dims>(?:\?|\d+)(?:x(?:\?|\d+))*x[A-Za-z]\w*)
  | (?P<hex>[-+]?0x[0-9A-Fa-f]+)
  | (?P<number>[-+]?(?:\d+\.\d*(?:[eE][-+]?\d+)?|\d+[eE][-+]?\d+|\d+))
  | (?P<ident>[A-Za-z_][\w.$]*)
  | (?P<punct>[{}()\[\]<>,=:?])
    """,
    re.VERBOSE,
)


@dataclass(frozen=True)
class _Tok:
    kind: str
    text: str
    line: int


def _tokenize(text: str) -> Iterator[_Tok]:
    """Tokens on demand, so a malformed file fails at its first bad token without the
    whole text being held as token objects."""
    line, pos = 1, 0
    while pos < len(text):
        m = _TOKEN.match(text, pos)
        if m is None:
            raise MlirSyntaxError(line, f"unexpected character {text[pos]!r}")
        kind = m.lastgroup or ""
        if kind == "nl":
            line += 1
        elif kind != "ws":
            if m.end() - pos > MAX_TOKEN_CHARS:
                raise MlirSyntaxError(line, f"a token longer than {MAX_TOKEN_CHARS} characters")
            yield _Tok(kind, m.group(), line)
        pos = m.end()
    while True:
        yield _Tok("eof", "", line)


def _check_text(text: object) -> str:
    if not isinstance(text, str):
        raise TypeError(f"graph text must be a str, got {type(text).__name__}")
    if len(text) > MAX_GRAPH_CHARS:
        raise ValueError(
            f"graph.mlir has {len(text)} characters; at most {MAX_GRAPH_CHARS} are read"
        )
    return text


# --- parser -------------------------------------------------------------------


class _Parser:
    def __init__(self, text: str) -> None:
        self._tokens = _tokenize(text)
        self._current = next(self._tokens)
        self.depth = 0  # nesting of attribute lists

    # token helpers
    def peek(self) -> _Tok:
        return self._current

    def next(self) -> _Tok:
        tok = self._current
        self._current = next(self._tokens)
        return tok

    def fail(self, message: str, tok: _Tok | None = None) -> MlirSyntaxError:
        tok = tok or self.peek()
        return MlirSyntaxError(tok.line, message)

    def expect(self, text: str) -> _Tok:
        tok = self.next()
        if tok.text != text:
            got = tok.text or "end of file"
            raise MlirSyntaxError(tok.line, f"expected {text!r}, got {got!r}")
        return tok

    def expect_kind(self, kind: str, what: str) -> _Tok:
        tok = self.next()
        if tok.kind != kind:
            got = tok.text or "end of file"
            raise MlirSyntaxError(tok.line, f"expected {what}, got {got!r}")
        return tok

    def accept(self, text: str) -> bool:
        if self.peek().text == text:
            self.next()
            return True
        return False

    # values
    def number(self) -> int | float:
        tok = self.expect_kind("number", "a number")
        text = tok.text
        if any(c in text for c in ".eE"):
            value = float(text)
            if not math.isfinite(value):
                raise MlirSyntaxError(tok.line, f"number {text} is out of the float64 range")
            return value
        return _int(tok)

    def string(self) -> str:
        tok = self.expect_kind("string", "a string")
        return re.sub(r"\\(.)", r"\1", tok.text[1:-1])

    def attr_value(self) -> Any:
        tok = self.peek()
        if tok.kind == "number":
            value = self.number()
            if self.accept(":"):
                ty = self.expect_kind("ident", "a scalar type").text
                if ty in ("f16", "f32", "f64"):
                    return _Typed(float(value), ty)
                return _Typed(value, ty)
            return value
        if tok.kind == "string":
            return self.string()
        if tok.kind == "hex":  # MLIR's form for NaN and infinities
            raise self.fail(f"attribute value {tok.text} is a hexadecimal bit pattern; "
                            "attribute numbers must be finite decimals")
        if tok.text == "[":
            if self.depth >= MAX_NESTING:
                raise self.fail(f"attribute lists nest deeper than {MAX_NESTING}")
            self.next()
            self.depth += 1
            items: list[Any] = []
            if not self.accept("]"):
                items.append(self.attr_value())
                while self.accept(","):
                    items.append(self.attr_value())
                self.expect("]")
            self.depth -= 1
            return items
        if tok.text == "array":
            return self.dense_array()
        if tok.kind == "attr":
            return self.dialect_attr()
        if tok.kind == "ident" and tok.text in ("true", "false"):
            self.next()
            return tok.text == "true"
        raise self.fail(f"expected an attribute value, got {tok.text or 'end of file'!r}")

    def dense_array(self) -> _Array:
        self.expect("array")
        self.expect("<")
        elem = self.expect_kind("ident", "an element type").text
        items: list[int | float] = []
        if self.accept(":"):
            items.append(self.number())
            while self.accept(","):
                items.append(self.number())
        self.expect(">")
        return _Array(elem, tuple(items))

    def dialect_attr(self) -> EnumValue | Packing:
        tok = self.next()
        prefix = "#" + schema.NAMESPACE + "."
        if not tok.text.startswith(prefix):
            raise MlirSyntaxError(tok.line, f"unknown attribute {tok.text!r}")
        mnemonic = tok.text[len(prefix):]
        if mnemonic not in schema.ENUM_ATTRIBUTES:
            raise MlirSyntaxError(tok.line, f"unknown attribute {tok.text!r}")
        self.expect("<")
        value = self.expect_kind("ident", f"a {mnemonic} value").text
        if mnemonic != "packing":
            self.expect(">")
            return EnumValue(mnemonic, value)
        params: dict[str, Any] = {}
        while self.accept(","):
            key = self.expect_kind("ident", "a packing parameter").text
            self.expect("=")
            params[key] = self.number() if self.peek().kind == "number" else self.next().text
        self.expect(">")
        return _packing(tok.line, value, params)

    def attr_dict(self) -> tuple[dict[str, Any], dict[str, int]]:
        """``{k = v, ...}`` -> (values, line of each key)."""
        self.expect("{")
        values: dict[str, Any] = {}
        lines: dict[str, int] = {}
        if self.accept("}"):
            return values, lines
        while True:
            key = self.expect_kind("ident", "an attribute name")
            if key.text in values:
                raise MlirSyntaxError(key.line, f"attribute {key.text!r} given twice")
            self.expect("=")
            values[key.text] = self.attr_value()
            lines[key.text] = key.line
            if self.accept("}"):
                return values, lines
            self.expect(",")

    # types
    def type_ref(self) -> TypeRef:
        tok = self.next()
        if tok.text == "tensor":
            self.expect("<")
            dims = self.next()
            if dims.kind == "dims":
                *shape_text, dtype = dims.text.split("x")
            elif dims.kind == "ident":
                shape_text, dtype = [], dims.text
            else:
                raise MlirSyntaxError(dims.line, f"bad tensor type near {dims.text!r}")
            self.expect(">")
            if dtype not in TENSOR_DTYPES:
                raise MlirSyntaxError(
                    dims.line, f"tensor element type must be one of {', '.join(TENSOR_DTYPES)}, "
                    f"got {dtype!r}"
                )
            shape = tuple(None if d == "?" else _int(_Tok("number", d, dims.line))
                          for d in shape_text)
            return TypeRef("tensor", dtype, shape)
        if tok.text == "!lattice.sparse_tensor":
            params = self.type_params(tok)
            return TypeRef("sparse_tensor", params.get("dtype", ""))
        if tok.text == "!lattice.weight":
            self.expect("<")
            family = self.expect_kind("ident", "a weight family").text
            self.expect(",")
            dtype = self.expect_kind("ident", "a weight dtype").text
            self.expect(">")
            return TypeRef("weight", dtype, family=family)
        raise MlirSyntaxError(tok.line, f"unknown type {tok.text or 'end of file'!r}")

    def type_params(self, start: _Tok) -> dict[str, str]:
        self.expect("<")
        params: dict[str, str] = {}
        while True:
            key = self.expect_kind("ident", "a type parameter").text
            self.expect("=")
            params[key] = self.next().text
            if self.accept(">"):
                break
            self.expect(",")
        expected = {"rank": "3", "coord": "batch_x_y_z", "feature": "row_channel"}
        for key, want in expected.items():
            if params.get(key) != want:
                raise MlirSyntaxError(
                    start.line, f"sparse_tensor {key} must be {want}, got {params.get(key)!r}"
                )
        if params.get("dtype") not in ("f32", "f16"):
            raise MlirSyntaxError(
                start.line, f"sparse_tensor dtype must be f32 or f16, got {params.get('dtype')!r}"
            )
        return params

    def type_list(self) -> tuple[TypeRef, ...]:
        """``(t, ...)`` or one bare type."""
        if not self.accept("("):
            return (self.type_ref(),)
        types: list[TypeRef] = []
        if not self.accept(")"):
            types.append(self.type_ref())
            while self.accept(","):
                types.append(self.type_ref())
            self.expect(")")
        return tuple(types)

    def value_list(self) -> list[_Tok]:
        values = [self.expect_kind("value", "an SSA value (%name)")]
        while self.accept(","):
            values.append(self.expect_kind("value", "an SSA value (%name)"))
        return values


def _int(tok: _Tok) -> int:
    """A decimal integer token that fits int64 (so no 10**4000-digit surprises)."""
    if len(tok.text.lstrip("+-")) > 19 or not _I64_MIN <= int(tok.text) <= _I64_MAX:
        raise MlirSyntaxError(tok.line, f"integer {tok.text[:40]} does not fit in 64 bits")
    return int(tok.text)


@dataclass(frozen=True)
class _Typed:
    """A scalar written with a type suffix: ``0.5 : f32``."""

    value: int | float
    type: str


@dataclass(frozen=True)
class _Array:
    """``array<i64: 1, 2, 3>``."""

    elem: str
    items: tuple[int | float, ...]


def _packing(line: int, kind: str, params: dict[str, Any]) -> Packing:
    allowed = schema.ENUM_ATTRIBUTES["packing"].values
    if kind not in allowed:
        raise MlirSyntaxError(line, f"packing kind {kind!r} is not one of {allowed}")
    if kind == "dense":
        if params:
            raise MlirSyntaxError(line, f"dense packing takes no parameters, got {sorted(params)}")
        return Packing("dense")
    names = ("group_size", "scale_dtype", "mode")
    if sorted(params) != sorted(names):
        raise MlirSyntaxError(
            line, f"{kind} packing needs exactly {', '.join(names)}, got {sorted(params)}"
        )
    group = params["group_size"]
    if not isinstance(group, int) or group <= 0:
        raise MlirSyntaxError(line, f"packing group_size must be a positive integer, got {group!r}")
    return Packing(kind, group, str(params["scale_dtype"]), str(params["mode"]))


# --- attribute values by schema kind ------------------------------------------


def _convert(kind: str, raw: Any, where: str, line: int) -> Any:
    """Checks one attribute value against its schema kind; returns the Python value."""

    def bad(rule: str) -> MlirSyntaxError:
        return MlirSyntaxError(line, f"{where} must be {rule}, got {_show(raw)}")

    if kind in ("i64_triple", "f64_triple"):
        elem = "i64" if kind == "i64_triple" else "f64"
        if not isinstance(raw, _Array) or raw.elem != elem or len(raw.items) != 3:
            raise bad(f"array<{elem}: a, b, c>")
        if elem == "i64":
            if not all(isinstance(v, int) for v in raw.items):
                raise bad("three integers")
            return tuple(int(v) for v in raw.items)
        values = tuple(float(v) for v in raw.items)
        if not all(math.isfinite(v) for v in values):
            raise bad("three finite floats")
        return values
    if kind == "i64":
        value = raw.value if isinstance(raw, _Typed) and raw.type == "i64" else raw
        if isinstance(value, bool) or not isinstance(value, int):
            raise bad("an integer")
        return value
    if kind == "f32":
        if not isinstance(raw, _Typed) or raw.type != "f32":
            raise bad("a float written '<value> : f32'")
        if not abs(float(raw.value)) <= _F32_MAX:  # also refuses NaN
            raise bad("a finite float32")
        return float(raw.value)
    if kind == "str":
        if not isinstance(raw, str):
            raise bad("a string")
        return raw
    if kind == "packing":
        if not isinstance(raw, Packing):
            raise bad("#lattice.packing<...>")
        return raw
    spec = schema.ENUM_ATTRIBUTES.get(kind)
    if spec is None:  # pragma: no cover - the schema names only known kinds
        raise MlirSyntaxError(line, f"{where} has unknown kind {kind!r}")
    if not isinstance(raw, EnumValue) or raw.mnemonic != kind:
        raise bad(f"#lattice.{kind}<...>")
    if raw.value not in spec.values:
        raise MlirSyntaxError(
            line, f"{where} value {raw.value!r} is not one of {', '.join(spec.values)}"
        )
    return raw.value


def _show(raw: Any) -> str:
    if isinstance(raw, _Array):
        return f"array<{raw.elem}: {', '.join(str(v) for v in raw.items)}>"
    if isinstance(raw, _Typed):
        return f"{raw.value} : {raw.type}"
    if isinstance(raw, EnumValue):
        return f"#lattice.{raw.mnemonic}<{raw.value}>"
    return repr(raw)


def _op_attributes(
    spec: schema.OpSpec, raw: dict[str, Any], lines: dict[str, int], line: int
) -> dict[str, Any]:
    for name in raw:
        if spec.attribute(name) is None:
            allowed = ", ".join(a.name for a in spec.attributes) or "none"
            raise MlirSyntaxError(
                lines.get(name, line),
                f"unknown attribute {name!r} on {spec.qualified_name} (allowed: {allowed})",
            )
    out: dict[str, Any] = {}
    for attr in spec.attributes:
        if attr.name not in raw:
            if attr.required:
                raise MlirSyntaxError(
                    line, f"{spec.qualified_name} is missing required attribute {attr.name!r}"
                )
            continue
        where = f"{spec.qualified_name} attribute {attr.name!r}"
        out[attr.name] = _convert(attr.kind, raw[attr.name], where, line)
    return out


# --- module structure -----------------------------------------------------------


def _parse_op(p: _Parser) -> Operation:
    results = p.value_list()
    p.expect("=")
    name = p.expect_kind("ident", "an op name")
    try:
        spec = schema.op_spec(name.text)
    except ValueError as exc:
        raise MlirSyntaxError(name.line, str(exc)) from None
    symbol = ""
    operands: list[_Tok] = []
    operand_types: tuple[TypeRef, ...] = ()
    raw: dict[str, Any] = {}
    lines: dict[str, int] = {}
    if spec.assembly == "weight":
        symbol = p.expect_kind("symbol", "a weight symbol (@name)").text[1:]
        raw, lines = p.attr_dict()
        p.expect(":")
        result_types: tuple[TypeRef, ...] = (p.type_ref(),)
    elif spec.assembly == "decompose":
        operands = p.value_list()
        p.expect(":")
        operand_types = (p.type_ref(),)
        p.expect("->")
        result_types = p.type_list()
    else:
        if p.peek().kind == "value":
            operands = p.value_list()
        if p.peek().text == "{":
            raw, lines = p.attr_dict()
        p.expect(":")
        operand_types = p.type_list()
        if len(operand_types) != len(operands):
            raise MlirSyntaxError(
                name.line,
                f"{spec.qualified_name} lists {len(operand_types)} operand types "
                f"for {len(operands)} operands",
            )
        p.expect("->")
        result_types = p.type_list()
    op = Operation(
        name.line,
        spec,
        tuple(t.text[1:] for t in results),
        tuple(t.text[1:] for t in operands),
        _op_attributes(spec, raw, lines, name.line),
        result_types,
        symbol,
        operand_types,
    )
    return op


def show_type(ty: TypeRef) -> str:
    if ty.kind == "tensor":
        dims = "".join(("?" if d is None else str(d)) + "x" for d in ty.shape)
        return f"tensor<{dims}{ty.dtype}>"
    if ty.kind == "weight":
        return f"!lattice.weight<{ty.family}, {ty.dtype}>"
    return f"!lattice.sparse_tensor<dtype = {ty.dtype}>"


def _parse_arguments(p: _Parser) -> tuple[Argument, ...]:
    p.expect("(")
    args: list[Argument] = []
    if p.accept(")"):
        return ()
    while True:
        tok = p.expect_kind("value", "an argument (%name)")
        p.expect(":")
        args.append(Argument(tok.text[1:], p.type_ref(), tok.line))
        if p.accept(")"):
            return tuple(args)
        p.expect(",")


def read_header(text: str) -> dict[str, Any]:
    """The ``module attributes {...}`` dict alone, unchecked, so a caller can refuse an
    artifact of another IR version or schema before its body is parsed."""
    p = _Parser(_check_text(text))
    p.expect("module")
    p.expect("attributes")
    return p.attr_dict()[0]


def parse_module(text: str) -> Module:
    """Parses ``graph.mlir`` text into a :class:`Module`: syntax only.

    What the text means is checked by :mod:`torch_lattice.artifact.validation`
    (``load_module`` parses and checks).

    Raises:
        ValueError: (an ``MlirSyntaxError``) with the line number and the broken rule.
    """
    p = _Parser(_check_text(text))
    p.expect("module")
    p.expect("attributes")
    raw, lines = p.attr_dict()
    p.expect("{")
    p.expect("func.func")
    function = p.expect_kind("symbol", "a function name (@forward)").text[1:]
    arguments = _parse_arguments(p)
    p.expect("->")
    module = Module(dict(raw), function, arguments, p.type_list(), attribute_lines=dict(lines))
    p.expect("{")
    while p.peek().text != "return":
        if p.peek().kind == "eof":
            raise p.fail("function body ends without 'return'")
        module.operations.append(_parse_op(p))
    ret = p.expect("return")
    module.returns = tuple(t.text[1:] for t in p.value_list())
    p.expect(":")
    return_types = [p.type_ref()]
    while p.accept(","):
        return_types.append(p.type_ref())
    module.return_types = tuple(return_types)
    module.return_line = ret.line
    p.expect("}")
    p.expect("}")
    if p.peek().kind != "eof":
        raise p.fail(f"unexpected {p.peek().text!r} after the module")
    return module
