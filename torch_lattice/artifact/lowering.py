"""Lowering of traced nodes to lattice ops.

Each supported module type and function has one lowering here.  A lowering
receives the node's symbolic arguments (:class:`Sparse`, :class:`Dense` or
plain Python values), the real result the node computed on the example inputs
(which gives channel counts, dtypes, strides and batch sizes) and emits the
ops through :class:`Lowering`.  Anything without a lowering raises
:class:`ExportError` naming the node.
"""

from __future__ import annotations

import inspect
import operator
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import fx, nn

import torch_lattice
from torch_lattice import sparse_ops, voxel
from torch_lattice.artifact import schema
from torch_lattice.artifact.errors import ExportError
from torch_lattice.artifact.mlir_text import ModuleText, Value, sparse_type, tensor_type
from torch_lattice.artifact.relations import (
    SupportPlan,
    centring,
    contract_padding,
    exportable_padding,
    planned_rows,
    support_plan,
)
from torch_lattice.artifact.weights import WeightTable, conv_weight_to_artifact, dtype_name
from torch_lattice.export_hints import EXPORT_ROLES
from torch_lattice.geometry import triple
from torch_lattice.nn import modules as M
from torch_lattice.nn.functional import pooling as P
from torch_lattice.nn.modules.conv import ConvBase
from torch_lattice.nn.modules.normalized import NormalizedConvBase
from torch_lattice.tensor import SparseTensor, Support

__all__ = [
    "FUNCTION_LOWERINGS",
    "LOWERED_METHODS",
    "MODULE_LOWERINGS",
    "Dense",
    "Lowering",
    "Sparse",
    "function_lowering",
    "leaf_functions",
]


@dataclass(frozen=True)
class Sparse:
    """A sparse value of the graph."""

    value: Value


@dataclass(frozen=True)
class Dense:
    """A dense tensor value of the graph (features, pooled rows, points)."""

    value: Value


Sym = Any  # Sparse | Dense | Python constants and containers of them


def describe(node: fx.Node) -> str:
    """``node 'name' (call_module layer1.conv)``: how errors name a node."""
    target = (
        node.target
        if isinstance(node.target, str)
        else getattr(node.target, "__qualname__", repr(node.target))
    )
    return f"node {node.name!r} ({node.op} {target})"


class Lowering:
    """State of one export: the module text, the weights and the input values."""

    def __init__(self, text: ModuleText, weights: WeightTable) -> None:
        self.text = text
        self.weights = weights
        self._point_active: dict[str, Value] = {}
        self.arguments: set[str] = set()  # names of function arguments
        # The first graph value on each Support (held, so its id stays unique).
        self._supports: dict[int, tuple[Support, Sparse]] = {}

    def remember(self, sym: Any, real: Any) -> None:
        """Records ``sym`` as a graph value carrying ``real``'s support."""
        if isinstance(sym, Sparse) and isinstance(real, SparseTensor):
            self._supports.setdefault(id(real.support), (real.support, sym))

    def value_with_support(self, support: Support) -> Sparse | None:
        """The graph value whose support is ``support`` (the same object), if any."""
        entry = self._supports.get(id(support))
        return entry[1] if entry is not None and entry[0] is support else None

    def cached_target(self, call: Call, what: str) -> Sparse:
        """The graph value whose support a no-target transpose landed on (our cached
        inverse support); the contract would generate one instead, so the artifact
        names it as the target."""
        found = self.value_with_support(call.real.support)
        if found is None:
            raise ExportError(
                f"{describe(call.node)}: the {what} landed on a cached support that no value "
                "of the graph carries; pass the target support explicitly"
            )
        return found

    # --- value helpers -----------------------------------------------------
    def sparse_result(self, real: Any, node: fx.Node) -> str:
        if not isinstance(real, SparseTensor):
            raise ExportError(f"{describe(node)} must return a SparseTensor")
        return sparse_type(dtype_name(real.feats.dtype, f"{describe(node)} features"))

    def dense_type(self, real: Any, node: fx.Node) -> str:
        if not isinstance(real, torch.Tensor) or real.ndim < 1:
            raise ExportError(f"{describe(node)} must return a tensor with a row dimension")
        index = not real.is_floating_point()
        dtype = dtype_name(real.dtype, f"{describe(node)} result", index=index)
        return tensor_type([None, *real.shape[1:]], dtype)

    def features(self, x: Sparse, real: SparseTensor, stem: str) -> Value:
        """``lattice.sparse.decompose`` of ``x``; returns its features value."""
        dtype = dtype_name(real.feats.dtype, f"{stem} features")
        types = (
            tensor_type([None, 4], "i32"),
            tensor_type([None, real.feats.shape[1]], dtype),
            tensor_type([1], "i32"),
        )
        return self.text.decompose(x.value, types, (f"{stem}_features_in", f"{stem}_active"))[1]

    def with_features(self, x: Sparse, feats: Value, real: SparseTensor, stem: str) -> Sparse:
        out = self.text.op(
            "sparse.with_features",
            {"input": x.value, "features": feats},
            {},
            sparse_type(dtype_name(real.feats.dtype, f"{stem} features")),
            stem,
        )
        return Sparse(out)

    def point_active(self, points: Dense, node: fx.Node) -> Value:
        """The ``<points>_active`` argument (rows in use) of a points input, made once."""
        name = points.value.name
        if name not in self.arguments:
            raise ExportError(
                f"{describe(node)}: points must be a forward argument (a dense input of the "
                "model), not a computed tensor"
            )
        if name not in self._point_active:
            self._point_active[name] = self.text.argument(
                f"{name}_active", tensor_type([1], "i32"), "tensor"
            )
        return self._point_active[name]


