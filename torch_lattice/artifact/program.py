"""Loading an MLX Lattice artifact and replaying it with Torch Lattice.

``load_lattice_program(dir)`` checks the artifact strictly before anything runs:
exactly ``graph.mlir`` and ``weights.safetensors``, IR version 2, the contract's
schema digest, the declared weight file, input/output names and roles that match
the function, and every ``lattice.weight`` bound to stored tensors of the right
layout, rank and dtype (and no stored tensor left unreferenced).
"""

from __future__ import annotations

import os
import stat
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors import safe_open

from torch_lattice.artifact import schema
from torch_lattice.artifact.mlir_parse import (
    MAX_GRAPH_CHARS,
    Argument,
    Module,
    TypeRef,
)
from torch_lattice.artifact.replay_ops import (
    EXECUTORS,
    ReplayContext,
    boundary_coords,
)
from torch_lattice.artifact.replay_weights import WeightValue, check_weight, storage_keys
from torch_lattice.artifact.validation import load_module
from torch_lattice.memory_budget import check_allocation
from torch_lattice.regular_file import describe_file_type, nul_byte_error, read_regular_file
from torch_lattice.tensor import SparseTensor

__all__ = ["LatticeProgram", "SparseInput", "SparseOutput", "load_lattice_program"]

_COORDINATES = ("physical", "logical")
# Files a conformance fixture case keeps beside the artifact; nothing else may be there.
FIXTURE_FILES = ("inputs.safetensors", "expected.safetensors")
_DTYPES = {"f32": torch.float32, "f16": torch.float16, "i32": torch.int32, "i64": torch.int64}
_FLOATS = (torch.float32, torch.float16)


@dataclass(frozen=True)
class SparseOutput:
    """A sparse program output: exactly ``active`` rows, no padding.

    Attributes:
        coords: ``(N, 4)`` int32 ``[b, x, y, z]`` (physical unless the program was
            loaded with ``coordinates="logical"``).
        features: ``(N, C)`` in the dtype the graph declares.
        active: int32 ``(1,)`` holding ``N``.
    """

    coords: torch.Tensor
    features: torch.Tensor
    active: torch.Tensor


@dataclass(frozen=True)
class SparseInput:
    """One sparse input of a program: the three ABI tensors one ``sparse.make`` reads.

    Attributes:
        name: what a SparseTensor argument is passed as: the names' common stem
            (``x`` for ``x_coords``, ``x_features``, ``x_active``), else the
            coordinates' name.
        coords, features, active: the ABI input names.
        stride: the stride ``sparse.make`` declares; a SparseTensor passed here must
            have it.
    """

    name: str
    coords: str
    features: str
    active: str
    stride: tuple[int, int, int]


