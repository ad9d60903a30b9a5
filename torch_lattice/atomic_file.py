"""Atomic file output: write a temporary file beside the target, then rename it.

Every file the project writes atomically (converted checkpoints and their manifests,
the example's ``model.safetensors``, benchmark reports) goes through this module, so
each gets the same guarantees:

- a reader sees either the old file or the complete new one, never a partial file
  (the temporary file is flushed to disk before ``os.replace``);
- a failure at any point leaves no temporary file behind;
- the file gets the mode a plain ``open(path, "w")`` would give it, ``0o666 & ~umask``.
  ``tempfile.mkstemp`` creates ``0o600`` whatever the umask, so the temporary file is
  chmod-ed before it is renamed into place.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import functools
import hashlib
import os
import re
import stat
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

from torch_lattice.regular_file import describe_file_type

__all__ = [
    "NAME_MAX",
    "OWNER_FIELD_BYTES",
    "atomic_write",
    "clean_stale_siblings",
    "current_umask",
    "exchange_paths",
    "fit_name",
    "new_file_mode",
    "owner_field",
    "owner_pattern",
    "owner_tag",
    "pid_alive",
    "refuse_non_regular",
    "sibling_name",
    "write_beside",
]

# The longest file name (one path component, in bytes) of Linux and macOS file systems.
NAME_MAX = 255
# The random part tempfile.mkstemp adds to a name.
_MKSTEMP_CHARS = 8

_PROC_STATUS = "/proc/self/status"


def _umask_from_proc() -> int | None:
    """The ``Umask:`` line of ``/proc/self/status`` (Linux 4.7+), else ``None``."""
    try:
        with open(_PROC_STATUS, encoding="ascii", errors="replace") as status:
            for line in status:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        return None
    return None


def current_umask() -> int:
    """The process umask, read without changing it where the platform allows.

    ``os.umask`` can only be read by setting it, which is process-global: a thread
    creating a file between the two calls would use umask 0. So Linux's
    ``/proc/self/status`` is read first, and the set-and-restore only runs where
    that is unavailable.
    """
    mask = _umask_from_proc()
    if mask is not None:
        return mask
    mask = os.umask(0o077)  # the most restrictive value while it is briefly changed
    os.umask(mask)
    return mask


def new_file_mode() -> int:
    """``0o666 & ~umask``: the mode ``open(path, "w")`` gives a new file."""
    return 0o666 & ~current_umask()


def fit_name(name: str, room: int) -> str:
    """The longest start of ``name`` that leaves ``room`` bytes of a :data:`NAME_MAX`
    file name free (whole characters only).

    A hidden name built from an output's (``.<name>.<random>.tmp``) is longer than the
    name itself: for a name near the limit it could not be created, and a file or
    folder the user may make could not be written.
    """
    while name and len(os.fsencode(name)) + room > NAME_MAX:
        name = name[:-1]
    return name


def _boot_id() -> bytes | None:
    """This boot of this machine: Linux's ``boot_id``, macOS's ``kern.bootsessionuuid``."""
    try:
        with open("/proc/sys/kernel/random/boot_id", "rb") as f:
            return f.read(64).strip() or None
    except OSError:
        pass
    if sys.platform != "darwin":
        return None
    try:
        buf = ctypes.create_string_buffer(64)
        size = ctypes.c_size_t(len(buf))
        found = ctypes.CDLL(None).sysctlbyname(b"kern.bootsessionuuid", buf,
                                               ctypes.byref(size), None, ctypes.c_size_t(0))
    except (OSError, AttributeError):
        return None
    return (buf.value or None) if found == 0 else None


@functools.cache
def owner_tag() -> str | None:
    """8 hex digits naming this boot of this machine and this process's pid namespace (a
    hash of the boot id and, on Linux, the namespace's inode), or None where the system
    does not say (then nothing is ever cleaned). Hidden temporary names carry it before
    the pid, so a later write removes only what a process of the same machine, boot and
    namespace left: a pid means nothing on another host sharing the folder (NFS), in
    another container, or after a reboot."""
    boot = _boot_id()
    if boot is None:
        return None
    try:
        namespace = os.stat("/proc/self/ns/pid").st_ino
    except OSError:
        if sys.platform.startswith("linux"):  # no way to tell containers apart
            return None
        namespace = 0  # macOS: one pid space per boot
    return hashlib.sha256(boot + b":" + str(namespace).encode()).hexdigest()[:8]


def owner_field(pid: int | None = None) -> str:
    """The ``<tag>-<pid>`` field of a hidden temporary name (this process's pid unless
    given; the tag 8 zeros where :func:`owner_tag` is None)."""
    return f"{owner_tag() or '0' * 8}-{os.getpid() if pid is None else pid}"


# The owner field of a hidden name: 8 hex digits, "-", a pid of at most 10 digits.
OWNER_FIELD_BYTES = 19
# The owner field and the "." after it.
_PID_ROOM = OWNER_FIELD_BYTES + 1


def owner_pattern() -> str | None:
    """The regular expression of :func:`owner_field` with this process's
    :func:`owner_tag`, the pid its group (ASCII, no leading zero, at most 10 digits: a
    longer one is no pid, and ``os.kill`` would raise OverflowError on it); None where the
    system gives no tag, so that nothing is cleaned."""
    owner = owner_tag()
    return None if owner is None else rf"{owner}-([1-9][0-9]{{0,9}})"


def _sibling_parts(final: Path, tag: str, random_chars: int) -> tuple[str, str]:
    """The cut stem and the suffix of :func:`sibling_name` (see there)."""
    suffix = f".{tag}{final.suffix}"
    if len(os.fsencode(suffix)) + random_chars + 2 + _PID_ROOM > NAME_MAX:
        suffix = f".{tag}"
    stem = fit_name(final.stem, len(os.fsencode(suffix)) + random_chars + 2 + _PID_ROOM)
    return stem, suffix


def sibling_name(final: Path, tag: str, random_chars: int) -> tuple[str, str]:
    """``(prefix, suffix)`` of a hidden name beside ``final``: ``.<stem>.<tag>-<pid>.`` and
    ``.<tag><suffix>``, cut so that with ``random_chars`` between them the name fits
    :data:`NAME_MAX` (``final``'s suffix is kept where it fits: writers such as
    matplotlib choose the format from it). The owner field (:func:`owner_field`) lets a
    later write to ``final`` on this machine remove what a killed process left
    (:func:`clean_stale_siblings`)."""
    stem, suffix = _sibling_parts(final, tag, random_chars)
    return f".{stem}.{owner_field()}.", suffix


def pid_alive(pid: int) -> bool:
    """Whether process ``pid`` may be alive: only a sure "no such process" says not."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (OSError, OverflowError):  # someone else's (EPERM), or unknown: keep its files
        return True
    return True


