"""Hostile artifacts and inputs for load_lattice_program and program(**inputs).

Every case builds a small artifact in tmp_path, breaks one thing, and asserts the
exception type and a fragment of its message (the argument and the rule). The
defined behaviours (NaN features, rows in any order, batches with gaps) are checked
against the unbroken run.
"""

from __future__ import annotations

import os
import struct
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

import torch_lattice as tl
from torch_lattice.artifact import load_lattice_program, schema
from torch_lattice.artifact.mlir_parse import MAX_GRAPH_CHARS, parse_module
from torch_lattice.artifact.packing import unpack_weight
from torch_lattice.artifact.validation import load_module
from torch_lattice.memory_budget import MemoryBudgetError

try:
    from artifact_replay_helpers import (
        SP,
        Graph,
        random_coords,
        sparse_inputs,
        triple,
        weight_type,
        write_artifact,
    )
except ImportError:  # tests/ may become a package
    from tests.artifact_replay_helpers import (
        SP,
        Graph,
        random_coords,
        sparse_inputs,
        triple,
        weight_type,
        write_artifact,
    )

CONV = (f"{triple('kernel_size', (3, 3, 3))}, {triple('dilation', (1, 1, 1))}, "
        'accumulation = "canonical_f32"')
POOL = (f"mode = #lattice.pool_mode<max>, {triple('kernel_size', (2, 2, 2))}, "
        f"{triple('stride', (2, 2, 2))}, {triple('padding', (0, 0, 0))}, "
        f"{triple('dilation', (1, 1, 1))}")
F32_2 = "tensor<?x2xf32>"


def _graph(stride: tuple[int, int, int] = (1, 1, 1)) -> Graph:
    """sparse.make -> subm_conv3d (3^3, 2 -> 3 channels) -> pool3d max 2 -> output."""
    g = Graph()
    g.sparse_input("x", 2, stride)
    g.weight("w", "conv.weight", "conv3d")
    g.op("y", "subm_conv3d", ["x", "w"], [SP, weight_type("conv3d")], CONV, SP)
    g.op("z", "pool3d", ["y"], [SP], POOL, SP)
    g.output("z", SP)
    return g


def _weights() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    return {"conv.weight": torch.randn(3, 3, 3, 3, 2, generator=g)}


def _bn_graph(eps: str) -> Graph:
    g = Graph()
    g.tensor_input("f", F32_2)
    for name in ("s", "b", "m", "v"):
        g.weight(name, f"bn.{name}", "channel" if name != "b" else "bias")
    g.op("y", "batch_norm", ["f", "s", "b", "m", "v"],
         [F32_2, weight_type("channel"), weight_type("bias"), weight_type("channel"),
          weight_type("channel")], f"eps = {eps}", F32_2)
    g.output("y", F32_2)
    return g


def _inputs(n: int = 20, seed: int = 0) -> dict[str, torch.Tensor]:
    coords = random_coords(n, 4, seed=seed)
    feats = torch.randn(n, 2, generator=torch.Generator().manual_seed(seed))
    return sparse_inputs("x", coords, feats)


@pytest.fixture
def program(tmp_path: Path):
    return load_lattice_program(write_artifact(tmp_path / "a", _graph(), _weights()))


# --- graph.mlir text ----------------------------------------------------------------------

Edit = Callable[[str], "str | bytes"]


def _sub(old: str, new: str, count: int = 1) -> Edit:
    def edit(text: str) -> str:
        assert old in text, old  # the case must really change the graph
        return text.replace(old, new, count)

    return edit


def _repeat_line(marker: str) -> Edit:
    def edit(text: str) -> str:
        lines = text.splitlines(keepends=True)
        i = next(k for k, line in enumerate(lines) if marker in line)
        return "".join([*lines[: i + 1], lines[i], *lines[i + 1:]])

    return edit


_Y_LINE = "%y = lattice.subm_conv3d %x, %w"
_SP_FEAT = "%x_features, %x_active"