class LatticeProgram:
    """A checked artifact, callable with SparseTensors or with its named ABI tensors.

    ``program(x)`` or ``program(x=x)`` takes a :class:`~torch_lattice.SparseTensor` for
    each sparse input (in the order of the model's arguments; see ``sparse_inputs``)
    and a tensor for each dense one; ``program(**inputs)`` takes every name in
    ``input_names`` (as ``inputs.safetensors`` holds them).  Both forms may be mixed.
    Either returns ``{output_name: value}``: a :class:`SparseOutput` for a
    ``sparse_tensor`` output, a tensor otherwise.
    """

    def __init__(self, module: Module, weights: dict[str, WeightValue], device: torch.device,
                 coordinates: str) -> None:
        self._module = module
        self._ctx = ReplayContext(weights, coordinates == "logical")
        attrs = module.attributes
        self.input_names: tuple[str, ...] = tuple(attrs["lattice.input_names"])
        self.input_roles: tuple[str, ...] = tuple(attrs["lattice.input_roles"])
        self.output_names: tuple[str, ...] = tuple(attrs["lattice.output_names"])
        self.output_roles: tuple[str, ...] = tuple(attrs["lattice.output_roles"])
        self.device = device
        self.coordinates = coordinates
        self.sparse_inputs: tuple[SparseInput, ...] = _sparse_inputs(module)
        self._positional = _positional_inputs(self.input_names, self.sparse_inputs)

    def __repr__(self) -> str:
        return (f"LatticeProgram(inputs={list(self.input_names)}, "
                f"outputs={list(self.output_names)}, coordinates={self.coordinates!r}, "
                f"device={self.device})")

    def __call__(
        self, *args: SparseTensor | torch.Tensor, **kwargs: SparseTensor | torch.Tensor
    ) -> dict[str, torch.Tensor | SparseOutput]:
        inputs = self._abi_inputs(args, kwargs)
        env: dict[str, object] = {}
        missing = [n for n in self.input_names if n not in inputs]
        extra = sorted(set(inputs) - set(self.input_names))
        if missing or extra:
            raise ValueError(
                f"program inputs must be exactly {list(self.input_names)}; "
                f"missing {missing}, unexpected {extra}"
            )
        for arg in self._module.arguments:
            env[arg.name] = _check_input(arg, inputs[arg.name], self.device)
        with torch.no_grad():  # an artifact is a forward graph: nothing to differentiate
            for op in self._module.operations:
                args = [env[name] for name in op.operands]
                results = EXECUTORS[op.spec.name](self._ctx, op, args)
                for name, value in zip(op.results, results, strict=True):
                    env[name] = value
        out: dict[str, torch.Tensor | SparseOutput] = {}
        for name, value_name, ty in zip(self.output_names, self._module.returns,
                                        self._module.result_types, strict=True):
            out[name] = self._output(name, env[value_name], ty)
        return out

    def _abi_inputs(
        self, args: tuple[object, ...], kwargs: dict[str, object]
    ) -> dict[str, object]:
        """The named ABI tensors for a call: SparseTensors (positional, or by their
        ``sparse_inputs`` name) become their coords, features and active tensors."""
        if len(args) > len(self._positional):
            raise TypeError(
                f"program takes {len(self._positional)} positional input(s) "
                f"{[p if isinstance(p, str) else p.name for p in self._positional]}, "
                f"got {len(args)}"
            )
        by_name = {s.name: s for s in self.sparse_inputs}
        inputs: dict[str, object] = {}
        given: list[tuple[str, object]] = [
            (p if isinstance(p, str) else p.name, a)
            for p, a in zip(self._positional[: len(args)], args, strict=True)
        ]
        for name, value in kwargs.items():
            if name in (g for g, _ in given):
                raise TypeError(f"program got multiple values for input {name!r}")
            given.append((name, value))
        for name, value in given:
            sparse = by_name.get(name)
            abi_form = name in self.input_names and not isinstance(value, SparseTensor)
            if sparse is None or abi_form:
                inputs[name] = value
                continue
            for abi, tensor in self._expand(sparse, value).items():
                if abi in kwargs and abi != name:
                    raise TypeError(f"program got {abi!r} both by name and inside {name!r}")
                inputs[abi] = tensor
        return inputs

    def _expand(self, sparse: SparseInput, value: object) -> dict[str, torch.Tensor]:
        """A SparseTensor as the ABI tensors of ``sparse`` (coordinates physical, that
        is logical x stride, unless the program was loaded with coordinates="logical")."""
        if not isinstance(value, SparseTensor):
            raise TypeError(
                f"input {sparse.name!r} must be a SparseTensor (or pass {sparse.coords!r}, "
                f"{sparse.features!r} and {sparse.active!r} by name), got {type(value).__name__}"
            )
        if value.stride != sparse.stride:
            raise ValueError(
                f"input {sparse.name!r} must have stride {sparse.stride} (as the artifact "
                f"declares), got {value.stride}"
            )
        rows = value.coords.shape[0]
        return {
            sparse.coords: boundary_coords(self._ctx, value),
            sparse.features: value.feats,
            sparse.active: torch.tensor([rows], dtype=torch.int32, device=value.feats.device),
        }

    def _output(self, name: str, value: object, ty: TypeRef) -> torch.Tensor | SparseOutput:
        """An output in the type the graph declares; a value that breaks it is an error."""
        dtype = _DTYPES.get(ty.dtype, torch.float32)
        if isinstance(value, SparseTensor):
            if ty.kind != "sparse_tensor":
                raise ValueError(f"output {name!r} is declared a {ty.kind} but the graph "
                                 "computes a sparse tensor")
            active = torch.tensor([value.coords.shape[0]], dtype=torch.int32,
                                  device=value.feats.device)
            feats = _declared_values(f"output {name!r} features", value.feats.detach(), dtype)
            return SparseOutput(boundary_coords(self._ctx, value, f"output {name!r}"), feats,
                                active)
        if not isinstance(value, torch.Tensor) or ty.kind != "tensor":
            raise ValueError(f"output {name!r} is declared a {ty.kind} but the graph computes "
                             f"a {type(value).__name__}")
        if len(ty.shape) != value.ndim or any(
            d is not None and d != s for d, s in zip(ty.shape, value.shape, strict=True)
        ):
            dims = "x".join("?" if d is None else str(d) for d in ty.shape)
            raise ValueError(f"output {name!r} is declared tensor<{dims}x{ty.dtype}> but the "
                             f"graph computes shape {tuple(value.shape)}")
        return _declared_values(f"output {name!r}", value.detach(), dtype)


