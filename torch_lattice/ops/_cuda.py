"""Torch-side wrappers of the CUDA kernels in ``csrc/cuda`` (``torch_lattice._C.cuda_*``).

Each function takes CUDA tensors, checks device, dtype and shape, allocates the outputs
and any scratch workspace with torch on the tensors' device, and passes raw pointers, the
device index and ``torch.cuda.current_stream(device).cuda_stream`` to C, so all work runs
on torch's current stream. The formats are those of docs/kernel-maps.md, identical to the
CPU ops. The op layer (``torch_lattice.ops``) registers these as the ops' CUDA kernels
(``register_kernel("cuda")``).

Gather-scatter is orchestrated here: one gather launch, one cuBLAS GEMM per non-empty
kernel row through ``torch.mm``, one scatter-add launch (docs/cuda.md, Gather-scatter).
Before the first kernel on a device, :func:`check_device_arch` checks that the binary
was built for it (once per device index).
"""

from __future__ import annotations

import contextlib
import functools
import itertools
import warnings
from collections.abc import Callable, Iterator

import torch

from torch_lattice.ops._native import _C, DTYPE_CODES, ptr

__all__ = [
    "ATOMIC_KERNELS",
    "DATAFLOWS",
    "arch_error",
    "check_deterministic",
    "check_device_arch",
    "conv_forward",
    "conv_weight_grad",
    "generate_support",
    "kernel_map",
    "kernel_pairs",
    "require_cuda",
    "weight_grad_dataflow",
]

Geom = tuple[tuple[int, int, int], tuple[int, int, int], tuple[int, int, int], tuple[int, int, int]]
Pairs = tuple[torch.Tensor, torch.Tensor, torch.Tensor]

# enum tl_cuda_dataflow in csrc/cuda/tl_cuda.h; gather_scatter runs through torch here
DATAFLOWS = {"implicit_gemm": 0, "fetch_on_demand": 1, "gather_scatter": 2}
# Oldest architecture the kernels support (cp.async, bf16 and TF32 tensor cores).
MIN_ARCH = 80
_FEATURE_DTYPES = (torch.float32, torch.float16, torch.bfloat16)

# (op, dataflow) of the CUDA convolution kernels that add floats with atomics, so their
# sums are ordered by thread scheduling and can differ in the last bits run to run
# (docs/determinism.md): fetch-on-demand forward and weight gradient (tl_cuda_pair_gemm.cuh),
# the gather-scatter forward's scatter-add (tl_cuda_gather_scatter.cu), and the implicit-GEMM
# weight gradient, whose chunks of output rows meet in atomics (tl_cuda_implicit_gemm.cu).
# The input gradient is a forward over the transposed relation, so it is the forward's
# kernel.  Deterministic: the implicit-GEMM forward (every output tile written once, kernel
# rows in order) and the gather-scatter weight gradient (one torch.mm per kernel row into
# dw[n], no atomics).
ATOMIC_KERNELS = frozenset(
    {
        ("conv_forward", "fetch_on_demand"),
        ("conv_forward", "gather_scatter"),
        ("conv_weight_grad", "fetch_on_demand"),
        ("conv_weight_grad", "implicit_gemm"),
    }
)


def check_deterministic(op: str, dataflow: str) -> None:
    """Refuses a kernel with float atomics while torch asks for deterministic algorithms.

    With ``torch.use_deterministic_algorithms(True)``, running ``(op, dataflow)`` of
    :data:`ATOMIC_KERNELS` raises ``RuntimeError`` naming both; with ``warn_only=True``
    it warns instead, as torch's own operators do.  The modules and
    ``torch_lattice.nn.functional`` never get here in that mode: they select the
    implicit-GEMM forward and the gather-scatter weight gradient (see
    :func:`torch_lattice.nn.functional.config.resolve_config`).
    """
    if (op, dataflow) not in ATOMIC_KERNELS or not torch.are_deterministic_algorithms_enabled():
        return
    msg = (
        f"torch_lattice {op} with dataflow {dataflow!r} on CUDA adds floats with atomics, so "
        "it is not deterministic, but torch.use_deterministic_algorithms(True) is set. Run "
        "the convolution through torch_lattice.nn or torch_lattice.nn.functional (they select "
        "the implicit-GEMM forward and the gather-scatter weight gradient in this mode) or "
        "call the op with dataflow='implicit_gemm' (forward) / 'gather_scatter' (weight "
        "gradient); see docs/determinism.md"
    )
    if torch.is_deterministic_algorithms_warn_only_enabled():
        warnings.warn(msg, UserWarning, stacklevel=3)
        return
    raise RuntimeError(msg)


