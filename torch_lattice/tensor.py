"""SparseTensor and its coordinate manager.

A :class:`SparseTensor` is a feature matrix over a :class:`Support` (its
coordinate rows, stride and spatial range).  Tensors derived from one another
share a :class:`CoordinateManager`, which caches generated supports and
kernel maps so that layers with the same geometry build them once.
"""

from __future__ import annotations

import threading
import weakref
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from multiprocessing.reduction import ForkingPickler
from typing import Any, TypeVar

import torch

from torch_lattice import _C
from torch_lattice.geometry import ConvGeometry, Triple, check_has_values, is_sequence, triple
from torch_lattice.memory_budget import check_allocation, check_output
from torch_lattice.ops._runtime import FEATURE_DTYPE_NAMES, FEATURE_DTYPES

__all__ = [
    "CoordinateManager",
    "Derivation",
    "SparseTensor",
    "Support",
    "add",
    "check_same_dtype",
    "check_strided",
    "same_support",
    "validate_coords",
]

_INT32_MAX = 2**31 - 1
_RANGE_MAX = 2**31  # one past the largest int32 coordinate
RangeT = tuple[int, int, int, int]


def validate_coords(coords: Any, name: str = "coords", *, feats: Any = None) -> torch.Tensor:
    """Checks an ``(N, 4)`` integer coordinate tensor and returns an owned int32 copy.

    Rows are ``[batch, x, y, z]``: non-negative, unique, within int32. The result
    never shares memory with ``coords``: it is copied *before* it is checked, so no
    later (or concurrent) edit of the caller's tensor reaches the checked rows or any
    support and kernel map built from them.  The copy is a normal tensor even under
    ``torch.inference_mode``, so its version counter tracks in-place edits.  ``feats``,
    the argument given beside the
    coordinates (if any), only sharpens the error for float coordinates: an integer
    ``(N, 4)`` ``feats`` means the two were swapped.

    Raises:
        TypeError: not a tensor, or not an integer dtype.
        ValueError: wrong shape, a device other than CPU or CUDA, negative, beyond
            int32, or repeated rows.
    """
    if not isinstance(coords, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(coords).__name__}")
    check_strided(coords, name)
    if coords.dtype not in (torch.int32, torch.int64, torch.int16, torch.int8, torch.uint8):
        raise TypeError(
            f"{name} must be an integer tensor (int32 or int64), got {coords.dtype}"
            + _float_coords_hint(coords, feats)
        )
    if coords.dim() != 2 or coords.shape[1] != 4:
        raise ValueError(
            f"{name} must have shape (N, 4) [batch, x, y, z], got {tuple(coords.shape)}"
        )
    if coords.device.type not in ("cpu", "cuda"):
        raise ValueError(f"{name} must be on the CPU or a CUDA device, got {coords.device}")
    if coords.shape[0] > 1 and coords.stride(0) == 0:
        # An expanded view repeats one row: refused before a copy materialises it.
        raise ValueError(f"{name} rows must be unique, row 1 repeats {coords[0].tolist()} "
                         "(an expanded view with row stride 0)")
    check_allocation(f"copying {name} ({coords.shape[0]} rows)",
                     coords.numel() * (coords.element_size() + 4))
    # One copy, taken first: the checks below and everything after read only it. Made
    # outside inference mode, so even under torch.inference_mode it is a normal tensor
    # whose version counter reveals a later in-place edit (Support.check_unchanged).
    with torch.inference_mode(False):
        owned = coords.clone(memory_format=torch.contiguous_format)
    if owned.numel():
        lo, hi = int(owned.min()), int(owned.max())
        if lo < 0:
            raise ValueError(f"{name} must be non-negative, found {lo}")
        if hi > _INT32_MAX:
            raise ValueError(f"{name} must fit in int32 (<= {_INT32_MAX}), found {hi}")
    with torch.inference_mode(False):
        out = _plain(owned.to(torch.int32))
    dup = _find_duplicate(out)
    if dup >= 0:
        row = out[dup].tolist()
        raise ValueError(f"{name} rows must be unique, row {dup} repeats {row}")
    return out


def _plain(t: torch.Tensor) -> torch.Tensor:
    """``t`` without torch.func's wrappers: inside ``torch.func.grad`` / ``jvp`` / ``vjp``
    a new tensor is a wrapper with no storage of its own, which the C core cannot read.
    Integer coordinates are never differentiated, so the plain tensor is the same rows."""
    functorch = torch._C._functorch
    while functorch.is_functorch_wrapped_tensor(t):
        t = functorch.get_unwrapped(t)
    return t


def _float_coords_hint(coords: torch.Tensor, feats: Any) -> str:
    """What to do about non-integer coordinates: swapped arguments, or points to voxelize."""
    if isinstance(feats, torch.Tensor) and not (
        feats.is_floating_point() or feats.is_complex() or feats.dtype == torch.bool
    ) and feats.dim() == 2 and feats.shape[1] == 4:
        return (
            f"; feats is an integer {tuple(feats.shape)} tensor, so the two look swapped: "
            "the order is SparseTensor(feats, coords)"
        )
    if coords.is_floating_point():
        return (
            "; for float points (e.g. metres), tl.voxelize(points, feats, voxel_size=...) "
            "makes the integer [batch, x, y, z] rows"
        )
    return ""


