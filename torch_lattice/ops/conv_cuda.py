"""CUDA kernels of the convolution ops (``csrc/cuda``, ``torch_lattice._C.cuda_*``).

:func:`conv_forward` and :func:`conv_weight_grad` run one relation in one of the three
dataflows on torch's current stream; this module registers them as the ``"cuda"``
kernels of the ops in :mod:`torch_lattice.ops.conv`, which check shapes and map formats
once for both devices.  Here only what concerns CUDA is checked: the device and its
architecture, the feature dtype, the dataflow name and determinism.  Outputs and scratch
workspace are allocated with torch on the tensors' device; raw pointers, the device index
and ``torch.cuda.current_stream(device).cuda_stream`` go to C.

Gather-scatter is orchestrated here: one gather launch, one cuBLAS GEMM per non-empty
kernel row through ``torch.mm``, one scatter-add launch (docs/cuda.md, Gather-scatter),
under cuBLAS precision settings restored on exit (:func:`_gemm_precision`); the kernel
rows' ranges are read back once per pair list (:func:`_row_ranges`).

With ``TORCH_LATTICE_CUDA_PENDING=1`` (:data:`PENDING_ENV`), what implicit GEMM and
fetch-on-demand derive from a map alone is computed once per map tensor and kept on it
(:func:`_derived`), the pipelined kernels may run (:data:`OPT_PIPELINED_FORWARD`,
:data:`OPT_PIPELINED_WGRAD`, :data:`OPT_PIPELINED_FOD_FORWARD`, :data:`OPT_PIPELINED_FP32`),
and implicit GEMM's weight gradient runs over the map's kept pair lists (:func:`_kept_pairs`);
these changes wait for a device run (docs/gpu-validation.md).
"""

from __future__ import annotations

import contextlib
import functools
import itertools
import os
from collections.abc import Callable, Iterator
from typing import TypeVar

import torch

from torch_lattice.ops import conv, kmap_cuda
from torch_lattice.ops._runtime import (
    _C,
    DTYPE_CODES,
    call_args,
    check_deterministic,
    ptr,
    require_cuda,
    weight_grad_dataflow,
    workspace_alloc,
)

__all__ = [
    "DATAFLOWS",
    "conv_forward",
    "conv_weight_grad",
    "pair_conv",
    "pair_conv_weight_grad",
    "sparse_conv",
    "sparse_conv_weight_grad",
]

Pairs = tuple[torch.Tensor, torch.Tensor, torch.Tensor]
T = TypeVar("T")

# enum tl_cuda_dataflow in csrc/cuda/tl_cuda.h; gather_scatter runs through torch here
DATAFLOWS = {"implicit_gemm": 0, "fetch_on_demand": 1, "gather_scatter": 2}
# The convolution kernels have no float64 path (tensor cores have none).
_FEATURE_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


def _maps(
    op: str, dataflow: str, nbr: torch.Tensor | None, pairs: Pairs | None
) -> tuple[torch.Tensor | None, Pairs | None]:
    """The map ``dataflow`` runs over, contiguous; its format was checked by the op
    (:mod:`torch_lattice.ops.conv`)."""
    if dataflow not in DATAFLOWS:
        raise ValueError(f"{op}: dataflow must be one of {sorted(DATAFLOWS)}, got {dataflow!r}")
    if dataflow == "implicit_gemm":
        if nbr is None:
            raise ValueError(f"{op}: implicit_gemm needs nbr, an (N_out, K) int32 tensor")
        return nbr.contiguous(), None
    if pairs is None or len(pairs) != 3:
        raise ValueError(f"{op}: {dataflow} needs pairs = (offsets, pair_in, pair_out)")
    offsets, pair_in, pair_out = pairs
    return None, (offsets.contiguous(), pair_in.contiguous(), pair_out.contiguous())


