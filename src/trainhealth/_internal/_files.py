"""Output paths given on the command line, checked before anything is written, and files written safely.

A command checks every place it will write before it writes anything, so a refusal leaves the
disk as it was: an output directory is new (its parent exists) or an existing directory (empty
where the command asks for a fresh one), never a symbolic link or a file; an output file is not
a link, a directory, or in a missing directory. :func:`write_text` writes through a temporary
file created exclusively beside the target (``O_EXCL | O_NOFOLLOW``: nothing already at that
name, a planted link included, is followed or reused) and renamed over the name, so a reader
never sees half a file and a link at the name is replaced, not followed.

Problems are :class:`~trainhealth._internal.errors.UsageError` naming the option and the path.

>>> import tempfile
>>> root = Path(tempfile.mkdtemp())
>>> out = output_directory(root / "out", "--out")
>>> write_text(out / "a.txt", "hello\\n"); (out / "a.txt").read_text()
'hello\\n'
>>> write_json(out / "b.json", {"b": 1, "a": 0.5}); (out / "b.json").read_text()
'{\\n  "a": 0.5,\\n  "b": 1\\n}\\n'
>>> output_directory(root / "missing" / "out", "--out")
Traceback (most recent call last):
...
trainhealth._internal.errors.UsageError: --out ...: its parent directory ... does not exist
"""

from __future__ import annotations

import json
import os
import secrets
import stat
from collections.abc import Iterable
from pathlib import Path

from trainhealth._internal.errors import UsageError

__all__ = [
    "check_output_directory",
    "check_output_file",
    "check_output_files",
    "exclusive_temporary",
    "output_directory",
    "same_file",
    "write_bytes",
    "write_json",
    "write_text",
]

_EXCLUSIVE = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)


def _lstat(path: Path, option: str) -> os.stat_result | None:
    try:
        return path.lstat()
    except FileNotFoundError:
        return None
    except NotADirectoryError:
        raise UsageError(f"{option} {path}: a part of the path is not a directory") from None
    except OSError as exc:
        raise UsageError(f"{option} {path}: {exc.strerror or exc}") from None


def _check_parent(path: Path, option: str) -> None:
    parent = path.absolute().parent
    try:
        is_directory = stat.S_ISDIR(os.stat(parent).st_mode)
    except (FileNotFoundError, NotADirectoryError):
        raise UsageError(f"{option} {path}: its parent directory {parent} does not exist") from None
    except OSError as exc:
        raise UsageError(f"{option} {path}: {exc.strerror or exc}") from None
    if not is_directory:
        raise UsageError(f"{option} {path}: {parent} is not a directory")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise UsageError(f"{option} {path}: cannot create it in {parent} (permission denied)")


def check_output_directory(path: Path, option: str, *, empty: bool = False) -> None:
    """Refuse ``path`` as an output directory unless it is one, or can be made in an existing directory;
    with ``empty``, an existing one must hold nothing (the command then owns all it finds there)."""
    found = _lstat(path, option)
    if found is None:
        _check_parent(path, option)
        return
    if stat.S_ISLNK(found.st_mode):
        raise UsageError(f"{option} {path}: is a symbolic link; give the directory itself")
    if not stat.S_ISDIR(found.st_mode):
        raise UsageError(f"{option} {path}: exists and is not a directory")
    if not os.access(path, os.W_OK | os.X_OK):
        raise UsageError(f"{option} {path}: not writable (permission denied)")
    if empty:
        try:
            holds = next(os.scandir(path), None) is not None
        except OSError as exc:
            raise UsageError(f"{option} {path}: {exc.strerror or exc}") from None
        if holds:
            raise UsageError(
                f"{option} {path}: already holds files; give a new or empty directory "
                f"(nothing there is overwritten or removed)"
            )


def output_directory(path: Path, option: str, *, empty: bool = False) -> Path:
    """:func:`check_output_directory`, then make the directory if it is new; returns ``path``."""
    check_output_directory(path, option, empty=empty)
    try:
        path.mkdir(exist_ok=True)
    except OSError as exc:
        raise UsageError(f"{option} {path}: cannot create it ({exc.strerror or exc})") from None
    return path


def check_output_file(path: Path, option: str) -> None:
    """Refuse ``path`` as an output file when it is a link or a directory, or its directory is missing."""
    found = _lstat(path, option)
    if found is None:
        _check_parent(path, option)
        return
    if stat.S_ISLNK(found.st_mode):
        raise UsageError(f"{option} {path}: is a symbolic link; refusing to write through it")
    if not stat.S_ISREG(found.st_mode):
        raise UsageError(f"{option} {path}: exists and is not a regular file")
    if not os.access(path.absolute().parent, os.W_OK | os.X_OK):
        raise UsageError(f"{option} {path}: cannot replace it (permission denied)")


def check_output_files(directory: Path, names: Iterable[str], option: str) -> None:
    """:func:`check_output_directory`, then :func:`check_output_file` for each of ``names`` already in it."""
    check_output_directory(directory, option)
    if directory.is_dir():
        for name in names:
            check_output_file(directory / name, option)


def same_file(first: Path, second: Path) -> bool:
    """Whether ``first`` and ``second`` name the same existing file (an output that would overwrite an input)."""
    try:
        return os.path.samefile(first, second)
    except OSError:  # one of them does not exist (yet)
        return False


def write_bytes(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` through an exclusively created temporary file beside it, renamed over it."""
    descriptor, temporary = exclusive_temporary(path)
    try:
        with os.fdopen(descriptor, "wb") as handle:
            handle.write(data)
        os.replace(temporary, path)
    except BaseException:
        temporary.unlink(missing_ok=True)  # ours: created exclusively above
        raise


def write_text(path: Path, text: str) -> None:
    """:func:`write_bytes` of ``text`` in UTF-8."""
    write_bytes(path, text.encode("utf-8"))


def write_json(path: Path, data: object) -> None:
    """:func:`write_text` of ``data`` as JSON: keys sorted, indented by two, a trailing newline. Every JSON
    document trainhealth writes (topologies, ground truth, probe results, state files) is written this way."""
    write_text(path, json.dumps(data, indent=2, sort_keys=True) + "\n")


def exclusive_temporary(path: Path) -> tuple[int, Path]:
    """A new file beside ``path`` (descriptor, name) to write it into, created exclusively without following
    links: whatever already sits at a name (a planted link, a crashed writer's leftover) is never reused."""
    for _ in range(100):
        candidate = path.with_name(f".{path.name}.{secrets.token_hex(6)}.partial")
        try:
            return os.open(candidate, _EXCLUSIVE, 0o666), candidate
        except FileExistsError:
            continue
    raise FileExistsError(f"{path}: no free name for a temporary file beside it")