def _find_duplicate(coords: torch.Tensor) -> int:
    """Index of the first repeated row, or -1."""
    if coords.shape[0] < 2:
        return -1
    if coords.device.type == "cpu":
        return int(_C.find_duplicate(coords.data_ptr(), coords.shape[0]))
    uniq, inverse = torch.unique(coords, dim=0, return_inverse=True)
    if uniq.shape[0] == coords.shape[0]:
        return -1
    first = torch.full((uniq.shape[0],), coords.shape[0], dtype=torch.long, device=coords.device)
    first.scatter_reduce_(0, inverse, torch.arange(coords.shape[0], device=coords.device), "amin")
    later = torch.arange(coords.shape[0], device=coords.device) != first[inverse]
    return int(torch.nonzero(later)[0, 0])


def _spatial_range(value: Any) -> RangeT | None:
    if value is None:
        return None
    if isinstance(value, torch.Tensor):
        # Sized first: tolist() of an expanded view (a pickle's zeros(1).expand(10**10))
        # would build the whole list before the length is checked.
        if value.numel() not in (1, 4):
            raise ValueError(f"spatial_range must be None, an int or (B, X, Y, Z), got a "
                             f"tensor of shape {tuple(value.shape)}")
        check_has_values("spatial_range", value)
        value = value.tolist() if value.numel() == 4 else value.item()
    if isinstance(value, int) and not isinstance(value, bool):
        value = (value,) * 4
    if not is_sequence(value):  # str and bytes too: b"\x02\x05\x05\x05" is not (2, 5, 5, 5)
        raise TypeError(f"spatial_range must be None, an int or a sequence (B, X, Y, Z) of "
                        f"ints, got {type(value).__name__}")
    if len(value) != 4:
        shown = value if len(value) <= 8 else f"a sequence of {len(value)} values"
        raise ValueError(f"spatial_range must be None, an int or (B, X, Y, Z), got {shown!r}")
    out = []
    for v in value:
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ValueError(f"spatial_range must hold positive ints (B, X, Y, Z), got {value!r}")
        # Coordinates are int32, so an extent past 2^31 (one past the largest coordinate)
        # only feeds products that overflow: refused here, where it is named.
        if v > _RANGE_MAX:
            raise ValueError(
                f"spatial_range entries must be at most 2^31 (coordinates are int32), got "
                f"{value!r}"
            )
        out.append(v)
    return (out[0], out[1], out[2], out[3])


@dataclass(eq=False)
class Support:
    """A coordinate set on one lattice: rows, stride and optional range.

    Compared and hashed by identity: two supports are the same cache key only
    if they are the same object, which holds exactly for tensors derived from
    one another.
    """

    coords: torch.Tensor
    stride: Triple
    spatial_range: RangeT | None
    manager: CoordinateManager
    # True for supports the manager keeps for its lifetime (a tensor's own rows, the
    # memoized generated supports); False for one made for a single call (a target
    # given as a tensor, a per-call generated support): their maps go to a bounded cache.
    stable: bool = False
    # grid_range() when inferred from coords: one reduction per support, not per layer call.
    _inferred_range: Triple | None = field(default=None, init=False, repr=False)
    # coords' in-place version when the support was made; a cached map of edited rows
    # would be silently wrong.
    _version: int = field(default=0, init=False, repr=False)

    def __post_init__(self) -> None:
        if self.coords.is_inference():
            # Rows made under torch.inference_mode (a generated support, a moved tensor)
            # have no version counter, so an edit through ``x.coords`` would go unseen:
            # keep a normal copy instead. One O(N) copy per support, nothing per call
            # (a per-call fingerprint would rescan every row on every layer call).
            with torch.inference_mode(False):
                self.coords = self.coords.clone()
        self._version = self.coords._version

    def check_unchanged(self) -> None:
        """Raises if ``coords`` was edited in place since the support was made (under
        ``torch.inference_mode`` too: the stored rows are never an inference tensor).

        Raises:
            ValueError: the rows changed (cached supports and maps would be stale).
        """
        if self.coords._version != self._version:
            raise ValueError(
                "coords of this SparseTensor were modified in place after it was built; "
                "coordinates are immutable (cached kernel maps depend on them): build a new "
                "SparseTensor from the edited rows instead"
            )

    def __reduce__(self) -> tuple[Any, ...]:
        # Rows, stride and range only; the manager pickles as a fresh, empty one (its
        # caches, lock and weak tables belong to this process), shared by the supports of
        # one manager within one pickle or deepcopy (the memo), so tensors that shared a
        # support still share one. Checked again on loading (_rebuild_support).
        return (_rebuild_support,
                (self.coords, self.stride, self.spatial_range, self.manager, self.stable))

    @property
    def num_rows(self) -> int:
        """``N``, the number of coordinate rows."""
        return int(self.coords.shape[0])

    def grid_range(self) -> Triple:
        """``R``: ``spatial_range[1:]`` or ``max(coords) + 1`` per axis (rows edited in
        place since are refused first: :meth:`check_unchanged`)."""
        self.check_unchanged()
        if self.spatial_range is not None:
            return (self.spatial_range[1], self.spatial_range[2], self.spatial_range[3])
        if self._inferred_range is None:
            if self.num_rows == 0:
                self._inferred_range = (0, 0, 0)
            else:
                # max + 1 in Python ints: max(coords) may be 2^31 - 1, so the
                # extent 2^31 does not fit the coordinates' int32.
                m = [int(v) + 1 for v in self.coords[:, 1:].amax(dim=0).tolist()]
                self._inferred_range = (m[0], m[1], m[2])
        return self._inferred_range

    def num_batches(self) -> int:
        """``B``: ``spatial_range[0]``, else the largest batch index + 1 (0 if empty)."""
        self.check_unchanged()
        if self.spatial_range is not None:
            return self.spatial_range[0]
        return int(self.coords[:, 0].max()) + 1 if self.num_rows else 0


