"""Append-only trace files for a running job: JSON lines, gzip, in segments; no pandas or pyarrow.

A :class:`SegmentWriter` appends rows (trace format v1 objects) to
``<directory>/<stem>.<n>.jsonl.gz``. Each append is one complete gzip member
written with one ``write`` call, so a file holds whole members plus, after a
crash mid-write, at most one cut member at its end, which readers drop
(:func:`trainhealth._internal.traces.io.read_trace_file`). A segment closes once it
holds ``segment_bytes``; the next append opens ``<n+1>``.

Files of the same stem left by an earlier process (a restarted job) are moved
into ``previous-<k>/`` on the first append, so the directory holds one run and
the earlier run's evidence is kept. Files are opened without following links:
a link planted at a segment's name is skipped, never written through.

>>> import gzip, json, tempfile, pathlib
>>> directory = pathlib.Path(tempfile.mkdtemp())
>>> writer = SegmentWriter(directory, "rank-0")
>>> writer.append([{"rank": 0, "step": 0, "op": "step", "start": 1.0, "duration": 0.5}]).name
'rank-0.0000.jsonl.gz'
>>> _ = writer.append([{"rank": 0, "step": 1, "op": "step", "start": 1.5, "duration": 0.5}])
>>> [json.loads(line)["step"] for line in gzip.open(directory / "rank-0.0000.jsonl.gz", "rt")]
[0, 1]
"""

from __future__ import annotations

import errno
import gzip
import json
import os
import re
import stat
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

__all__ = ["SEGMENT_SUFFIX", "SegmentWriter"]

SEGMENT_SUFFIX = ".jsonl.gz"
# O_NONBLOCK: a FIFO planted at the name fails at once (ENXIO) instead of blocking the writer
_OPEN_FLAGS = (
    os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NONBLOCK | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)
)


class SegmentWriter:
    """Appends rows to the segments ``<stem>.<n>.jsonl.gz`` of ``directory``; see the module docstring."""

    def __init__(
        self,
        directory: str | os.PathLike[str],
        stem: str,
        *,
        segment_bytes: int = 64 << 20,
        compress_level: int = 6,
        durable: bool = True,
    ) -> None:
        if segment_bytes < 1:
            raise ValueError("segment_bytes must be >= 1")
        self.directory = Path(directory)
        self.stem = stem
        self.segment_bytes = segment_bytes
        self.compress_level = compress_level
        self.durable = durable  # fsync after each append: on disk, not only in the page cache
        self._pattern = re.compile(re.escape(stem) + r"\.(\d+)" + re.escape(SEGMENT_SUFFIX) + "$")
        self._index: int | None = None  # the open segment; None until the first append
        self._size = 0
        self.rows_written = 0

    @property
    def path(self) -> Path | None:
        """The segment the next append goes to (None before the first append)."""
        return None if self._index is None else self._segment(self._index)

    def _segment(self, index: int) -> Path:
        return self.directory / f"{self.stem}.{index:04d}{SEGMENT_SUFFIX}"

    def append(self, rows: Iterable[Mapping[str, Any]]) -> Path | None:
        """Append ``rows`` as one gzip member; the segment written, or None when there were no rows."""
        text = "".join(json.dumps(row, separators=(",", ":")) + "\n" for row in rows)
        if not text:
            return None
        data = gzip.compress(text.encode("utf-8"), compresslevel=self.compress_level)
        if self._index is None:
            self.directory.mkdir(parents=True, exist_ok=True)
            self._move_earlier_run_aside()
            self._index = 0
        elif self._size >= self.segment_bytes:
            self._index += 1
            self._size = 0
        descriptor = self._open()
        try:
            written = 0
            while written < len(data):
                written += os.write(descriptor, data[written:])
            if self.durable:
                os.fsync(descriptor)
        finally:
            os.close(descriptor)
        self._size += len(data)
        self.rows_written += text.count("\n")
        return self.path

    def _open(self) -> int:
        """The open segment's descriptor; a segment that is a link or not a regular file is skipped."""
        assert self._index is not None
        for _ in range(100):
            path = self._segment(self._index)
            try:
                descriptor = os.open(path, _OPEN_FLAGS, 0o644)
            except OSError as exc:
                if exc.errno not in (errno.ELOOP, errno.EISDIR, errno.ENXIO):
                    raise
            else:
                status = os.fstat(descriptor)
                if stat.S_ISREG(status.st_mode):
                    self._size = status.st_size
                    return descriptor
                os.close(descriptor)  # a FIFO or device planted at the name
            self._index += 1
            self._size = 0
        raise FileExistsError(f"{self.directory}: no usable segment name for {self.stem}")

    def _move_earlier_run_aside(self) -> None:
        """Move this stem's segments from an earlier process into ``previous-<k>/`` (the first free k)."""
        earlier = [
            path
            for path in self.directory.iterdir()
            if self._pattern.match(path.name) and path.is_file() and not path.is_symlink()
        ]
        if not earlier:
            return
        k = 1
        while any((self.directory / f"previous-{k}" / path.name).exists() for path in earlier):
            k += 1
        target = self.directory / f"previous-{k}"
        target.mkdir(exist_ok=True)
        for path in earlier:
            os.replace(path, target / path.name)