def weight_grad_dataflow() -> str:
    """The dataflow of the implicit-GEMM op's CUDA weight gradient: ``"implicit_gemm"``,
    or ``"gather_scatter"`` (no atomics) while deterministic algorithms are on."""
    return "gather_scatter" if torch.are_deterministic_algorithms_enabled() else "implicit_gemm"


def require_cuda(op: str, *tensors: torch.Tensor) -> torch.device:
    """Device shared by ``tensors``; raises unless CUDA kernels can run on it."""
    if not _C.cuda_compiled():
        raise RuntimeError(
            f"{op}: torch_lattice was built without CUDA kernels; rebuild with "
            "TORCH_LATTICE_CUDA=1 (needs nvcc) or move the tensors to the CPU"
        )
    if not torch.cuda.is_available():
        raise RuntimeError(f"{op}: torch reports no usable CUDA device")
    device = tensors[0].device
    for t in tensors:
        if t.device.type != "cuda" or t.device != device:
            raise ValueError(
                f"{op}: all tensors must be on the same CUDA device; got {t.device} and {device}"
            )
    check_device_arch(op, _device_index(device))
    return device


def arch_error(op: str, index: int, capability: tuple[int, int], archs: str) -> str | None:
    """Why the kernels cannot run on a device of ``capability``, or None when they can.

    Args:
        op: name of the calling op, for the message.
        index: CUDA device index, for the message.
        capability: ``(major, minor)`` compute capability of the device.
        archs: ``;``-separated SM architectures built (``_C.cuda_archs()``, e.g.
            ``"80;86;89;90"``); the newest one is also embedded as PTX.

    A device runs SASS built for the same major version and an equal or older minor
    version, and the PTX of the newest architecture when it is at least that new.
    """
    major, minor = capability
    cc = major * 10 + minor
    built = sorted(int(a) for a in archs.split(";") if a.strip())
    listed = ", ".join(f"sm_{a}" for a in built) or "none"
    if cc < MIN_ARCH:
        return (
            f"{op}: CUDA device {index} has compute capability {major}.{minor} (sm_{cc}), "
            f"but torch_lattice's CUDA kernels need sm_{MIN_ARCH} or newer (Ampere or later); "
            f"this binary was built for {listed}. Move the tensors to the CPU."
        )
    runs = any(a // 10 == major and a <= cc for a in built) or (bool(built) and cc >= built[-1])
    if runs:
        return None
    return (
        f"{op}: CUDA device {index} has compute capability {major}.{minor} (sm_{cc}), "
        f"but this torch_lattice binary was built only for {listed}; rebuild with "
        f"TORCH_LATTICE_CUDA_ARCHS including {cc} (e.g. TORCH_LATTICE_CUDA_ARCHS="
        f'"{";".join(str(a) for a in sorted({*built, cc}))}").'
    )


@functools.cache
def _capability(index: int) -> tuple[int, int]:
    # Cached per device index: a device's capability never changes within a process.
    major, minor = _C.cuda_device_capability(index)
    return major, minor


@functools.cache
def _runs_on(index: int) -> bool:
    return arch_error("", index, _capability(index), _C.cuda_archs()) is None


def check_device_arch(op: str, index: int) -> None:
    """Raises RuntimeError when the kernels cannot run on CUDA device ``index``.

    The device is queried once per index; the answer is cached.
    """
    if not _runs_on(index):
        raise RuntimeError(arch_error(op, index, _capability(index), _C.cuda_archs()))


def _device_index(device: torch.device) -> int:
    return device.index if device.index is not None else torch.cuda.current_device()


def _call_args(device: torch.device) -> tuple[int, int]:
    return _device_index(device), torch.cuda.current_stream(device).cuda_stream


def _workspace_alloc(device: torch.device) -> Callable[[int], int]:
    """The ``alloc(nbytes) -> pointer`` a CUDA entry point calls for its workspace.

    The entry point measures its workspace and calls this once (not for 0 bytes), so
    an op crosses into C once. Each buffer is a torch uint8 tensor on ``device`` held
    by the callable, which the C call's arguments keep alive until it returns; torch's
    caching allocator returns blocks aligned to at least 512 bytes, which satisfies
    the 256-byte alignment the C side checks."""
    held: list[torch.Tensor] = []

    def alloc(nbytes: int) -> int:
        held.append(torch.empty((nbytes,), dtype=torch.uint8, device=device))
        return held[-1].data_ptr()

    return alloc


def _check_coords(op: str, name: str, coords: torch.Tensor) -> torch.Tensor:
    if coords.dtype != torch.int32 or coords.dim() != 2 or coords.shape[1] != 4:
        raise ValueError(
            f"{op}: {name} must be an (N, 4) int32 tensor, got {coords.dtype} {tuple(coords.shape)}"
        )
    return coords.contiguous()


def generate_support(
    coords: torch.Tensor, geom: Geom, out_range: tuple[int, int, int], num_batches: int
) -> torch.Tensor:
    """Output support of a strided convolution, as ``lattice::generate_support`` on CPU.

    Args:
        coords: ``(N, 4)`` int32 input rows ``(b, x, y, z)`` on a CUDA device.
        geom: ``(kernel_size, stride, padding, dilation)``, each a 3-tuple.
        out_range: output grid size per axis (negative values count as 0).
        num_batches: number of batches (bounds the output size).

    Returns:
        ``(M, 4)`` int32, unique rows sorted by ``(b, x, y, z)``, on the same device.
    """
    device = require_cuda("generate_support", coords)
    coords = _check_coords("generate_support", "coords", coords)
    rng = tuple(max(0, int(r)) for r in out_range)
    n = coords.shape[0]
    bound = _C.generate_bound(n, geom, rng, num_batches)
    out = torch.empty((bound, 4), dtype=torch.int32, device=device)
    index, stream = _call_args(device)
    alloc = _workspace_alloc(device)
    m = _C.cuda_generate(index, stream, ptr(coords), n, geom, rng, alloc, ptr(out), bound)
    return out[:m].clone()


def kernel_map(
    in_coords: torch.Tensor, out_coords: torch.Tensor, geom: Geom
) -> tuple[torch.Tensor, torch.Tensor]:
    """Neighbour tables ``(nbr (N_out, K), rev (N_in, K))`` int32, as ``lattice::kernel_map``.

    Raises:
        ValueError: If an input row repeats or has a negative entry.
    """
    device = require_cuda("kernel_map", in_coords, out_coords)
    in_coords = _check_coords("kernel_map", "in_coords", in_coords)
    out_coords = _check_coords("kernel_map", "out_coords", out_coords)
    k = geom[0][0] * geom[0][1] * geom[0][2]
    n_in, n_out = in_coords.shape[0], out_coords.shape[0]
    nbr = torch.empty((n_out, k), dtype=torch.int32, device=device)
    rev = torch.empty((n_in, k), dtype=torch.int32, device=device)
    index, stream = _call_args(device)
    alloc = _workspace_alloc(device)
    _C.cuda_kmap_build(
        index, stream, ptr(in_coords), n_in, ptr(out_coords), n_out, geom, alloc, ptr(nbr)
    )
    _C.cuda_kmap_reverse(index, stream, ptr(nbr), n_out, k, n_in, ptr(rev))
    return nbr, rev


def kernel_pairs(nbr: torch.Tensor) -> Pairs:
    """Per-kernel-row pair lists of a neighbour table (docs/kernel-maps.md).

    Args:
        nbr: ``(N_out, K)`` int32 neighbour table on a CUDA device.

    Returns:
        ``offsets`` ``(K + 1,)`` int64, ``pair_in`` and ``pair_out`` ``(P,)`` int32, all on
        the device; pairs of kernel row ``n`` are ``offsets[n]:offsets[n + 1]``, sorted by
        ``pair_out``.
    """
    device = require_cuda("kernel_pairs", nbr)
    if nbr.dtype != torch.int32 or nbr.dim() != 2:
        raise ValueError(f"kernel_pairs: nbr must be (N_out, K) int32, got {nbr.dtype}")
    nbr = nbr.contiguous()
    n_out, k = nbr.shape
    index, stream = _call_args(device)
    alloc = _workspace_alloc(device)
    count = _C.cuda_pairs_count(index, stream, ptr(nbr), n_out, k, alloc)
    offsets = torch.empty((k + 1,), dtype=torch.int64, device=device)
    pair_in = torch.empty((count,), dtype=torch.int32, device=device)
    pair_out = torch.empty((count,), dtype=torch.int32, device=device)
    _C.cuda_pairs_build(
        index,
        stream,
        ptr(nbr),
        n_out,
        k,
        alloc,
        count,
        ptr(offsets),
        ptr(pair_in),
        ptr(pair_out),
    )
    return offsets, pair_in, pair_out


def _check_map(
    op: str, dataflow: str, k: int, nbr: torch.Tensor | None, pairs: Pairs | None
) -> tuple[torch.Tensor | None, Pairs | None]:
    if dataflow not in DATAFLOWS:
        raise ValueError(f"{op}: dataflow must be one of {sorted(DATAFLOWS)}, got {dataflow!r}")
    if dataflow == "implicit_gemm":
        if nbr is None or nbr.dtype != torch.int32 or nbr.dim() != 2 or nbr.shape[1] != k:
            raise ValueError(f"{op}: implicit_gemm needs nbr, an (N_out, {k}) int32 tensor")
        return nbr.contiguous(), None
    if pairs is None or len(pairs) != 3:
        raise ValueError(f"{op}: {dataflow} needs pairs = (offsets, pair_in, pair_out)")
    offsets, pair_in, pair_out = pairs
    if offsets.dtype != torch.int64 or offsets.shape != (k + 1,):
        raise ValueError(
            f"{op}: offsets must be ({k + 1},) int64, got {offsets.dtype} {tuple(offsets.shape)}"
        )
    if (
        pair_in.dtype != torch.int32
        or pair_out.dtype != torch.int32
        or (pair_in.shape != pair_out.shape or pair_in.dim() != 1)
    ):
        raise ValueError(f"{op}: pair_in and pair_out must be (P,) int32 of equal length")
    return None, (offsets.contiguous(), pair_in.contiguous(), pair_out.contiguous())


def _check_features(op: str, a: torch.Tensor, b: torch.Tensor, names: tuple[str, str]) -> None:
    if a.dtype not in _FEATURE_DTYPES:
        raise TypeError(
            f"{op}: CUDA kernels support float32, float16 and bfloat16 features, got {a.dtype}"
        )
    if b.dtype != a.dtype:
        raise TypeError(
            f"{op}: {names[0]} ({a.dtype}) and {names[1]} ({b.dtype}) must have the same dtype"
        )


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
    n_in, n_out, k, cin, cout = sizes
    code = DTYPE_CODES[a.dtype]
    n_pairs = pairs[1].shape[0] if pairs is not None else 0
    index, stream = _call_args(a.device)
    pair_ptrs = [ptr(t) for t in pairs] if pairs is not None else [0, 0, 0]
    tf32 = a.dtype == torch.float32 and allow_tf32
    _C.cuda_conv(
        index,
        stream,
        DATAFLOWS[dataflow],
        int(weight_grad),
        code,
        n_in,
        n_out,
        k,
        cin,
        cout,
        tf32,
        ptr(a),
        ptr(b),
        ptr(nbr) if nbr is not None else 0,
        *pair_ptrs,
        n_pairs,
        _workspace_alloc(a.device),
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
    index, stream = _call_args(src.device)
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
    """``(n, start, end)`` of every non-empty kernel row (one readback of the offsets)."""
    host = offsets.tolist()
    return [(n, a, b) for n, (a, b) in enumerate(itertools.pairwise(host)) if b > a]


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
    gathered = _gather(x, pair_in)  # enqueued before the offsets readback waits
    ranges = _row_ranges(offsets)
    if ranges:
        index, stream = _call_args(x.device)
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

    Args:
        dataflow: ``"implicit_gemm"`` (uses ``nbr``), ``"fetch_on_demand"`` or
            ``"gather_scatter"`` (use ``pairs``).
        feats: ``(N_in, C_in)`` float32, float16 or bfloat16.
        weight: ``(K, C_in, C_out)``, same dtype.
        nbr: ``(N_out, K)`` int32 neighbour table.
        pairs: ``(offsets, pair_in, pair_out)`` of :func:`kernel_pairs`; for the input
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
    _check_features(op, feats, weight, ("feats", "weight"))
    if weight.dim() != 3 or feats.dim() != 2 or weight.shape[1] != feats.shape[1]:
        raise ValueError(
            f"{op}: weight must be (K, C_in, C_out) with C_in == feats.shape[1]; got "
            f"weight {tuple(weight.shape)}, feats {tuple(feats.shape)}"
        )
    k, cin, cout = weight.shape
    nbr, pairs = _check_map(op, dataflow, k, nbr, pairs)
    if nbr is not None:
        n_out = nbr.shape[0] if n_out is None else n_out
        if n_out != nbr.shape[0]:
            raise ValueError(f"{op}: n_out ({n_out}) must equal nbr.shape[0] ({nbr.shape[0]})")
    elif n_out is None or n_out < 0:
        raise ValueError(f"{op}: n_out (a non-negative int) is required with pairs")
    feats, weight = feats.contiguous(), weight.contiguous()
    if dataflow == "gather_scatter":
        return _gather_scatter_forward(feats, weight, pairs, n_out, allow_tf32)
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
    _check_features(op, feats, grad_out, ("feats", "grad_out"))
    if feats.dim() != 2 or grad_out.dim() != 2:
        raise ValueError(f"{op}: feats and grad_out must be 2-D (rows, channels)")
    if nbr is not None:
        k = nbr.shape[1] if nbr.dim() == 2 else -1
    elif pairs is not None and len(pairs) == 3:
        k = pairs[0].shape[0] - 1
    else:
        raise ValueError(f"{op}: pass nbr (implicit_gemm) or pairs (pair dataflows)")
    nbr, pairs = _check_map(op, dataflow, k, nbr, pairs)
    if nbr is not None and nbr.shape[0] != grad_out.shape[0]:
        raise ValueError(
            f"{op}: nbr has {nbr.shape[0]} output rows but grad_out has {grad_out.shape[0]}"
        )
    feats, grad_out = feats.contiguous(), grad_out.contiguous()
    if dataflow == "gather_scatter":
        return _gather_scatter_weight_grad(feats, grad_out, pairs, allow_tf32)
    n_in, cin = feats.shape
    n_out, cout = grad_out.shape
    dw = torch.empty((k, cin, cout), dtype=feats.dtype, device=feats.device)
    _run(dataflow, True, feats, grad_out, (n_in, n_out, k, cin, cout), nbr, pairs, dw, allow_tf32)
    return dw
