"""The one bridge to ``torch_lattice._C`` shared by every op family.

Here: the native library handle, dtype and reduction codes, pointer and thread
helpers, the device checks (CPU, and CUDA with its architecture check), the
CUDA call arguments (device index, torch's current stream) and workspace
allocation, and the determinism rules of the CUDA convolution kernels.  The
op families (``kmap``, ``conv``, ``pool``, ``voxel`` and their ``*_cuda``
siblings) import from here and never from one another's private helpers.
"""

from __future__ import annotations

import functools
import warnings
from collections.abc import Callable, Sequence
from typing import Any, TypeVar, cast

import torch

from torch_lattice import _C
from torch_lattice.memory_budget import check_allocation

__all__ = [
    "ATOMIC_KERNELS",
    "DTYPE_CODES",
    "FEATURE_DTYPES",
    "FEATURE_DTYPE_NAMES",
    "MIN_ARCH",
    "REDUCTION_CODES",
    "_C",
    "arch_error",
    "call_args",
    "check_copies",
    "check_deterministic",
    "check_device_arch",
    "check_size",
    "compute_dtype",
    "cuda_feature_code",
    "device_index",
    "device_type",
    "one_device",
    "optional_ptr",
    "ptr",
    "refuse_function_transforms",
    "require_cpu",
    "require_cuda",
    "strided_copy_bytes",
    "symbolic_sizes",
    "threads",
    "weight_grad_dataflow",
    "workspace_alloc",
]

F = TypeVar("F", bound=Callable[..., Any])

# dtype codes of enum tl_dtype in csrc/core/tl_conv.h
DTYPE_CODES = {torch.float32: 0, torch.float64: 1, torch.float16: 2, torch.bfloat16: 3}
# The feature dtypes of a SparseTensor and of the ops (each computes in one of them, or
# in float32 for the half types): torch's other floating dtypes (float8, ...) are refused.
FEATURE_DTYPES = tuple(DTYPE_CODES)
FEATURE_DTYPE_NAMES = "float32, float64, float16 or bfloat16"
# enum tl_voxel_reduction in csrc/core/tl_voxel.h
REDUCTION_CODES = {"mean": 0, "sum": 1, "max": 2}
# Oldest architecture the CUDA kernels support (cp.async, bf16 and TF32 tensor cores).
MIN_ARCH = 80


# ---- CPU ----


def device_type(op: str, *tensors: torch.Tensor) -> str:
    """``"cpu"`` or ``"cuda"``: the one device all ``tensors`` are on.

    Raises:
        ValueError: tensors on different devices.
        RuntimeError: a device type with no kernels (CUDA kernels are checked
            when called, by :func:`require_cuda`).
    """
    devices = _devices(op, tensors)
    if len(devices) != 1:
        raise ValueError(f"lattice::{op}: all tensors must be on one device, got {devices}")
    kind = next(iter(devices)).type
    if kind not in ("cpu", "cuda"):
        raise RuntimeError(f"lattice::{op}: no kernels for {kind} tensors (use CPU or CUDA)")
    return kind


def _devices(op: str, tensors: Sequence[torch.Tensor]) -> set[torch.device]:
    """The devices of ``tensors``, refusing more than one."""
    devices = {t.device for t in tensors}
    if len(devices) > 1:
        raise ValueError(f"lattice::{op}: all tensors must be on one device, got {devices}")
    return devices


def one_device(op: str) -> Callable[[F], F]:
    """Decorates an op's fake kernel: its tensor arguments (also inside lists) must be on
    one device, as the real kernels check (:func:`device_type`). A meta tensor beside CPU
    tensors sends the call to the fake kernel, which would return an uninitialized tensor
    on the other arguments' device instead of an error."""

    def wrap(fake: F) -> F:
        @functools.wraps(fake)
        def checked(*args: Any, **kwargs: Any) -> Any:
            tensors = []
            for a in (*args, *kwargs.values()):
                items = a if isinstance(a, (list, tuple)) else (a,)
                tensors += [t for t in items if isinstance(t, torch.Tensor)]
            _devices(op, tensors)
            return fake(*args, **kwargs)

        return cast(F, checked)

    return wrap