@dataclass(frozen=True)
class Call:
    """One node being lowered: its symbolic and real arguments and its real result."""

    node: fx.Node
    args: tuple[Any, ...]
    kwargs: dict[str, Any]
    real_args: tuple[Any, ...]
    real_kwargs: dict[str, Any]
    real: Any

    @property
    def name(self) -> str:
        return self.node.name

    def bind(self, fn: Callable[..., Any]) -> tuple[dict[str, Any], dict[str, Any]]:
        """Symbolic and real arguments by parameter name, defaults applied."""
        sig = inspect.signature(fn)
        sym = sig.bind(*self.args, **self.kwargs)
        real = sig.bind(*self.real_args, **self.real_kwargs)
        sym.apply_defaults()
        real.apply_defaults()
        return dict(sym.arguments), dict(real.arguments)

    def _expect(self, value: Any, kind: type, what: str, rule: str) -> Any:
        if not isinstance(value, kind):
            raise ExportError(
                f"{describe(self.node)}: {what} must be {rule}, got {type(value).__name__}"
            )
        return value

    def sparse(self, value: Any, what: str) -> Sparse:
        return self._expect(value, Sparse, what, "a SparseTensor computed in the graph")

    def dense(self, value: Any, what: str) -> Dense:
        rule = "a dense tensor of the graph (for example features read with .feats)"
        return self._expect(value, Dense, what, rule)


ModuleLowering = Callable[[Lowering, Call, nn.Module, str], Sym]
FunctionLowering = Callable[[Lowering, Call, Callable[..., Any]], Sym]

MODULE_LOWERINGS: dict[type[nn.Module], ModuleLowering] = {}
FUNCTION_LOWERINGS: dict[Callable[..., Any], FunctionLowering] = {}


def _module(*types: type[nn.Module]) -> Callable[[ModuleLowering], ModuleLowering]:
    def register(fn: ModuleLowering) -> ModuleLowering:
        for t in types:
            MODULE_LOWERINGS[t] = fn
        return fn

    return register


def _function(*fns: Callable[..., Any] | None) -> Callable[[FunctionLowering], FunctionLowering]:
    def register(fn: FunctionLowering) -> FunctionLowering:
        for f in fns:
            if f is not None:
                FUNCTION_LOWERINGS[f] = fn
        return fn

    return register


# What a user's subclass of an exportable module may define and still be exported as
# that module: construction, initialisation, loading, copying and printing. Its forward
# (or its call), or any other method the library's classes define (what their forward
# runs), may compute something the lowering does not.
_HARMLESS_OVERRIDES = frozenset({
    "__init__", "extra_repr", "__repr__", "__str__", "reset_parameters",
    "_load_from_state_dict", "__getstate__", "__setstate__", "__deepcopy__",
})
_CALLS = frozenset({"forward", "__call__", "_call_impl"})


def _lowered_class(module: nn.Module) -> type[nn.Module] | None:
    """The nearest class of ``module`` that has a lowering."""
    return next((t for t in type(module).__mro__ if t in MODULE_LOWERINGS), None)


def _ours_or_torch(cls: type) -> bool:
    """A class of this library or of torch (``torch.nn.utils.parametrize`` injects one per
    parametrized module): lowered as what it is."""
    return cls.__module__.startswith(("torch_lattice.", "torch."))


def overridden_methods(module: nn.Module) -> list[str]:
    """``Class.method`` for each user class of ``module`` (from outside this library and
    torch) that overrides its forward, or a method of a library class behind it other
    than :data:`_HARMLESS_OVERRIDES`."""
    if _lowered_class(module) is None:
        return []
    mro = type(module).__mro__
    library = {name for cls in mro if cls.__module__.startswith("torch_lattice.")
               for name in vars(cls)}  # fmt: skip
    found = []
    for cls in mro:
        if _ours_or_torch(cls) or cls is object:
            continue
        for name, value in vars(cls).items():
            method = callable(value) or isinstance(value, (property, staticmethod, classmethod))
            if method and (name in _CALLS or (name in library and name not in _HARMLESS_OVERRIDES)):
                found.append(f"{cls.__name__}.{name}")
    return found


def module_lowering(module: nn.Module) -> ModuleLowering | None:
    """The lowering of ``module``'s nearest lowered class, or None where it has none.
    A user's subclass that overrides a method of it (:func:`overridden_methods`) would be
    exported as the base class, computing the base class's result: the export refuses
    those first (``export._check_lowering``, ``trace.trace_model``)."""
    lowered = _lowered_class(module)
    return None if lowered is None else MODULE_LOWERINGS[lowered]


def overriding_subclass_error(what: str, module: nn.Module) -> ExportError:
    """The error for a module that :func:`module_lowering` refuses for its overrides."""
    base = next(c for c in type(module).__mro__ if _ours_or_torch(c))  # nn.Module at last
    owner = "torch_lattice" if base.__module__.startswith("torch_lattice.") else "torch"
    return ExportError(
        f"{what}: {type(module).__name__} subclasses {owner}'s {base.__name__} and "
        f"overrides {', '.join(overridden_methods(module))}; the artifact would compute "
        f"{base.__name__}'s result, not its own. Export a {base.__name__} inside a module "
        "whose forward does the rest with exportable operations"
    )


