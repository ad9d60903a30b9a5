"""Reading legacy checkpoints safely, and loading converted state strictly.

Container detection (:func:`extract_model_state`), in this order:

1. The top level must be a mapping.
2. Optimizer state anywhere is refused (:class:`OptimizerStateError`): the whole object
   is an optimizer state dict (``state`` and ``param_groups``), a top-level entry holding
   a container is named like one (``optimizer``, ``optim``, ...), or a container at any
   depth of dicts, lists and tuples looks like one. ``None``, strings and numbers
   (``{"optimizer": "adam"}``) hold no state.
3. ``{"model": sd}`` or ``{"state_dict": sd}`` (``sd`` a mapping) unwraps ``sd``; other
   top-level entries (``epoch``, ``config``, ...) are reported as ignored. Both wrappers
   at once are ambiguous and refused.
4. Otherwise the top level is a bare state dict and must hold only tensors.
"""

from __future__ import annotations

import hashlib
import io
import pickle
import re
import struct
import warnings
import zipfile
import zlib
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from torch_lattice.memory_budget import MemoryBudgetError, check_allocation
from torch_lattice.migration.errors import (
    ConversionError,
    OptimizerStateError,
    StateDictMismatchError,
    UnsafeCheckpointError,
)
from torch_lattice.migration.prezip import claimed_storage_bytes
from torch_lattice.regular_file import read_regular_file

__all__ = [
    "LegacyCheckpoint",
    "extract_model_state",
    "load_converted",
    "load_state_dict_strict",
    "read_legacy_checkpoint",
]

WRAPPER_KEYS = ("model", "state_dict")
_CONTAINER_HINT = "expected a state dict, {'model': state_dict} or {'state_dict': state_dict}"


@dataclass(frozen=True)
class LegacyCheckpoint:
    """A legacy checkpoint's model state and where it came from.

    Attributes:
        state_dict: the model state (tensors by key), unmodified.
        container: ``"bare"``, ``"model"`` or ``"state_dict"`` (see module docstring).
        ignored_keys: top-level entries beside the wrapper that were not converted.
        sha256: hex digest of the source file's bytes (empty when not read from a file).
    """

    state_dict: dict[str, Any]
    container: str
    ignored_keys: tuple[str, ...]
    sha256: str = ""


def _is_optimizer_state(value: Any) -> bool:
    return isinstance(value, Mapping) and "state" in value and "param_groups" in value


def _holds_state(value: Any) -> bool:
    """``{"optimizer": None}`` or ``{"optimizer": "adam"}`` holds no state."""
    return value is not None and not isinstance(value, (torch.Tensor, str, int, float, bool))


def _children(value: Any) -> list[tuple[Any, Any]]:
    """A container's (key, value) entries; none for anything else."""
    if isinstance(value, Mapping):
        return list(value.items())
    if isinstance(value, (list, tuple)):
        return list(enumerate(value))
    return []


def _refuse_optimizer_state(obj: Mapping[Any, Any]) -> None:
    if _is_optimizer_state(obj):
        raise OptimizerStateError(
            "checkpoint is an optimizer state dict ('state', 'param_groups'); "
            "only model state is converted"
        )
    # Every container at any depth (checkpoints nest them: {"train": {"opt": ...}},
    # {"extra": [opt.state_dict()]}), walked without recursion and each once, so a
    # deeply nested or self-referencing pickle cannot exhaust the stack. A top-level name
    # containing "optim" counts; deeper, only an optimizer state dict's own keys do (a
    # {"config": {"optimizer": {"lr": ...}}} holds hyper-parameters, not state).
    # Each entry keeps its parent's index in `path` instead of its location as text: the
    # text is built only for the error, so a long key referenced many times costs nothing.
    path: list[tuple[int, Any]] = []  # (parent's index or -1, key)
    pending: list[tuple[int, Any, bool]] = []  # (index in path, value, top level)
    for k, v in obj.items():
        path.append((-1, k))
        pending.append((len(path) - 1, v, True))
    seen: set[int] = set()
    while pending:
        at, value, top = pending.pop()
        key = path[at][1]
        if not _holds_state(value) or id(value) in seen:
            continue
        seen.add(id(value))
        if (top and "optim" in str(key).lower()) or _is_optimizer_state(value):
            raise OptimizerStateError(
                f"checkpoint holds optimizer state under {_location(path, at)}; only model "
                f"state is converted (resuming training needs its own policy). Save the model "
                f"state alone, e.g. torch.save({{'model': ckpt['model']}}, path), and convert "
                f"that"
            )
        for k, v in _children(value):
            if _holds_state(v) and id(v) not in seen:
                path.append((at, k))
                pending.append((len(path) - 1, v, False))