def refuse_function_transforms(op: str, *tensors: torch.Tensor | None) -> None:
    """Raises ``NotImplementedError`` for an operand of a differentiating function
    transform: ``torch.func.grad`` / ``vjp`` / ``jacrev`` / ``jvp`` (whose tensors are
    grad-tracking wrappers, which torch's custom-op autograd refuses with an error about
    ``setup_context``) or ``torch.autograd.forward_ad`` (a tangent, which the ops have
    no rule for: torch would silently return a zero one). ``torch.func.vmap`` and
    reverse-mode ``torch.autograd`` work and pass. Outside those, a cheap check."""
    grad_tracking = getattr(torch._C._functorch, "is_gradtrackingtensor", None)
    dual = torch.autograd.forward_ad._current_level >= 0
    for t in tensors:
        if t is None:
            continue
        # A wrapper nothing differentiates (x.detach() or a no_grad call inside the
        # transform: a stop-gradient target, a frozen extractor) runs as before.
        differentiated = (grad_tracking is not None and grad_tracking(t)
                          and t.requires_grad and torch.is_grad_enabled())
        if differentiated or (
                dual and torch.autograd.forward_ad.unpack_dual(t).tangent is not None):
            raise NotImplementedError(
                f"{op}: torch.func's differentiating transforms (grad, vjp, jacrev, jvp, "
                "hessian) and forward-mode AD (torch.autograd.forward_ad) are not "
                "supported by torch_lattice's ops; use reverse-mode torch.autograd "
                "(backward, torch.autograd.grad, torch.autograd.functional.jacobian / vjp); "
                "torch.func.vmap works"
            )


def require_cpu(op: str, *tensors: torch.Tensor) -> None:
    """Raises unless every tensor is on the CPU."""
    if device_type(op, *tensors) != "cpu":
        raise RuntimeError(f"lattice::{op}: runs on the CPU only; move the tensors to the CPU")


def compute_dtype(op: str, dtype: torch.dtype, halves: bool = False) -> torch.dtype:
    """dtype the C core computes ``op`` in: float32/float64 as they are; half
    types as they are where ``op``'s kernels take them (``halves``: float sums
    inside, rounded once), else in float32, cast back by the caller.

    Raises:
        TypeError: ``dtype`` is not floating.
    """
    if dtype in (torch.float32, torch.float64):
        return dtype
    if dtype in (torch.float16, torch.bfloat16):
        return dtype if halves else torch.float32
    raise TypeError(f"lattice::{op}: features must be floating ({FEATURE_DTYPE_NAMES}), "
                    f"got {dtype}")


# ---- dtype and shape of index and coordinate tensors ----
# The C core and the CUDA kernels trust sizes: they read ``shape[0]`` rows of the layout
# they expect (4 int32 a coordinate row, one int64 an inverse entry) and check only the
# values they read, so every op checks these first and a direct caller of
# ``torch.ops.lattice.*`` gets a ValueError naming the argument, not a read past its end.


def check_size(cond: bool | torch.SymBool, message: Callable[[], str]) -> None:
    """Raises ``ValueError(message())`` unless ``cond``, a size rule an op's real and fake
    kernels share. Under ``torch.compile`` the fake kernels see symbolic sizes (a generated
    support's row count is data-dependent), which a plain ``if`` cannot decide; torch
    then checks the rule when the graph runs instead."""
    torch._check_with(ValueError, cond, message)


def symbolic_sizes(*tensors: torch.Tensor | None) -> bool:
    """Whether a size of ``tensors`` is symbolic (a fake kernel under ``torch.compile``):
    asking whether such a tensor is contiguous, or comparing its size with the budget,
    would guard on it, or fail where the size depends on data."""
    return any(isinstance(s, torch.SymInt) for t in tensors if t is not None for s in t.shape)


def strided_copy_bytes(*tensors: torch.Tensor | None) -> int:
    """The bytes of the contiguous copies of the strided ones among ``tensors``: an
    ``expand``ed view is a few bytes of storage however many rows it shows, its copy
    all of them. 0 where a size is symbolic (the real kernel's call checks)."""
    if symbolic_sizes(*tensors):
        return 0
    return sum(t.numel() * t.element_size() for t in tensors
               if t is not None and not t.is_contiguous())  # fmt: skip