def _declared_values(what: str, value: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """``value`` cast to the declared ``dtype``; a value the cast would change is refused.

    A float cast to an integer type wraps or truncates silently (3e9 -> -2147483648),
    so it must be finite, integral and in range; an integer to a narrower integer
    must fit. Float to float rounds as the contract's float32 accumulation allows.
    """
    if value.dtype == dtype or dtype.is_floating_point or value.numel() == 0:
        return value.to(dtype)
    info = torch.iinfo(dtype)
    if value.is_floating_point():
        finite = torch.isfinite(value)
        if not bool(finite.all()):
            raise ValueError(f"{what} is declared {dtype} but holds a non-finite value")
        if not bool((value == torch.trunc(value)).all()):
            raise ValueError(f"{what} is declared {dtype} but holds a non-integral value")
    # Python numbers compare exactly whatever the width (float64 holds every float32).
    low, high = value.min().item(), value.max().item()
    if low < info.min or high > info.max:
        shown = high if high > info.max else low
        raise ValueError(f"{what} is declared {dtype}, whose range is [{info.min}, "
                         f"{info.max}], but holds {shown:.17g}")
    return value.to(dtype)


def _sparse_inputs(module: Module) -> tuple[SparseInput, ...]:
    """Each ``sparse.make`` that reads three function arguments, in argument order."""
    position = {arg.name: i for i, arg in enumerate(module.arguments)}
    found: list[SparseInput] = []
    for op in module.operations:
        if op.spec.name != "sparse.make" or not all(o in position for o in op.operands):
            continue
        coords, features, active = op.operands
        stem = coords.removesuffix("_coords")
        name = stem if (features, active) == (f"{stem}_features", f"{stem}_active") else coords
        found.append(SparseInput(name, coords, features, active, tuple(op.attributes["stride"])))
    found.sort(key=lambda s: position[s.coords])
    # An argument read by two sparse.make ops (or twice by one), or a name shared by two
    # groups or taken by another input, cannot stand for one SparseTensor: such inputs
    # keep only the named form.
    reads = Counter(n for s in found for n in (s.coords, s.features, s.active))
    names = Counter(s.name for s in found)
    return tuple(
        s for s in found
        if names[s.name] == 1
        and (s.name == s.coords or s.name not in position)
        and all(reads[n] == 1 for n in (s.coords, s.features, s.active))
    )


def _positional_inputs(
    input_names: tuple[str, ...], sparse: tuple[SparseInput, ...]
) -> list[str | SparseInput]:
    """The inputs in call order: a SparseInput where its coordinates come, a name for
    each input no SparseInput covers."""
    covered = {n: s for s in sparse for n in (s.coords, s.features, s.active)}
    order: list[str | SparseInput] = []
    for name in input_names:
        group = covered.get(name)
        if group is None:
            order.append(name)
        elif name == group.coords:
            order.append(group)
    return order


def _check_input(arg: Argument, value: object, device: torch.device) -> torch.Tensor:
    if not isinstance(value, torch.Tensor):
        raise TypeError(f"input {arg.name!r} must be a torch.Tensor, got {type(value).__name__}")
    ty = arg.type
    if len(ty.shape) != value.ndim or any(
        d is not None and d != s for d, s in zip(ty.shape, value.shape, strict=True)
    ):
        dims = "x".join("?" if d is None else str(d) for d in ty.shape)
        raise ValueError(f"input {arg.name!r} must have shape {dims}, got {tuple(value.shape)}")
    want = _DTYPES[ty.dtype]
    # float features may come in either float width (they are computed in float32);
    # float64 would be rounded silently, so it is refused.
    if want in _FLOATS:
        if value.dtype not in _FLOATS:
            raise TypeError(f"input {arg.name!r} must be {ty.dtype} (float32 or float16), "
                            f"got {value.dtype}")
        return value.to(device)
    if value.is_floating_point() or value.is_complex() or value.dtype == torch.bool:
        raise TypeError(f"input {arg.name!r} must be {ty.dtype} ({want}), got {value.dtype}")
    if value.dtype != want and value.numel():
        # Another integer width is taken when every value fits: nothing wraps silently.
        info = torch.iinfo(want)
        low, high = int(value.min()), int(value.max())
        if low < info.min or high > info.max:
            raise ValueError(f"input {arg.name!r} is {ty.dtype}: its {value.dtype} values "
                             f"[{low}, {high}] do not fit [{info.min}, {info.max}]")
    return value.to(device=device, dtype=want)


# --- loading ---------------------------------------------------------------------------


def _check_files(root: Path) -> None:
    if (nul := nul_byte_error(root, "artifact_dir")) is not None:
        raise ValueError(nul)
    if not root.is_dir():
        raise ValueError(f"artifact_dir {str(root)!r} is not a directory")
    names = set(os.listdir(root))
    expected = {schema.GRAPH_FILE, schema.WEIGHT_FILE}
    # A conformance fixture case is an artifact plus its inputs and expected outputs.
    missing, extra = sorted(expected - names), names - expected - set(FIXTURE_FILES)
    if missing or extra:
        # Only the names this loader owns are printed: a refusal never lists what else
        # a folder holds (it may be a folder the caller did not mean to expose).
        raise ValueError(
            f"artifact_dir must hold exactly {schema.GRAPH_FILE} and {schema.WEIGHT_FILE} "
            f"(plus, in a conformance fixture, {' and '.join(FIXTURE_FILES)}); "
            f"missing {missing}, and {len(extra)} unexpected other "
            f"entr{'y' if len(extra) == 1 else 'ies'}"
        )
    for name in sorted(names):
        path = root / name
        # A link could point anywhere (another artifact's weights, a device file): refused.
        if path.is_symlink():
            raise ValueError(f"artifact_dir: {name} is a symbolic link; artifact files must "
                             "be regular files")
        # A FIFO would block a reader forever, a device never ends: regular files only.
        mode = path.stat().st_mode
        if not stat.S_ISREG(mode):
            raise ValueError(f"artifact_dir: {name} is not a regular file "
                             f"({describe_file_type(mode)}); artifact files must be")
    size = (root / schema.GRAPH_FILE).stat().st_size
    if size > MAX_GRAPH_CHARS:
        raise ValueError(f"graph.mlir is {size} bytes; at most {MAX_GRAPH_CHARS} are read")


def _load_weights(module: Module, path: Path, device: torch.device) -> dict[str, WeightValue]:
    # Every stored tensor is read into memory: the file's size, checked before reading.
    check_allocation(f"reading {schema.WEIGHT_FILE}", path.stat().st_size)
    try:
        with safe_open(str(path), framework="pt", device="cpu") as handle:
            stored = {key: handle.get_tensor(key) for key in handle.keys()}
    except (OSError, MemoryError):
        raise
    except Exception as exc:  # safetensors raises its own SafetensorError for a bad file
        raise ValueError(f"weights.safetensors is not a readable safetensors file: {exc}"
                         ) from None
    used: set[str] = set()
    weights: dict[str, WeightValue] = {}
    for op in module.operations:
        if op.spec.name != "weight":
            continue
        value = check_weight(op, stored)
        weights[op.symbol] = WeightValue(
            value.key, value.family, value.layout, value.packing,
            tuple(t.to(device) for t in value.tensors),
        )
        used.update(storage_keys(op))
    unused = sorted(set(stored) - used)
    if unused:
        raise ValueError(f"weights.safetensors holds tensors no lattice.weight names: {unused}")
    return weights


def check_device(device: object, name: str = "device") -> torch.device:
    """``device`` as a :class:`torch.device` the replay can run on (``None``: the CPU).

    Checked before anything is loaded: torch itself fails late on a CUDA device, with an
    ``AssertionError`` when it was built without CUDA and an opaque error for an index it
    does not have.

    Raises:
        TypeError: ``device`` that is not a str, torch.device or None.
        ValueError: not a device name, a device type other than CPU or CUDA (the
            replay has kernels for those two only), CUDA where this torch has no CUDA
            support or no device, or a CUDA index past ``torch.cuda.device_count()``;
            each message starts with ``name``.
    """
    if device is not None and not isinstance(device, (str, torch.device)):
        raise TypeError(f"{name} must be a str, torch.device or None, got {device!r}")
    try:
        dev = torch.device("cpu" if device is None else device)
    except RuntimeError as exc:  # torch's message lists every device type
        raise ValueError(f"{name} {device!r} is not a torch device ({exc})") from None
    if dev.type not in ("cpu", "cuda"):
        raise ValueError(f"{name} {device!r}: the replay runs on 'cpu' or 'cuda' devices only, "
                         f"got device type {dev.type!r}")
    if dev.type == "cuda":
        if not torch.backends.cuda.is_built():
            raise ValueError(f"{name} {device!r}: CUDA is not available in this torch build "
                             f"(torch {torch.__version__} has no CUDA support); use 'cpu'")
        count = torch.cuda.device_count()
        if count == 0:
            raise ValueError(f"{name} {device!r}: this torch build has CUDA but sees no CUDA "
                             "device (torch.cuda.device_count() is 0); use 'cpu'")
        if dev.index is not None and dev.index >= count:
            raise ValueError(f"{name} {device!r}: CUDA index {dev.index} is out of range; "
                             f"torch sees {count} CUDA device(s) (indices 0 to {count - 1})")
    return dev


def load_lattice_program(
    artifact_dir: str | os.PathLike[str],
    *,
    coordinates: str = "physical",
    device: str | torch.device | None = None,
) -> LatticeProgram:
    """Loads and checks an IR-v2 artifact directory for replay with Torch Lattice kernels.

    Args:
        artifact_dir: directory holding exactly ``graph.mlir`` and ``weights.safetensors``.
        coordinates: ``"physical"`` (IR v2: boundary coordinates are logical x stride;
            inputs must be divisible by the declared stride) or ``"logical"`` (taken as
            they are; what torch-lattice 0.5's own artifacts carry).
        device: where to run (``None``: CPU); a CPU or CUDA device this torch can use
            (see ``torch_lattice.artifact.program.check_device``).

    Returns:
        A :class:`LatticeProgram`.

    Raises:
        ValueError: a bad argument, file set, header, op, attribute or weight, naming it;
            a ``device`` this torch cannot run on (no CUDA in this build, a CUDA index
            past ``torch.cuda.device_count()``, a type other than CPU or CUDA).
        TypeError: ``artifact_dir`` that is not a path, ``device`` of another type.
    """
    if not isinstance(artifact_dir, (str, os.PathLike)):
        raise TypeError(f"artifact_dir must be a path, got {type(artifact_dir).__name__}")
    if coordinates not in _COORDINATES:
        raise ValueError(f"coordinates must be 'physical' or 'logical', got {coordinates!r}")
    dev = check_device(device)
    root = Path(artifact_dir)
    _check_files(root)
    data = read_regular_file(root / schema.GRAPH_FILE, "graph.mlir", max_bytes=MAX_GRAPH_CHARS,
                             follow_symlinks=False)
    try:
        # Universal newlines, as text-mode reading gives (line numbers in errors).
        text = data.decode("utf-8").replace("\r\n", "\n").replace("\r", "\n")
    except UnicodeDecodeError as exc:
        raise ValueError(f"graph.mlir is not UTF-8 text: {exc}") from None
    module = load_module(text)
    weights = _load_weights(module, root / schema.WEIGHT_FILE, dev)
    return LatticeProgram(module, weights, dev, coordinates)

