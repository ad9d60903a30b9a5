"""The storage sizes a pre-zip torch checkpoint claims, read without allocating them.

torch < 1.6 wrote checkpoints as four pickles in a row (a magic number, a protocol
version, system information, the object) followed by each storage's bytes. Its
reader allocates every storage at the size the object's pickle names *before* it
reads the bytes, so a 370-byte file naming a storage of 2^33 floats makes torch ask
for 32 GiB. :func:`claimed_storage_bytes` walks the same pickles with stand-ins for
every global they name (nothing is imported or called) and adds up the storages'
sizes, so the caller can refuse a claim the file cannot hold before torch reads it.
"""

from __future__ import annotations

import io
import pickle
from typing import Any, ClassVar

__all__ = ["claimed_storage_bytes"]

# Bytes per element of each legacy storage class (torch's dtypes); a class not
# listed counts one byte, the least any storage takes.
_ELEMENT_BYTES = {
    "DoubleStorage": 8, "FloatStorage": 4, "HalfStorage": 2, "BFloat16Storage": 2,
    "LongStorage": 8, "IntStorage": 4, "ShortStorage": 2, "CharStorage": 1,
    "ByteStorage": 1, "BoolStorage": 1, "ComplexDoubleStorage": 16,
    "ComplexFloatStorage": 8, "QInt32Storage": 4, "QInt8Storage": 1, "QUInt8Storage": 1,
}


class _Stand:
    """What every global and every call of one becomes: accepts whatever the pickle
    does to it (calls, item and attribute state, appends) and keeps nothing."""

    def __init__(self, name: str = "") -> None:
        self.name = name

    def __call__(self, *args: Any, **kwargs: Any) -> _Stand:
        return _Stand()

    def __setitem__(self, key: Any, value: Any) -> None:
        pass

    def __setstate__(self, state: Any) -> None:
        pass

    def append(self, value: Any) -> None:
        pass

    def extend(self, values: Any) -> None:
        pass


class _Scan(pickle._Unpickler):  # type: ignore[name-defined]
    """Unpickles with stand-ins, recording each storage's (key, bytes) it names.

    The pure-Python unpickler: its memo is a dict, where the C one grows an array to the
    largest index a LONG_BINPUT names (a few bytes asking for gigabytes)."""

    def __init__(self, stream: io.BytesIO, storages: dict[Any, int]) -> None:
        # latin1 reads any Python 2 byte string (torch's own reader decodes them too).
        super().__init__(stream, encoding="latin1")
        self.storages = storages

    def find_class(self, module: str, name: str) -> Any:
        return _Stand(str(name))

    def _refuse_bytearray8(self) -> None:
        # BYTEARRAY8 (protocol 5) allocates the length it declares before reading the
        # bytes; torch's pre-zip files are protocol 2 and never hold one.
        raise pickle.UnpicklingError("a protocol-5 bytearray has no place in a pre-zip "
                                     "checkpoint")

    dispatch: ClassVar[dict[int, Any]] = dict(pickle._Unpickler.dispatch)  # type: ignore[attr-defined]
    dispatch[pickle.BYTEARRAY8[0]] = _refuse_bytearray8

    def persistent_load(self, pid: Any) -> Any:
        if isinstance(pid, tuple) and len(pid) == 6 and pid[0] in ("storage", b"storage"):
            kind, key, numel = pid[1], pid[2], pid[4]
            if isinstance(numel, bool) or not isinstance(numel, int) or numel < 0:
                raise pickle.UnpicklingError(f"a storage's element count is {numel!r}")
            size = _ELEMENT_BYTES.get(kind.name if isinstance(kind, _Stand) else "", 1)
            try:
                hash(key)
            except TypeError:
                key = repr(key)
            # torch allocates a root storage where its key first appears and reuses it
            # after, whatever later mentions claim: the first claim is the one to count.
            self.storages.setdefault(key, numel * size)
        return _Stand()


def claimed_storage_bytes(data: bytes) -> int:
    """The bytes of all storages the pre-zip checkpoint ``data`` names (each root
    storage once).

    Raises:
        pickle.UnpicklingError, EOFError, ValueError, ...: ``data`` is not such a
            checkpoint (whatever :mod:`pickle` raises on it).
    """
    stream = io.BytesIO(data)
    for _ in range(3):  # magic number, protocol version, system information
        _Scan(stream, {}).load()
    storages: dict[Any, int] = {}
    _Scan(stream, storages).load()
    return sum(storages.values())