# Characters of a key's repr that an error message shows.
_KEY_CHARS = 60


def _location(path: list[tuple[int, Any]], at: int) -> str:
    """Entry ``at``'s location, ``'a'['b'][0]``, each key's repr cut to _KEY_CHARS."""
    keys = []
    while at >= 0:
        at, key = path[at]
        text = repr(key)
        keys.append(text if len(text) <= _KEY_CHARS else text[: _KEY_CHARS - 3] + "...")
    first, *rest = reversed(keys)
    return first + "".join(f"[{k}]" for k in rest)


def extract_model_state(obj: Any) -> tuple[dict[str, Any], str, tuple[str, ...]]:
    """Finds the model state in a loaded legacy checkpoint.

    Returns:
        ``(state_dict, container, ignored_keys)``; see the module docstring.

    Raises:
        OptimizerStateError: optimizer state is present.
        ConversionError: not a mapping, two wrappers, or a bare dict with non-tensors.
    """
    if not isinstance(obj, Mapping):
        raise ConversionError(f"checkpoint top level is a {type(obj).__name__}; {_CONTAINER_HINT}")
    _refuse_optimizer_state(obj)
    wrappers = [k for k in WRAPPER_KEYS if isinstance(obj.get(k), Mapping)]
    if len(wrappers) > 1:
        raise ConversionError(
            "checkpoint has both 'model' and 'state_dict'; which one is ambiguous"
        )
    if wrappers:
        key = wrappers[0]
        ignored = tuple(str(k) for k in obj if k != key)
        return dict(obj[key]), key, ignored
    others = [str(k) for k, v in obj.items() if not isinstance(v, torch.Tensor)]
    if others:
        raise ConversionError(
            f"checkpoint top-level entries {others} are not tensors; {_CONTAINER_HINT}"
        )
    return dict(obj), "bare", ()


def _unpickler_detail(exc: BaseException) -> str:
    """The one informative line of torch's (long, multi-line) load error."""
    text = re.sub(r"\x1b\[[0-9;]*m", "", str(exc))
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    for i, line in enumerate(lines):
        _, marker, rest = line.partition("WeightsUnpickler error:")
        if marker:
            detail = rest.strip() or (lines[i + 1] if i + 1 < len(lines) else "")
            return detail.split(" was not an allowed global")[0]
    return lines[0] if lines else type(exc).__name__


_ZIP_MAGIC = b"PK\x03\x04"


def _check_zip(source: Path, data: bytes) -> None:
    """Refuses a corrupted checkpoint archive before torch reads it.

    torch's reader takes the first of two entries with one name and does not check
    CRCs, so a flipped byte became ``inf`` where a weight was 1.0. Here every entry
    name must be unique and every entry's CRC must match (entries are stored, not
    compressed, by torch.save; the sum of their declared sizes, what torch.load would
    allocate, is checked against the budget before any is read).
    """
    name = f"source checkpoint {str(source)!r}"
    try:
        with zipfile.ZipFile(io.BytesIO(data)) as archive:
            infos = archive.infolist()
            seen: set[str] = set()
            for info in infos:
                if info.filename in seen:
                    raise ConversionError(f"{name} is a corrupted archive: entry "
                                          f"{info.filename!r} appears twice")
                seen.add(info.filename)
            # torch.load inflates every entry (a deflated entry of zeros is 1000 times
            # its stored size), so all of them together must fit the budget.
            check_allocation(f"loading {name}", sum(i.file_size for i in infos))
            bad = archive.testzip()
    except (ConversionError, MemoryBudgetError):
        raise
    except (zipfile.BadZipFile, zipfile.LargeZipFile, EOFError, NotImplementedError,
            OSError, OverflowError, RuntimeError, ValueError, struct.error, zlib.error) as exc:
        # zipfile reports an encrypted entry as RuntimeError, odd headers as ValueError.
        raise ConversionError(f"{name} is a corrupted archive: {exc}") from None
    if bad is not None:
        raise ConversionError(f"{name} is a corrupted archive: entry {bad!r} fails its CRC "
                              "check")


