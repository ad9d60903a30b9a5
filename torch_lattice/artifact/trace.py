"""Tracing a model for export: torch.fx with our modules and functions as leaves.

Every module type with a lowering (and every other torch_lattice module) is a
leaf, so its forward is not traced into; our free functions (``tl.cat``,
``tl.voxelize``, the functional pools...) are recorded as single
``call_function`` nodes whether they are called as ``tl.cat(...)`` or
imported by name.
"""

from __future__ import annotations

import inspect
import sys
from types import ModuleType
from typing import Any

from torch import fx, nn

from torch_lattice.artifact.errors import ExportError
from torch_lattice.artifact.lowering import (
    leaf_functions,
    module_lowering,
    overridden_methods,
    overriding_subclass_error,
)

__all__ = ["LatticeTracer", "trace_model"]


def _function_homes() -> list[ModuleType]:
    """Modules whose attributes name a leaf function (patched while tracing)."""
    homes: dict[str, ModuleType] = {}
    for fn in leaf_functions():
        name = getattr(fn, "__module__", None) or ""
        if name.startswith("torch_lattice"):
            for mod_name in (name, "torch_lattice", "torch_lattice.nn.functional"):
                if mod_name in sys.modules:
                    homes[mod_name] = sys.modules[mod_name]
    return list(homes.values())


class LatticeTracer(fx.Tracer):
    """``torch.fx`` tracer that keeps exportable modules and functions whole."""

    def __init__(self) -> None:
        ours = [
            f
            for f in leaf_functions()
            if getattr(f, "__module__", "").startswith("torch_lattice")
        ]
        super().__init__(autowrap_modules=(), autowrap_functions=tuple(ours))
        # Patch only our functions, wherever a module attribute names them.
        self._autowrap_search = _function_homes()

    def is_leaf_module(self, m: nn.Module, module_qualified_name: str) -> bool:
        # a subclass overriding a lowered module's methods stays a leaf too, so that the
        # export refuses it by name (traced into, it would reach the library's internals)
        if module_lowering(m) is not None or type(m).__module__.startswith("torch_lattice.nn"):
            return True
        return super().is_leaf_module(m, module_qualified_name)


def _single_module_graph(model: nn.Module, names: list[str]) -> fx.GraphModule:
    """A one-node graph for a model that is itself an exportable module.

    The module becomes the child ``<class name in lower case>`` of the graph's
    root, so its weights are stored as ``submconv3d.weight`` and so on.
    """
    key = type(model).__name__.lower()
    root = nn.Module()
    root.add_module(key, model)
    graph = fx.Graph()
    inputs = tuple(graph.placeholder(name) for name in names)
    graph.output(graph.call_module(key, inputs))
    return fx.GraphModule(root, graph)


def trace_model(model: nn.Module, n_inputs: int) -> tuple[fx.GraphModule, list[str]]:
    """Traces ``model.forward`` with its first ``n_inputs`` positional parameters.

    Later parameters keep their defaults, which must be None.

    Returns:
        The graph module and the names of the traced inputs, in order.

    Raises:
        ExportError: variadic or keyword-only required parameters, a later parameter
            whose default is not None, too many or
            too few inputs, or a forward that torch.fx cannot trace.
    """
    params = list(inspect.signature(model.forward).parameters.values())
    positional = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    if any(p.kind == p.VAR_POSITIONAL for p in params):
        raise ExportError("model.forward takes *args; export needs named inputs")
    required = [p for p in positional if p.default is p.empty]
    if not len(required) <= n_inputs <= len(positional):
        raise ExportError(
            f"example_inputs has {n_inputs} values but model.forward takes "
            f"{len(required)} to {len(positional)} positional inputs "
            f"({', '.join(p.name for p in positional)})"
        )
    missing_kw = [p.name for p in params if p.kind == p.KEYWORD_ONLY and p.default is p.empty]
    if missing_kw:
        raise ExportError(f"model.forward has required keyword-only inputs {missing_kw}")
    names = [p.name for p in positional[:n_inputs]]
    if overridden_methods(model):
        raise overriding_subclass_error("model", model)
    if module_lowering(model) is not None:
        return _single_module_graph(model, names), names
    concrete: dict[str, Any] = {p.name: p.default for p in positional[n_inputs:]}
    concrete.update({p.name: p.default for p in params if p.kind == p.KEYWORD_ONLY})
    # torch.fx guards any other constant with a comparison node (which then reads as an
    # unsupported `eq`) or, for a tuple, generates code that does not compile.
    valued = [name for name, default in concrete.items() if default is not None]
    if valued:
        raise ExportError(
            f"model.forward's parameters {valued} beyond example_inputs have defaults other "
            "than None, which torch.fx cannot trace as constants; give them as "
            "example_inputs, default them to None, or export a wrapper module whose forward "
            "takes the example inputs only"
        )
    try:
        graph = LatticeTracer().trace(model, concrete_args=concrete or None)
    except ExportError:
        raise
    except Exception as exc:  # torch.fx raises many kinds (TraceError, TypeError, ...)
        raise ExportError(
            f"model.forward is not traceable by torch.fx ({type(exc).__name__}: {exc}); "
            "export needs a forward without data-dependent Python control flow"
        ) from exc
    return fx.GraphModule(model, graph), names