# --- forward relations: centring and generated supports -----------------------


def _geometry_text(geometry: Any) -> str:
    return (f"kernel_size {tuple(geometry.kernel_size)}, stride {tuple(geometry.stride)}, "
            f"padding {tuple(geometry.padding)}, dilation {tuple(geometry.dilation)}")


def contract_forward_padding(call: Call, what: str, geometry: Any, generates: bool
                             ) -> tuple[int, int, int]:
    """The IR padding that makes the contract's centred forward relation this layer's.

    MLX Lattice reads input ``o*s + (r - k//2)*d - p'`` on odd kernel axes, Torch
    Lattice ``o*s + r*d - p``; they agree with ``p' = p - (k//2)*d``, which the IR can
    carry only when it is not negative.
    """
    k, d = geometry.kernel_size, geometry.dilation
    padding = contract_padding(k, geometry.padding, d)
    if padding is not None:
        return padding
    c = centring(k, d)
    if generates:
        nearest = exportable_padding(k, geometry.stride, d)
        hint = (f"padding {nearest}" if nearest is not None else
                "kernel_size == stride with an even kernel, or an odd kernel with stride <= "
                "kernel_size // 2 + 1 and padding = kernel_size - stride")
    else:
        hint = f"padding {tuple(max(p, ci) for p, ci in zip(geometry.padding, c, strict=True))}"
    raise ExportError(
        f"{describe(call.node)}: {what} with {_geometry_text(geometry)} has no exact artifact "
        "form: MLX Lattice centres odd kernel axes (output o reads input o*s + (r - k//2)*d - "
        f"p'), which equals this layer's o*s + r*d - p only with p' = p - (k//2)*d = p - {c}, "
        f"negative here. Nearest configuration that exports: {hint}"
    )


def generated_support_plan(call: Call, what: str, geometry: Any) -> SupportPlan:
    """How the contract regenerates the support a no-target conv or pool generates.

    The contract's ``conv3d`` and ``pool3d`` output ``unique(floor(c / stride))`` over
    the input rows; ours every reachable cell in ``[0, R_out)``.  A stride-1 expansion
    before the floor makes them equal for ``padding = kernel_size - stride``
    (:func:`~torch_lattice.artifact.relations.support_plan`), except that ours drops
    rows past ``R_out`` (:func:`check_example_rows`).
    """
    k, s, d = geometry.kernel_size, geometry.stride, geometry.dilation
    plan = support_plan(k, s, geometry.padding, d)
    if plan is None:
        nearest = exportable_padding(k, s, d)
        hint = (f"padding {nearest}" if nearest is not None
                else "kernel_size == stride with an even kernel (padding 0)")
        raise ExportError(
            f"{describe(call.node)}: a support-generating {what} with {_geometry_text(geometry)}"
            " has no exact artifact form: Torch Lattice outputs every reachable cell o "
            "(o*s + r*d - p on an input row, within [0, R_out)), the contract "
            "unique(floor(c / stride)) of its input rows (after an expansion the artifact "
            "can add only when padding = kernel_size - stride, or (kernel_size - 1) * "
            f"dilation at stride 1). Nearest configuration that exports: {hint}; or give the "
            "output support explicitly (Conv3d(...)(x, coordinates=target))"
        )
    return plan


def check_example_rows(call: Call, what: str, plan: SupportPlan, x: Any, out: Any) -> None:
    """Refuses a layer that drops, on the example, rows past ``R_out`` that ``plan``
    (and so the contract) keeps."""
    if isinstance(x, SparseTensor) and isinstance(out, SparseTensor):
        theirs = planned_rows(x.coords, plan)
        if theirs.shape[0] != out.coords.shape[0]:
            raise ExportError(
                f"{describe(call.node)}: on example_inputs this {what} drops "
                f"{theirs.shape[0] - out.coords.shape[0]} rows at the upper edge of the "
                f"input range {x.support.grid_range()} (its output range R_out ends before "
                "the last reachable cell), which the contract keeps; give the input a "
                "spatial_range large enough for every reachable output cell"
            )


def _expand_support(low: Lowering, x: Sparse, real_x: SparseTensor, plan: SupportPlan,
                    stem: str) -> Sparse:
    """``pool_transpose3d`` at stride 1 then ``pool3d`` by the stride: a value whose rows
    are the eager layer's output support (its features are not used)."""
    dtype = dtype_name(real_x.feats.dtype, f"{stem} features")
    value = x.value
    if plan.expands:
        attrs = {"kernel_size": plan.expand_kernel, "stride": (1, 1, 1),
                 "padding": (0, 0, 0), "dilation": plan.expand_dilation}
        value = low.text.op("pool_transpose3d", {"input": value, "target": None}, attrs,
                            sparse_type(dtype), f"{stem}_support_expand")
    if plan.stride != (1, 1, 1):
        attrs = {"mode": "sum", "kernel_size": plan.stride, "stride": plan.stride,
                 "padding": (0, 0, 0), "dilation": (1, 1, 1)}
        value = low.text.op("pool3d", {"input": value}, attrs, sparse_type(dtype),
                            f"{stem}_support")
    return Sparse(value)