def _check_prezip(source: Path, data: bytes) -> None:
    """Refuses a pre-zip checkpoint whose storages claim more bytes than the file
    holds: torch would allocate them all before finding out (see :mod:`.prezip`)."""
    name = f"source checkpoint {str(source)!r}"
    try:
        claimed = claimed_storage_bytes(data)
    except Exception as exc:  # whatever pickle raises on bytes that are not a checkpoint
        raise ConversionError(f"cannot load {name} as a torch checkpoint: it is neither a "
                              f"zip archive nor a pre-zip checkpoint ({exc})") from None
    if claimed > len(data):
        raise ConversionError(f"{name} is corrupted: its tensors claim {claimed} bytes of "
                              f"storage but the file holds {len(data)} bytes")


def read_legacy_checkpoint(path: str | Path) -> LegacyCheckpoint:
    """Reads a legacy checkpoint without running pickle code.

    The file is read once; its bytes are hashed and then unpickled with
    ``torch.load(..., weights_only=True, map_location="cpu")``, which only rebuilds
    tensors, containers and primitives (and Torch Lattice's ``SparseTensor``, whose
    rebuild checks every field; never a model weight), so a pickle that names any other
    callable is refused before that callable runs.

    Raises:
        ConversionError: missing or unreadable file, or an unrecognized container.
        UnsafeCheckpointError: the pickle needs objects beyond plain weights.
        OptimizerStateError: optimizer state is present.
    """
    source = Path(path)
    try:
        # A regular file only (a FIFO would hang), its size checked against the budget.
        data = read_regular_file(source, "source checkpoint")
    except ValueError as exc:
        raise ConversionError(str(exc)) from None
    if data.startswith(_ZIP_MAGIC):
        _check_zip(source, data)
    else:
        _check_prezip(source, data)
    try:
        with warnings.catch_warnings():  # e.g. pickle-protocol notes: keep stderr to one line
            warnings.simplefilter("ignore")
            obj = torch.load(io.BytesIO(data), map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as exc:
        detail = _unpickler_detail(exc)
        if "Unsupported global" in detail:
            raise UnsafeCheckpointError(
                f"refusing {str(source)!r}: unpickling it would call code beyond plain "
                f"weights ({detail}); only weights-only checkpoints are read"
            ) from exc
        raise ConversionError(
            f"cannot load {str(source)!r} as a weights-only torch checkpoint: {detail}"
        ) from exc
    except Exception as exc:  # torch raises several types for corrupt archives
        raise ConversionError(
            f"cannot load {str(source)!r} as a torch checkpoint: {_unpickler_detail(exc)}"
        ) from exc
    state, container, ignored = extract_model_state(obj)
    return LegacyCheckpoint(state, container, ignored, hashlib.sha256(data).hexdigest())


def load_state_dict_strict(model: nn.Module, state: Mapping[str, torch.Tensor]) -> None:
    """Loads ``state`` into ``model`` only if keys and shapes match exactly.

    Raises:
        StateDictMismatchError: naming every missing key, unexpected key and shape
            mismatch (nothing is loaded then).
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    if not isinstance(state, Mapping):
        raise TypeError(f"state must be a mapping of names to tensors, got {type(state).__name__}")
    bad = [k for k, v in state.items() if not isinstance(v, torch.Tensor)]
    if bad:
        raise TypeError(f"state must hold only tensors; not tensors: {bad}")
    expected = model.state_dict()
    missing = [k for k in expected if k not in state]
    unexpected = [k for k in state if k not in expected]
    mismatched = [
        (k, tuple(state[k].shape), tuple(v.shape))
        for k, v in expected.items()
        if k in state and tuple(state[k].shape) != tuple(v.shape)
    ]
    if missing or unexpected or mismatched:
        raise StateDictMismatchError(missing, unexpected, mismatched)
    model.load_state_dict(dict(state), strict=True)


def load_converted(model: nn.Module, path: str | Path) -> None:
    """Loads a converted ``.safetensors`` file into ``model`` strictly (see above).

    Raises:
        ConversionError: the file is missing, not a regular file, larger than the memory
            budget or not safetensors.
        StateDictMismatchError: keys or shapes differ from the model's.
    """
    from safetensors.torch import load

    source = Path(path)
    if not source.is_file():
        raise ConversionError(f"converted weights {str(source)!r} do not exist or are not a file")
    try:
        # Read whole into memory: its size checked against the budget first, as every
        # other file the tools read (safetensors' own reader checked nothing).
        data = read_regular_file(source, "converted weights")
    except ValueError as exc:
        raise ConversionError(str(exc)) from None
    try:
        state = load(data)
    except Exception as exc:  # safetensors raises its own error type for a bad header
        raise ConversionError(
            f"cannot read {str(source)!r} as safetensors: {type(exc).__name__}: {exc}"
        ) from exc
    load_state_dict_strict(model, state)