GRAPH_CASES: list[tuple[str, Edit, type[Exception], str]] = [
    ("empty", lambda t: "", ValueError, "expected 'module'"),
    ("truncated-half", lambda t: t[: len(t) // 2], ValueError, "graph.mlir line"),
    ("truncated-before-close", lambda t: t.rstrip()[:-1], ValueError, "expected '}'"),
    ("not-utf8", lambda t: t.encode() + b"\xff\xfe", ValueError, "not UTF-8"),
    ("nul-byte", lambda t: t.replace("lattice.pool3d", "lattice.pool\x003d"), ValueError,
     "unexpected character"),
    ("garbage-after-module", lambda t: t + "}\n", ValueError, "after the module"),
    ("deep-nesting", lambda t: t.replace('lattice.output_names = ["output"]',
                                         "lattice.output_names = " + "[" * 5000 + "]" * 5000),
     ValueError, "nest deeper than"),
    ("huge-integer", _sub("lattice.ir_version = 2", "lattice.ir_version = " + "9" * 40),
     ValueError, "does not fit in 64 bits"),
    ("huge-integer-token", _sub("lattice.ir_version = 2", "lattice.ir_version = " + "9" * 5000),
     ValueError, "token longer than"),
    ("huge-dim", _sub("tensor<?x2xf32>", "tensor<?x" + "9" * 30 + "xf32>", 2), ValueError,
     "does not fit in 64 bits"),
    ("huge-token", _sub('"conv.weight"', '"' + "k" * 10000 + '"'), ValueError,
     "token longer than"),
    ("duplicate-ssa", _repeat_line(_Y_LINE), ValueError, "%y is defined twice"),
    ("duplicate-weight-symbol",
     _sub("%w = lattice.weight @w", "%w0 = lattice.weight @w {storage_key = \"conv.weight\", "
          "layout = #lattice.weight_layout<conv3d_o_xyz_i>, packing = #lattice.packing<dense>} "
          ": !lattice.weight<conv3d, f32>\n    %w = lattice.weight @w"),
     ValueError, "@w is declared twice"),
    ("use-before-definition", _sub("lattice.subm_conv3d %x, %w", "lattice.subm_conv3d %z, %w"),
     ValueError, "%z is used before it is defined"),
    ("return-undefined", _sub("return %z", "return %q"), ValueError, "undefined value %q"),
    ("operand-type-mismatch", _sub("(tensor<?x4xi32>, tensor<?x2xf32>, tensor<1xi32>)",
                                   "(tensor<?x4xi32>, tensor<?x7xf32>, tensor<1xi32>)"),
     ValueError, "declares %x_features as tensor<?x7xf32>, but it is tensor<?x2xf32>"),
    ("operand-kind-mismatch", _sub("lattice.subm_conv3d %x, %w", "lattice.subm_conv3d %w, %w"),
     ValueError, "operand 'input' must be a sparse_tensor"),
    ("operand-count", _sub("lattice.subm_conv3d %x, %w {", "lattice.subm_conv3d %x {"),
     ValueError, "operand types for 1 operands"),
    ("result-count", _sub("%z = lattice.pool3d", "%z, %z2 = lattice.pool3d"), ValueError,
     "has 1 result(s), got 2"),
    ("return-type-mismatch", _sub("return %z : !lattice.sparse_tensor<rank = 3, coord = "
                                  "batch_x_y_z, feature = row_channel, dtype = f32>",
                                  "return %z : tensor<?x3xf32>"),
     ValueError, "the return and the function declare"),
    ("unknown-element-type", _sub("tensor<?x2xf32>", "tensor<?x2xbf17>", 2), ValueError,
     "element type must be one of"),
    ("negative-kernel", _sub("kernel_size = array<i64: 3, 3, 3>",
                             "kernel_size = array<i64: 3, -3, 3>"),
     ValueError, "kernel_size entries must lie in [1,"),
    ("zero-stride", _sub("stride = array<i64: 2, 2, 2>", "stride = array<i64: 2, 0, 2>"),
     ValueError, "stride entries must lie in [1,"),
    ("zero-stride-make", _sub("stride = array<i64: 1, 1, 1>", "stride = array<i64: 0, 1, 1>"),
     ValueError, "lattice.sparse.make stride entries"),
    ("negative-padding", _sub("padding = array<i64: 0, 0, 0>", "padding = array<i64: 0, 0, -1>"),
     ValueError, "padding entries must lie in [0,"),
    ("huge-kernel-volume", _sub("kernel_size = array<i64: 2, 2, 2>",
                                "kernel_size = array<i64: 1000, 1000, 1000>"),
     ValueError, "has 1000000000 rows; at most"),
    ("huge-stride", _sub("stride = array<i64: 2, 2, 2>", "stride = array<i64: 2, 2, 4294967296>"),
     ValueError, "stride entries must lie in"),
    ("kernel-not-triple", _sub("kernel_size = array<i64: 3, 3, 3>",
                               "kernel_size = array<i64: 3, 3>"),
     ValueError, "must be array<i64: a, b, c>"),
    ("kernel-float", _sub("kernel_size = array<i64: 3, 3, 3>",
                          "kernel_size = array<i64: 3, 3.5, 3>"),
     ValueError, "must be three integers"),
    ("kernel-string", _sub("kernel_size = array<i64: 3, 3, 3>", 'kernel_size = "3"'),
     ValueError, "attribute 'kernel_size' must be array<i64"),
    ("enum-out-of-contract", _sub("#lattice.pool_mode<max>", "#lattice.pool_mode<median>"),
     ValueError, "value 'median' is not one of"),
    ("enum-wrong-kind", _sub("#lattice.pool_mode<max>", "#lattice.join<left>"),
     ValueError, "must be #lattice.pool_mode"),
    ("unknown-attribute", _sub("accumulation = ", "groups = 2, accumulation = "),
     ValueError, "unknown attribute 'groups'"),
    ("missing-attribute", _sub(f"{triple('dilation', (1, 1, 1))}, accumulation",
                               "accumulation"),
     ValueError, "missing required attribute 'dilation'"),
    ("attribute-twice", _sub("accumulation = ", 'accumulation = "x", accumulation = '),
     ValueError, "given twice"),
    ("bad-accumulation", _sub('"canonical_f32"', '"fast_f16"'), ValueError,
     "accumulation must be 'canonical_f32'"),
    ("unknown-op", _sub("lattice.pool3d", "lattice.pool4d"), ValueError, "pool4d"),
    ("ir-version", _sub("lattice.ir_version = 2", "lattice.ir_version = 3"), ValueError,
     "ir_version = 3"),
    ("input-names-mismatch", _sub('"x_active"]', '"x_act"]'), ValueError,
     "must match the @forward arguments"),
    ("sparse-dtype", _sub("dtype = f32>", "dtype = f64>"), ValueError,
     "sparse_tensor dtype must be f32 or f16"),
]


@pytest.mark.parametrize(("edit", "exc", "fragment"), [c[1:] for c in GRAPH_CASES],
                         ids=[c[0] for c in GRAPH_CASES])
def test_hostile_graph_is_refused(tmp_path: Path, edit: Edit, exc: type[Exception],
                                  fragment: str) -> None:
    root = write_artifact(tmp_path / "a", _graph(), _weights())
    text = edit((root / schema.GRAPH_FILE).read_text(encoding="utf-8"))
    if isinstance(text, bytes):
        (root / schema.GRAPH_FILE).write_bytes(text)
    else:
        (root / schema.GRAPH_FILE).write_text(text, encoding="utf-8")
    with pytest.raises(exc) as info:
        load_lattice_program(root)
    assert fragment in str(info.value)


def test_the_unbroken_graph_loads_and_runs(program) -> None:
    out = program(**_inputs())["output"]
    assert out.coords.shape[1] == 4 and out.features.shape[1] == 3
    assert int(out.active) == out.coords.shape[0] > 0


def test_huge_graph_file_is_refused_before_reading(tmp_path: Path) -> None:
    root = write_artifact(tmp_path / "a", _graph(), _weights())
    with open(root / schema.GRAPH_FILE, "r+b") as f:  # sparse: no real disk use
        f.truncate(MAX_GRAPH_CHARS + 1)
    with pytest.raises(ValueError, match="at most"):
        load_lattice_program(root)
    with pytest.raises(ValueError, match="at most"):
        parse_module(" " * (MAX_GRAPH_CHARS + 1))


@pytest.mark.parametrize(("eps", "fragment"), [
    ("-1.0e-05 : f32", "eps must be >= 0"),
    ("1.0e+39 : f32", "must be a finite float32"),
    ("1.0e+999 : f32", "out of the float64 range"),
    ("1.0e-05", "a float written '<value> : f32'"),
    ("nan : f32", "expected an attribute value, got 'nan'"),
    ("0x7FC00000 : f32", "0x7FC00000 is a hexadecimal bit pattern"),
    ("-0xFF800000 : f32", "is a hexadecimal bit pattern"),
])
def test_bad_eps_is_refused(tmp_path: Path, eps: str, fragment: str) -> None:
    root = write_artifact(tmp_path / "a", _bn_graph(eps), {
        f"bn.{n}": torch.ones(2) for n in ("s", "b", "m", "v")})
    with pytest.raises(ValueError, match=r"graph\.mlir line") as info:
        load_lattice_program(root)
    assert fragment in str(info.value)


def test_batch_norm_graph_with_a_good_eps_runs(tmp_path: Path) -> None:
    root = write_artifact(tmp_path / "a", _bn_graph("1.0e-05 : f32"), {
        f"bn.{n}": torch.ones(2) for n in ("s", "b", "m", "v")})
    f = torch.randn(5, 2)
    out = load_lattice_program(root)(f=f)["output"]
    assert torch.allclose(out, (f - 1) / (1 + 1e-5) ** 0.5 + 1)


def test_global_pool_batch_size_is_bounded(tmp_path: Path) -> None:
    g = Graph()
    g.sparse_input("x", 2)
    g.op("y", "global_pool", ["x"], [SP], "mode = #lattice.pool_mode<avg>, batch_size = "
         "1000000000000", F32_2)
    g.output("y", F32_2)
    with pytest.raises(ValueError, match="batch_size must be at most"):
        load_lattice_program(write_artifact(tmp_path / "a", g, {}))


# --- weights.safetensors ---------------------------------------------------------------------


def _corrupt(root: Path, data: bytes) -> None:
    (root / schema.WEIGHT_FILE).write_bytes(data)


WEIGHT_CASES: list[tuple[str, Callable[[Path], None], str]] = [
    ("empty-file", lambda r: _corrupt(r, b""), "not a readable safetensors file"),
    ("garbage", lambda r: _corrupt(r, b"\x00" * 64), "not a readable safetensors file"),
    ("truncated", lambda r: _corrupt(r, (r / schema.WEIGHT_FILE).read_bytes()[:-40]),
     "not a readable safetensors file"),
    ("huge-header-length", lambda r: _corrupt(r, struct.pack("<Q", 2**62) + b"{}"),
     "not a readable safetensors file"),
    ("header-not-json", lambda r: _corrupt(r, struct.pack("<Q", 8) + b"{{{{{{{{"),
     "not a readable safetensors file"),
    ("missing-key", lambda r: save_file({}, str(r / schema.WEIGHT_FILE)), "has no tensor"),
    ("extra-key", lambda r: save_file({**_weights(), "stray": torch.ones(1)},
                                      str(r / schema.WEIGHT_FILE)), "no lattice.weight names"),
    ("wrong-dtype-int", lambda r: save_file({"conv.weight": torch.ones(3, 3, 3, 3, 2,
                                                                       dtype=torch.int32)},
                                            str(r / schema.WEIGHT_FILE)),
     "must be f32 as the weight type declares"),
    ("wrong-dtype-f64", lambda r: save_file({"conv.weight": torch.ones(3, 3, 3, 3, 2,
                                                                       dtype=torch.float64)},
                                            str(r / schema.WEIGHT_FILE)),
     "must be f32 as the weight type declares"),
    ("wrong-rank", lambda r: save_file({"conv.weight": torch.ones(3, 54)},
                                       str(r / schema.WEIGHT_FILE)), "stores a 5-D tensor"),
]


@pytest.mark.parametrize(("breaker", "fragment"), [c[1:] for c in WEIGHT_CASES],
                         ids=[c[0] for c in WEIGHT_CASES])
def test_hostile_weights_are_refused(tmp_path: Path, breaker: Callable[[Path], None],
                                     fragment: str) -> None:
    root = write_artifact(tmp_path / "a", _graph(), _weights())
    breaker(root)
    with pytest.raises(ValueError) as info:
        load_lattice_program(root)
    assert fragment in str(info.value)


def test_wrong_weight_shape_is_refused_when_run(tmp_path: Path) -> None:
    root = write_artifact(tmp_path / "a", _graph(), {"conv.weight": torch.ones(3, 3, 3, 3, 5)})
    program = load_lattice_program(root)  # the input width is known only at run time
    with pytest.raises(ValueError, match=r"needs \(C_out, 3, 3, 3, 2\)"):
        program(**_inputs())


def _packed_graph() -> Graph:
    g = Graph()
    g.tensor_input("f", "tensor<?x32xf32>")
    packing = "#lattice.packing<int4, group_size = 32, scale_dtype = f16, mode = affine>"
    g.weight("w", "lin", "linear", packing)
    g.op("y", "linear", ["f", "w"], ["tensor<?x32xf32>", weight_type("linear")], "",
         "tensor<?x4xf32>")
    g.output("y", "tensor<?x4xf32>")
    return g


@pytest.mark.parametrize(("scales", "biases", "fragment"), [
    ((1, 4, 2), (1, 4, 1), "do not match weight"),
    ((1, 3, 1), (1, 3, 1), "do not match weight"),
    ((1, 4, 1), (1, 4), "packed biases must be a 3-D f16 tensor"),
])
def test_inconsistent_packed_weights_are_refused(tmp_path: Path, scales: tuple[int, ...],
                                                 biases: tuple[int, ...], fragment: str) -> None:
    weights = {"lin.weight": torch.zeros(1, 4, 4, dtype=torch.uint32),
               "lin.scales": torch.ones(scales, dtype=torch.float16),
               "lin.biases": torch.zeros(biases, dtype=torch.float16)}
    root = write_artifact(tmp_path / "a", _packed_graph(), weights)
    with pytest.raises(ValueError) as info:
        load_lattice_program(root)(f=torch.ones(3, 32))
    assert fragment in str(info.value)


def test_consistent_packed_weights_run(tmp_path: Path) -> None:
    weights = {"lin.weight": torch.zeros(1, 4, 4, dtype=torch.uint32),
               "lin.scales": torch.ones(1, 4, 1, dtype=torch.float16),
               "lin.biases": torch.full((1, 4, 1), 0.5, dtype=torch.float16)}
    root = write_artifact(tmp_path / "a", _packed_graph(), weights)
    out = load_lattice_program(root)(f=torch.ones(3, 32))["output"]
    assert torch.equal(out, torch.full((3, 4), 16.0))


def test_unpacking_is_checked_against_the_memory_budget(tmp_path: Path) -> None:
    """int4 codes unpack to ~35x the file's bytes (int64 codes, float32 values): the file
    size alone was checked, so a file within the budget could allocate many times it."""
    weights = {"lin.weight": torch.zeros(1, 4, 4, dtype=torch.uint32),
               "lin.scales": torch.ones(1, 4, 1, dtype=torch.float16),
               "lin.biases": torch.full((1, 4, 1), 0.5, dtype=torch.float16)}
    root = write_artifact(tmp_path / "a", _packed_graph(), weights)
    program = load_lattice_program(root)
    previous = tl.set_memory_budget((root / schema.WEIGHT_FILE).stat().st_size + 64)
    try:
        with pytest.raises(ValueError, match=r"line 14: lattice.linear weight: weight 'lin': "
                           r"unpacking packed weight \(1, 4, 4\) \(128 codes\) would "
                           r"allocate 3072 bytes"):
            program(f=torch.ones(3, 32))
        with pytest.raises(MemoryBudgetError, match="unpacking packed weight"):
            unpack_weight(weights["lin.weight"], weights["lin.scales"], weights["lin.biases"],
                          bits=4)
    finally:
        tl.set_memory_budget(previous)


# --- the artifact directory -----------------------------------------------------------------


@pytest.mark.parametrize("name", [schema.GRAPH_FILE, schema.WEIGHT_FILE,
                                  "expected.safetensors"])
def test_symlinks_are_refused(tmp_path: Path, name: str) -> None:
    root = write_artifact(tmp_path / "a", _graph(), _weights())
    real = tmp_path / "elsewhere"
    target = root / name
    if target.exists():
        target.rename(real)
    else:
        real.write_bytes(b"")
    os.symlink(real, target)
    with pytest.raises(ValueError, match=f"{name} is a symbolic link"):
        load_lattice_program(root)


def test_a_directory_named_like_the_graph_is_refused(tmp_path: Path) -> None:
    root = write_artifact(tmp_path / "a", _graph(), _weights())
    (root / schema.GRAPH_FILE).unlink()
    (root / schema.GRAPH_FILE).mkdir()
    with pytest.raises(ValueError, match=r"graph\.mlir is not a regular file"):
        load_lattice_program(root)


def test_an_extra_file_is_refused(tmp_path: Path) -> None:
    root = write_artifact(tmp_path / "a", _graph(), _weights())
    (root / "notes.txt").write_text("hi")
    with pytest.raises(ValueError, match=r"1 unexpected other entry"):
        load_lattice_program(root)


# --- program inputs ---------------------------------------------------------------------------


def _with(**changes: torch.Tensor | None) -> dict[str, torch.Tensor]:
    inputs = _inputs()
    for key, value in changes.items():
        if value is None:
            del inputs[key]
        else:
            inputs[key] = value
    return inputs


_C = random_coords(20, 4)
_F = torch.randn(20, 2, generator=torch.Generator().manual_seed(0))


def _coords_with(row: int, value: list[int]) -> torch.Tensor:
    c = _C.clone()
    c[row] = torch.tensor(value, dtype=torch.int32)
    return c


INPUT_CASES: list[tuple[str, dict[str, torch.Tensor | None], type[Exception], str]] = [
    ("missing", {"x_active": None}, ValueError, "missing ['x_active']"),
    ("extra", {"x_extra": torch.ones(1)}, ValueError, "unexpected ['x_extra']"),
    ("not-a-tensor", {"x_active": [20]}, TypeError, "'x_active' must be a torch.Tensor"),
    ("float-coords", {"x_coords": _C.float()}, TypeError, "'x_coords' must be i32"),
    ("int64-coords-past-int32", {"x_coords": _C.long() + 2**32}, ValueError,
     "'x_coords' is i32: its torch.int64 values [4294967296,"),
    ("int64-active-past-int32", {"x_active": torch.tensor([-(2**40)])}, ValueError,
     "'x_active' is i32"),
    ("bool-active", {"x_active": torch.tensor([True])}, TypeError, "'x_active' must be i32"),
    ("int-features", {"x_features": _F.int()}, TypeError, "'x_features' must be f32"),
    ("f64-features", {"x_features": _F.double()}, TypeError,
     "'x_features' must be f32 (float32 or float16), got torch.float64"),
    ("coords-3-columns", {"x_coords": _C[:, :3]}, ValueError, "must have shape ?x4"),
    ("features-wrong-width", {"x_features": torch.ones(20, 3)}, ValueError,
     "must have shape ?x2"),
    ("features-1d", {"x_features": torch.ones(20)}, ValueError, "must have shape ?x2"),
    ("active-2", {"x_active": torch.tensor([1, 2], dtype=torch.int32)}, ValueError,
     "must have shape 1"),
    ("rows-differ", {"x_features": torch.ones(19, 2)}, ValueError, "with N = 20 rows"),
    ("active-negative", {"x_active": torch.tensor([-1], dtype=torch.int32)}, ValueError,
     "%x_active = -1 is outside [0, 20]"),
    ("active-past-rows", {"x_active": torch.tensor([21], dtype=torch.int32)}, ValueError,
     "%x_active = 21 is outside [0, 20]"),
    ("negative-coordinate", {"x_coords": _coords_with(3, [0, -1, 0, 0])}, ValueError,
     "coords must be non-negative"),
    ("negative-batch", {"x_coords": _coords_with(3, [-1, 0, 0, 0])}, ValueError,
     "non-negative"),
    ("duplicate-rows", {"x_coords": _coords_with(1, _C[0].tolist())}, ValueError,
     "rows must be unique, row 1 repeats"),
]


@pytest.mark.parametrize(("changes", "exc", "fragment"), [c[1:] for c in INPUT_CASES],
                         ids=[c[0] for c in INPUT_CASES])
def test_hostile_inputs_are_refused(program, changes: dict[str, torch.Tensor | None],
                                    exc: type[Exception], fragment: str) -> None:
    with pytest.raises(exc) as info:
        program(**_with(**changes))
    assert fragment in str(info.value)


def test_integer_inputs_of_another_width_that_fit_are_taken(program) -> None:
    want = program(**_inputs())["output"]
    got = program(x_coords=_C.long(), x_features=_F, x_active=torch.tensor([20]))["output"]
    assert torch.equal(got.coords, want.coords) and torch.equal(got.features, want.features)
    half = program(x_coords=_C, x_features=_F.half(), x_active=torch.tensor([20]))["output"]
    assert half.features.dtype == torch.float32 and half.coords.shape == want.coords.shape


def test_physical_coordinates_not_divisible_by_the_stride(tmp_path: Path) -> None:
    root = write_artifact(tmp_path / "a", _graph(stride=(2, 2, 2)), _weights())
    coords = _C * torch.tensor([1, 2, 2, 2], dtype=torch.int32)
    program = load_lattice_program(root)
    assert program(**sparse_inputs("x", coords, _F))["output"].coords.shape[0] > 0
    coords[4, 2] += 1
    with pytest.raises(ValueError, match=r"row 4 .* is not divisible by the declared stride"):
        program(**sparse_inputs("x", coords, _F))
    # rows past active are ignored, whatever they hold
    assert program(**sparse_inputs("x", coords, _F, active=4))["output"].active.item() > 0


def _sorted(out) -> tuple[torch.Tensor, torch.Tensor]:
    key = out.coords.to(torch.int64)
    order = torch.tensor(sorted(range(key.shape[0]), key=lambda i: key[i].tolist()),
                         dtype=torch.int64)
    return key[order], out.features[order]


def test_rows_and_batches_in_any_order_give_the_same_result(program) -> None:
    """Input rows need not be sorted (by batch or otherwise): the result is the same set."""
    want = _sorted(program(**_inputs())["output"])
    perm = torch.randperm(20, generator=torch.Generator().manual_seed(5))
    got = _sorted(program(**sparse_inputs("x", _C[perm], _F[perm]))["output"])
    assert torch.equal(got[0], want[0])
    assert torch.allclose(got[1], want[1], atol=1e-5)


def test_batches_with_gaps_keep_their_indices(program) -> None:
    c = _C.clone()
    c[:, 0] = torch.where(c[:, 0] == 1, 7, 0).to(torch.int32)
    out = program(**sparse_inputs("x", c, _F))["output"]
    assert set(out.coords[:, 0].tolist()) == {0, 7}


def test_nan_features_propagate_and_stay_local(program) -> None:
    """NaN is data, not an error: it reaches exactly the outputs it feeds."""
    clean = _sorted(program(**_inputs())["output"])
    f = _F.clone()
    f[0, 0] = float("nan")
    got = _sorted(program(**sparse_inputs("x", _C, f))["output"])
    assert torch.equal(got[0], clean[0])
    nan_rows = torch.isnan(got[1]).any(dim=1)
    assert nan_rows.any() and not nan_rows.all()
    assert torch.allclose(got[1][~nan_rows], clean[1][~nan_rows], atol=1e-5)


def test_zero_active_rows_give_an_empty_output(program) -> None:
    out = program(**sparse_inputs("x", _C, _F, active=0))["output"]
    assert out.coords.shape == (0, 4) and int(out.active) == 0


# --- the graph fuzz target (fuzz/fuzz_graph.py) -------------------------------------------

_ROOT = Path(__file__).resolve().parents[2]
_SEEDS = sorted((_ROOT / "fuzz" / "corpus" / "graph").iterdir())


@pytest.mark.parametrize("seed", _SEEDS, ids=[s.name for s in _SEEDS])
def test_graph_fuzz_seeds_are_valid_graphs(seed: Path) -> None:
    """The seeds must pass every check, so that mutations start from accepted graphs."""
    module = load_module(seed.read_text(encoding="utf-8"))
    assert module.function == "forward" and module.operations


def test_graph_fuzz_checker_reports_unclean_exceptions(monkeypatch) -> None:
    import sys

    if str(_ROOT) not in sys.path:
        sys.path.insert(0, str(_ROOT))
    from fuzz import fuzz_graph

    data = _SEEDS[0].read_bytes()
    fuzz_graph.check(data)  # a valid graph
    fuzz_graph.check(b"module attributes {" + b"[" * 100)  # a clean ValueError

    def deep(text: str) -> None:
        raise RecursionError("maximum recursion depth exceeded")

    monkeypatch.setattr(fuzz_graph, "parse_module", deep)
    with pytest.raises(AssertionError, match="unclean exception RecursionError"):
        fuzz_graph.check(data)

    def silent(text: str) -> None:
        raise ValueError()

    monkeypatch.setattr(fuzz_graph, "parse_module", silent)
    with pytest.raises(AssertionError, match="without a message"):
        fuzz_graph.check(data)


def _devoxelize_graph() -> Graph:
    g = Graph()
    g.tensor_input("pts", "tensor<?x3xf32>")
    g.tensor_input("b", "tensor<?xi32>")
    g.tensor_input("pa", "tensor<1xi32>")
    g.sparse_input("v", 2)
    g.op("o", "devoxelize", ["pts", "v", "b", "pa"],
         ["tensor<?x3xf32>", SP, "tensor<?xi32>", "tensor<1xi32>"],
         "voxel_size = array<f64: 1.0, 1.0, 1.0>, origin = array<f64: 0.0, 0.0, 0.0>, "
         "interpolation = #lattice.point_interpolation<nearest>", F32_2)
    g.output("o", F32_2)
    return g


@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_devoxelize_refuses_non_finite_points(tmp_path: Path, bad: float) -> None:
    program = load_lattice_program(write_artifact(tmp_path / "a", _devoxelize_graph(), {}))
    voxels = sparse_inputs("v", torch.zeros(1, 4, dtype=torch.int32), torch.ones(1, 2))
    pts = torch.tensor([[0.2, 0.2, 0.2], [bad, 0.5, 0.5]])
    common = {"b": torch.zeros(2, dtype=torch.int32), **voxels}
    out = program(pts=pts, pa=torch.tensor([1], dtype=torch.int32), **common)["output"]
    assert out.tolist() == [[1.0, 1.0]]  # the bad row is past point_active_rows
    with pytest.raises(ValueError, match=r"points must be finite, points\[1\]"):
        program(pts=pts, pa=torch.tensor([2], dtype=torch.int32), **common)


# --- expected outputs of a conformance case ------------------------------------------------


@pytest.mark.parametrize(("key", "value", "fragment"), [
    ("out.active", torch.zeros(0, dtype=torch.int32), "out.active must be one integer"),
    ("out.active", torch.tensor([5], dtype=torch.int32), "out.active = 5 is outside [0, 2]"),
    ("out.active", torch.tensor([-1], dtype=torch.int32), "out.active = -1 is outside"),
    ("out.coords", torch.zeros(2, 3, dtype=torch.int32), "out.coords must be an integer (N, 4)"),
    ("out.coords", torch.zeros(2, 4), "out.coords must be an integer (N, 4)"),
    ("out.features", torch.zeros(3, 2), "out.features must be (N, C) with N = 2"),
    # Compared as floats, 1+5j matched 1 and True matched 1.0: never a pass.
    ("out.features", torch.ones(2, 2) + 5j, "out.features must hold real numbers"),
    ("out.features", torch.ones(2, 2, dtype=torch.bool), "out.features must hold real numbers"),
    ("out.coords", torch.tensor([[0, 0, 0, 0], [0, 1, 0, 0]], dtype=torch.bool),
     "out.coords must hold real numbers (a floating or integer dtype), got torch.bool"),
    ("out.active", torch.tensor([True]), "out.active must hold real numbers"),
])
def test_malformed_expected_outputs_are_refused(key: str, value: torch.Tensor,
                                                fragment: str) -> None:
    from torch_lattice.artifact import SparseOutput
    from torch_lattice.artifact.conformance import compare_outputs

    coords = torch.tensor([[0, 0, 0, 0], [0, 1, 0, 0]], dtype=torch.int32)
    got = SparseOutput(coords, torch.ones(2, 2), torch.tensor([2], dtype=torch.int32))
    expected = {"out.coords": coords, "out.features": torch.ones(2, 2),
                "out.active": torch.tensor([2], dtype=torch.int32)}
    assert compare_outputs({"out": got}, expected, rtol=0, atol=0)[0].ok
    with pytest.raises(ValueError) as info:
        compare_outputs({"out": got}, {**expected, key: value}, rtol=0, atol=0)
    assert fragment in str(info.value)


@pytest.mark.parametrize("value", [torch.ones(3) + 7j, torch.ones(3, dtype=torch.bool)],
                         ids=["complex", "bool"])
def test_a_dense_expected_output_must_hold_real_numbers(value: torch.Tensor) -> None:
    from torch_lattice.artifact.conformance import compare_outputs

    assert compare_outputs({"d": torch.ones(3)}, {"d": torch.ones(3)}, rtol=0, atol=0)[0].ok
    with pytest.raises(ValueError, match=f"expected d must hold real numbers .*{value.dtype}"):
        compare_outputs({"d": torch.ones(3)}, {"d": value}, rtol=0, atol=0)


@pytest.mark.parametrize("broken", ["inputs.safetensors", "expected.safetensors"])
def test_replay_cli_reports_a_corrupt_fixture_file(tmp_path: Path, broken: str,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    from torch_lattice.artifact.__main__ import main

    root = write_artifact(tmp_path / "case", _graph(), _weights())
    save_file(_inputs(), str(root / "inputs.safetensors"))
    save_file({"output.coords": torch.zeros(0, 4, dtype=torch.int32),
               "output.features": torch.zeros(0, 3),
               "output.active": torch.tensor([0], dtype=torch.int32)},
              str(root / "expected.safetensors"))
    assert main(["replay", str(root)]) == 1  # a real mismatch: the replay has rows
    (root / broken).write_bytes(b"\x00" * 20)
    assert main(["replay", str(root)]) == 1
    assert "is not a readable safetensors file" in capsys.readouterr().out