# Changes that are built and compiled but not yet verified by a device run stay off the
# default path until one passes (docs/gpu-validation.md, "Waiting for a GPU run"): this
# environment variable, "1", turns them all on, or a comma-separated list of their names
# (:data:`PENDING_CHANGES`) some of them; scripts/device-check.sh sets it for its tests
# and benchmark, so that the run verifies them.
PENDING_ENV = "TORCH_LATTICE_CUDA_PENDING"
# The pending changes by name: map-derived data kept with the map, the pipelined
# kernels (the implicit-GEMM forward in fp16, bf16, TF32; the fetch-on-demand weight
# gradient and forward in fp16, bf16, TF32; the same three in plain fp32, on the CUDA
# cores), and the implicit-GEMM op's weight gradient over the map's pair lists
# (:func:`_kept_pairs`).
PENDING_CHANGES = ("kept_map_data", "pipelined_forward", "pipelined_wgrad",
                   "pipelined_fod_forward", "pair_weight_grad", "pipelined_fp32")


# Option bits of a ``cuda_conv`` call (csrc/cuda/tl_cuda.h, TL_CUDA_*): TF32 tensor cores
# for float32, and the pipelined kernels, which are pending: the implicit-GEMM forward, the
# fetch-on-demand weight gradient, the fetch-on-demand forward, and plain float32 in each.
OPT_TF32 = 1
OPT_PIPELINED_FORWARD = 2
OPT_PIPELINED_WGRAD = 4
OPT_PIPELINED_FOD_FORWARD = 8
OPT_PIPELINED_FP32 = 16  # plain fp32 through the same pipelined kernels (CUDA cores)
# The option bit of each pending pipelined kernel, by its name in PENDING_CHANGES.
_PIPELINED_OPTS = {
    "pipelined_forward": OPT_PIPELINED_FORWARD,
    "pipelined_wgrad": OPT_PIPELINED_WGRAD,
    "pipelined_fod_forward": OPT_PIPELINED_FOD_FORWARD,
    "pipelined_fp32": OPT_PIPELINED_FP32,
}


def _pending_now() -> frozenset[str]:
    """The names of the pending changes :data:`PENDING_ENV` turns on now."""
    value = os.environ.get(PENDING_ENV, "")
    if value == "1":
        return frozenset(PENDING_CHANGES)
    return frozenset(v.strip() for v in value.split(",")) & frozenset(PENDING_CHANGES)


def pending(change: str | None = None) -> bool:
    """Whether the CUDA changes that wait for a device run are on (:data:`PENDING_ENV`):
    all of them (``change`` None: the variable is ``1``), or the one named (``1``, or a
    comma-separated list naming it)."""
    if change is None:
        return os.environ.get(PENDING_ENV) == "1"
    return change in _pending_now()


def _check_dtype(op: str, a: torch.Tensor, b: torch.Tensor | None = None) -> None:
    """The kernels' dtypes: float32, float16 or bfloat16, and (``b`` given) one dtype for
    both operands (the weight-gradient ops' own check, ``conv._check_grad_out``, refuses
    a grad_out of another dtype on either device first)."""
    if a.dtype not in _FEATURE_DTYPES:
        raise TypeError(
            f"{op}: CUDA kernels support float32, float16 and bfloat16 features, got {a.dtype}"
        )
    if b is not None and b.dtype != a.dtype:
        raise TypeError(
            f"{op}: feats ({a.dtype}) and grad_out ({b.dtype}) must have the same dtype"
        )


def _version(t: torch.Tensor) -> int:
    """``t``'s version counter, or -1 for an inference tensor, which has none (reading
    ``_version`` raises): a map built under ``torch.inference_mode`` must not be modified
    in place after its first call, as for the CPU's tile lists (``conv._state``)."""
    return -1 if t.is_inference() else t._version


def _kept(t: torch.Tensor, name: str) -> object | None:
    """What :func:`_keep` kept on ``t`` under ``name``, or None where nothing was or ``t``
    changed in place since."""
    kept = getattr(t, name, None)
    return kept[1] if kept is not None and kept[0] == _version(t) else None