# The random parts between the pid and the tag: tempfile.mkstemp's 8 characters, or
# secrets.token_hex(8)'s 16 hex digits.
_RANDOM = r"(?:[a-z0-9_]{8}|[0-9a-f]{16})"


def clean_stale_siblings(path: str | os.PathLike[str], tags: tuple[str, ...] = ("tmp",)
                         ) -> None:
    """Removes the hidden files :func:`sibling_name` named beside ``path`` (with one of
    ``tags``) for a process of this machine, boot and pid namespace that is gone: what a
    write killed outright (SIGKILL) left, partial or whole.

    Only regular files (never links or folders) named exactly so, with this process's
    :func:`owner_tag` and the pid of no live process, are removed; anything else (another
    host's or container's temporaries in a shared folder among them), or any error, is
    left alone.
    """
    owner = owner_pattern()
    if owner is None:
        return
    final = Path(path)
    patterns = []
    for tag in tags:
        stem, suffix = _sibling_parts(final, tag, 16)
        short_stem, short_suffix = _sibling_parts(final, tag, _MKSTEMP_CHARS)
        for s, x in ((stem, suffix), (short_stem, short_suffix)):
            patterns.append(re.compile(rf"\.{re.escape(s)}\.{owner}\.{_RANDOM}"
                                       rf"{re.escape(x)}"))
    try:
        names = os.listdir(final.parent)
    except OSError:
        return
    for name in names:
        match = next((m for m in (p.fullmatch(name) for p in patterns) if m), None)
        if match is None or pid_alive(int(match.group(1))):
            continue
        candidate = final.parent / name
        with contextlib.suppress(OSError):
            if stat.S_ISREG(os.lstat(candidate).st_mode):
                os.unlink(candidate)


