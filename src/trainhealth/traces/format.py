"""Trace format v1: the columns, the operations, and validation that names file, row and column.

One row per operation executed by one rank (docs/trace-format.md). Validation
is vectorised with pandas and stops at the first problem, reported as a
:class:`TraceError` whose message reads ``FILE: row N (line M), column 'C': problem``.

>>> import pandas as pd
>>> frame = pd.DataFrame({"rank": [0], "step": [3], "op": ["all_reduce"], "group": ["dp0"], "seq": [7],
...                       "start": [1.5], "duration": [-0.25]})
>>> validate(frame, "trace.jsonl")
Traceback (most recent call last):
...
trainhealth.traces.ops.TraceError: trace.jsonl: row 1, column 'duration': negative value -0.25
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd

from trainhealth.traces.ops import COMMUNICATION_OPS, COMPUTATION_OPS, MARKER_OPS, OPS, TraceError

__all__ = [
    "COLUMNS",
    "COMMUNICATION_OPS",
    "COMPUTATION_OPS",
    "MARKER_OPS",
    "OPS",
    "REQUIRED_COLUMNS",
    "Column",
    "TraceError",
    "validate",
]



@dataclass(frozen=True)
class Column:
    name: str
    kind: str  # "int", "float" or "str"
    required: bool
    meaning: str


COLUMNS: tuple[Column, ...] = (
    Column("rank", "int", True, "global rank that executed the operation"),
    Column("step", "int", True, "training iteration"),
    Column("op", "str", True, "operation: " + ", ".join(OPS)),
    Column("group", "str", False, "communicator id, the same on every member rank (communication ops)"),
    Column("seq", "int", False, "sequence number within group (communication ops)"),
    Column("start", "float", True, "start time in seconds on the rank's own clock"),
    Column("duration", "float", True, "elapsed seconds, including waiting for other ranks"),
    Column("bytes", "int", False, "message size"),
    Column("host", "str", False, "host name of the rank"),
    Column("gpu", "int", False, "local GPU index on the host"),
    Column("peer", "int", False, "the other rank of a send or recv"),
)
REQUIRED_COLUMNS = tuple(column.name for column in COLUMNS if column.required)
_BY_NAME = {column.name: column for column in COLUMNS}


def validate(frame: pd.DataFrame, path: str, lines: Sequence[int] | None = None) -> pd.DataFrame:
    """Check ``frame`` against trace format v1 and return it with canonical dtypes.

    ``lines`` maps row positions to line numbers of a text file, for messages.
    Unknown extra columns are kept unchanged.
    """

    def fail(problem: str, position: int | None = None, column: str | None = None) -> TraceError:
        if position is None:
            return TraceError(path, problem, column=column)
        line = None if lines is None else lines[position]
        return TraceError(path, problem, row=position + 1, column=column, line=line)

    missing = [name for name in REQUIRED_COLUMNS if name not in frame.columns]
    if missing:
        raise fail(f"missing required column{'s' if len(missing) > 1 else ''}", column=", ".join(missing))
    if len(frame) == 0:
        raise fail("no records (empty trace)")
    out = frame.copy(deep=False)  # columns are replaced below, never changed in place
    out.index = pd.RangeIndex(len(out))
    for column in COLUMNS:
        if column.name not in out.columns:
            continue
        raw = out[column.name]
        if column.kind == "int":
            out[column.name] = _integers(raw, column, fail)
        elif column.kind == "float":
            out[column.name] = _floats(raw, column, fail)
        else:
            out[column.name] = _strings(raw, column, fail)
    bad_op = ~out["op"].isin(OPS)
    if bad_op.any():
        position = int(np.flatnonzero(bad_op.to_numpy())[0])
        raise fail(f"unknown op {out['op'][position]!r}; expected one of {', '.join(OPS)}", position, "op")
    negative = out["duration"].to_numpy() < 0
    if negative.any():
        position = int(np.flatnonzero(negative)[0])
        raise fail(f"negative value {out['duration'][position]:g}", position, "duration")
    communication = out["op"].isin(COMMUNICATION_OPS).to_numpy()
    for name in ("group", "seq"):
        if name not in out.columns:
            if communication.any():
                raise fail(f"communication operations need '{name}'", int(np.flatnonzero(communication)[0]), name)
            out[name] = pd.Series([None] * len(out), dtype=object if name == "group" else "Int64")
            continue
        absent = out[name].isna().to_numpy(copy=True)
        if name == "group":
            absent = absent | (out[name].fillna("") == "").to_numpy()
        bad = communication & absent
        if bad.any():
            position = int(np.flatnonzero(bad)[0])
            raise fail(f"a {out['op'][position]} needs a {name}", position, name)
    return out


#: ``fail(problem, position, column)`` of :func:`validate`: the error to raise.
_Fail = Callable[[str, int | None, str | None], TraceError]


def _first_bad(mask: np.ndarray) -> int | None:
    hits = np.flatnonzero(mask)
    return int(hits[0]) if len(hits) else None


def _integers(raw: pd.Series, column: Column, fail: _Fail) -> pd.Series:
    if pd.api.types.is_integer_dtype(raw.dtype):  # already integers (Parquet): only the checks that can fail
        missing = raw.isna().to_numpy()
        values = raw.to_numpy(dtype=np.int64, na_value=0)
        position = _first_bad(values < 0)
        if position is not None:
            raise fail(f"negative value {raw[position]}", position, column.name)
        if column.required:
            position = _first_bad(missing)
            if position is not None:
                raise fail("missing value", position, column.name)
            return pd.Series(values, index=raw.index)
        return pd.Series(pd.array(values, dtype="Int64"), index=raw.index).where(~missing, pd.NA)
    present = _present(raw)
    numbers = pd.to_numeric(raw.where(present), errors="coerce")
    position = _first_bad((present & numbers.isna()).to_numpy())
    if position is not None:
        raise fail(f"expected an integer, got {raw[position]!r}", position, column.name)
    values = numbers.to_numpy(dtype=float, na_value=np.nan)
    position = _first_bad(present.to_numpy() & ((values % 1 != 0) | ~np.isfinite(values)))
    if position is not None:
        raise fail(f"expected an integer, got {raw[position]!r}", position, column.name)
    position = _first_bad(present.to_numpy() & (values < 0))
    if position is not None:
        raise fail(f"negative value {raw[position]}", position, column.name)
    if column.required:
        position = _first_bad(~present.to_numpy())
        if position is not None:
            raise fail("missing value", position, column.name)
        return pd.Series(values.astype(np.int64), index=raw.index)
    return pd.Series(pd.array(np.where(present, values, 0).astype(np.int64), dtype="Int64"),
                     index=raw.index).where(present.to_numpy(), pd.NA)


def _floats(raw: pd.Series, column: Column, fail: _Fail) -> pd.Series:
    if pd.api.types.is_float_dtype(raw.dtype) and not pd.api.types.is_extension_array_dtype(raw.dtype):
        values = raw.to_numpy()
        position = _first_bad(~np.isfinite(values))
        if position is not None:
            raise fail("missing value" if np.isnan(values[position]) else f"expected a finite number, got "
                        f"{raw[position]!r}", position, column.name)
        return pd.Series(values.astype(np.float64, copy=False), index=raw.index)
    present = _present(raw)
    numbers = pd.to_numeric(raw.where(present), errors="coerce")
    position = _first_bad((present & numbers.isna()).to_numpy())
    if position is not None:
        raise fail(f"expected a number, got {raw[position]!r}", position, column.name)
    position = _first_bad(~present.to_numpy())
    if position is not None:
        raise fail("missing value", position, column.name)
    values = numbers.to_numpy(dtype=np.float64)
    position = _first_bad(~np.isfinite(values))
    if position is not None:
        raise fail(f"expected a finite number, got {raw[position]!r}", position, column.name)
    return pd.Series(values, index=raw.index)


def _strings(raw: pd.Series, column: Column, fail: _Fail) -> pd.Series:
    # distinct values first: a trace has millions of rows but few op, group and host names
    codes, distinct = pd.factorize(raw, use_na_sentinel=True)
    distinct = np.asarray(distinct, dtype=object)
    text = np.array([isinstance(v, str) for v in distinct], dtype=bool)
    wrong = ~text & np.array([not _is_null(v) for v in distinct], dtype=bool)
    if wrong.any():
        position = _first_bad(np.isin(codes, np.flatnonzero(wrong)))
        raise fail(f"expected text, got {raw[position]!r}", position, column.name)
    usable = text & np.array([isinstance(v, str) and v.strip() != "" for v in distinct], dtype=bool)
    present = (codes >= 0) & usable[np.maximum(codes, 0)] if len(distinct) else np.zeros(len(codes), dtype=bool)
    if column.required:
        position = _first_bad(~present)
        if position is not None:
            raise fail("missing value", position, column.name)
    values = np.append(distinct, np.array([None], dtype=object))[np.where(present, codes, len(distinct))]
    return pd.Series(values, index=raw.index, dtype=object)


def _is_null(value: object) -> bool:
    return value is pd.NA or (isinstance(value, float) and math.isnan(value))


def _present(raw: pd.Series) -> pd.Series:
    present = raw.notna()
    if raw.dtype == object:
        present &= raw.map(lambda v: not (isinstance(v, str) and v.strip() == ""))
    return present