def check_copies(op: str, out_bytes: int | torch.SymInt = 0, **tensors: torch.Tensor | None
                 ) -> None:  # fmt: skip
    """The contiguous copies an op makes of its strided operands
    (:func:`strided_copy_bytes`), with ``out_bytes`` of outputs sized from them, within the
    memory budget, before any is made. Symbolic sizes (fake kernels under
    ``torch.compile``) are left to the real kernel's call."""
    if symbolic_sizes(*tensors.values()) or not isinstance(out_bytes, int):
        return
    strided = {name: t for name, t in tensors.items() if t is not None and not t.is_contiguous()}
    if strided:
        shapes = ", ".join(f"{name} {tuple(t.shape)}" for name, t in strided.items())
        check_allocation(f"lattice::{op}: contiguous copies of strided {shapes}"
                         + (" and its output" if out_bytes else ""),
                         out_bytes + strided_copy_bytes(*strided.values()))


def check_tensor(
    op: str, name: str, t: torch.Tensor, dtypes: tuple[torch.dtype, ...],
    shape: tuple[int | torch.SymInt | str, ...],
) -> None:  # fmt: skip
    """Raises ``ValueError`` unless ``t`` has one of ``dtypes`` and ``shape``: one entry a
    dimension, an int (or a tensor's size) for a size it must have, a name (``"N"``) for
    any size."""

    def message() -> str:
        kinds = " or ".join(str(d).removeprefix("torch.") for d in dtypes)
        dims = "(" + ", ".join(str(s) for s in shape) + ("," if len(shape) == 1 else "") + ")"
        return (f"lattice::{op}: {name} must be a {dims} {kinds} tensor, got {t.dtype} "
                f"{tuple(t.shape)}")  # fmt: skip

    if t.dtype not in dtypes or t.dim() != len(shape):
        raise ValueError(message())
    for i, s in enumerate(shape):
        if not isinstance(s, str):
            check_size(t.shape[i] == s, message)


def check_coords(op: str, name: str, coords: torch.Tensor) -> None:
    """Raises unless ``coords`` are ``(N, 4)`` int32 rows ``(b, x, y, z)``."""
    check_tensor(op, name, coords, (torch.int32,), ("N", 4))


def check_non_negative(op: str, name: str, coords: torch.Tensor) -> None:
    """Raises ``ValueError`` unless every entry of the checked ``(N, 4)`` rows ``coords``
    (batch index and coordinates) is non-negative, as ``SparseTensor`` requires of its
    rows: for the ops whose C core would otherwise take a negative row as it is. One pass
    over the rows (on CUDA one readback)."""
    if coords.shape[0] == 0:
        return
    lo = int(coords.min())
    if lo < 0:
        row = int(torch.nonzero((coords < 0).any(dim=1))[0, 0])
        raise ValueError(
            f"lattice::{op}: {name} must be non-negative, found {lo} (row {row}: "
            f"[batch, x, y, z] = {coords[row].tolist()})"
        )


def ptr(t: torch.Tensor) -> int:
    """Data pointer of a contiguous tensor (0 when empty)."""
    if not t.is_contiguous():
        raise ValueError("internal error: tensor passed to the C core must be contiguous")
    return t.data_ptr() if t.numel() else 0


def optional_ptr(t: torch.Tensor | None) -> int:
    """:func:`ptr` of an optional operand (a null pointer for None, e.g. no batch column)."""
    return 0 if t is None else ptr(t)


def threads() -> int:
    """Threads for one C call: torch's intra-op setting, shared by all work."""
    return max(1, torch.get_num_threads())


# ---- CUDA device, architecture, stream, workspace ----


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
    check_device_arch(op, device_index(device))
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


def device_index(device: torch.device) -> int:
    """CUDA index of ``device`` (torch's current device where it names none)."""
    return device.index if device.index is not None else torch.cuda.current_device()


def call_args(device: torch.device) -> tuple[int, int]:
    """``(device index, torch's current stream)``, the first two arguments of every
    ``_C.cuda_*`` call, so all work runs on torch's stream."""
    return device_index(device), torch.cuda.current_stream(device).cuda_stream


def workspace_alloc(device: torch.device) -> Callable[[int], int]:
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


def cuda_feature_code(op: str, dtype: torch.dtype) -> int:
    """dtype code of features of the CUDA voxel and pooling kernels (any of
    :data:`FEATURE_DTYPES`); TypeError naming the dtype otherwise, as on the CPU (the
    convolutions take fewer dtypes, see ``conv_cuda``)."""
    compute_dtype(op, dtype)
    return DTYPE_CODES[dtype]


# ---- determinism of the CUDA convolution kernels ----

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
