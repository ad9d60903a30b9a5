"""``save_lattice_model_artifact``: a trained model to an MLX Lattice artifact.

The model is traced with torch.fx (:mod:`torch_lattice.artifact.trace`), then
run node by node on the example inputs; each node's real result gives the
shapes, dtypes, strides and batch sizes its lowering
(:mod:`torch_lattice.artifact.lowering`) writes into the graph.  The artifact
directory is written atomically (see :func:`write_artifact`).
"""

from __future__ import annotations

import copy
import json
import operator
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file
from torch import fx, nn
from torch.utils import _pytree

from torch_lattice.artifact import schema
from torch_lattice.artifact.artifact_dir import (
    check_destination as _check_destination,
)
from torch_lattice.artifact.artifact_dir import (
    check_loadable,
    check_output_names,
    clean_stale_temporaries,
    make_temporary,
    place,
    remove_artifact_files,
)
from torch_lattice.artifact.errors import ExportError
from torch_lattice.artifact.lowering import (
    LOWERED_METHODS,
    Call,
    Dense,
    Lowering,
    Sparse,
    describe,
    function_lowering,
    lower_getattr,
    lower_method,
    module_lowering,
    overridden_methods,
    overriding_subclass_error,
)
from torch_lattice.artifact.mlir_text import ModuleText, safe_name, sparse_type, tensor_type
from torch_lattice.artifact.packing import check_packing
from torch_lattice.artifact.trace import trace_model
from torch_lattice.artifact.weights import WeightTable, dtype_name
from torch_lattice.atomic_file import current_umask, new_file_mode
from torch_lattice.regular_file import nul_byte_error
from torch_lattice.tensor import SparseTensor

__all__ = [
    "FLOAT_LAYERS_METADATA",
    "ArtifactFiles",
    "ExportError",
    "save_lattice_model_artifact",
    "write_artifact",
]

# weights.safetensors metadata key: JSON {layer: why its weights stayed float}.
FLOAT_LAYERS_METADATA = "torch_lattice.float_layers"


@dataclass(frozen=True)
class ArtifactFiles:
    """What :func:`save_lattice_model_artifact` wrote."""

    artifact_dir: Path
    graph_path: Path
    weights_path: Path
    weight_keys: tuple[str, ...]
    # Quantized exports: the layers whose weights stayed float, with the reason (also in
    # weights.safetensors' metadata under FLOAT_LAYERS_METADATA, as JSON).
    float_layers: dict[str, str] = field(default_factory=dict)