# --- convolutions ------------------------------------------------------------


def _conv_op(module: ConvBase, target: bool, normalized: bool) -> str:
    if isinstance(module, M.GenerativeConvTranspose3d):
        if target:
            return "target_normalized_conv_transpose3d" if normalized else "target_conv_transpose3d"
        return (
            "normalized_generative_conv_transpose3d"
            if normalized
            else "generative_conv_transpose3d"
        )
    if isinstance(module, M.ConvTranspose3d):
        base = "normalized_conv_transpose3d" if normalized else "conv_transpose3d"
        return f"target_{base}" if target else base
    if isinstance(module, M.Conv3d):
        return "target_conv3d" if target else "conv3d"
    if isinstance(module, M.SubmConv3d):
        return "normalized_subm_conv3d" if normalized else "subm_conv3d"
    raise ExportError(f"{type(module).__name__} is not a convolution the contract names")


def _float_reason(op: str) -> str | None:
    """Why ``op``'s weight stays float in a quantized export (``None``: it may be packed)."""
    if op in schema.PACKED_WEIGHT_OPS:
        return None
    return (f"{op}: MLX Lattice runs target transposes with float weights only (\"target "
            "transpose convolution does not support packed weights\")")


@_module(ConvBase)
def _lower_conv(low: Lowering, call: Call, module: nn.Module, qualname: str) -> Sym:
    assert isinstance(module, ConvBase)
    x = call.sparse(call.args[0] if call.args else call.kwargs.get("input"), "the input")
    target = None
    for value in (*call.args[1:], call.kwargs.get("coordinates"), call.kwargs.get("target")):
        if value is not None:
            target = call.sparse(value, "the target support (coordinates=)")
    pointwise = module.weight.shape[0] == 1
    if isinstance(module, NormalizedConvBase) and low.weights.packing:
        # The spec rejects packed weights for this family (pointwise ones included):
        # squaring an affine-packed weight does not give the normalization's W*W.
        raise ExportError(
            f"{type(module).__name__} {qualname!r}: a normalized convolution cannot be "
            "exported with packed weights (quantize_bits): its normalization squares the "
            "weights, which an affine-packed weight does not preserve; export without "
            "quantize_bits"
        )
    # Pointwise normalized modules skip normalization (docs/semantics.md); the
    # contract's normalized ops always normalize, so they lower to the plain op.
    normalized = isinstance(module, NormalizedConvBase) and not pointwise
    real_x = call.real_args[0] if call.real_args else call.real_kwargs["input"]
    if target is None and isinstance(module, M.ConvTranspose3d):
        # Ours lands on the input support of the matching Conv3d; the contract's
        # conv_transpose3d generates every src*stride + r - padding. Name the support.
        if call.real.support is not real_x.support:  # not the 1x1x1 identity
            target = low.cached_target(call, "inverse ConvTranspose3d")
    padding = getattr(module, "padding", (0, 0, 0))
    if isinstance(module, M.Conv3d):  # the forward relation: centred in the contract
        what = f"Conv3d {qualname!r}"
        padding = contract_forward_padding(call, what, module, generates=target is None)
        if target is None:
            plan = generated_support_plan(call, what, module)
            check_example_rows(call, what, plan, real_x, call.real)
            if plan.expands:  # the contract's floor alone misses rows: name the support
                target = _expand_support(low, x, real_x, plan, qualname)
    op = _conv_op(module, target is not None, normalized)
    weight = low.weights.declare(
        f"{qualname}.weight", conv_weight_to_artifact(module.weight, module.kernel_size),
        "conv3d", _float_reason(op),
    )
    bias = None
    if module.bias is not None:
        bias = low.weights.declare(f"{qualname}.bias", module.bias, "bias")
    geometry = {
        "kernel_size": module.kernel_size,
        "stride": getattr(module, "stride", (1, 1, 1)),
        "padding": padding,
        "dilation": getattr(module, "dilation", (1, 1, 1)),
        "eps": getattr(module, "eps", None),
    }
    attrs = {a.name: geometry[a.name] for a in schema.OPS[op].attributes if a.name in geometry}
    operands = {"input": x.value, "weight": weight, "bias": bias}
    if target is not None:
        operands["target"] = target.value
    out = low.text.op(op, operands, attrs, low.sparse_result(call.real, call.node), qualname)
    return Sparse(out)


# --- pooling -----------------------------------------------------------------

_POOL_MODES = {M.MaxPool3d: "max", M.AvgPool3d: "avg", M.SumPool3d: "sum"}


def _pool(low: Lowering, call: Call, x: Sparse, mode: str, geometry: Any, stem: str) -> Sparse:
    real_x = call.real_args[0] if call.real_args else call.real_kwargs.get("input")
    what = f"{mode} pooling {stem!r}"
    padding = contract_forward_padding(call, what, geometry, generates=True)
    plan = generated_support_plan(call, what, geometry)
    if plan.expands:
        # pool3d has no target form, and expanded rows would join its windows
        raise ExportError(
            f"{describe(call.node)}: {what} with {_geometry_text(geometry)} has no exact "
            "artifact form: its output support needs rows the contract's pool3d (which "
            "outputs unique(floor(c / stride)) and takes no target) does not generate. "
            "Nearest configuration that exports: kernel_size == stride, padding 0, with an "
            "even kernel (or kernel 1)"
        )
    check_example_rows(call, what, plan, real_x, call.real)
    attrs = {
        "mode": mode,
        "kernel_size": geometry.kernel_size,
        "stride": geometry.stride,
        "padding": padding,
        "dilation": geometry.dilation,
    }
    out = low.text.op(
        "pool3d", {"input": x.value}, attrs, low.sparse_result(call.real, call.node), stem
    )
    return Sparse(out)


