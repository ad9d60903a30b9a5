"""The relation between two supports: its kernel map (or transpose pair lists),
built here on a miss and cached in the coordinate manager, and running it with
the configured dataflow.

Every convolution family ends here: a forward convolution reads the map from
its input support to its output support; a transposed one reads the map of
the matching forward convolution (fine support -> coarse support) the other
way round.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from torch_lattice.geometry import ConvGeometry
from torch_lattice.locked_cache import get_or_build
from torch_lattice.nn.functional.config import ConvConfig, Dataflow
from torch_lattice.nn.functional.tuning import TuningKey, tuned_dataflow
from torch_lattice.ops import kmap as km
from torch_lattice.ops._runtime import refuse_function_transforms
from torch_lattice.ops.conv import pair_conv, sparse_conv
from torch_lattice.ops.kmap import KernelMap, PairLists
from torch_lattice.tensor import Support

__all__ = ["apply_kernel_map", "kernel_map", "transpose_pairs"]


def kernel_map(source: Support, target: Support, geometry: ConvGeometry) -> KernelMap:
    """The map relating ``source`` rows to ``target`` rows, cached in ``source``'s
    coordinate manager (built once; counted in its ``builds``).

    Maps between the manager's stable supports are kept for its lifetime; a map
    with a single-call support (``conv3d(x, coordinates=q)`` with a new ``q`` each
    call) goes to its bounded least-recently-used cache.

    Raises:
        ValueError: either support's rows were edited in place after it was made,
            or the tables would exceed the memory budget.
    """
    # km.build_kernel_map is looked up per call, so a test's stand-in builder is seen.
    build = functools.partial(km.build_kernel_map, source.coords, target.coords, geometry)
    return source.manager.cached("kernel_maps", (source, target, geometry), (source, target), build)


@dataclass(frozen=True)
class _TransposePairs:
    """A cached entry of :func:`transpose_pairs`: the lists, and (built on first use)
    their reversal, the lists an input gradient runs over."""

    pairs: PairLists
    _reversed: dict[bool, PairLists] = field(default_factory=dict, compare=False, repr=False)
    _lock: threading.RLock = field(default_factory=threading.RLock, compare=False, repr=False)

    def reversed(self) -> PairLists:
        return get_or_build(self._reversed, True, self._lock, lambda: km.reverse_pairs(*self.pairs))


def _transpose_entry(fine: Support, coarse: Support, geometry: ConvGeometry) -> _TransposePairs:
    def build() -> _TransposePairs:
        return _TransposePairs(km.build_transpose_pairs(fine.coords, coarse.coords, geometry))

    return fine.manager.cached("transpose_pairs", (fine, coarse, geometry), (fine, coarse), build)


def transpose_pairs(fine: Support, coarse: Support, geometry: ConvGeometry) -> PairLists:
    """Pair lists of the transposed relation coarse -> fine, cached like a kernel map,
    built from the ``(N_coarse, K)`` table only (``build_transpose_pairs``).

    Raises:
        ValueError: either support's rows were edited in place after it was made.
    """
    return _transpose_entry(fine, coarse, geometry).pairs


def reversed_transpose_pairs(fine: Support, coarse: Support, geometry: ConvGeometry) -> PairLists:
    """:func:`transpose_pairs` reversed (fine -> coarse, sorted by coarse row; built once,
    kept with them): the lists a transpose's input gradient runs over."""
    return _transpose_entry(fine, coarse, geometry).reversed()


def backward_pairs(
    feats: torch.Tensor, reversed_lists: Callable[[], PairLists]
) -> tuple[torch.Tensor | None, ...]:
    """``pair_conv``'s ``rev_*`` arguments for a convolution of ``feats``: the cached
    ``reversed_lists()`` on the CPU where an input gradient will be asked for (the CPU
    kernels need them sorted, and ``pair_conv``'s backward would sort the swapped lists
    on every call), else three Nones (on CUDA backward swaps the lists for free)."""
    if feats.device.type == "cpu" and feats.requires_grad and torch.is_grad_enabled():
        return tuple(reversed_lists())
    return (None, None, None)


