"""Choosing a layer's dataflow by measurement (autotuning), as the peers' autotuners do.

Where a call's configuration asks for it (``ConvConfig.autotune``; the CUDA default), the
first call of each *layer shape* times the candidate dataflows on its own inputs and
every later call of that shape runs the fastest. A shape is a :class:`TuningKey`: the
device model, the feature dtype, ``C_in``, ``C_out``, the kernel volume, whether the
relation runs transposed, the input's size class (rows within a factor of two share a
choice) and whether the call trains (autograd on and the features or the weight
requiring a gradient). Choices live for the process; :func:`save_tuning` and
:func:`load_tuning` keep them in a file, opt-in. Dataflows compute the same relation, so
a choice changes speed and floating-point ordering only.

Timing runs what the call will run: for an inference call a forward pass without
autograd, for a training call a forward and its backward (on detached copies of the
inputs, so the caller's graph and ``.grad`` fields are untouched), since the backward
runs the dataflow its forward ran and the dataflows' backward passes differ more than
their forwards. One warm-up and the best of ``REPEATS`` per candidate, with the device
synchronised around each. A candidate that raises (out of memory, say) is left out; when
all do, the call keeps its configured dataflow. Nothing is timed while torch compiles or
a CUDA graph is being captured: such a call uses a choice made earlier or the configured
dataflow.
"""

from __future__ import annotations

import functools
import json
import logging
import math
import os
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, fields
from pathlib import Path

import torch

from torch_lattice.atomic_file import NAME_MAX, atomic_write
from torch_lattice.nn.functional.dataflow import Dataflow
from torch_lattice.regular_file import (
    describe_file_type,
    names_a_folder,
    nul_byte_error,
    parse_json,
    read_regular_file,
)

__all__ = [
    "REPEATS",
    "TuningKey",
    "clear_tuning",
    "is_training",
    "load_tuning",
    "save_tuning",
    "tuned_dataflow",
    "tuning_choices",
]

log = logging.getLogger("torch_lattice.tuning")

REPEATS = 3
FORMAT = "torch_lattice.tuning"
# Version 2 added TuningKey.training; version-1 files load as inference choices.
VERSION = 2
_VERSIONS = (1, 2)
# A tuning file holds one small record per layer shape: a few hundred bytes each.
MAX_FILE_BYTES = 1 << 20
MAX_ENTRIES = 4096
_DTYPES = ("float32", "float16", "bfloat16", "float64")
_INT_MAX = 2**31 - 1


@dataclass(frozen=True)
class TuningKey:
    """The layer shape a choice holds for.

    Raises:
        TypeError: a field of another type.
        ValueError: a field out of its range (the message names it and the rule).
    """

    device: str  # "cpu", or "cuda:" and the device's name (a choice is per GPU model)
    dtype: str  # the feature dtype's name, e.g. "float16"
    c_in: int
    c_out: int
    kernel_volume: int
    size_class: int  # bit length of the input's row count
    transposed: bool
    training: bool = False  # a backward will follow: forward and backward are timed

    def __post_init__(self) -> None:
        for f in fields(self):
            _check_field(f.name, getattr(self, f.name))

    @classmethod
    def of(cls, feats: torch.Tensor, weight: torch.Tensor, transposed: bool) -> TuningKey:
        """The key of a call on ``(N_in, C_in)`` ``feats`` with a ``(K, C_in, C_out)`` weight,
        in the current autograd mode (``is_training``)."""
        k, c_in, c_out = weight.shape
        return cls(_device_kind(feats.device), str(feats.dtype).removeprefix("torch."),
                   int(c_in), int(c_out), int(k), int(feats.shape[0]).bit_length(),
                   bool(transposed), is_training(feats, weight))


def is_training(feats: torch.Tensor, weight: torch.Tensor) -> bool:
    """Whether a call on these tensors, now, will be differentiated: autograd is on and the
    features or the weight require a gradient."""
    return torch.is_grad_enabled() and (feats.requires_grad or weight.requires_grad)


def _device_kind(device: torch.device) -> str:
    if device.type == "cuda":
        return "cuda:" + _cuda_name(device.index if device.index is not None
                                    else torch.cuda.current_device())
    return device.type


