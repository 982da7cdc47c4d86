"""Reading a Parquet trace into pandas one row group at a time, into arrays allocated once.

A 16,384-GPU window is eleven million rows. Converting a whole Arrow table holds
the table and the frame at once, and pandas' conversion of nullable integers is
slow; here each row group is decoded, copied into the frame's own arrays and
dropped, so the reader holds one row group beside the frame. Integer and float
columns become numpy arrays (integers with nulls: pandas' nullable integers),
text columns categoricals over the values of every row group's dictionary; any
other column (booleans, timestamps, whatever a file holds) is left to Arrow's
own conversion. The 64-bit integer columns named in ``narrow`` are kept in 32 bits
as long as every value fits (half the memory; widened when a row group's do not).
Files the frame could not be built from this way (repeated column names, an index
stored as a column) are read whole, as Arrow converts them.

>>> import io, pyarrow as pa, pyarrow.parquet as pq
>>> buffer = io.BytesIO()
>>> pq.write_table(pa.table({"rank": [0, 1, 2], "seq": [5, None, 7], "op": ["send", "recv", None]}), buffer,
...                row_group_size=2)
>>> frame = read_parquet(buffer, frozenset({"op"}))
>>> frame["seq"].tolist(), frame["op"].tolist(), str(frame["rank"].dtype)
([5, <NA>, 7], ['send', 'recv', nan], 'int64')
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

__all__ = ["read_parquet"]


def read_parquet(
    handle: Any,
    text_columns: frozenset[str],
    unread: frozenset[str] = frozenset(),
    narrow: frozenset[str] = frozenset(),
) -> pd.DataFrame:
    """The Parquet file open in ``handle`` as a frame; its string columns named in ``text_columns`` as
    categoricals; the columns named in ``unread`` are not read; the 64-bit integer columns named in
    ``narrow`` in 32 bits where every value fits. One thread: Arrow's reader threads can abort the
    interpreter at exit (apache/arrow#34314)."""
    schema = pq.read_schema(handle)
    handle.seek(0)
    text = [field.name for field in schema if field.name in text_columns and _is_string(field.type)]
    file = pq.ParquetFile(handle, read_dictionary=text)
    rows = file.metadata.num_rows
    if len(set(schema.names)) < len(schema.names) or _stored_index(schema):
        return file.read(use_threads=False).to_pandas(split_blocks=True, self_destruct=True)
    columns = [
        _column(field, rows, field.name in text, field.name in narrow) for field in schema if field.name not in unread
    ]
    offset = 0
    for index in range(file.num_row_groups):
        offset += _add_row_group(file, index, columns, offset)
    pa.default_memory_pool().release_unused()  # the row groups' buffers, else kept by the allocator
    return pd.DataFrame({column.name: column.finish() for column in columns}, copy=False)


def _add_row_group(file: pq.ParquetFile, index: int, columns: list[_Numbers | _Text | _Other], offset: int) -> int:
    """Row group ``index`` copied into ``columns`` from row ``offset`` on; its row count."""
    group = file.read_row_group(index, [column.name for column in columns], use_threads=False)
    for column in columns:
        column.add(offset, group.column(column.name))
    return int(group.num_rows)


def _is_string(kind: pa.DataType) -> bool:
    return bool(pa.types.is_string(kind) or pa.types.is_large_string(kind))


def _stored_index(schema: pa.Schema) -> bool:
    """Whether pandas wrote its index as a column (Arrow's conversion would make it the frame's index)."""
    metadata = schema.pandas_metadata or {}
    return any(isinstance(name, str) for name in metadata.get("index_columns", []))


class _Numbers:
    """An integer or float column: one numpy array; integers with nulls also a mask (floats: NaN)."""

    def __init__(self, name: str, kind: pa.DataType, rows: int, narrow: bool = False) -> None:
        self.name = name
        self.narrowed = narrow and kind == pa.int64()  # 32 bits while every value fits (see add)
        self.values = np.empty(rows, dtype=np.int32 if self.narrowed else kind.to_pandas_dtype())
        self.integer = pa.types.is_integer(kind)
        self.mask: np.ndarray | None = None

    def add(self, offset: int, column: pa.ChunkedArray) -> None:
        for chunk in column.chunks:
            rows = slice(offset, offset + len(chunk))
            offset += len(chunk)
            if self.narrowed and not _fits_int32(chunk):
                self.values, self.narrowed = self.values.astype(np.int64), False
            if self.integer and chunk.null_count:
                if self.mask is None:
                    self.mask = np.zeros(len(self.values), dtype=bool)
                self.mask[rows] = chunk.is_null().to_numpy(zero_copy_only=False)
                chunk = chunk.fill_null(0)
            self.values[rows] = chunk.to_numpy(zero_copy_only=False)

    def finish(self) -> np.ndarray | pd.arrays.IntegerArray:
        return self.values if self.mask is None else pd.arrays.IntegerArray(self.values, self.mask)


class _Text:
    """A dictionary-encoded string column: codes into the values of every row group's dictionary."""

    def __init__(self, name: str, rows: int) -> None:
        self.name = name
        self.codes = np.empty(rows, dtype=np.int16)  # widened when a file has more distinct values
        self.code_of: dict[str, int] = {}

    def add(self, offset: int, column: pa.ChunkedArray) -> None:
        for chunk in column.chunks:
            known = [
                -1 if value is None else self.code_of.setdefault(value, len(self.code_of))
                for value in chunk.dictionary.to_pylist()
            ]
            if len(self.code_of) > np.iinfo(self.codes.dtype).max:
                self.codes = self.codes.astype(np.int32)
            table = np.array(known + [-1], dtype=self.codes.dtype)  # a null index: the last entry
            self.codes[offset : offset + len(chunk)] = table[chunk.indices.fill_null(len(known)).to_numpy()]
            offset += len(chunk)

    def finish(self) -> pd.Categorical:
        return pd.Categorical.from_codes(self.codes, categories=pd.Index(list(self.code_of), dtype=object))


class _Other:
    """Any other column: its pieces, converted by Arrow at the end."""

    def __init__(self, name: str, kind: pa.DataType) -> None:
        self.name = name
        self.kind = kind
        self.chunks: list[pa.Array] = []

    def add(self, offset: int, column: pa.ChunkedArray) -> None:
        self.chunks += column.chunks

    def finish(self) -> Any:
        return pa.chunked_array(self.chunks, type=self.kind).to_pandas()


def _fits_int32(chunk: pa.Array) -> bool:
    """Whether every value of the integer ``chunk`` fits 32 bits (nulls aside)."""
    extent = pc.min_max(chunk)
    low, high = extent["min"].as_py(), extent["max"].as_py()
    limits = np.iinfo(np.int32)
    return low is None or (limits.min <= low and high <= limits.max)


def _column(field: pa.Field, rows: int, text: bool, narrow: bool = False) -> _Numbers | _Text | _Other:
    if text:
        return _Text(field.name, rows)
    if pa.types.is_integer(field.type) or (pa.types.is_floating(field.type) and field.type != pa.float16()):
        return _Numbers(field.name, field.type, rows, narrow)
    return _Other(field.name, field.type)