# Cached entries that involve a single-call support (see Support.stable), per manager.
TRANSIENT_CACHE_SIZE = 32

# The kinds of cached entries: supports of strided convolutions (and re-ranged ones), of
# generative transposes, kernel maps, and pair lists of transposes built without one.
CACHE_KINDS = ("generated", "generative", "kernel_maps", "transpose_pairs")
# The kinds whose builds ``CoordinateManager.builds`` counts (tests and profiling).
COUNTED_KINDS = frozenset({"kernel_maps", "transpose_pairs"})

V = TypeVar("V")


@dataclass(frozen=True)
class Derivation:
    """How a generated support was made: from ``source`` through ``geometry``."""

    source: Support
    geometry: ConvGeometry


@dataclass(eq=False)
class CoordinateManager:
    """Caches of supports and kernel maps shared by related tensors.

    The manager stores and looks up; it builds nothing.  The functional layer
    (``torch_lattice/nn/functional/supports.py`` and ``relation.py``) builds each
    generated support, kernel map and pair list on a miss and hands the builder to
    :meth:`cached`.  Each entry is keyed by the identity of the supports it relates
    and the geometry, so it is built once and reused by every layer with the same
    geometry.

    Bounded growth: entries between the manager's stable supports (its tensors'
    own rows and the supports it generated from them) live as long as the
    manager; entries involving a single-call support (a target given as a tensor
    or from another manager, a per-call generated support) go to a
    least-recently-used cache of ``TRANSIENT_CACHE_SIZE`` entries, so a new
    target on every call cannot grow memory (docs/limits.md).

    Thread safety: lookups and fills run under the manager's re-entrant lock,
    held during a build too, so threads sharing a cold tensor build each
    support and map once (the others wait, then take the cached entry).  The
    C builders release the GIL, so without the lock every thread that missed
    would build the entry again.

    Pickling or copying a manager (``copy.copy`` too) gives a new, empty one: caches,
    derivations and the lock are never copied.
    """

    # One table per kind of entry (CACHE_KINDS), for stable supports.
    _tables: dict[str, dict[tuple[Any, ...], Any]] = field(
        default_factory=lambda: {kind: {} for kind in CACHE_KINDS}
    )
    # Entries involving a single-call support (a fresh target each call), least recently
    # used first: bounded by TRANSIENT_CACHE_SIZE, so repeated calls cannot grow memory.
    _transient: OrderedDict[tuple[Any, ...], Any] = field(default_factory=OrderedDict)
    # Weakly keyed: a derivation lives as long as the output support it describes.
    _derivations: weakref.WeakKeyDictionary[Support, list[Derivation]] = field(
        default_factory=weakref.WeakKeyDictionary
    )
    # Supports generated as unique{source * s + r * d - p} (every candidate kept), weakly
    # keyed by the generated support: a transpose onto one has a pair per (source row,
    # kernel row) and can skip the (N_generated, K) table.
    _expanded: weakref.WeakKeyDictionary[Support, Derivation] = field(
        default_factory=weakref.WeakKeyDictionary
    )
    # Kernel maps and transpose pair lists built (not served from cache), counted by
    # ``cached``; for tests and profiling.
    builds: int = 0
    _lock: threading.RLock = field(default_factory=threading.RLock, repr=False)

    def __reduce__(self) -> tuple[Any, ...]:
        # Caches are not copied: kernel maps are rebuilt on first use in the copy, and a
        # deepcopy shares no mutable state (nor the lock) with the original.
        return (_new_manager, ())

    def new_support(
        self, coords: torch.Tensor, stride: Triple, spatial_range: RangeT | None,
        *, stable: bool = False,
    ) -> Support:
        """A new support owned by this manager (rows are not validated here).

        ``stable=True`` for a support kept as long as the manager (a tensor's own rows,
        memoized generated supports); the default is a single-call support, whose
        cached maps are bounded (see ``Support.stable``).
        """
        return Support(coords, stride, spatial_range, self, stable)

    def is_stable(self, *supports: Support) -> bool:
        """Whether every one of ``supports`` is a stable support of this manager."""
        return all(s.stable and s.manager is self for s in supports)

    def cached(self, kind: str, key: tuple[Any, ...], supports: tuple[Support, ...],
               build: Callable[[], V]) -> V:
        """The ``kind`` entry (one of ``CACHE_KINDS``) for ``key``, which relates
        ``supports``: from the cache, else ``build()``, stored and returned.

        Kept for the manager's lifetime when every support is stable, else in the
        bounded least-recently-used cache.  A hit on a stable table reads a dict
        without the lock; a miss takes the manager's lock and looks again, so threads
        that missed together build once.  Builds of ``COUNTED_KINDS`` are counted in
        ``builds``.  The manager calls ``build`` itself (no wrapper), so a map built on
        a miss goes straight from here to the op layer.

        Entries are never inference tensors (see the build below).

        Raises:
            ValueError: a support's rows were edited in place after it was made.
        """
        for support in supports:
            support.check_unchanged()
        full_key = (kind, *key)
        stable = self.is_stable(*supports)
        table = self._tables[kind] if stable else self._transient
        if stable:
            hit = table.get(full_key)
            if hit is not None:
                return hit
        with self._lock:
            hit = table.get(full_key)
            if hit is not None:
                if not stable:
                    self._transient.move_to_end(full_key)
                return hit
            # Built as normal tensors even under torch.inference_mode, as every cache's
            # entries are (locked_cache.py): a validation pass would break training after.
            with torch.inference_mode(False):
                value = build()
            table[full_key] = value
            self.builds += kind in COUNTED_KINDS
            while len(self._transient) > TRANSIENT_CACHE_SIZE:
                self._transient.popitem(last=False)
            return value

    def cache_sizes(self) -> dict[str, int]:
        """Entries per cache (for tests and profiling): ``generated``, ``generative``,
        ``kernel_maps``, ``transpose_pairs`` (stable supports) and ``transient`` (bounded)."""
        with self._lock:
            sizes = {kind: len(table) for kind, table in self._tables.items()}
            return {**sizes, "transient": len(self._transient)}

    def ranged_support(self, source: Support, spatial_range: RangeT) -> Support:
        """``source``'s rows (the same tensor) under another ``spatial_range`` (cached,
        so a network that pads the range on every call reuses one support and its maps)."""
        return self.cached(
            "generated", ("ranged", source, spatial_range), (source,),
            lambda: self.new_support(source.coords, source.stride, spatial_range,
                                     stable=self.is_stable(source)),
        )

    def record_derivation(self, output: Support, source: Support, geometry: ConvGeometry) -> None:
        """Notes that a Conv3d with ``geometry`` mapped ``source`` onto ``output``."""
        with self._lock:
            entries = self._derivations.setdefault(output, [])
            d = Derivation(source, geometry)
            if d not in entries:
                entries.append(d)

    def record_expansion(self, output: Support, source: Support, geometry: ConvGeometry) -> None:
        """Notes that ``output`` is every ``source * stride + r * dilation - padding``."""
        with self._lock:
            self._expanded[output] = Derivation(source, geometry)

    def is_expansion(self, output: Support, source: Support, geometry: ConvGeometry) -> bool:
        """Whether ``output`` was generated from ``source`` by ``geometry``'s transpose
        (``record_expansion``)."""
        with self._lock:
            return self._expanded.get(output) == Derivation(source, geometry)

    def derivations(self, support: Support) -> list[Derivation]:
        """The (source, geometry) pairs that generated ``support``."""
        with self._lock:
            return list(self._derivations.get(support, ()))