def _keep(t: torch.Tensor, name: str, compute: Callable[[], T]) -> T:
    """``compute()``, computed once per tensor ``t`` and kept on it (attribute ``name``,
    with ``t``'s version, so an in-place change computes it again): what a map derives
    is kept with the map tensor it comes from."""
    kept = _kept(t, name)
    if kept is not None:
        return kept  # type: ignore[return-value]
    with torch.inference_mode(False):  # kept past the call: never an inference tensor
        value = compute()
    setattr(t, name, (_version(t), value))
    return value


def _derived(
    dataflow: str,
    weight_grad: bool,
    code: int,
    sizes: tuple[int, int, int, int, int],
    nbr: torch.Tensor | None,
    pairs: Pairs | None,
    n_pairs: int,
) -> torch.Tensor | None:
    """What this call derives from its map alone (implicit GEMM's order of output rows,
    fetch-on-demand's per-kernel-row tile starts), or None to let the call compute it.

    Computed once per map tensor (``nbr``, or the pair lists' offsets) and kept on it
    (``_tl_derived``, with the tensor's version, so an in-place change computes it again),
    so a forward or backward on a cached map enqueues its multiply alone.  Only where
    ``pending("kept_map_data")`` holds, and never during CUDA graph capture, whose
    allocations belong to the graph."""
    if not pending("kept_map_data") or torch.cuda.is_current_stream_capturing():
        return None
    n_in, n_out, k, cin, cout = sizes
    df = DATAFLOWS[dataflow]
    owner = nbr if nbr is not None else pairs[0] if pairs is not None else None
    if owner is None:
        return None
    # The order depends on the map and n_in; the weight gradient's tile starts also on the
    # channel tiles (its chunk size).
    key = (df, weight_grad, n_in, n_out, k, n_pairs) + ((cin, cout) if weight_grad else ())
    cache: dict[tuple, torch.Tensor | None] = _keep(owner, "_tl_derived", dict)
    if key in cache:
        return cache[key]
    nbytes = _C.cuda_conv_derived_size(df, int(weight_grad), code, *sizes)
    derived = None
    if nbytes > 0:
        with torch.inference_mode(False):  # kept past the call, as _keep's values are
            derived = torch.empty(nbytes, dtype=torch.uint8, device=owner.device)
        head = _call_head(owner.device, dataflow, weight_grad, code, sizes)
        map_ptrs = _map_ptrs(nbr, pairs)
        alloc = workspace_alloc(owner.device)
        _C.cuda_conv_derive(*head, *map_ptrs, n_pairs, alloc, ptr(derived))
    cache[key] = derived
    return derived


def _call_head(
    device: torch.device,
    dataflow: str,
    weight_grad: bool,
    code: int,
    sizes: tuple[int, int, int, int, int],
) -> tuple[int, ...]:
    """The arguments ``cuda_conv`` and ``cuda_conv_derive`` start with: device index,
    stream, dataflow, direction, dtype code and the five sizes."""
    index, stream = call_args(device)
    return (index, stream, DATAFLOWS[dataflow], int(weight_grad), code, *sizes)


def _map_ptrs(nbr: torch.Tensor | None, pairs: Pairs | None) -> list[int]:
    """Pointers of the map: ``nbr``, then offsets, pair_in and pair_out (0 where absent)."""
    pair_ptrs = [ptr(t) for t in pairs] if pairs is not None else [0, 0, 0]
    return [ptr(nbr) if nbr is not None else 0, *pair_ptrs]


def _run(
    dataflow: str,
    weight_grad: bool,
    a: torch.Tensor,
    b: torch.Tensor,
    sizes: tuple[int, int, int, int, int],
    nbr: torch.Tensor | None,
    pairs: Pairs | None,
    out: torch.Tensor,
    allow_tf32: bool,
) -> None:
    code = DTYPE_CODES[a.dtype]
    n_pairs = pairs[1].shape[0] if pairs is not None else 0
    opts = OPT_TF32 if a.dtype == torch.float32 and allow_tf32 else 0
    on = _pending_now()
    for change, bit in _PIPELINED_OPTS.items():
        if change in on:
            opts |= bit
    derived = _derived(dataflow, weight_grad, code, sizes, nbr, pairs, n_pairs)
    head = _call_head(a.device, dataflow, weight_grad, code, sizes)
    _C.cuda_conv(
        *head,
        opts,
        ptr(a),
        ptr(b),
        *_map_ptrs(nbr, pairs),
        n_pairs,
        ptr(derived) if derived is not None else 0,
        workspace_alloc(a.device),
        ptr(out),
    )


