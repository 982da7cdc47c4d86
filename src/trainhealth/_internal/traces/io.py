"""Reading and writing trace format v1: Parquet, JSON Lines, CSV, and gzip-compressed text.

The file type follows the extension. Readers take files and directories (every
trace file directly inside, plus its ``topology.json``); every problem is a
:class:`~trainhealth._internal.traces.ops.TraceError` naming file, row and column.

>>> import pandas as pd, tempfile, pathlib
>>> records = pd.DataFrame({"rank": [0, 1], "step": [0, 0], "op": ["all_reduce"] * 2, "group": ["dp0"] * 2,
...                         "seq": [0, 0], "start": [0.0, 0.1], "duration": [0.5, 0.4]})
>>> path = pathlib.Path(tempfile.mkdtemp()) / "trace.jsonl.gz"
>>> write_trace(records, path)
>>> read_trace([path]).records[["rank", "duration"]].to_dict("list")
{'rank': [0, 1], 'duration': [0.5, 0.4]}
"""

from __future__ import annotations

import csv
import gzip
import io
import json
import logging
import os
import zlib
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from trainhealth._internal._files import exclusive_temporary
from trainhealth._internal.traces.files import kind_of, regular_file
from trainhealth._internal.traces.format import COLUMNS, TraceError, shown, validate
from trainhealth._internal.traces.parquet import read_parquet
from trainhealth._internal.traces.topology import TOPOLOGY_FILE, Topology

__all__ = ["TRACE_SUFFIXES", "Trace", "concat_records", "is_trace_file", "read_trace", "read_trace_file", "write_trace"]

log = logging.getLogger(__name__)

TRACE_SUFFIXES = (".parquet", ".jsonl", ".jsonl.gz", ".csv", ".csv.gz")


@dataclass(frozen=True)
class Trace:
    """Validated records (canonical dtypes), the topology when one was given, and where they came from."""

    records: pd.DataFrame
    topology: Topology | None
    sources: tuple[str, ...]


def _suffix(path: Path) -> str | None:
    name = path.name.lower()
    for suffix in sorted(TRACE_SUFFIXES, key=len, reverse=True):
        if name.endswith(suffix):
            return suffix
    return None


def is_trace_file(path: Path) -> bool:
    return _suffix(path) is not None


#: the format's text columns: few distinct values (op, group, host names) in millions of rows
_TEXT_COLUMNS = frozenset(column.name for column in COLUMNS if column.kind == "str")
_INTEGER_COLUMNS = frozenset(column.name for column in COLUMNS if column.kind == "int")


def read_trace_file(
    path: str | os.PathLike[str], categorical: bool = False, unread: frozenset[str] = frozenset()
) -> pd.DataFrame:
    """One trace file, validated; with ``categorical``, its text columns are categoricals and its integers
    32-bit where they fit (see :func:`~trainhealth._internal.traces.format.validate`). The optional columns
    named in ``unread`` are left unread in Parquet files, for callers that do not use them (their values go
    unchecked); other formats are read whole."""
    path = Path(path)
    suffix = _suffix(path)
    if suffix is None:
        raise TraceError(str(path), f"unknown file type; expected one of {', '.join(TRACE_SUFFIXES)}")
    if regular_file(path) == 0:
        raise TraceError(str(path), "empty file")
    lines = None
    try:
        if suffix == ".parquet":
            with open(path, "rb") as handle:  # opened once: a trace replaced meanwhile is read whole, old or new
                frame = read_parquet(handle, _TEXT_COLUMNS, unread, _INTEGER_COLUMNS if categorical else frozenset())
        else:
            text = _read_text(path, suffix.endswith(".gz"))
            if suffix.startswith(".jsonl"):
                frame, lines = _parse_jsonl(text, str(path))
            else:
                frame, lines = _parse_csv(text, str(path))
    except TraceError:
        raise
    except (
        pa.ArrowException,
        OSError,
        EOFError,
        zlib.error,
        UnicodeDecodeError,
        pd.errors.ParserError,
        pd.errors.EmptyDataError,
    ) as exc:
        kind = {".parquet": "Parquet"}.get(suffix, suffix.lstrip(".").upper())
        raise TraceError(str(path), f"not a readable {kind} file (truncated or corrupt?): {_short(exc)}") from None
    return validate(frame, str(path), lines, categorical)