def multiply_stride(a: Triple, b: Triple) -> Triple:
    """``a * b`` per axis: the output stride of a strided convolution.

    Raises:
        ValueError: the product leaves int32 (strides are stored and multiplied into
            coordinates as int32), naming both strides.
    """
    out = (a[0] * b[0], a[1] * b[1], a[2] * b[2])
    if max(out) > _INT32_MAX:
        raise ValueError(
            f"total stride {out} (input stride {a} x stride {b}) is beyond the int32 limit "
            f"{_INT32_MAX}"
        )
    return out


def divide_stride(source: Triple, stride: Triple) -> Triple:
    """``source / stride`` per axis; it must divide exactly (transposes).

    Raises:
        ValueError: some axis of ``source`` is not a multiple of ``stride``.
    """
    if any(a % b for a, b in zip(source, stride, strict=True)):
        raise ValueError(
            f"input stride {source} must be divisible by the transpose stride {stride}: "
            "the output stride is input.stride / stride exactly"
        )
    return (source[0] // stride[0], source[1] // stride[1], source[2] // stride[2])


class SparseTensor:
    """Features on a sparse set of lattice coordinates.

    Args:
        feats: ``(N, C)`` float32, float64, float16 or bfloat16 tensor (the dtypes the
            kernels take; float8 and other floating dtypes raise ``TypeError``).
        coords: ``(N, 4)`` integer tensor ``[batch, x, y, z]`` of logical grid
            indices; stored as int32.  Non-negative, unique rows.
        stride: int or 3-tuple of positive ints: the lattice spacing.
        spatial_range: ``None`` or ``(B, X, Y, Z)`` (an int is broadcast);
            every coordinate must lie inside it.

    Pickling and copying (``torch.save``/``torch.load``, ``pickle``, ``copy.deepcopy``,
    ``DataLoader`` workers) keep ``feats`` (as torch pickles a tensor; a deepcopy of
    non-leaf features raises, as torch's does), ``coords``, ``stride`` and
    ``spatial_range``. The coordinate manager is not copied: the copy gets a new, empty
    one (cached kernel maps are rebuilt on first use, and the Conv3d history that
    ``ConvTranspose3d(src)`` without a target reads is gone); tensors copied or pickled
    together that shared a support share one again. Loaded rows are checked as here.
    ``copy.copy`` shares the support. See docs/concepts.md, "Saving, copying and data
    loaders".

    Raises:
        TypeError: a wrong type (not a tensor, integer or float8 features, float
            coordinates).
        ValueError: a broken rule (shape, negative or repeated rows, a row
            outside ``spatial_range``, different devices); the message names
            the argument and the rule.
    """

    __slots__ = ("_feats", "_support")

    def __init__(
        self,
        feats: torch.Tensor,
        coords: torch.Tensor,
        stride: int | Sequence[int] = 1,
        spatial_range: int | Sequence[int] | None = None,
    ) -> None:
        coords32 = validate_coords(coords, feats=feats)
        _check_feats(feats, coords32.shape[0])
        if feats.device != coords.device:
            raise ValueError(
                "feats and coords must be on the same device, "
                f"got {feats.device} and {coords.device}"
            )
        srange = _spatial_range(spatial_range)
        _check_in_range(coords32, srange)
        support = CoordinateManager().new_support(
            coords32, triple("stride", stride, 1), srange, stable=True
        )
        self._feats = feats
        self._support = support

    @classmethod
    def from_support(cls, feats: torch.Tensor, support: Support) -> SparseTensor:
        """Wraps features over an existing (already validated) support.

        Raises:
            TypeError: ``support`` is not a ``Support`` (``x.support``); ``feats`` is not a
                floating tensor of a supported dtype.
            ValueError: ``feats`` is not ``(N, C)`` with one row per support row, or is
                on another device than the support.
        """
        if not isinstance(support, Support):
            raise TypeError(
                f"support must be a torch_lattice Support (e.g. x.support), got "
                f"{type(support).__name__}"
            )
        _check_feats(feats, support.num_rows)
        if feats.device != support.coords.device:
            raise ValueError(
                "feats and coords must be on the same device, "
                f"got {feats.device} and {support.coords.device}"
            )
        out = cls.__new__(cls)
        out._feats = feats
        out._support = support
        return out

    # --- properties -------------------------------------------------------
    @property
    def feats(self) -> torch.Tensor:
        """``(N, C)`` features."""
        return self._feats

    @property
    def F(self) -> torch.Tensor:
        """Alias of :attr:`feats` (TorchSparse spelling)."""
        return self._feats

    @property
    def coords(self) -> torch.Tensor:
        """``(N, 4)`` int32 ``[batch, x, y, z]``."""
        return self._support.coords

    @property
    def C(self) -> torch.Tensor:
        """Alias of :attr:`coords` (TorchSparse spelling)."""
        return self._support.coords

    @property
    def stride(self) -> Triple:
        """Lattice spacing per axis (the product of the strides that led here)."""
        return self._support.stride

    @property
    def spatial_range(self) -> RangeT | None:
        """``(B, X, Y, Z)`` bounding every row, or ``None``."""
        return self._support.spatial_range

    @property
    def support(self) -> Support:
        """The coordinate set (rows, stride, range), shared by derived tensors."""
        return self._support

    @property
    def coordinate_manager(self) -> CoordinateManager:
        """The cache of supports and kernel maps this tensor shares."""
        return self._support.manager

    @property
    def device(self) -> torch.device:
        """Device of the features and coordinates."""
        return self._feats.device

    @property
    def dtype(self) -> torch.dtype:
        """Dtype of the features."""
        return self._feats.dtype

    @property
    def shape(self) -> torch.Size:
        """``(N, C)``, the shape of the features."""
        return self._feats.shape

    def __len__(self) -> int:
        return int(self._feats.shape[0])

    def __getattr__(self, name: str) -> Any:
        # Reached only for a missing attribute. A torch.Tensor one (x.dim()) means dense
        # code was given a SparseTensor, most often a torch.nn.SyncBatchNorm that
        # convert_sync_batchnorm put in a tl.nn.BatchNorm's place (BatchNorm subclasses
        # BatchNorm1d, for its state dict): say so, not just "no attribute 'dim'".
        message = f"{type(self).__name__!r} object has no attribute {name!r}"
        if not name.startswith("_") and hasattr(torch.Tensor, name):
            message += (
                ": a SparseTensor is not a torch.Tensor; a dense module or function was "
                "given one (give it x.feats). torch.nn.SyncBatchNorm.convert_sync_batchnorm "
                "makes such a module: it replaces tl.nn.BatchNorm and BatchNormReLU with a "
                "dense SyncBatchNorm, so it does not apply to them (docs/distributed.md)"
            )
        raise AttributeError(message, name=name, obj=self)

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        _register_subclass(cls)

    def __reduce__(self) -> tuple[Any, ...]:
        # Features as torch pickles them (requires_grad kept, a non-leaf's graph not; a
        # deepcopy of a non-leaf raises as torch does), and the support (Support.__reduce__).
        # Nothing here raises; features torch will not send to another process are
        # handled by _reduce_for_process, so a DataLoader worker never drops a sample.
        args: tuple[Any, ...] = (self._feats, self._support)
        if type(self) is not SparseTensor:
            args += (type(self),)
        return (_rebuild_sparse_tensor, args)

    # --- derived tensors --------------------------------------------------
    def replace(self, feats: torch.Tensor) -> SparseTensor:
        """Same support, new ``(N, C')`` features (checked by :meth:`from_support`)."""
        return SparseTensor.from_support(feats, self._support)

    def to(self, *args: Any, **kwargs: Any) -> SparseTensor:
        """Like ``torch.Tensor.to``; a dtype applies to features only."""
        try:
            feats = self._feats.to(*args, **kwargs)
        except AssertionError as exc:  # torch's "not compiled with CUDA" is an assertion
            raise RuntimeError(f"to: cannot move the features: {exc}") from exc
        if feats.dtype not in FEATURE_DTYPES:
            raise TypeError(
                f"to: feats must stay floating, of a supported dtype ({FEATURE_DTYPE_NAMES}), "
                f"got {feats.dtype}"
            )
        if feats.device.type not in ("cpu", "cuda"):
            raise ValueError(
                f"to: a SparseTensor lives on the CPU or a CUDA device, got {feats.device}"
            )
        if feats.device == self._feats.device:
            return SparseTensor.from_support(feats, self._support)
        s = self._support
        moved = CoordinateManager().new_support(
            s.coords.to(feats.device), s.stride, s.spatial_range, stable=True
        )
        return SparseTensor.from_support(feats, moved)

    def cpu(self) -> SparseTensor:
        """``to("cpu")``."""
        return self.to("cpu")

    def cuda(self, device: int | str | torch.device | None = None) -> SparseTensor:
        """``to("cuda")``, or to the given CUDA device (an index, a name or a
        ``torch.device``).

        Raises:
            TypeError: ``device`` is not None, an int, a str or a ``torch.device``.
            RuntimeError: ``device`` is not a CUDA device, as ``torch.Tensor.cuda``
                raises (``to`` would move to any device: ``cuda("cpu")`` stayed on the
                CPU).
        """
        if device is None:
            return self.to("cuda")
        if isinstance(device, bool) or not isinstance(device, (int, str, torch.device)):
            raise TypeError(
                f"cuda: device must be None, an int, a str or a torch.device, got "
                f"{type(device).__name__}"
            )
        try:
            dev = torch.device("cuda", device) if isinstance(device, int) else torch.device(device)
        except RuntimeError as exc:  # a negative index, a malformed name
            raise RuntimeError(f"cuda: device {device!r} is not a device: {exc}") from exc
        if dev.type != "cuda":
            raise RuntimeError(f"cuda: device must be a CUDA device, got {dev}")
        return self.to(dev)

    def half(self) -> SparseTensor:
        """float16 features on the same support."""
        return self.replace(self._feats.half())

    def bfloat16(self) -> SparseTensor:
        """bfloat16 features on the same support."""
        return self.replace(self._feats.bfloat16())

    def float(self) -> SparseTensor:
        """float32 features on the same support."""
        return self.replace(self._feats.float())

    def double(self) -> SparseTensor:
        """float64 features on the same support."""
        return self.replace(self._feats.double())

    def detach(self) -> SparseTensor:
        """Features detached from the autograd graph, on the same support."""
        return self.replace(self._feats.detach())

    def __add__(self, other: object) -> SparseTensor:
        """Feature-wise sum on equal supports (see :func:`add`)."""
        if not isinstance(other, SparseTensor):
            return NotImplemented
        return add(self, other)

    def dense(self) -> torch.Tensor:
        """``[B, C, X, Y, Z]`` dense tensor (zeros off the support).

        Raises:
            ValueError: the tensor has no ``spatial_range``.
        """
        srange = self.spatial_range
        if srange is None:
            raise ValueError("dense() needs spatial_range; construct the SparseTensor with one")
        b, x, y, z = srange
        channels = int(self._feats.shape[1])
        cells = b * x * y * z * max(1, channels)
        if cells >= 2**62:  # beyond any tensor's element count, whatever the budget
            raise ValueError(
                f"dense() of spatial_range {srange} with {channels} channels is "
                "too large for a dense tensor"
            )
        # The zero grid plus its permuted contiguous copy.
        check_allocation(
            f"dense() of spatial_range {srange} with {channels} channels",
            2 * cells * self._feats.element_size(),
        )
        out = self._feats.new_zeros((b, x, y, z, self._feats.shape[1]))
        c = self.coords.long()
        out = out.index_put((c[:, 0], c[:, 1], c[:, 2], c[:, 3]), self._feats)
        return out.permute(0, 4, 1, 2, 3).contiguous()

    def __repr__(self) -> str:
        return (
            f"SparseTensor(rows={len(self)}, channels={self._feats.shape[1]}, "
            f"stride={self.stride}, spatial_range={self.spatial_range}, "
            f"dtype={self.dtype}, device={self.device})"
        )


def _check_in_range(coords: torch.Tensor, srange: RangeT | None) -> None:
    """Raises ``ValueError`` unless every row of ``coords`` lies inside ``srange``."""
    if srange is not None and coords.shape[0]:
        hi = coords.amax(dim=0).tolist()
        for axis, (h, r) in enumerate(zip(hi, srange, strict=True)):
            if h >= r:
                name = "bxyz"[axis]
                raise ValueError(
                    f"coords must lie inside spatial_range {srange}: {name}={h} >= {r}"
                )


def _new_manager() -> CoordinateManager:
    """What an unpickled or copied manager is: a new, empty one."""
    return CoordinateManager()


def _rebuild_support(coords: Any, stride: Any, spatial_range: Any, manager: Any,
                     stable: Any) -> Support:
    """Unpickles a :class:`Support`. Every field is checked as ``SparseTensor()`` checks
    it, since the file may be untrusted (``torch.load(weights_only=True)`` calls this).

    Raises:
        TypeError: a field of the wrong type.
        ValueError: rows, stride or range breaking ``SparseTensor``'s rules.
    """
    if not isinstance(manager, CoordinateManager):
        raise TypeError(f"manager must be a CoordinateManager, got {type(manager).__name__}")
    if not isinstance(stable, bool):
        raise TypeError(f"stable must be a bool, got {type(stable).__name__}")
    coords32 = validate_coords(coords)
    srange = _spatial_range(spatial_range)
    _check_in_range(coords32, srange)
    return manager.new_support(coords32, triple("stride", stride, 1), srange, stable=stable)


def _rebuild_sparse_tensor(feats: Any, support: Any,
                           cls: type[SparseTensor] = SparseTensor) -> SparseTensor:
    """Unpickles a :class:`SparseTensor` over a support from :func:`_rebuild_support`.

    Raises:
        TypeError: ``support`` is not a Support, ``cls`` not a SparseTensor class, or
            ``feats`` not a floating tensor.
        ValueError: ``feats`` of the wrong shape or on another device than the rows.
    """
    if not (isinstance(cls, type) and issubclass(cls, SparseTensor)):
        raise TypeError(f"cls must be a SparseTensor class, got {cls!r}")
    return cls.from_support(feats, support)  # which checks support and feats


# torch.load's default (weights_only=True) loads a SparseTensor: these rebuild functions
# check what they are given, so allowing them keeps that loader safe.
torch.serialization.add_safe_globals([_rebuild_sparse_tensor, _rebuild_support, _new_manager])


# ---- to another process (multiprocessing, DataLoader workers) ----
#
# A worker pickles its samples in a queue's feeder thread; an error there is printed in the
# worker and the sample is dropped, so the DataLoader waits forever. So nothing raises
# while a SparseTensor is pickled for another process: what would (features that are a
# non-leaf requiring grad, which torch refuses to send) is sent as an error raised where the
# tensor is loaded, which the DataLoader re-raises.


def _refuse_in_process(message: str) -> None:
    """Raises ``RuntimeError(message)`` where a refused tensor is unpickled."""
    raise RuntimeError(message)


def _reduce_for_process(x: SparseTensor) -> tuple[Any, ...]:
    feats = x.feats
    if feats.requires_grad and not feats.is_leaf:
        return (_refuse_in_process, (
            "a SparseTensor whose feats are a non-leaf that requires grad cannot be sent to "
            "another process (autograd does not cross process boundaries); send "
            "x.detach() instead",
        ))
    return x.__reduce__()


def _rebuild_shared_support(coords: torch.Tensor, stride: Triple,
                            spatial_range: RangeT | None, manager: CoordinateManager,
                            stable: bool) -> Support:
    """A support from another process of this program, whose rows were checked when it
    was built: copied (the sent tensor's memory is shared with the sender, whose edits
    this process's version counter would not see), not checked again."""
    with torch.inference_mode(False):
        owned = coords.clone(memory_format=torch.contiguous_format)
    return manager.new_support(owned, stride, spatial_range, stable=stable)


def _reduce_support_for_process(s: Support) -> tuple[Any, ...]:
    return (_rebuild_shared_support,
            (s.coords, s.stride, s.spatial_range, s.manager, s.stable))


ForkingPickler.register(SparseTensor, _reduce_for_process)
ForkingPickler.register(Support, _reduce_support_for_process)


def _register_subclass(cls: type[SparseTensor]) -> None:
    """ForkingPickler dispatches on the exact type: each subclass is registered too
    (SparseTensor.__init_subclass__), so none can hang a DataLoader either."""
    ForkingPickler.register(cls, _reduce_for_process)


def check_strided(t: torch.Tensor, name: str) -> None:
    """Raises ``TypeError`` for a sparse (COO, CSR, ...) or nested tensor: the kernels
    read rows of plain strided memory, and torch's own errors about such a tensor come
    later, from deep inside a layer, naming no argument."""
    if t.is_nested or t.layout != torch.strided:
        got = "a nested tensor" if t.is_nested else f"layout {t.layout} (.to_dense() converts it)"
        raise TypeError(f"{name} must be a dense (strided) tensor, got {got}")


def _check_feats(feats: Any, rows: int) -> None:
    if not isinstance(feats, torch.Tensor):
        raise TypeError(f"feats must be a torch.Tensor, got {type(feats).__name__}")
    check_strided(feats, "feats")
    if feats.dtype not in FEATURE_DTYPES:
        raise TypeError(
            f"feats must be a floating tensor of a supported dtype ({FEATURE_DTYPE_NAMES}), "
            f"got {feats.dtype}"
        )
    if feats.dim() != 2:
        raise ValueError(f"feats must have shape (N, C), got {tuple(feats.shape)}")
    if feats.shape[0] != rows:
        raise ValueError(
            f"feats must have one row per coordinate: {feats.shape[0]} rows for {rows} coords"
        )


def same_support(a: SparseTensor, b: SparseTensor) -> bool:
    """True when ``a`` and ``b`` have the same rows, in the same order, on one lattice:
    one :class:`Support` object, or equal strides and equal coordinate rows."""
    if a.support is b.support:
        return True
    if a.stride != b.stride or a.coords.shape != b.coords.shape or a.device != b.device:
        return False
    return bool(torch.equal(a.coords, b.coords))


def check_same_support(op: str, a: SparseTensor, b: object, index: int) -> None:
    """Raises unless ``b`` (argument ``index`` of ``op``) is a SparseTensor on ``a``'s
    support (:func:`same_support`) with ``a``'s ``spatial_range``: the result keeps
    ``a``'s support, so another range (which holds the batch count) would be dropped
    silently; ``sparse_cat`` and ``sparse_binary`` refuse it too.

    Raises:
        TypeError: ``b`` is not a SparseTensor.
        ValueError: the supports or their spatial ranges differ.
    """
    if not isinstance(b, SparseTensor):
        raise TypeError(f"{op}: argument {index} must be a SparseTensor, got {type(b).__name__}")
    if not same_support(a, b):
        raise ValueError(
            f"{op}: argument {index} has a different support ({len(b)} rows, stride {b.stride}) "
            f"than argument 0 ({len(a)} rows, stride {a.stride}); supports must be the same "
            "object or have equal coordinates in the same order"
        )
    if a.spatial_range != b.spatial_range:
        raise ValueError(
            f"{op}: argument {index} has spatial_range {b.spatial_range} but argument 0 "
            f"{a.spatial_range}; tensors on equal rows must have the same spatial_range (it "
            "holds the batch count; the result would keep argument 0's)"
        )


def check_same_dtype(op: str, a: SparseTensor, b: SparseTensor, names: tuple[str, str]) -> None:
    """Raises ``TypeError`` unless ``a`` and ``b`` (named ``names`` in the message) have
    one feature dtype: the coordinate joins (``sparse_binary``, ``sparse_cat``, the
    artifact contract's ``sparse.*`` ops, which run in one dtype) never promote one
    operand to the other's dtype (``a + b`` and :func:`cat` promote, as torch does)."""
    if a.dtype != b.dtype:
        raise TypeError(
            f"{op}: {names[0]} feats are {a.dtype} but {names[1]} feats {b.dtype}; feature "
            "dtypes must match (nothing is promoted: cast one with .to(dtype))"
        )


def add(a: SparseTensor, b: SparseTensor) -> SparseTensor:
    """``a + b`` feature-wise on equal supports (``(N, C)`` each); the result keeps
    ``a``'s support, so its cached kernel maps stay shared. Different feature dtypes
    promote as torch's ``+`` does (an autocast convolution's bfloat16 output plus a
    float32 skip is float32).

    Raises:
        TypeError: an argument is not a SparseTensor.
        ValueError: different supports, spatial ranges or channel counts; (a
            ``MemoryBudgetError``) the output beyond the memory budget.
    """
    if not isinstance(a, SparseTensor):
        raise TypeError(f"add: argument 0 must be a SparseTensor, got {type(a).__name__}")
    check_same_support("add", a, b, 1)
    if a.feats.shape[1] != b.feats.shape[1]:
        raise ValueError(f"add: channel counts differ: {a.feats.shape[1]} and {b.feats.shape[1]}")
    # as sparse_binary's: features may be expanded; the result takes the promoted dtype
    check_output("add", len(a), a.feats, dtype=torch.promote_types(a.dtype, b.dtype))
    return SparseTensor.from_support(a.feats + b.feats, a.support)
