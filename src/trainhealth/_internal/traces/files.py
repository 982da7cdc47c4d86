"""Opening the files a trace reader is given: only regular files, within a size, errors naming the path.

A named pipe given as a trace would block a reader forever, a directory or a link loop would
surface as an ``OSError`` from deep inside pandas; :func:`regular_file` refuses them first, as a
:class:`~trainhealth._internal.traces.ops.TraceError` that names the path.

>>> import tempfile, pathlib
>>> folder = pathlib.Path(tempfile.mkdtemp())
>>> regular_file(folder)
Traceback (most recent call last):
...
trainhealth._internal.traces.ops.TraceError: ...: not a regular file (a directory)
"""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path

from trainhealth._internal.traces.ops import TraceError

__all__ = ["kind_of", "read_bytes", "regular_file"]

_KINDS = (
    (stat.S_ISDIR, "a directory"),
    (stat.S_ISFIFO, "a named pipe"),
    (stat.S_ISSOCK, "a socket"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
)


def _problem(exc: OSError) -> str:
    if isinstance(exc, FileNotFoundError):
        return "no such file or directory"
    if isinstance(exc, NotADirectoryError):
        return "a part of the path is not a directory"
    if exc.errno == errno.ELOOP:
        return "too many levels of symbolic links (a link loop?)"
    return f"cannot read it: {exc.strerror or exc}"


def kind_of(path: Path) -> str | None:
    """``"file"``, ``"directory"``, or None when nothing is there; :class:`TraceError` when the path itself is
    unusable (a name too long, a link loop, a file where a directory should be)."""
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        return None
    except OSError as exc:
        if isinstance(exc, NotADirectoryError):
            return None
        raise TraceError(str(path), _problem(exc)) from None
    return "directory" if stat.S_ISDIR(mode) else "file" if stat.S_ISREG(mode) else "other"


def regular_file(path: Path, *, max_bytes: int | None = None) -> int:
    """The size of ``path``, a regular file (a link to one is fine); :class:`TraceError` otherwise."""
    try:
        found = os.stat(path)
    except OSError as exc:
        raise TraceError(str(path), _problem(exc)) from None
    if not stat.S_ISREG(found.st_mode):
        kind = next((name for test, name in _KINDS if test(found.st_mode)), "not a file")
        raise TraceError(str(path), f"not a regular file ({kind})")
    if max_bytes is not None and found.st_size > max_bytes:
        raise TraceError(
            str(path), f"{found.st_size} bytes: larger than the {max_bytes >> 20} MiB such a file may have"
        )
    return found.st_size


def read_bytes(path: Path, *, max_bytes: int | None = None) -> bytes:
    """The contents of the regular file ``path`` (see :func:`regular_file`)."""
    regular_file(path, max_bytes=max_bytes)
    try:
        return path.read_bytes()
    except OSError as exc:
        raise TraceError(str(path), _problem(exc)) from None