@_module(M.MaxPool3d, M.AvgPool3d, M.SumPool3d)
def _lower_pool_module(low: Lowering, call: Call, module: nn.Module, qualname: str) -> Sym:
    x = call.sparse(call.args[0], "the input")
    mode = next(m for t, m in _POOL_MODES.items() if isinstance(module, t))
    return _pool(low, call, x, mode, module, qualname)


_POOL_FUNCTIONS = {P.max_pool3d: "max", P.avg_pool3d: "avg", P.sum_pool3d: "sum"}


@_function(*_POOL_FUNCTIONS)
def _lower_pool_function(low: Lowering, call: Call, fn: Callable[..., Any]) -> Sym:
    sym, _ = call.bind(fn)
    x = call.sparse(sym["input"], "input")
    for name in ("kernel_size", "stride", "padding", "dilation"):
        if isinstance(sym[name], (Sparse, Dense)):
            raise ExportError(f"{describe(call.node)}: {name} must be a constant")
    geometry = P.pool_geometry(sym["kernel_size"], sym["stride"], sym["padding"], sym["dilation"])
    return _pool(low, call, x, _POOL_FUNCTIONS[fn], geometry, call.name)


def _global_pool(low: Lowering, call: Call, x: Sparse, mode: str, stem: str) -> Dense:
    real = call.real
    out = low.text.op(
        "global_pool",
        {"input": x.value},
        {"mode": mode, "batch_size": int(real.shape[0])},
        low.dense_type(real, call.node),
        stem,
    )
    return Dense(out)


@_module(M.GlobalAvgPool, M.GlobalMaxPool)
def _lower_global_module(low: Lowering, call: Call, module: nn.Module, qualname: str) -> Sym:
    mode = "avg" if isinstance(module, M.GlobalAvgPool) else "max"
    return _global_pool(low, call, call.sparse(call.args[0], "the input"), mode, qualname)


@_function(P.global_avg_pool, P.global_max_pool)
def _lower_global_function(low: Lowering, call: Call, fn: Callable[..., Any]) -> Sym:
    mode = "avg" if fn is P.global_avg_pool else "max"
    return _global_pool(low, call, call.sparse(call.args[0], "input"), mode, call.name)


# --- feature-wise modules ----------------------------------------------------


def _feature_op(
    low: Lowering,
    call: Call,
    stem: str,
    emit: Callable[[Value, str], Value],
) -> Sym:
    """Runs ``emit(features, result_type)`` on a dense value, or on a sparse value's
    features (decompose, emit, with_features)."""
    x = call.args[0] if call.args else call.kwargs.get("input")
    if isinstance(x, Dense):
        return Dense(emit(x.value, low.dense_type(call.real, call.node)))
    x = call.sparse(x, "the input")
    real_in = call.real_args[0] if call.real_args else call.real_kwargs["input"]
    feats = low.features(x, real_in, stem)
    out = emit(feats, low.dense_type(call.real.feats, call.node))
    return low.with_features(x, out, call.real, stem)


def _activation_attrs(kind: str, **params: Any) -> dict[str, Any]:
    attrs = {"kind": kind, "approximate": "none", "alpha": 0.01, "beta": 1.0, "threshold": 20.0}
    attrs.update(params)
    return attrs


def _activation(low: Lowering, call: Call, stem: str, kind: str, **params: Any) -> Sym:
    attrs = _activation_attrs(kind, **params)

    def emit(feats: Value, type_: str) -> Value:
        return low.text.op("activation", {"input": feats}, attrs, type_, f"{stem}_features")

    return _feature_op(low, call, stem, emit)


def _activation_params(module_or_kwargs: Any, kind: str) -> dict[str, Any]:
    get = (
        module_or_kwargs.get
        if isinstance(module_or_kwargs, dict)
        else lambda k, d: getattr(module_or_kwargs, k, d)
    )
    if kind == "leaky_relu":
        return {"alpha": float(get("negative_slope", 0.01))}
    if kind == "gelu":
        approx = get("approximate", "none")
        if approx not in ("none", "tanh"):
            raise ExportError(f"GELU approximate={approx!r} has no artifact form")
        return {"approximate": approx}
    if kind == "softplus":
        return {"beta": float(get("beta", 1.0)), "threshold": float(get("threshold", 20.0))}
    return {}


_ACTIVATION_MODULES: dict[type[nn.Module], str] = {
    nn.ReLU: "relu",
    nn.LeakyReLU: "leaky_relu",
    nn.SiLU: "silu",
    nn.GELU: "gelu",
    nn.Sigmoid: "sigmoid",
    nn.Tanh: "tanh",
    nn.Softplus: "softplus",
}


@_module(*_ACTIVATION_MODULES)
def _lower_activation_module(low: Lowering, call: Call, module: nn.Module, qualname: str) -> Sym:
    kind = next(k for t, k in _ACTIVATION_MODULES.items() if isinstance(module, t))
    return _activation(low, call, qualname, kind, **_activation_params(module, kind))