def _legacy_tf32() -> bool | None:
    """``torch.backends.cuda.matmul.allow_tf32``, or None where reading it raises.

    torch >= 2.9 raises on that read (and on every float32 cuBLAS GEMM, which asks the
    same question) when the legacy flag and ``matmul.fp32_precision`` disagree."""
    try:
        return bool(torch.backends.cuda.matmul.allow_tf32)
    except RuntimeError:
        return None


def _reduction_setting(m: object, name: str) -> bool | tuple[bool, bool]:
    """A reduced-precision-reduction flag as its setter takes it back: ``(allowed,
    split_k)`` where this torch has the split-K part (setting a bool alone turns split-K
    on), else the bool."""
    allowed = bool(getattr(m, name))
    try:
        return allowed, bool(getattr(m, name + "_split_k"))
    except AttributeError:
        return allowed


@contextlib.contextmanager
def _gemm_precision(allow_tf32: bool) -> Iterator[None]:
    """cuBLAS settings for the GEMMs of one gather-scatter call, restored on exit.

    float32 uses TF32 tensor cores only when ``allow_tf32``; float16 and bfloat16 products
    reduce in fp32 (no reduced-precision split-K reductions).

    TF32 is switched through the legacy ``allow_tf32`` setter only, which on torch >= 2.9
    sets the legacy precision and ``matmul.fp32_precision`` together: setting
    ``fp32_precision`` alone leaves the two APIs disagreeing, and torch then raises in
    every float32 cuBLAS GEMM and every read of ``allow_tf32`` (tests, inductor, user
    code).  When the flag already has the wanted value nothing is touched; otherwise the
    caller's values of both APIs are put back on exit, legacy first.  Likewise only
    reduction flags that are on are turned off, and put back with their split-K part.
    """
    m = torch.backends.cuda.matmul
    new_api = hasattr(m, "fp32_precision")
    saved_new = m.fp32_precision if new_api else None
    saved_legacy = _legacy_tf32()
    switch = saved_legacy is not allow_tf32
    # reduced-precision reductions to turn off, with what to put back
    reductions = [
        (name, _reduction_setting(m, name))
        for name in (
            "allow_fp16_reduced_precision_reduction",
            "allow_bf16_reduced_precision_reduction",
        )
        if getattr(m, name)
    ]
    try:
        if switch:
            m.allow_tf32 = allow_tf32
        for name, _ in reductions:
            setattr(m, name, False)
        yield
    finally:
        if switch:
            # Legacy setter first (it also writes fp32_precision), then the new-API value
            # the caller had, so both read back as before ("none" stays "none").
            m.allow_tf32 = bool(saved_legacy) if saved_legacy is not None else allow_tf32
            if new_api and m.fp32_precision != saved_new:
                m.fp32_precision = saved_new
        for name, setting in reductions:
            setattr(m, name, setting)