def apply_kernel_map(
    feats: torch.Tensor,
    weight: torch.Tensor,
    kmap: KernelMap,
    config: ConvConfig,
    *,
    transposed: bool = False,
) -> torch.Tensor:
    """``(N_out, C_out)`` features of the relation ``kmap`` applied to ``feats``.

    Args:
        feats: ``(N_in, C_in)`` rows of the relation's input side (the coarse
            side when ``transposed``).
        weight: ``(K, C_in, C_out)``.
        kmap: map from the forward convolution's input to its output support.
        config: resolved configuration; its dataflow picks the kernels, unless it
            autotunes (then the dataflow chosen for this layer shape does, and the
            configured one is the fallback; :mod:`.tuning`).
        transposed: run it from the output support back onto the input support.
    """
    dataflow = config.dataflow
    assert dataflow is not None  # resolve_config sets it
    if config.autotune:
        key = TuningKey.of(feats, weight, transposed)
        step = _timed_training_step if key.training else _timed_forward
        candidates = {
            d: functools.partial(step, feats, weight, kmap, d, transposed, config)
            for d in Dataflow
        }
        dataflow = tuned_dataflow(key, feats.device, candidates, dataflow)
    return _run(feats, weight, kmap, dataflow, transposed, config)


def _timed_forward(feats: torch.Tensor, weight: torch.Tensor, kmap: KernelMap,
                   dataflow: Dataflow, transposed: bool, config: ConvConfig) -> None:
    """What an inference call runs with ``dataflow``: its forward, without autograd."""
    with torch.no_grad():
        _run(feats, weight, kmap, dataflow, transposed, config)


def _timed_training_step(feats: torch.Tensor, weight: torch.Tensor, kmap: KernelMap,
                         dataflow: Dataflow, transposed: bool, config: ConvConfig) -> None:
    """What a training call runs with ``dataflow``: its forward and the backward to the
    inputs that require a gradient, on detached copies (same storage), so the caller's
    graph and ``.grad`` fields are untouched."""
    f = feats.detach().requires_grad_(feats.requires_grad)
    w = weight.detach().requires_grad_(weight.requires_grad)
    with torch.enable_grad():
        y = _run(f, w, kmap, dataflow, transposed, config)
        torch.autograd.grad(y, [t for t in (f, w) if t.requires_grad], torch.ones_like(y))


def _run(
    feats: torch.Tensor,
    weight: torch.Tensor,
    kmap: KernelMap,
    dataflow: Dataflow,
    transposed: bool,
    config: ConvConfig,
) -> torch.Tensor:
    # torch.func / forward-mode AD are refused (refuse_function_transforms says why);
    # tested inline, with torch's own checks, so the common path makes no extra call
    # (dynamo cannot trace the functorch one, and warns: skipped while it traces).
    if torch.autograd.forward_ad._current_level >= 0 or (
        not torch.compiler.is_compiling()
        and any(map(torch._C._functorch.is_gradtrackingtensor, (feats, weight)))
    ):
        refuse_function_transforms("convolution", feats, weight)
    nbr, rev = (kmap.rev, kmap.nbr) if transposed else (kmap.nbr, kmap.rev)
    tf32 = bool(config.allow_tf32)
    if dataflow is Dataflow.ImplicitGEMM:
        return sparse_conv(feats, weight, nbr, rev, tf32)
    # On CUDA one pair list serves forward, backward and the transposed relation:
    # backward swaps pair_in and pair_out (rev pairs None), so nothing else is built and
    # no host sync happens beyond the one pair-count readback. On the CPU each direction
    # comes from its own table, cached with the map, and the reversed one is passed where
    # a gradient will be asked for (an argsort per backward cost as much as a C = 16
    # convolution).
    fwd = kmap.relation_pairs(transposed)
    back = backward_pairs(feats, lambda: kmap.relation_pairs(not transposed))
    gather = dataflow is Dataflow.GatherScatter
    return pair_conv(feats, weight, *fwd, *back, nbr.shape[0], gather, tf32)
