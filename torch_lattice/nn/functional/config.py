"""Dataflow configuration: which execution strategy runs a relation.

Dataflows are execution strategies only; for one relation and one weight
they give the same result up to floating-point ordering.  A configuration is
resolved from, in order of precedence: the module's ``config=``, the
innermost :func:`conv_config` scope (context-local: threads and asyncio tasks
do not see each other's scopes), the global configuration, and the default of
the device the features are on: implicit GEMM on the CPU, and on CUDA the
dataflow measured fastest for each layer shape on first use (``autotune``,
:mod:`torch_lattice.nn.functional.tuning`), falling back to the fastest dataflow
a recorded GPU run has verified (``CUDA_DEFAULT``, with the evidence in
docs/gpu-validation.md).  Fields left ``None`` fall through to the next level.

An explicit dataflow wins over tuning: a level that sets ``dataflow`` without
``autotune`` turns tuning off below it, and ``autotune=True`` at a level turns it
on again (the dataflow then is only the fallback where nothing can be timed).

Target-conditioned transposes (``ConvTranspose3d(src, target)`` and the
generative/normalized variants with a target) always run gather-scatter; an
explicit request for another dataflow on them raises ``ValueError``.
"""

from __future__ import annotations

import contextlib
import functools
import logging
from collections.abc import Iterator
from contextvars import ContextVar
from dataclasses import dataclass, fields, replace

import torch

from torch_lattice.nn.functional.dataflow import Dataflow
from torch_lattice.nn.functional.tuning import TuningKey, tuning_choices

__all__ = [
    "CUDA_DEFAULT",
    "ConvConfig",
    "Dataflow",
    "clear_global_conv_config",
    "conv_config",
    "get_global_conv_config",
    "resolve_config",
    "resolved_dataflow",
    "set_global_conv_config",
]

log = logging.getLogger("torch_lattice.dataflow")


@dataclass(frozen=True)
class ConvConfig:
    """Tuning of a sparse convolution; ``None`` means "inherit".

    Attributes:
        dataflow: the execution strategy.
        allow_tf32: let CUDA kernels use TF32 tensor cores for fp32 (off
            unless enabled; no effect on CPU).
        autotune: time the dataflows on a layer shape's first call and run the
            fastest from then on (on by default on CUDA, off on the CPU, where
            implicit GEMM is the fastest; docs/dataflows.md).
    """

    dataflow: Dataflow | None = None
    allow_tf32: bool | None = None
    autotune: bool | None = None

    def __post_init__(self) -> None:
        if self.dataflow is not None and not isinstance(self.dataflow, Dataflow):
            raise TypeError(f"dataflow must be a Dataflow, got {self.dataflow!r}")
        for name in ("allow_tf32", "autotune"):
            value = getattr(self, name)
            if value is not None and not isinstance(value, bool):
                raise TypeError(f"{name} must be a bool, got {value!r}")

    def over(self, base: ConvConfig) -> ConvConfig:
        """This config with its unset fields taken from ``base``."""
        return replace(
            base,
            **{
                f.name: getattr(self, f.name)
                for f in fields(self)
                if getattr(self, f.name) is not None
            },
        )

    def layered_over(self, base: ConvConfig) -> ConvConfig:
        """This config as a level over ``base``: like :meth:`over`, except that a
        dataflow set here without ``autotune`` is not tuned (an explicit dataflow wins)."""
        level = self
        if level.dataflow is not None and level.autotune is None:
            level = replace(level, autotune=False)
        return level.over(base)


DEFAULT = ConvConfig(dataflow=Dataflow.ImplicitGEMM, allow_tf32=False, autotune=False)

# The CUDA default: the fastest dataflow that a recorded run of scripts/device-check.sh on
# a real GPU has verified at the current kernels (every dataflow x dtype x forward / input
# gradient / weight gradient against the CPU); gather-scatter (cuBLAS GEMMs) while none
# has.  docs/gpu-validation.md holds the runs: run 4 (2026-12-01, H200) passed every CUDA
# test, and fetch-on-demand was the fastest there in 14 of the 16 single-layer cases
# (C x precision) and in all 4 SparseResUNet42 ones.  Autotuning picks among those
# verified dataflows per layer shape; fetch-on-demand is its fallback.
CUDA_DEFAULT = ConvConfig(dataflow=Dataflow.FetchOnDemand, allow_tf32=False, autotune=True)