def _gather(src: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
    """``src[idx]`` (rows) in one launch of ``tl_cuda_gather_rows``."""
    n_src, c = src.shape
    dst = torch.empty((idx.shape[0], c), dtype=src.dtype, device=src.device)
    index, stream = call_args(src.device)
    _C.cuda_gather_rows(
        index, stream, DTYPE_CODES[src.dtype], ptr(src), n_src, c, ptr(idx), idx.shape[0], ptr(dst)
    )
    return dst


@functools.cache
def _fp32_products(index: int, dtype: torch.dtype) -> bool:
    """Whether ``torch.mm(a, b, out_dtype=torch.float32, out=rows)`` works for ``dtype`` on
    device ``index`` (``aten::mm.dtype_out``, newer torch), written into a row slice of a
    larger float32 buffer as the forward does: then half-precision products reach the
    scatter-add in fp32, unrounded.  Probed once per device and dtype, in that exact form
    and checked by value (small integers, exact in every dtype), so a torch whose overload
    exists but rejects or mishandles ``out=`` falls back to products in the storage dtype.
    """
    device = torch.device("cuda", index)
    a = torch.arange(6, dtype=torch.float32).reshape(3, 2).to(device=device, dtype=dtype)
    b = torch.arange(8, dtype=torch.float32).reshape(2, 4).to(device=device, dtype=dtype)
    expected = torch.arange(6.0).reshape(3, 2) @ torch.arange(8.0).reshape(2, 4)
    buf = torch.full((5, 4), -1.0, dtype=torch.float32, device=device)
    try:
        with _gemm_precision(False):
            torch.mm(a, b, out_dtype=torch.float32, out=buf[1:4])
        host = buf.cpu()
    except (RuntimeError, TypeError, NotImplementedError):
        return False
    untouched = bool((host[0] == -1).all() and (host[4] == -1).all())
    return untouched and torch.equal(host[1:4], expected)


def _row_ranges(offsets: torch.Tensor) -> list[tuple[int, int, int]]:
    """``(n, start, end)`` of every non-empty kernel row.

    Read back from the device once per offsets tensor and kept on it (``_tl_row_ranges``,
    with the tensor's version, so an in-place change reads it again): a kernel map keeps
    its pair lists, so the forward and both gradients of later calls make no readback."""
    def read() -> list[tuple[int, int, int]]:
        host = offsets.tolist()
        return [(n, a, b) for n, (a, b) in enumerate(itertools.pairwise(host)) if b > a]

    return _keep(offsets, "_tl_row_ranges", read)


def _gather_scatter_forward(
    x: torch.Tensor, w: torch.Tensor, pairs: Pairs, n_out: int, allow_tf32: bool
) -> torch.Tensor:
    """``y[pair_out] += x[pair_in] @ w[n]``: gather, per-kernel-row cuBLAS GEMMs, scatter-add."""
    offsets, pair_in, pair_out = pairs
    cout = w.shape[2]
    exact = x.dtype == torch.float32
    # fp32 accumulates straight into y; half types into an fp32 buffer cast once.
    acc = torch.zeros((n_out, cout), dtype=torch.float32, device=x.device)
    if pair_in.shape[0] == 0 or x.shape[1] == 0 or cout == 0:
        return acc if exact else acc.to(x.dtype)
    gathered = _gather(x, pair_in)  # enqueued before a first offsets readback waits
    ranges = _row_ranges(offsets)
    if ranges:
        index, stream = call_args(x.device)
        # Half types: fp32 products where torch can write them (one rounding in all),
        # else products in the storage dtype (one more rounding per kernel row).
        wide = not exact and _fp32_products(index, x.dtype)
        pdtype = torch.float32 if wide else x.dtype
        products = torch.empty((pair_in.shape[0], cout), dtype=pdtype, device=x.device)
        with _gemm_precision(allow_tf32):
            for n, a, b in ranges:
                if wide:
                    torch.mm(gathered[a:b], w[n], out_dtype=pdtype, out=products[a:b])
                else:
                    torch.mm(gathered[a:b], w[n], out=products[a:b])
        _C.cuda_scatter_add_rows(
            index,
            stream,
            DTYPE_CODES[pdtype],
            ptr(products),
            products.shape[0],
            cout,
            ptr(pair_out),
            n_out,
            ptr(acc),
        )
    return acc if exact else acc.to(x.dtype)


def _gather_scatter_weight_grad(
    x: torch.Tensor, dy: torch.Tensor, pairs: Pairs, allow_tf32: bool
) -> torch.Tensor:
    """``dw[n] = x[pair_in]^T dy[pair_out]`` per kernel row, through cuBLAS."""
    offsets, pair_in, pair_out = pairs
    k = offsets.shape[0] - 1
    dw = torch.zeros((k, x.shape[1], dy.shape[1]), dtype=x.dtype, device=x.device)
    if pair_in.shape[0] == 0 or dw.numel() == 0:
        return dw
    xg, dyg = _gather(x, pair_in), _gather(dy, pair_out)  # enqueued before the readback
    ranges = _row_ranges(offsets)
    if ranges:
        with _gemm_precision(allow_tf32):
            for n, a, b in ranges:
                torch.mm(xg[a:b].t(), dyg[a:b], out=dw[n])
    return dw


def conv_forward(
    dataflow: str,
    feats: torch.Tensor,
    weight: torch.Tensor,
    nbr: torch.Tensor | None = None,
    pairs: Pairs | None = None,
    n_out: int | None = None,
    allow_tf32: bool = False,
) -> torch.Tensor:
    """``y[o] = sum_n feats[i] @ weight[n]`` over the relation, on the GPU.

    Shapes and map formats are the caller's (the ops check them, :mod:`.conv`).

    Args:
        dataflow: ``"implicit_gemm"`` (uses ``nbr``), ``"fetch_on_demand"`` or
            ``"gather_scatter"`` (use ``pairs``).
        feats: ``(N_in, C_in)`` float32, float16 or bfloat16.
        weight: ``(K, C_in, C_out)``, same dtype.
        nbr: ``(N_out, K)`` int32 neighbour table.
        pairs: ``(offsets, pair_in, pair_out)`` of ``kernel_pairs``; for the input
            gradient pass ``(offsets, pair_out, pair_in)`` and ``weight^T``.
        n_out: output rows; required with pairs, defaults to ``nbr.shape[0]``.

    Returns:
        ``(N_out, C_out)`` in the dtype of ``feats``, accumulated in fp32. TF32 tensor
        cores are used for float32 only when ``allow_tf32`` (``ConvConfig.allow_tf32``).
    """
    op = "conv_forward"
    tensors = [feats, weight] + ([nbr] if nbr is not None else []) + list(pairs or ())
    require_cuda(op, *tensors)
    check_deterministic(op, dataflow)
    _check_dtype(op, feats)
    nbr, pairs = _maps(op, dataflow, nbr, pairs)
    if nbr is not None:
        n_out = nbr.shape[0]
    elif n_out is None or n_out < 0:
        raise ValueError(f"{op}: n_out (a non-negative int) is required with pairs")
    feats, weight = feats.contiguous(), weight.contiguous()
    if dataflow == "gather_scatter":
        return _gather_scatter_forward(feats, weight, pairs, n_out, allow_tf32)
    k, cin, cout = weight.shape
    y = torch.empty((n_out, cout), dtype=feats.dtype, device=feats.device)
    sizes = (feats.shape[0], n_out, k, cin, cout)
    _run(dataflow, False, feats, weight, sizes, nbr, pairs, y, allow_tf32)
    return y


def conv_weight_grad(
    dataflow: str,
    feats: torch.Tensor,
    grad_out: torch.Tensor,
    nbr: torch.Tensor | None = None,
    pairs: Pairs | None = None,
    allow_tf32: bool = False,
) -> torch.Tensor:
    """``dw[n] = sum feats[i]^T grad_out[o]`` over the relation's pairs, on the GPU.

    Shapes and map formats are the caller's (the ops check them, :mod:`.conv`).

    Args:
        dataflow: as in :func:`conv_forward`.
        feats: ``(N_in, C_in)`` float32, float16 or bfloat16.
        grad_out: ``(N_out, C_out)``, same dtype.
        nbr: ``(N_out, K)`` int32 neighbour table (implicit GEMM).
        pairs: ``(offsets, pair_in, pair_out)`` (fetch-on-demand, gather-scatter).

    Returns:
        ``(K, C_in, C_out)`` in the dtype of ``feats``, accumulated in fp32.
    """
    op = "conv_weight_grad"
    tensors = [feats, grad_out] + ([nbr] if nbr is not None else []) + list(pairs or ())
    require_cuda(op, *tensors)
    check_deterministic(op, dataflow)
    _check_dtype(op, feats, grad_out)
    nbr, pairs = _maps(op, dataflow, nbr, pairs)
    k = nbr.shape[1] if nbr is not None else pairs[0].shape[0] - 1
    feats, grad_out = feats.contiguous(), grad_out.contiguous()
    if dataflow == "gather_scatter":
        return _gather_scatter_weight_grad(feats, grad_out, pairs, allow_tf32)
    n_in, cin = feats.shape
    n_out, cout = grad_out.shape
    dw = torch.empty((k, cin, cout), dtype=feats.dtype, device=feats.device)
    _run(dataflow, True, feats, grad_out, (n_in, n_out, k, cin, cout), nbr, pairs, dw, allow_tf32)
    return dw


# ---- the "cuda" kernels of the ops in conv.py ----


@conv.sparse_conv.register_kernel("cuda")
def sparse_conv(feats, weight, nbr, rev, allow_tf32=False):
    conv.check_sparse_conv(feats, weight, nbr, rev)
    return conv_forward("implicit_gemm", feats, weight, nbr=nbr, allow_tf32=allow_tf32)


def _kept_pairs(nbr: torch.Tensor) -> Pairs | None:
    """The pair lists of ``nbr`` (:func:`kmap_cuda.kernel_pairs`), built on the first call
    and kept on the table (``_tl_pairs``, :func:`_keep`), or None during CUDA graph capture
    before they exist: counting the pairs reads one number back to the host.  They cost 8
    bytes a pair for as long as the map lives."""
    kept = _kept(nbr, "_tl_pairs")
    if kept is None and torch.cuda.is_current_stream_capturing():
        return None
    return _keep(nbr, "_tl_pairs", lambda: kmap_cuda.kernel_pairs(nbr))


@conv.sparse_conv_weight_grad.register_kernel("cuda")
def sparse_conv_weight_grad(feats, grad_out, nbr, allow_tf32=False):
    conv.check_sparse_conv_weight_grad(feats, grad_out, nbr)
    dataflow = weight_grad_dataflow()
    nbr = nbr.contiguous()
    # Pending: the map's pairs, built once, so that the weight gradient multiplies only
    # the rows that have a neighbour; implicit GEMM's own kernel walks every output row
    # of every kernel row (docs/cuda.md, Implicit GEMM).
    pairs = _kept_pairs(nbr) if pending("pair_weight_grad") else None
    if dataflow == "gather_scatter":  # deterministic algorithms: no atomics (determinism.md)
        pairs = kmap_cuda.kernel_pairs(nbr) if pairs is None else pairs
        return conv_weight_grad(dataflow, feats, grad_out, pairs=pairs, allow_tf32=allow_tf32)
    if pairs is not None:
        return conv_weight_grad(
            "fetch_on_demand", feats, grad_out, pairs=pairs, allow_tf32=allow_tf32
        )
    return conv_weight_grad(dataflow, feats, grad_out, nbr=nbr, allow_tf32=allow_tf32)


@conv.pair_conv.register_kernel("cuda")
def pair_conv(
    feats,
    weight,
    offsets,
    pair_in,
    pair_out,
    rev_offsets,
    rev_in,
    rev_out,
    n_out,
    gather,
    allow_tf32=False,
):
    conv.check_pair_conv_operands(
        feats, weight, offsets, pair_in, pair_out, (rev_offsets, rev_in, rev_out)
    )
    conv.check_pair_conv_output(feats, weight, n_out)
    return conv_forward(
        conv.pair_dataflow(gather),
        feats,
        weight,
        pairs=(offsets, pair_in, pair_out),
        n_out=n_out,
        allow_tf32=allow_tf32,
    )


@conv.pair_conv_weight_grad.register_kernel("cuda")
def pair_conv_weight_grad(feats, grad_out, offsets, pair_in, pair_out, gather, allow_tf32=False):
    conv.check_pair_conv_weight_grad(feats, grad_out, offsets, pair_in, pair_out)
    return conv_weight_grad(
        conv.pair_dataflow(gather),
        feats,
        grad_out,
        pairs=(offsets, pair_in, pair_out),
        allow_tf32=allow_tf32,
    )