_ACTIVATION_FUNCTIONS: dict[Callable[..., Any], str] = {
    torch.relu: "relu",
    torch.nn.functional.relu: "relu",
    torch.nn.functional.leaky_relu: "leaky_relu",
    torch.nn.functional.silu: "silu",
    torch.nn.functional.gelu: "gelu",
    torch.sigmoid: "sigmoid",
    torch.tanh: "tanh",
    torch.nn.functional.softplus: "softplus",
}


@_function(*_ACTIVATION_FUNCTIONS)
def _lower_activation_function(low: Lowering, call: Call, fn: Callable[..., Any]) -> Sym:
    kind = _ACTIVATION_FUNCTIONS[fn]
    kwargs = dict(call.kwargs)
    if kind == "leaky_relu" and len(call.args) > 1:
        kwargs["negative_slope"] = call.args[1]
    if kind == "softplus":
        extra = call.args[1:3]
        kwargs.update(zip(("beta", "threshold")[: len(extra)], extra, strict=True))
    return _activation(low, call, call.name, kind, **_activation_params(kwargs, kind))


@_module(nn.BatchNorm1d)
def _lower_batch_norm(low: Lowering, call: Call, module: nn.Module, qualname: str) -> Sym:
    assert isinstance(module, nn.BatchNorm1d)
    if module.running_mean is None or module.running_var is None:
        raise ExportError(
            f"{describe(call.node)}: BatchNorm without running statistics "
            "(track_running_stats=False) normalizes with batch statistics, which an artifact "
            "cannot express"
        )
    c = module.num_features

    def emit(feats: Value, type_: str) -> Value:
        w = module.weight if module.weight is not None else torch.ones(c)
        b = module.bias if module.bias is not None else torch.zeros(c)
        operands = {
            "input": feats,
            "scale": low.weights.declare(f"{qualname}.weight", w, "channel"),
            "bias": low.weights.declare(f"{qualname}.bias", b, "bias"),
            "mean": low.weights.declare(f"{qualname}.running_mean", module.running_mean, "channel"),
            "var": low.weights.declare(f"{qualname}.running_var", module.running_var, "channel"),
        }
        attrs = {"eps": float(module.eps)}
        if not isinstance(module, M.BatchNormReLU):
            return low.text.op("batch_norm", operands, attrs, type_, f"{qualname}_features")
        # The fused module is the two artifact ops it computes.
        normalized = low.text.op("batch_norm", operands, attrs, type_, f"{qualname}_normalized")
        relu = _activation_attrs("relu")
        return low.text.op("activation", {"input": normalized}, relu, type_, f"{qualname}_features")

    return _feature_op(low, call, qualname, emit)


@_module(nn.Linear)
def _lower_linear(low: Lowering, call: Call, module: nn.Module, qualname: str) -> Sym:
    assert isinstance(module, nn.Linear)
    x = call.dense(call.args[0], "the input of Linear")
    if call.real.ndim != 2:
        raise ExportError(f"{describe(call.node)}: Linear is exportable on (rows, features) only")
    weight = low.weights.declare(f"{qualname}.weight", module.weight, "linear")
    bias = None
    if module.bias is not None:
        bias = low.weights.declare(f"{qualname}.bias", module.bias, "bias")
    out = low.text.op(
        "linear",
        {"input": x.value, "weight": weight, "bias": bias},
        {},
        low.dense_type(call.real, call.node),
        qualname,
    )
    return Dense(out)


@_module(nn.Identity, nn.Dropout)
def _lower_identity(low: Lowering, call: Call, module: nn.Module, qualname: str) -> Sym:
    return call.args[0]  # eval-mode dropout is the identity


# --- feature algebra and supports ---------------------------------------------


def _cat_chain(low: Lowering, call: Call, values: Sequence[Any], join: str) -> Sym:
    if not isinstance(values, (list, tuple)) or len(values) < 1:
        raise ExportError(f"{describe(call.node)}: cat needs a list of SparseTensors")
    parts = [call.sparse(v, f"cat input {i}") for i, v in enumerate(values)]
    out = parts[0]
    type_ = low.sparse_result(call.real, call.node)
    for i, part in enumerate(parts[1:], start=1):
        value = low.text.op(
            "sparse.cat",
            {"lhs": out.value, "rhs": part.value},
            {"join": join},
            type_,
            f"{call.name}_{i}",
        )
        out = Sparse(value)
    return out


@_function(torch_lattice.cat, sparse_ops.cat)
def _lower_cat(low: Lowering, call: Call, fn: Callable[..., Any]) -> Sym:
    # Equal supports (the only ones tl.cat accepts): every join gives the same rows.
    return _cat_chain(low, call, call.args[0] if call.args else call.kwargs["tensors"], "inner")


def _binary(
    low: Lowering, call: Call, lhs: Any, rhs: Any, op: str, join: str, fills: tuple[float, float]
) -> Sym:
    a = call.sparse(lhs, f"the left operand of {op}")
    b = call.sparse(rhs, f"the right operand of {op}")
    attrs = {"op": op, "join": join, "lhs_fill": fills[0], "rhs_fill": fills[1]}
    out = low.text.op(
        "sparse.binary",
        {"lhs": a.value, "rhs": b.value},
        attrs,
        low.sparse_result(call.real, call.node),
        call.name,
    )
    return Sparse(out)