def _short(exc: BaseException) -> str:
    return str(exc).splitlines()[0][:200] if str(exc) else type(exc).__name__


def _read_text(path: Path, compressed: bool) -> str:
    if compressed:
        return _gunzip_whole_members(path.read_bytes(), path).decode("utf-8")
    return path.read_text(encoding="utf-8")


def _gunzip_whole_members(data: bytes, path: Path) -> bytes:
    """The gzip members of ``data``, decompressed; a cut last member after whole ones is dropped with a
    warning: it is the append a writer was making when it stopped (a crash) or is still making (a live
    trace). A file with no whole member raises ``EOFError``."""
    pieces: list[bytes] = []
    while data:
        member = zlib.decompressobj(wbits=31)
        try:
            piece = member.decompress(data)
        except zlib.error:
            if not pieces:
                raise
            log.warning("%s: ignored %d bytes after the last whole gzip member (corrupt)", path, len(data))
            break
        if not member.eof:
            if not pieces:
                raise EOFError("compressed file ended before the end-of-stream marker was reached")
            log.warning("%s: ignored the last gzip member, cut off mid-write (a writer stopped or is writing)", path)
            break
        pieces.append(piece)
        data = member.unused_data
    return b"".join(pieces)


def _parse_jsonl(text: str, path: str) -> tuple[pd.DataFrame, list[int]]:
    rows: list[dict[str, Any]] = []
    lines: list[int] = []
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as exc:
            raise TraceError(
                path, f"not valid JSON (truncated file?): {exc.msg}", row=len(rows) + 1, line=number
            ) from None
        except RecursionError:
            raise TraceError(path, "JSON nested too deeply", row=len(rows) + 1, line=number) from None
        if not isinstance(row, dict):
            raise TraceError(path, "each line must be a JSON object", row=len(rows) + 1, line=number)
        for name, value in row.items():
            if isinstance(value, (dict, list)):  # a trace row is flat: every value a number, text, bool or null
                raise TraceError(
                    path,
                    f"expected a number, text, true, false or null, got {shown(value)}",
                    row=len(rows) + 1,
                    line=number,
                    column=name,
                )
        rows.append(row)
        lines.append(number)
    return pd.DataFrame.from_records(rows), lines


def _parse_csv(text: str, path: str) -> tuple[pd.DataFrame, list[int]]:
    if not text.strip():
        raise TraceError(path, "empty file")
    header = next(csv.reader(io.StringIO(text[: text.find("\n") + 1 or len(text)])), [])
    repeated = sorted({name for name in header if header.count(name) > 1})
    if repeated:
        raise TraceError(path, "the header row names a column twice", column=", ".join(repeated))
    frame = pd.read_csv(io.StringIO(text), dtype=str, keep_default_na=False, na_values=[""])
    header = [str(name) for name in frame.columns]
    unnamed = [name for name in header if name.startswith("Unnamed:")]
    if unnamed:
        raise TraceError(path, "the header row has an empty column name")
    known = {column.name for column in COLUMNS}
    for name in header:
        if name not in known:  # extra columns: numbers where every value is one, text otherwise
            try:
                frame[name] = pd.to_numeric(frame[name])
            except (ValueError, TypeError):
                pass
    # Rows are data lines after the header; pandas skips blank lines, which CSV traces do not have.
    return frame, [index + 2 for index in range(len(frame))]


def _files_in(path: Path) -> list[Path]:
    try:
        files = sorted(p for p in path.iterdir() if is_trace_file(p) and p.is_file())
    except OSError as exc:
        raise TraceError(str(path), f"cannot list the directory: {exc.strerror or exc}") from None
    if not files:
        raise TraceError(str(path), f"no trace files ({', '.join(TRACE_SUFFIXES)}) in this directory")
    return files