def save_lattice_model_artifact(
    model: nn.Module,
    artifact_dir: str | os.PathLike[str],
    *,
    example_inputs: Sequence[Any],
    quantize_bits: int | None = None,
    quantize_group_size: int = 32,
    output_names: Sequence[str] | None = None,
) -> ArtifactFiles:
    """Exports an eval-mode model as ``graph.mlir`` + ``weights.safetensors``.

    Args:
        model: a module in eval mode built from torch_lattice modules and
            functions (see docs/artifacts.md for the supported set).
        artifact_dir: the directory to write.  If it exists it must be an
            artifact (exactly ``graph.mlir`` and ``weights.safetensors``, the
            graph an IR module) or empty; it is then replaced atomically.
            ``"."`` and ``".."`` name the current folder and its parent.
        example_inputs: the positional inputs of ``model.forward`` (a tuple or
            list), never modified (the model runs on copies); a SparseTensor
            argument ``x`` becomes the artifact inputs ``x_coords``,
            ``x_features``, ``x_active``, a tensor argument keeps its name.
        quantize_bits: None (dense weights), 4 or 8: pack the conv3d and linear
            weights of the ops MLX Lattice runs packed as affine int4 / int8 per
            group of input channels (float32 scales for float32 weights). Target
            transposes keep float weights (the result's ``float_layers`` names
            them with the reason); a normalized convolution raises.
        quantize_group_size: input channels per quantization group: 32, 64 or
            128 (the sizes MLX Lattice runs).
        output_names: names of the flattened outputs; default ``output`` for one
            output, else ``output_0``, ``output_1``, ...

    Returns:
        :class:`ArtifactFiles` with the paths, the stored weight keys and, for a
        quantized export, the layers kept in float (``float_layers``, also stored
        as JSON in ``weights.safetensors``' metadata, key ``torch_lattice.float_layers``).

    Raises:
        ValueError: (an ``ExportError``) a module in training mode, an
            untraceable forward, an unsupported module or function (named by
            node), a normalized convolution with ``quantize_bits``, bad
            arguments. Nothing is written on failure.
        TypeError: arguments of the wrong type.
        FileExistsError: ``artifact_dir`` is something else than an artifact or
            an empty directory.
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    if not isinstance(artifact_dir, (str, os.PathLike)):
        raise TypeError(f"artifact_dir must be a path, got {type(artifact_dir).__name__}")
    if (nul := nul_byte_error(artifact_dir, "artifact_dir")) is not None:
        raise ExportError(nul)
    if isinstance(example_inputs, (SparseTensor, torch.Tensor)) or not isinstance(
        example_inputs, (tuple, list)
    ):
        raise TypeError("example_inputs must be a tuple or list of the forward's inputs")
    if not example_inputs:
        raise ExportError("example_inputs must not be empty")
    if quantize_bits is not None:
        check_packing(quantize_bits, quantize_group_size)
    training = [name or type(model).__name__ for name, m in model.named_modules() if m.training]
    if training:
        raise ExportError(
            f"model must be in eval mode (call model.eval()); in training mode: "
            f"{', '.join(training[:5])}{' ...' if len(training) > 5 else ''}"
        )
    target = Path(artifact_dir)
    if target.name in ("", ".."):  # ".", "..", "a/..": no name of their own
        target = target.resolve()  # the folder itself (such a path is never a link)
        if not target.name:
            raise ExportError(f"artifact_dir {str(artifact_dir)!r} is the root folder; "
                              "name a folder to write")
    _check_destination(target)
    text, weights = lower_model(
        model, tuple(example_inputs), quantize_bits, quantize_group_size, output_names
    )
    float_layers = {k.removesuffix(".weight"): why for k, why in weights.float_weights.items()}
    metadata = {FLOAT_LAYERS_METADATA: json.dumps(float_layers)} if float_layers else {}
    write_artifact(target, text, weights.tensors, metadata)
    return ArtifactFiles(
        target, target / schema.GRAPH_FILE, target / schema.WEIGHT_FILE,
        tuple(sorted(weights.tensors)), float_layers,
    )


def lower_model(
    model: nn.Module,
    example_inputs: tuple[Any, ...],
    quantize_bits: int | None,
    quantize_group_size: int,
    output_names: Sequence[str] | None,
) -> tuple[str, WeightTable]:
    """The graph text and the weights (storage tensors) of ``model`` (nothing written)."""
    gm, names = trace_model(model, len(example_inputs))
    text = ModuleText()
    low = Lowering(text, WeightTable(text, quantize_bits, quantize_group_size))
    inputs = {n: _input(low, n, v) for n, v in zip(names, example_inputs, strict=True)}
    # Nodes without a lowering are refused before anything runs: run first, one could
    # change the model's parameters or buffers (an nn.Embedding with max_norm renormalizes
    # its weight in place).
    for n in gm.graph.nodes:
        _check_lowering(gm, n)
    # The graph runs on copies: what runs may still edit its inputs in place (a forward
    # hook), and a node is run before its lowering can refuse it for its values.
    copies = tuple(_private_copy(v) for v in example_inputs)
    interp = _Interpreter(gm, low, inputs)
    with torch.no_grad():
        interp.run(*copies)
    _returns(text, interp.outputs, output_names)
    return text.render(), low.weights


def _private_copy(value: Any) -> Any:
    """A copy of an example input that shares no storage with it: a SparseTensor's
    features and coordinates (with a coordinate manager of its own) or a tensor's
    values; anything else (which :func:`_input` refuses) as it is."""
    if isinstance(value, SparseTensor):
        return copy.deepcopy(value.detach())
    if isinstance(value, torch.Tensor):
        return value.detach().clone()
    return value


def _input(low: Lowering, name: str, value: Any) -> Sparse | Dense:
    stem = safe_name(name)
    if isinstance(value, SparseTensor):
        dtype = dtype_name(value.feats.dtype, f"input {name!r} features")
        coords = low.text.argument(f"{stem}_coords", tensor_type([None, 4], "i32"), "sparse_coords")
        feats = low.text.argument(
            f"{stem}_features", tensor_type([None, value.feats.shape[1]], dtype), "sparse_features"
        )
        active = low.text.argument(f"{stem}_active", tensor_type([1], "i32"), "sparse_active")
        out = low.text.op(
            "sparse.make",
            {"coords": coords, "features": feats, "active": active},
            {"stride": value.stride, "coord_order": "batch_x_y_z"},
            sparse_type(dtype),
            stem,
        )
        return Sparse(out)
    if isinstance(value, torch.Tensor):
        if value.ndim < 1:
            raise ExportError(f"input {name!r} must have a row dimension, got a scalar")
        dtype = dtype_name(value.dtype, f"input {name!r}", index=not value.is_floating_point())
        arg = low.text.argument(stem, tensor_type([None, *value.shape[1:]], dtype), "tensor")
        low.arguments.add(arg.name)
        return Dense(arg)
    raise ExportError(
        f"input {name!r} must be a SparseTensor or a torch.Tensor, got {type(value).__name__}"
    )


# fx inserts this check for parameters left at a None default (concrete_args).
_ASSERT_IS_NONE = getattr(fx._symbolic_trace, "_assert_is_none", None)
# Functions lowered by _Interpreter itself (getitem: of a tuple or list only, known when
# its input has run).
_STRUCTURAL = (getattr, _ASSERT_IS_NONE, operator.getitem)


def _check_lowering(gm: fx.GraphModule, n: fx.Node) -> None:
    """Raises ``ExportError`` for a node that no lowering takes, whatever its values: a
    parameter or buffer read directly, a module or function without a lowering, a method
    other than ``replace``."""
    if n.op == "get_attr":
        raise ExportError(
            f"{describe(n)}: forward reads a parameter or buffer directly; only modules "
            "with a lowering may own weights"
        )
    if n.op == "call_module":
        module = gm.get_submodule(str(n.target))
        if overridden_methods(module):
            raise overriding_subclass_error(describe(n), module)
        if module_lowering(module) is None:
            raise ExportError(
                f"{describe(n)}: module {type(module).__module__}.{type(module).__name__} "
                "is not exportable (docs/artifacts.md lists the supported modules)"
            )
    if n.op == "call_method" and n.target not in LOWERED_METHODS:
        raise ExportError(f"{describe(n)}: method .{n.target}() is not exportable")
    if (n.op == "call_function" and n.target not in _STRUCTURAL
            and function_lowering(n.target) is None):
        raise _not_exportable_function(n)


def _not_exportable_function(n: fx.Node) -> ExportError:
    return ExportError(
        f"{describe(n)}: function {getattr(n.target, '__module__', '')}."
        f"{getattr(n.target, '__qualname__', n.target)} is not exportable "
        "(docs/artifacts.md lists the supported functions)"
    )


class _Interpreter(fx.Interpreter):
    """Runs the traced graph on real values and lowers each node as it goes."""

    def __init__(self, gm: fx.GraphModule, low: Lowering, inputs: dict[str, Any]) -> None:
        super().__init__(gm)
        self.extra_traceback = False  # our errors already name the node
        self.low = low
        self.inputs = inputs
        self.sym: dict[fx.Node, Any] = {}
        self.outputs: Any = None

    def run_node(self, n: fx.Node) -> Any:
        try:
            real = super().run_node(n)
        except ExportError:
            raise
        except Exception as exc:
            raise ExportError(
                f"{describe(n)} failed on example_inputs: {type(exc).__name__}: {exc}"
            ) from exc
        self.sym[n] = self._lower(n, real)
        self.low.remember(self.sym[n], real)
        return real

    def _lower(self, n: fx.Node, real: Any) -> Any:
        if n.op == "placeholder":
            return self.inputs.get(str(n.target), real)  # defaulted parameters stay constants
        if n.op == "output":
            self.outputs = fx.node.map_arg(n.args[0], lambda a: self.sym[a])
            return None
        call = Call(
            n,
            fx.node.map_arg(n.args, lambda a: self.sym[a]),
            fx.node.map_arg(n.kwargs, lambda a: self.sym[a]),
            fx.node.map_arg(n.args, lambda a: self.env[a]),
            fx.node.map_arg(n.kwargs, lambda a: self.env[a]),
            real,
        )
        if n.op == "call_module":
            module = self.fetch_attr(str(n.target))
            lowering = module_lowering(module)
            assert lowering is not None  # _check_lowering refused the others
            return lowering(self.low, call, module, str(n.target))
        if n.op == "call_method":
            return lower_method(self.low, call)
        if n.target is getattr:
            return lower_getattr(self.low, call)
        if n.target is _ASSERT_IS_NONE:
            return None  # fx's check that a None default stayed None; it ran above
        if n.target is operator.getitem and isinstance(call.args[0], (tuple, list)):
            return call.args[0][call.args[1]]
        fn = function_lowering(n.target)
        if fn is None:  # getitem of a value other than a tuple or list
            raise _not_exportable_function(n)
        return fn(self.low, call, n.target)  # type: ignore[arg-type]


def _returns(text: ModuleText, outputs: Any, names: Sequence[str] | None) -> None:
    leaves, _ = _pytree.tree_flatten(outputs)
    if not leaves:
        raise ExportError("the model returns nothing the artifact could hold")
    bad = [type(v).__name__ for v in leaves if not isinstance(v, (Sparse, Dense))]
    if bad:
        raise ExportError(
            f"every output must be a SparseTensor or tensor computed by the graph; got {bad}"
        )
    if names is None:
        names = ["output"] if len(leaves) == 1 else [f"output_{i}" for i in range(len(leaves))]
    elif isinstance(names, str) or not all(isinstance(n, str) and n for n in names):
        raise TypeError("output_names must be a sequence of non-empty strings")
    if len(names) != len(leaves) or len(set(names)) != len(names):
        raise ExportError(
            f"output_names must be {len(leaves)} distinct names (one per output), got {names!r}"
        )
    check_output_names(names)
    for value, name in zip(leaves, names, strict=True):
        role = "sparse_tensor" if isinstance(value, Sparse) else "tensor"
        text.add_return(value.value, name, role)


# --- writing ---------------------------------------------------------------------
# Destination rules, atomic placement and cleanup live in artifact_dir.


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_artifact(target: Path, graph: str, tensors: dict[str, torch.Tensor],
                   metadata: dict[str, str] | None = None) -> None:
    """Writes the artifact directory atomically (see :mod:`~torch_lattice.artifact.artifact_dir`).

    The graph is first checked with the loader's parser; both files are written into
    a hidden temporary sibling directory, flushed, and placed in one step (an
    existing artifact is exchanged atomically where the system allows). On any
    failure nothing new is left behind and only files this call wrote are deleted.
    """
    _check_destination(target)
    check_loadable(graph)
    clean_stale_temporaries(target)
    temp = make_temporary(target)
    try:
        graph_path = temp / schema.GRAPH_FILE
        graph_path.write_text(graph, encoding="utf-8")
        weights_path = temp / schema.WEIGHT_FILE
        save_file(tensors, str(weights_path), metadata={"format": "torch", **(metadata or {})})
        for path in (graph_path, weights_path):
            _fsync(path)
            os.chmod(path, new_file_mode())
        os.chmod(temp, 0o777 & ~current_umask())  # made 0o700
        # Again: a folder of someone else's made at the target while this export wrote
        # (it was missing or empty before) would be swapped out and hidden otherwise.
        _check_destination(target)
        place(temp, target)
    except BaseException:
        remove_artifact_files(temp)
        raise