@functools.cache
def _cuda_name(index: int) -> str:
    return torch.cuda.get_device_name(index)


# The process's choices (any thread may tune; the first result recorded stays).
_LOCK = threading.Lock()
_CHOICES: dict[TuningKey, Dataflow] = {}


def tuning_choices() -> dict[TuningKey, Dataflow]:
    """A copy of the choices made (or loaded) in this process."""
    with _LOCK:
        return dict(_CHOICES)


def clear_tuning() -> None:
    """Forgets every choice: the next call of each layer shape times its candidates again."""
    with _LOCK:
        _CHOICES.clear()


def _can_time(device: torch.device) -> bool:
    if torch.compiler.is_compiling():
        return False
    return not (device.type == "cuda" and torch.cuda.is_current_stream_capturing())


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _seconds(run: Callable[[], object], device: torch.device) -> float:
    """Best of ``REPEATS`` timed calls after one warm-up."""
    run()
    best = math.inf
    for _ in range(REPEATS):
        _sync(device)
        start = time.perf_counter()
        run()
        _sync(device)
        best = min(best, time.perf_counter() - start)
    return best


def tuned_dataflow(key: TuningKey, device: torch.device,
                   candidates: Mapping[Dataflow, Callable[[], object]], fallback: Dataflow
                   ) -> Dataflow:
    """The dataflow for ``key``: its recorded choice, else the fastest of ``candidates``
    (each what this call runs with that dataflow: its forward, and for a training key its
    backward too, each candidate in charge of its own autograd mode), recorded;
    ``fallback`` when none can be timed."""
    with _LOCK:
        made = _CHOICES.get(key)
    if made is not None:
        return made
    if not _can_time(device):
        return fallback
    times: dict[Dataflow, float] = {}
    for dataflow, run in candidates.items():
        try:
            times[dataflow] = _seconds(run, device)
        except Exception as exc:  # a candidate that cannot run is not chosen
            log.info("autotune %s: %s left out (%s)", key, dataflow.value, exc)
    if not times:
        return fallback
    best = min(times, key=times.__getitem__)
    log.info("autotune %s: %s (%s)", key, best.value,
             ", ".join(f"{d.value} {t * 1e3:.3f} ms" for d, t in times.items()))
    with _LOCK:
        return _CHOICES.setdefault(key, best)


def save_tuning(path: str | os.PathLike[str]) -> int:
    """Writes this process's choices to ``path`` (JSON, atomically); returns how many.

    Raises:
        TypeError: ``path`` is not a str or os.PathLike.
        ValueError: ``path`` is a directory (or ends in a separator), a symbolic link or
            another non-regular file (a FIFO, a device), its folder does not exist, its
            file name is over 255 bytes, or it holds a NUL byte.
    """
    if not isinstance(path, (str, os.PathLike)):
        raise TypeError(f"save_tuning: path must be a str or os.PathLike, got "
                        f"{type(path).__name__}")
    if (nul := nul_byte_error(path, "save_tuning: path")) is not None:
        raise ValueError(nul)
    if names_a_folder(path):
        raise ValueError(f"save_tuning: path {str(path)!r} ends in a separator, so it names "
                         "a folder; name a file")
    target = Path(path)
    if (name_bytes := len(os.fsencode(target.name))) > NAME_MAX:
        raise ValueError(f"save_tuning: the file name of path {str(path)[:80]!r}... is "
                         f"{name_bytes} bytes, over the {NAME_MAX}-byte limit of file names")
    # The rename would replace a link (not write through it) or a device node: refused.
    if target.is_symlink():
        raise ValueError(f"save_tuning: path {str(path)!r} is a symbolic link; name the "
                         "file itself")
    if target.is_dir():
        raise ValueError(f"save_tuning: path {str(path)!r} is a directory; name a file")
    if target.exists() and not target.is_file():
        raise ValueError(f"save_tuning: path {str(path)!r} is "
                         f"{describe_file_type(target.stat().st_mode)}; only a regular file "
                         "is replaced")
    if not target.parent.is_dir():
        raise ValueError(f"save_tuning: the folder of path {str(path)!r} does not exist")
    choices = tuning_choices()
    doc = {
        "format": FORMAT,
        "version": VERSION,
        "choices": [{**asdict(k), "dataflow": d.value} for k, d in sorted(
            choices.items(), key=lambda kv: tuple(asdict(kv[0]).values()))],
    }
    text = json.dumps(doc, indent=1) + "\n"
    atomic_write(path, lambda temp: Path(temp).write_text(text))
    return len(choices)