def read_trace(
    paths: str | os.PathLike[str] | Iterable[str | os.PathLike[str]],
    topology: str | os.PathLike[str] | None = None,
    categorical: bool = False,
    unread: frozenset[str] = frozenset(),
) -> Trace:
    """Every record of the given files and directories (one path, or several); ``topology`` overrides a
    directory's ``topology.json``. ``categorical`` and ``unread``: see :func:`read_trace_file`."""
    if isinstance(paths, (str, os.PathLike)):  # one path, not the characters of its name
        paths = [paths]
    files: list[Path] = []
    found_topology: Path | None = None
    for entry in map(Path, paths):
        kind = kind_of(entry)
        if kind == "directory":
            files += _files_in(entry)
            if kind_of(entry / TOPOLOGY_FILE) is not None and found_topology is None:
                found_topology = entry / TOPOLOGY_FILE
        elif kind is not None:
            files.append(entry)
        else:
            raise TraceError(str(entry), "no such file or directory")
    if not files:
        raise TraceError("(no input)", "no trace files given")
    records = concat_records([read_trace_file(file, categorical, unread) for file in files])
    chosen = Path(topology) if topology is not None else found_topology
    return Trace(records, Topology.load(chosen) if chosen is not None else None, tuple(map(str, files)))


def concat_records(frames: list[pd.DataFrame]) -> pd.DataFrame:
    """Validated records of several files, one after another; a text column that is categorical in every
    file stays categorical (over all the files' values), where ``pd.concat`` would make it one object per row."""
    if len(frames) == 1:
        return frames[0]
    united = {}
    for name in _TEXT_COLUMNS:
        columns = [frame[name] for frame in frames if name in frame.columns]
        if len(columns) == len(frames) and all(isinstance(c.dtype, pd.CategoricalDtype) for c in columns):
            categories = columns[0].cat.categories
            for column in columns[1:]:
                categories = categories.union(column.cat.categories, sort=False)
            united[name] = pd.CategoricalDtype(categories)
    return pd.concat([frame.astype(united) for frame in frames] if united else frames, ignore_index=True)


_ARROW_TYPES = {"int": pa.int64(), "float": pa.float64(), "str": pa.string()}


def write_trace(records: pd.DataFrame, path: str | os.PathLike[str]) -> None:
    """Validate ``records`` and write them to ``path``; the extension picks the format."""
    path = Path(path)
    suffix = _suffix(path)
    if suffix is None:
        raise TraceError(str(path), f"unknown file type; expected one of {', '.join(TRACE_SUFFIXES)}")
    frame = validate(records, str(path))
    known = [column.name for column in COLUMNS if column.name in frame.columns]
    frame = frame[known + [name for name in frame.columns if name not in known]]
    path.parent.mkdir(parents=True, exist_ok=True)
    if suffix == ".parquet":
        fields = [
            pa.field(c.name, _ARROW_TYPES[c.kind], nullable=not c.required) for c in COLUMNS if c.name in frame.columns
        ]
        schema = pa.schema(fields)
        table = pa.Table.from_pandas(frame[[f.name for f in fields]], schema=schema, preserve_index=False)
        for name in [name for name in frame.columns if name not in schema.names]:
            try:
                column = pa.array(frame[name])
            except (pa.ArrowException, ValueError, TypeError, OverflowError):  # mixed types: kept as text
                column = pa.array(
                    frame[name].map(lambda v: None if v is None or v is pd.NA else str(v)), type=pa.string()
                )
            table = table.append_column(str(name), column)
    else:
        text = (
            frame.to_json(orient="records", lines=True, force_ascii=False)
            if suffix.startswith(".jsonl")
            else frame.to_csv(index=False)
        )
        data = text.encode("utf-8")
    descriptor, temporary = exclusive_temporary(path)
    try:
        with os.fdopen(descriptor, "wb") as handle:
            if suffix == ".parquet":
                pq.write_table(table, handle)
            else:
                handle.write(gzip.compress(data) if suffix.endswith(".gz") else data)
        os.replace(temporary, path)  # readers never see a half-written trace
    except BaseException:
        temporary.unlink(missing_ok=True)
        raise