def write_beside(path: str | os.PathLike[str], write: Callable[[Path], None]) -> Path:
    """Writes a complete temporary file in ``path``'s folder, ready to rename over it.

    The temporary name keeps ``path``'s suffix (writers such as matplotlib choose the
    format from it) and starts with a dot; its stem is cut where the name would pass
    :data:`NAME_MAX` (:func:`sibling_name`). The file is flushed to disk and given
    :func:`new_file_mode` before it is returned. Use this directly only when several
    files must be renamed together; otherwise call :func:`atomic_write`.

    Args:
        path: the final file; its folder must exist.
        write: called with the temporary path; writes the whole content there.

    Returns:
        The temporary file. The caller renames it with ``os.replace`` or removes it.

    Raises:
        Whatever ``write`` or the file system raises; the temporary file is removed.
    """
    final = Path(path)
    prefix, suffix = sibling_name(final, "tmp", _MKSTEMP_CHARS)
    fd, name = tempfile.mkstemp(prefix=prefix, suffix=suffix, dir=final.parent)
    os.close(fd)
    temp = Path(name)
    try:
        write(temp)
        with open(temp, "rb") as written:  # on disk before a rename makes it visible
            os.fsync(written.fileno())
        os.chmod(temp, new_file_mode())
    except BaseException:
        temp.unlink(missing_ok=True)
        raise
    return temp


def refuse_non_regular(path: str | os.PathLike[str]) -> None:
    """Raises ``FileExistsError`` when ``path`` exists and is not a regular file.

    ``os.replace`` puts a new file in place of whatever the name holds: a FIFO, a device
    node (``--out /dev/null`` run as root would replace the system's ``/dev/null``), a
    socket or a symbolic link (the link, not its target). Only regular files are
    replaced, as ``save_tuning``, the converter and the artifact exporter do.
    """
    try:
        mode = os.lstat(path).st_mode
    except FileNotFoundError:
        return
    if not stat.S_ISREG(mode):
        kind = describe_file_type(mode)
        raise FileExistsError(errno.EEXIST, f"{os.fspath(path)!r} exists and is {kind}; "
                              "only a regular file is replaced (name a new file or a "
                              "regular one)", os.fspath(path))


def atomic_write(path: str | os.PathLike[str], write: Callable[[Path], None]) -> None:
    """Writes ``path`` atomically with :func:`write_beside` and ``os.replace``.

    An existing regular file at ``path`` is replaced; anything else there (a folder, a
    FIFO, a device node such as ``/dev/null``, a socket, a symbolic link) raises
    ``FileExistsError`` before ``write`` runs and is left as it is. On any failure
    ``path`` is unchanged and no temporary file remains.

    Args:
        path: the file to write; its folder must exist.
        write: called with a temporary path; writes the whole content there.
    """
    refuse_non_regular(path)
    clean_stale_siblings(path)
    temp = write_beside(path, write)
    try:
        refuse_non_regular(path)  # again: something may have appeared while writing
        os.replace(temp, path)
    except BaseException:
        temp.unlink(missing_ok=True)
        raise


# renameat2(2) arguments (linux/fcntl.h, linux/fs.h).
_AT_FDCWD = -100
_RENAME_EXCHANGE = 2
# errno values meaning "this system or file system cannot exchange": use the fallback.
_NO_EXCHANGE = {errno.EINVAL, errno.ENOSYS, errno.ENOTSUP, errno.EOPNOTSUPP, errno.EXDEV}


def exchange_paths(a: str | os.PathLike[str], b: str | os.PathLike[str]) -> bool:
    """Swaps two existing paths in one atomic step, where the system can.

    Linux's ``renameat2(..., RENAME_EXCHANGE)`` (kernel 3.15+, glibc 2.28+, most local
    file systems) swaps two directory entries at once: a reader sees either the old
    or the new one at each path, never neither. ``os.rename`` of a directory onto an
    existing non-empty one fails, and two renames leave a moment with nothing there.

    Returns:
        True when the paths were swapped; False when the system or the file system
        offers no exchange (not Linux, an older libc or kernel, EINVAL from the file
        system): the caller then uses its documented fallback. Nothing changed then.

    Raises:
        OSError: the exchange was possible but failed (a missing path, permissions).
    """
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        renameat2 = libc.renameat2
    except (OSError, AttributeError):  # no renameat2 in this libc (glibc < 2.28, musl)
        return False
    renameat2.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p,
                          ctypes.c_uint]
    renameat2.restype = ctypes.c_int
    rc = renameat2(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b), _RENAME_EXCHANGE)
    if rc == 0:
        return True
    err = ctypes.get_errno()
    if err in _NO_EXCHANGE:
        return False
    raise OSError(err, os.strerror(err), os.fspath(a), None, os.fspath(b))