def _device_default(device: object) -> ConvConfig:
    kind = getattr(device, "type", device)
    if kind is None or kind == "cpu":
        return DEFAULT
    if kind == "cuda":
        return CUDA_DEFAULT
    if isinstance(kind, str):
        return DEFAULT  # other devices fail later, in the op, with their own message
    raise TypeError(f"device must be a torch.device, a str or None, got {type(device).__name__}")


class _GlobalConfig:
    """Holder of the process-wide configuration (set by the user only)."""

    value: ConvConfig | None = None


_scoped: ContextVar[ConvConfig | None] = ContextVar("torch_lattice_conv_config", default=None)


def set_global_conv_config(config: ConvConfig) -> None:
    """Sets the process-wide configuration."""
    if not isinstance(config, ConvConfig):
        raise TypeError(f"config must be a ConvConfig, got {type(config).__name__}")
    _GlobalConfig.value = config


def get_global_conv_config() -> ConvConfig | None:
    """The process-wide configuration, or None when unset."""
    return _GlobalConfig.value


def clear_global_conv_config() -> None:
    """Removes the process-wide configuration."""
    _GlobalConfig.value = None


@contextlib.contextmanager
def conv_config(config: ConvConfig | None = None, **fields_: object) -> Iterator[ConvConfig]:
    """Scoped configuration: ``with conv_config(dataflow=Dataflow.FetchOnDemand): ...``.

    Accepts a :class:`ConvConfig`, keyword fields, or both (fields win).
    Nested scopes inherit unset fields from the enclosing one.
    """
    cfg = config if config is not None else ConvConfig()
    if not isinstance(cfg, ConvConfig):
        raise TypeError(f"config must be a ConvConfig, got {type(cfg).__name__}")
    cfg = replace(cfg, **fields_)  # type: ignore[arg-type]
    outer = _scoped.get()
    token = _scoped.set(cfg.layered_over(outer if outer is not None else ConvConfig()))
    try:
        yield cfg
    finally:
        _scoped.reset(token)


def _explicit(module_config: ConvConfig | None) -> ConvConfig:
    """Every explicitly set field, module over scope over global (no default)."""
    cfg = ConvConfig()
    for level in (_GlobalConfig.value, _scoped.get(), module_config):
        if level is not None:
            cfg = level.layered_over(cfg)
    return cfg


def resolve_config(
    module_config: ConvConfig | None = None,
    *,
    target_transpose: bool = False,
    device: object = None,
) -> ConvConfig:
    """The effective configuration of one call on features on ``device``
    (a ``torch.device``, ``"cpu"``, ``"cuda"``; None means the CPU).

    On CUDA with ``torch.use_deterministic_algorithms(True)`` the dataflow is
    implicit GEMM whatever was asked for (target transposes too): its forward
    and input gradient have no atomics, and its weight gradient then runs the
    gather-scatter kernel (docs/determinism.md).  Dataflows compute the same
    relation, so this changes floating-point ordering only.  Deterministic mode
    also turns autotuning off on every device (a timed choice can differ from
    run to run).

    Raises:
        ValueError: a target-conditioned transpose with an explicit dataflow
            other than gather-scatter.
    """
    kind = getattr(device, "type", device)
    if (
        (kind is None or isinstance(kind, str))
        and (module_config is None or isinstance(module_config, ConvConfig))
        and not torch.compiler.is_compiling()  # dynamo traces past the cache and warns
    ):
        # Every input is a hashable value: one resolution per combination, not one per call
        # (each call of a layer resolves its configuration; on a GPU the Python time of a
        # call is of the order of a small layer's kernels).
        cfg = _resolved(
            _GlobalConfig.value,
            _scoped.get(),
            module_config,
            target_transpose,
            kind,
            torch.are_deterministic_algorithms_enabled(),
        )
    else:
        cfg = _resolve(module_config, target_transpose, device)
    log.debug("dataflow %s (target transpose: %s)", cfg.dataflow, target_transpose)
    return cfg