@_function(operator.add, sparse_ops.add)
def _lower_add(low: Lowering, call: Call, fn: Callable[..., Any]) -> Sym:
    # tl's ``a + b`` needs equal supports, where the outer join is exact.
    return _binary(low, call, call.args[0], call.args[1], "add", "outer", (0.0, 0.0))


# --- points --------------------------------------------------------------------


def _floats(call: Call, name: str, value: Any) -> tuple[float, float, float]:
    if isinstance(value, (Sparse, Dense, torch.Tensor)):
        raise ExportError(f"{describe(call.node)}: {name} must be a number or 3 numbers")
    items = tuple(value) if isinstance(value, (tuple, list)) else (value,) * 3
    return (float(items[0]), float(items[1]), float(items[2]))


@_function(torch_lattice.voxelize, voxel.voxelize)
def _lower_voxelize(low: Lowering, call: Call, fn: Callable[..., Any]) -> Sym:
    sym, _ = call.bind(fn)
    if sym["reduction"] not in ("mean", "sum"):
        raise ExportError(
            f"{describe(call.node)}: voxelize reduction={sym['reduction']!r} has no artifact "
            "form (the contract has 'mean' and 'sum')"
        )
    points = call.dense(sym["points"], "points")
    if sym["batch_indices"] is None:
        raise ExportError(
            f"{describe(call.node)}: voxelize needs batch_indices passed from a forward "
            "argument to be exported (the contract has no default batch)"
        )
    operands = {
        "points": points.value,
        "features": call.dense(sym["features"], "features").value,
        "batch_indices": call.dense(sym["batch_indices"], "batch_indices").value,
        "active_rows": low.point_active(points, call.node),
    }
    attrs = {
        "voxel_size": _floats(call, "voxel_size", sym["voxel_size"]),
        "origin": _floats(call, "origin", sym["origin"]),
        "reduction": sym["reduction"],
        "stride": (1, 1, 1),
    }
    out = low.text.op(
        "voxelize", operands, attrs, low.sparse_result(call.real, call.node), call.name
    )
    return Sparse(out)


@_function(torch_lattice.devoxelize, voxel.devoxelize)
def _lower_devoxelize(low: Lowering, call: Call, fn: Callable[..., Any]) -> Sym:
    sym, real = call.bind(fn)
    points = call.dense(sym["points"], "points")
    if sym["batch_indices"] is None:
        raise ExportError(
            f"{describe(call.node)}: devoxelize needs batch_indices passed from a forward "
            "argument to be exported"
        )
    stride = real["voxels"].stride
    size = _floats(call, "voxel_size", sym["voxel_size"])
    edge = tuple(v * s for v, s in zip(size, stride, strict=True))
    # The contract samples voxel q at its corner q * edge (nearest: round, linear:
    # floor and floor + 1); ours at its centre (q + 0.5) * edge.  Shifting the
    # origin by half an edge makes the two the same.
    origin = tuple(
        o + 0.5 * e for o, e in zip(_floats(call, "origin", sym["origin"]), edge, strict=True)
    )
    interpolation = {"nearest": "nearest", "trilinear": "linear"}[sym["interpolation"]]
    operands = {
        "points": points.value,
        "voxels": call.sparse(sym["voxels"], "voxels").value,
        "batch_indices": call.dense(sym["batch_indices"], "batch_indices").value,
        "point_active_rows": low.point_active(points, call.node),
    }
    attrs = {"voxel_size": edge, "origin": origin, "interpolation": interpolation}
    out = low.text.op(
        "devoxelize", operands, attrs, low.dense_type(call.real, call.node), call.name
    )
    return Dense(out)


# --- structural: features in and out of sparse values -------------------------


def lower_getattr(low: Lowering, call: Call) -> Sym:
    """``x.feats`` / ``x.F`` of a sparse value: its features (``sparse.decompose``)."""
    obj, attr = call.args[0], call.args[1]
    if isinstance(obj, Sparse) and attr in ("feats", "F"):
        return Dense(low.features(obj, call.real_args[0], call.name))
    raise ExportError(
        f"{describe(call.node)}: reading .{attr} of a {type(obj).__name__} is not exportable "
        "(only a SparseTensor's .feats is)"
    )


# The methods lower_method takes (of a SparseTensor; the exporter refuses the others
# before the graph runs).
LOWERED_METHODS = frozenset({"replace"})


def lower_method(low: Lowering, call: Call) -> Sym:
    """``x.replace(feats)``: the same support with new features."""
    method = call.node.target
    if method in LOWERED_METHODS and isinstance(call.args[0], Sparse):
        feats = call.args[1] if len(call.args) > 1 else call.kwargs.get("feats")
        dense = call.dense(feats, "the new features of replace()")
        return low.with_features(call.args[0], dense.value, call.real, call.name)
    raise ExportError(f"{describe(call.node)}: method .{method}() is not exportable")


# --- building blocks (present once torch_lattice has them) ----------------------

_F = torch_lattice.nn.functional


def _const(call: Call, name: str, value: Any) -> Any:
    if isinstance(value, (Sparse, Dense, torch.Tensor)):
        raise ExportError(f"{describe(call.node)}: {name} must be a constant")
    return value


def _optional_target(call: Call, value: Any) -> Value | None:
    return None if value is None else call.sparse(value, "target").value