def _check_field(name: str, value: object) -> None:
    """The rule of each :class:`TuningKey` field."""
    if name == "device":
        if not isinstance(value, str):
            raise TypeError(f"device must be a str, got {type(value).__name__}")
        if not 0 < len(value) <= 256:
            raise ValueError(f"device must be a non-empty string of at most 256 characters, "
                             f"got {value!r}"[:300])
    elif name == "dtype":
        if value not in _DTYPES:
            raise ValueError(f"dtype must be one of {list(_DTYPES)}, got {value!r}"[:300])
    elif name in ("transposed", "training"):
        if not isinstance(value, bool):
            raise TypeError(f"{name} must be true or false (a bool), got {value!r}"[:300])
    else:
        low, high = (0, 63) if name == "size_class" else (1, _INT_MAX)
        if not isinstance(value, int) or isinstance(value, bool):
            raise TypeError(f"{name} must be an int in [{low}, {high}], got {value!r}"[:300])
        if not low <= value <= high:
            raise ValueError(f"{name} must be an int in [{low}, {high}], got {value!r}")


def _entry(i: int, raw: object, version: int) -> tuple[TuningKey, Dataflow]:
    where = f"choices[{i}]"
    names = [f.name for f in fields(TuningKey)
             if version > 1 or f.name != "training"] + ["dataflow"]
    if not isinstance(raw, dict) or sorted(raw) != sorted(names):
        raise ValueError(f"{where} must be an object with exactly the keys {names}")
    try:
        key = TuningKey(**{n: raw[n] for n in names[:-1]})
    except (TypeError, ValueError) as exc:
        raise ValueError(f"{where}.{exc}") from None
    try:
        dataflow = Dataflow(raw["dataflow"])
    except ValueError:
        raise ValueError(f"{where}.dataflow must be one of {[d.value for d in Dataflow]}, "
                         f"got {raw['dataflow']!r}"[:300]) from None
    return key, dataflow


def load_tuning(path: str | os.PathLike[str]) -> int:
    """Adds the choices saved in ``path`` (:func:`save_tuning`) to this process's, over
    any made for the same keys; returns how many. Nothing is added unless the whole file
    is valid.

    Raises:
        ValueError: ``path`` is not a regular file of at most 1 MiB (a link is followed
            to one), not UTF-8 JSON (nested too deeply, or an object repeating a key,
            included), or not a tuning file of version 1 or 2 (the message names the
            file, the entry and the rule; version 1, without ``training``, holds
            inference choices), or two entries are for the same layer.
    """
    data = read_regular_file(path, "tuning file", max_bytes=MAX_FILE_BYTES)
    name = f"tuning file {str(path)!r}"
    doc = parse_json(data, name, "is not JSON")
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        raise ValueError(f"{name}: \"format\" must be {FORMAT!r}")
    version = doc.get("version")
    if type(version) is not int or version not in _VERSIONS:
        raise ValueError(f"{name}: \"version\" must be 1 or 2, got {version!r}"[:300])
    raw = doc.get("choices")
    if not isinstance(raw, list) or len(raw) > MAX_ENTRIES:
        raise ValueError(f"{name}: \"choices\" must be a list of at most {MAX_ENTRIES} entries")
    entries: dict[TuningKey, Dataflow] = {}
    first: dict[TuningKey, int] = {}
    try:
        for i, e in enumerate(raw):
            key, choice = _entry(i, e, version)
            if key in entries:  # which one wins would be the file's order, not a rule
                raise ValueError(f"choices[{i}] repeats the layer of choices[{first[key]}]")
            entries[key], first[key] = choice, i
    except ValueError as exc:
        raise ValueError(f"{name}: {exc}") from None
    with _LOCK:
        _CHOICES.update(entries)
    return len(entries)