@functools.lru_cache(maxsize=512)
def _resolved(
    global_config: ConvConfig | None,
    scoped: ConvConfig | None,
    module_config: ConvConfig | None,
    target_transpose: bool,
    kind: str | None,
    deterministic: bool,
) -> ConvConfig:
    """resolve_config's result for these values of everything it reads (the global and
    scoped configurations and the deterministic-algorithms flag are arguments here so
    that a change to any of them is a new key)."""
    del global_config, scoped, deterministic  # read again by _resolve, equal by the key
    return _resolve(module_config, target_transpose, kind)


def _resolve(module_config: ConvConfig | None, target_transpose: bool,
             device: object) -> ConvConfig:
    """resolve_config, computed."""
    explicit = _explicit(module_config)
    if target_transpose:
        if explicit.dataflow not in (None, Dataflow.GatherScatter):
            raise ValueError(
                f"target-conditioned transposes run with Dataflow.GatherScatter; "
                f"{explicit.dataflow} was requested explicitly. Use "
                "config=ConvConfig(dataflow=Dataflow.GatherScatter) on this module or leave "
                "the dataflow unset"
            )
        explicit = replace(explicit, dataflow=Dataflow.GatherScatter, autotune=False)
    cfg = explicit.over(_device_default(device))
    if cfg.autotune and torch.are_deterministic_algorithms_enabled():
        # A timed choice can differ from run to run: deterministic mode runs the
        # configured dataflow on every device.
        cfg = replace(cfg, autotune=False)
    if _deterministic_cuda(device) and cfg.dataflow is not Dataflow.ImplicitGEMM:
        # Only implicit GEMM has an atomic-free CUDA forward (docs/determinism.md).
        log.debug("dataflow %s -> ImplicitGEMM: deterministic algorithms on CUDA", cfg.dataflow)
        cfg = replace(cfg, dataflow=Dataflow.ImplicitGEMM)
    return cfg


def _deterministic_cuda(device: object) -> bool:
    """Whether a call on ``device`` must run deterministic CUDA kernels."""
    kind = getattr(device, "type", device)
    return kind == "cuda" and torch.are_deterministic_algorithms_enabled()


def resolved_dataflow(
    module_config: object = None,
    *,
    target_transpose: bool = False,
    device: object = None,
    input: object = None,
) -> Dataflow:
    """The dataflow a call would use in this context.

    Where the call is autotuned (the CUDA default, or ``autotune=True``), the dataflow
    depends on the layer's shape: pass the convolution module as ``module_config`` and
    its ``input`` (a SparseTensor) to get the choice made for that shape, in the current
    autograd mode (training and inference calls keep their own choices); before the
    shape's first call (or without ``input``) this is the untuned fallback,
    fetch-on-demand on CUDA.

    Args:
        module_config: a module's ``ConvConfig``, a convolution module (its
            ``config`` is used), or None.
        target_transpose: whether the call is a target-conditioned transpose.
        device: where the features are (``torch.device`` or ``"cpu"`` /
            ``"cuda"``); None means the CPU, or ``input``'s device when given.
        input: the SparseTensor the module is called on (for autotuned calls).
    """
    module = None
    if module_config is not None and not isinstance(module_config, ConvConfig):
        if not hasattr(module_config, "config"):
            raise TypeError(
                "module_config must be a ConvConfig, a convolution module or None, got "
                f"{type(module_config).__name__}"
            )
        module, module_config = module_config, module_config.config
        if module_config is not None and not isinstance(module_config, ConvConfig):
            raise TypeError(
                f"module_config.config must be a ConvConfig or None, got "
                f"{type(module_config).__name__}"
            )
    if not isinstance(target_transpose, bool):
        raise TypeError(f"target_transpose must be a bool, got {target_transpose!r}")
    feats = getattr(input, "feats", None)
    if input is not None and not isinstance(feats, torch.Tensor):
        raise TypeError(f"input must be a SparseTensor, got {type(input).__name__}")
    if device is None and feats is not None:
        device = feats.device
    cfg = resolve_config(module_config, target_transpose=target_transpose, device=device)
    assert cfg.dataflow is not None  # DEFAULT sets it
    weight = getattr(module, "weight", None)
    if cfg.autotune and feats is not None and isinstance(weight, torch.Tensor):
        transposed = bool(getattr(module, "transposed_relation", False))
        key = TuningKey.of(feats, weight, transposed)
        return tuning_choices().get(key, cfg.dataflow)
    return cfg.dataflow