@_function(getattr(_F, "pool_transpose3d", None))
def _lower_pool_transpose(low: Lowering, call: Call, fn: Callable[..., Any]) -> Sym:
    sym, _ = call.bind(fn)
    geometry = P.pool_geometry(
        *(_const(call, n, sym[n]) for n in ("kernel_size", "stride", "padding", "dilation"))
    )
    attrs = {
        "kernel_size": geometry.kernel_size,
        "stride": geometry.stride,
        "padding": geometry.padding,
        "dilation": geometry.dilation,
    }
    target = _optional_target(call, sym["target"])
    if target is None and not sym.get("expand_coordinates", False):
        # Ours reuses a cached pooling input when there is one; the contract generates.
        cached = low.value_with_support(call.real.support)
        target = None if cached is None else cached.value
    operands = {"input": call.sparse(sym["input"], "input").value, "target": target}
    type_ = low.sparse_result(call.real, call.node)
    return Sparse(low.text.op("pool_transpose3d", operands, attrs, type_, call.name))


@_function(getattr(_F, "trilinear_upsample3d", None))
def _lower_trilinear(low: Lowering, call: Call, fn: Callable[..., Any]) -> Sym:
    sym, _ = call.bind(fn)
    attrs = {"stride": triple("stride", _const(call, "stride", sym["stride"]), 1)}
    operands = {
        "input": call.sparse(sym["input"], "input").value,
        "target": _optional_target(call, sym["target"]),
    }
    type_ = low.sparse_result(call.real, call.node)
    return Sparse(low.text.op("trilinear_upsample3d", operands, attrs, type_, call.name))


@_function(getattr(_F, "global_pool", None))
def _lower_global_pool(low: Lowering, call: Call, fn: Callable[..., Any]) -> Sym:
    sym, _ = call.bind(fn)
    mode = _const(call, "mode", sym["mode"])
    return _global_pool(low, call, call.sparse(sym["input"], "input"), mode, call.name)


@_function(getattr(torch_lattice, "reindex_sparse", None))
def _lower_reindex(low: Lowering, call: Call, fn: Callable[..., Any]) -> Sym:
    sym, _ = call.bind(fn)
    operands = {
        "input": call.sparse(sym["input"], "input").value,
        "target": call.sparse(sym["target"], "target").value,
    }
    attrs = {"fill": float(_const(call, "fill", sym["fill"]))}
    type_ = low.sparse_result(call.real, call.node)
    return Sparse(low.text.op("sparse.reindex", operands, attrs, type_, call.name))


@_function(getattr(torch_lattice, "sparse_cat", None))
def _lower_sparse_cat(low: Lowering, call: Call, fn: Callable[..., Any]) -> Sym:
    sym, _ = call.bind(fn)
    return _cat_chain(low, call, sym["inputs"], _const(call, "join", sym["join"]))


@_function(getattr(torch_lattice, "sparse_binary", None))
def _lower_sparse_binary(low: Lowering, call: Call, fn: Callable[..., Any]) -> Sym:
    sym, _ = call.bind(fn)
    fills = (
        float(_const(call, "lhs_fill", sym["lhs_fill"])),
        float(_const(call, "rhs_fill", sym["rhs_fill"])),
    )
    op = _const(call, "op", sym["op"])
    join = _const(call, "join", sym["join"])
    return _binary(low, call, sym["lhs"], sym["rhs"], op, join, fills)


# --- a model's own helpers, by the role it marks them with (export_hints) -----


def _lower_same_rows(low: Lowering, call: Call, fn: Callable[..., Any]) -> Sym:
    # The same rows, order and features; only metadata the contract does not carry
    # (Torch Lattice's declared range) changes, so the value passes through unchanged.
    first = next(iter(inspect.signature(fn).parameters))
    sym, _ = call.bind(fn)
    return call.sparse(sym[first], f"the input ({first})")


def _lower_relabel(low: Lowering, call: Call, fn: Callable[..., Any]) -> Sym:
    # y's features on x's support object: in the graph that is y itself, whose rows
    # are x's (checked on the example), whatever order a runtime gives them.
    y_name, x_name = list(inspect.signature(fn).parameters)[:2]
    sym, real = call.bind(fn)
    call.sparse(sym[x_name], x_name)
    y = call.sparse(sym[y_name], y_name)
    ry, rx = real[y_name], real[x_name]
    if ry.stride != rx.stride or not torch.equal(ry.coords, rx.coords):
        raise ExportError(
            f"{describe(call.node)}: on example_inputs {y_name}'s rows are not {x_name}'s "
            f"rows; {getattr(fn, '__name__', 'this helper')} only re-labels features of the "
            "same rows"
        )
    return y


_ROLE_LOWERINGS: dict[str, FunctionLowering] = {
    "same_rows": _lower_same_rows,
    "relabel": _lower_relabel,
}


def function_lowering(fn: Any) -> FunctionLowering | None:
    """The lowering of a called function: ours, or by the role a model marked it with."""
    found = FUNCTION_LOWERINGS.get(fn)
    if found is None and fn in EXPORT_ROLES:
        found = _ROLE_LOWERINGS[EXPORT_ROLES[fn]]
    return found


def leaf_functions() -> list[Callable[..., Any]]:
    """Every function the tracer records as one call: ours and the marked helpers."""
    return [*FUNCTION_LOWERINGS, *EXPORT_ROLES]
