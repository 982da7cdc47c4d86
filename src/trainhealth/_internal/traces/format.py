"""Trace format v1: the columns, the operations, and validation that names file, row and column.

One row per operation executed by one rank (docs/trace-format.md). Validation
is vectorised with pandas and stops at the first problem, reported as a
:class:`TraceError` whose message reads ``FILE: row N (line M), column 'C': problem``.

Every number has a range (:attr:`Column.limit`): ranks and GPU indices fit 31 bits,
steps, sequence numbers and byte counts 53 (what a JSON or CSV reader keeps exactly),
times are seconds (start within 10^12 of zero, a duration at most 10^9). A value out
of range, of the wrong type (true/false where a number belongs, a list, a timestamp)
or not finite is refused, never wrapped or rounded.

>>> import pandas as pd
>>> frame = pd.DataFrame({"rank": [0], "step": [3], "op": ["all_reduce"], "group": ["dp0"], "seq": [7],
...                       "start": [1.5], "duration": [-0.25]})
>>> validate(frame, "trace.jsonl")
Traceback (most recent call last):
...
trainhealth._internal.traces.ops.TraceError: trace.jsonl: row 1, column 'duration': negative value -0.25
"""

from __future__ import annotations

import math
import reprlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd

from trainhealth._internal.traces.ops import COMMUNICATION_OPS, COMPUTATION_OPS, MARKER_OPS, OPS, TraceError

__all__ = [
    "COLUMNS",
    "COMMUNICATION_OPS",
    "COMPUTATION_OPS",
    "MARKER_OPS",
    "OPS",
    "REQUIRED_COLUMNS",
    "Column",
    "MAX_COUNT",
    "MAX_RANK",
    "TraceError",
    "shown",
    "validate",
]

#: The largest rank, GPU index or peer (a 32-bit signed integer, as torch.distributed keeps them).
MAX_RANK = 2**31 - 1
#: The largest step, sequence number or byte count: below 2**53, every integer a JSON or CSV reader
#: turns into a float is still exact.
MAX_COUNT = 2**53 - 1


@dataclass(frozen=True)
class Column:
    name: str
    kind: str  # "int", "float" or "str"
    required: bool
    meaning: str
    #: numbers: the largest magnitude accepted (integers are also >= 0, durations too)
    limit: float = 0.0


COLUMNS: tuple[Column, ...] = (
    Column("rank", "int", True, "global rank that executed the operation", MAX_RANK),
    Column("step", "int", True, "training iteration", MAX_COUNT),
    Column("op", "str", True, "operation: " + ", ".join(OPS)),
    Column("group", "str", False, "communicator id, the same on every member rank (communication ops)"),
    Column("seq", "int", False, "sequence number within group (communication ops)", MAX_COUNT),
    Column("start", "float", True, "start time in seconds on the rank's own clock", 1e12),
    Column("duration", "float", True, "elapsed seconds, including waiting for other ranks", 1e9),
    Column("bytes", "int", False, "message size", MAX_COUNT),
    Column("host", "str", False, "host name of the rank"),
    Column("gpu", "int", False, "local GPU index on the host", MAX_RANK),
    Column("peer", "int", False, "the other rank of a send or recv", MAX_RANK),
)
REQUIRED_COLUMNS = tuple(column.name for column in COLUMNS if column.required)
_BY_NAME = {column.name: column for column in COLUMNS}


def validate(
    frame: pd.DataFrame, path: str, lines: Sequence[int] | None = None, categorical: bool = False
) -> pd.DataFrame:
    """Check ``frame`` against trace format v1 and return it with canonical dtypes.

    ``lines`` maps row positions to line numbers of a text file, for messages.
    Unknown extra columns are kept unchanged. With ``categorical``, the text columns are pandas categoricals
    (codes into their few distinct values) instead of one ``str`` per row: a fraction of the memory of
    millions of rows, and what the localizer reads without hashing them again; and an integer column whose
    values all fit 32 bits is kept in them (``int32``, ``Int32`` where values are missing): half the memory,
    the same values.
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
    text: dict[str, _Text] = {}
    for column in COLUMNS:
        if column.name not in out.columns:
            continue
        raw = out[column.name]
        if column.kind == "int":
            out[column.name] = _integers(raw, column, fail, narrow=categorical)
        elif column.kind == "float":
            out[column.name] = _floats(raw, column, fail)
        else:
            text[column.name] = _strings(raw, column, fail)
            out[column.name] = text[column.name].series(categorical)
    op = text["op"]
    position = _first_bad(op.where(~np.isin(op.distinct, OPS)))
    if position is not None:
        raise fail(f"unknown op {shown(out['op'][position])}; expected one of {', '.join(OPS)}", position, "op")
    negative = out["duration"].to_numpy() < 0
    if negative.any():
        position = int(np.flatnonzero(negative)[0])
        raise fail(f"negative value {out['duration'][position]:g}", position, "duration")
    communication = op.where(np.isin(op.distinct, COMMUNICATION_OPS))
    for name in ("group", "seq"):
        if name not in out.columns:
            if communication.any():
                raise fail(f"communication operations need '{name}'", int(np.flatnonzero(communication)[0]), name)
            if name == "group":
                out[name] = _Text(np.full(len(out), -1), np.array([], dtype=object), out.index).series(categorical)
            else:
                out[name] = pd.Series([None] * len(out), dtype="Int64")
            continue
        # text is None where it was missing or blank (see _strings)
        absent = text[name].missing if name == "group" else out[name].isna().to_numpy()
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


def _integer_type(largest: float, narrow: bool) -> type[np.signedinteger]:
    """The type an integer column is kept in: 32 bits with ``narrow`` when its ``largest`` value fits, else 64."""
    return np.int32 if narrow and largest <= np.iinfo(np.int32).max else np.int64


def _nullable(kind: type[np.signedinteger]) -> pd.api.extensions.ExtensionDtype:
    """pandas' integer type with missing values over ``kind``."""
    return pd.Int32Dtype() if kind is np.int32 else pd.Int64Dtype()


def _integers(raw: pd.Series, column: Column, fail: _Fail, narrow: bool = False) -> pd.Series:
    """``raw`` as integers (``int64``; ``Int64`` for an optional column), or the error of its first bad value;
    with ``narrow``, in 32 bits when every value fits."""
    _refuse_non_numbers(raw, column, fail, "an integer")
    if pd.api.types.is_integer_dtype(raw.dtype):  # already integers (Parquet): only the checks that can fail
        # the range is checked on the smallest and largest value; rows are looked at only to name a bad one
        missing = raw.isna().to_numpy()
        present = not missing.all()
        # numpy's reductions over the values with missing ones as 0 (neither negative nor out of range):
        # several times faster than pandas' over nullable integers
        values = raw.to_numpy(dtype=raw.dtype.numpy_dtype, na_value=0) if missing.any() else raw.to_numpy()
        smallest, largest = (values.min(), values.max()) if present else (0, 0)
        del values
        if smallest < 0:
            position = _first_bad(raw.to_numpy(dtype=np.int64, na_value=0) < 0)
            raise fail(f"negative value {raw[position]}", position, column.name)
        if largest > column.limit:
            position = _first_bad(raw.to_numpy(dtype=np.uint64, na_value=0) > column.limit)
            raise fail(f"value {raw[position]} out of range (at most {column.limit:.0f})", position, column.name)
        kind = _integer_type(largest, narrow)
        if column.required:
            position = _first_bad(missing)
            if position is not None:
                raise fail("missing value", position, column.name)
            return raw if raw.dtype == kind else raw.astype(kind)
        # kept as it is when already canonical; int64 without nulls becomes Int64 on the same array
        return raw if raw.dtype == _nullable(kind) else raw.astype(_nullable(kind))
    present = _present(raw)
    numbers = _to_numbers(raw.where(present))
    position = _first_bad((present & numbers.isna()).to_numpy())
    if position is not None:
        raise fail(f"expected an integer, got {shown(raw[position])}", position, column.name)
    values = numbers.to_numpy(dtype=float, na_value=np.nan)
    position = _first_bad(present.to_numpy() & ((values % 1 != 0) | ~np.isfinite(values)))
    if position is not None:
        raise fail(f"expected an integer, got {shown(raw[position])}", position, column.name)
    position = _first_bad(present.to_numpy() & (values < 0))
    if position is not None:
        raise fail(f"negative value {_text(raw[position])}", position, column.name)
    position = _first_bad(present.to_numpy() & (values > column.limit))
    if position is not None:
        raise fail(f"value {_text(raw[position])} out of range (at most {column.limit:.0f})", position, column.name)
    kind = _integer_type(float(np.max(values, where=present.to_numpy(), initial=0.0)), narrow)
    if column.required:
        position = _first_bad(~present.to_numpy())
        if position is not None:
            raise fail("missing value", position, column.name)
        return pd.Series(values.astype(kind), index=raw.index, copy=False)
    return pd.Series(pd.array(np.where(present, values, 0).astype(kind), dtype=_nullable(kind)), index=raw.index).where(
        present.to_numpy(), pd.NA
    )


def _floats(raw: pd.Series, column: Column, fail: _Fail) -> pd.Series:
    _refuse_non_numbers(raw, column, fail, "a number")
    if pd.api.types.is_float_dtype(raw.dtype) and not pd.api.types.is_extension_array_dtype(raw.dtype):
        values = raw.to_numpy().astype(np.float64, copy=False)
        position = _first_bad(~np.isfinite(values))
        if position is not None:
            raise fail(
                "missing value" if np.isnan(values[position]) else f"expected a finite number, got {raw[position]!r}",
                position,
                column.name,
            )
    else:
        present = _present(raw)
        numbers = _to_numbers(raw.where(present))
        position = _first_bad((present & numbers.isna()).to_numpy())
        if position is not None:
            raise fail(f"expected a number, got {shown(raw[position])}", position, column.name)
        position = _first_bad(~present.to_numpy())
        if position is not None:
            raise fail("missing value", position, column.name)
        values = numbers.to_numpy(dtype=np.float64)
        position = _first_bad(~np.isfinite(values))
        if position is not None:
            raise fail(f"expected a finite number, got {shown(raw[position])}", position, column.name)
    if len(values) and max(values.max(), -values.min()) > column.limit:  # the rows looked at only to name one
        position = int(np.flatnonzero(np.abs(values) > column.limit)[0])
        raise fail(f"value {values[position]:g} out of range (at most {column.limit:g} seconds)", position, column.name)
    return raw if raw.dtype == np.float64 else pd.Series(values, index=raw.index, copy=False)


def _refuse_non_numbers(raw: pd.Series, column: Column, fail: _Fail, expected: str) -> None:
    """Booleans, timestamps, lists and other objects where a number belongs: refused, not converted."""
    if (
        pd.api.types.is_bool_dtype(raw.dtype)
        or pd.api.types.is_datetime64_any_dtype(raw.dtype)
        or pd.api.types.is_timedelta64_dtype(raw.dtype)
        or isinstance(raw.dtype, pd.PeriodDtype)
    ):
        position = _first_bad(raw.notna().to_numpy())
        if position is not None:
            raise fail(f"expected {expected}, got {shown(raw[position])}", position, column.name)
        return
    if raw.dtype != object and not isinstance(raw.dtype, pd.CategoricalDtype):
        return
    if pd.api.types.infer_dtype(raw, skipna=True) in (
        "string",
        "integer",
        "floating",
        "mixed-integer-float",
        "decimal",
        "empty",
    ):
        return
    wrong = raw.map(lambda v: not (v is None or v is pd.NaT or _is_null(v) or _plain_number_or_text(v)))
    position = _first_bad(wrong.to_numpy(dtype=bool))
    if position is not None:
        raise fail(f"expected {expected}, got {shown(raw[position])}", position, column.name)


def _plain_number_or_text(value: object) -> bool:
    return isinstance(value, (str, int, float, np.integer, np.floating)) and not isinstance(value, (bool, np.bool_))


def _to_numbers(raw: pd.Series) -> pd.Series:
    """``raw`` as numbers, NaN where a value is not one (integers too large for any dtype included)."""
    try:
        return pd.to_numeric(raw, errors="coerce")
    except (TypeError, ValueError, OverflowError):  # values pandas cannot even try: one at a time
        return pd.to_numeric(raw.map(_number_or_nan), errors="coerce")


def _number_or_nan(value: object) -> float:
    try:
        return float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError, OverflowError):
        return math.nan


@dataclass(frozen=True)
class _Text:
    """A validated text column: codes into its few distinct values."""

    codes: np.ndarray  # per row: index into distinct, -1 where missing or blank
    distinct: np.ndarray  # the distinct values (a categorical's unused categories too)
    index: pd.Index

    def series(self, categorical: bool) -> pd.Series:
        """The column: a categorical, or one ``str`` per row; missing (None, NaN in a categorical) where it was
        missing or blank."""
        if categorical:
            return pd.Series(pd.Categorical.from_codes(self.codes, categories=self.distinct), index=self.index)
        values = np.append(self.distinct, np.array([None], dtype=object))[self.codes]
        return pd.Series(values, index=self.index, dtype=object, copy=False)

    def where(self, chosen: np.ndarray) -> np.ndarray:
        """Per row: whether its value is one of the ``chosen`` distinct values (a mask over ``distinct``)."""
        return np.append(chosen, False)[self.codes]

    @property
    def missing(self) -> np.ndarray:
        return self.codes < 0


def _strings(raw: pd.Series, column: Column, fail: _Fail) -> _Text:
    # distinct values first: a trace has millions of rows but few op, group and host names
    try:
        codes, distinct = _factorized(raw)
    except TypeError:  # unhashable values (lists, dictionaries): never text
        unhashable = raw.map(lambda v: not (isinstance(v, str) or _is_null(v)))
        first = int(np.flatnonzero(unhashable.to_numpy(dtype=bool))[0])
        raise fail(f"expected text, got {shown(raw[first])}", first, column.name) from None
    text = np.array([isinstance(v, str) for v in distinct], dtype=bool)
    wrong = ~text & np.array([not _is_null(v) for v in distinct], dtype=bool)
    position = _first_bad(np.append(wrong, False)[codes]) if wrong.any() else None  # (an unused category: none)
    if position is not None:
        raise fail(f"expected text, got {shown(raw[position])}", position, column.name)
    usable = text & np.array([isinstance(v, str) and v.strip() != "" for v in distinct], dtype=bool)
    if not usable.all():  # blank and null values are missing ones: renumbered to -1
        codes = np.append(np.where(usable, np.cumsum(usable) - 1, -1), -1)[codes]
        distinct = distinct[usable]
    if column.required:
        position = _first_bad(codes < 0)
        if position is not None:
            raise fail("missing value", position, column.name)
    return _Text(codes, distinct, raw.index)


def _factorized(raw: pd.Series) -> tuple[np.ndarray, np.ndarray]:
    """Codes into the distinct values (-1 for nulls); a categorical's own codes, not hashed again."""
    if not isinstance(raw.dtype, pd.CategoricalDtype):
        codes, distinct = pd.factorize(raw, use_na_sentinel=True)
        return codes, np.asarray(distinct, dtype=object)
    # the categories as they are (an unused one may be among them), the codes in their own small integers
    return raw.cat.codes.to_numpy(), np.asarray(raw.cat.categories, dtype=object)


def _text(value: object) -> str:
    """A number as the file wrote it (``-1``, not ``'-1'``)."""
    return value[:40] if isinstance(value, str) else shown(value)


_SHOWN = reprlib.Repr()
_SHOWN.maxlevel, _SHOWN.maxstring, _SHOWN.maxother, _SHOWN.maxlong = 2, 40, 40, 40
_SHOWN.maxlist = _SHOWN.maxtuple = _SHOWN.maxdict = _SHOWN.maxset = 4


def shown(value: object) -> str:
    """``repr(value)`` cut short (a value from a file may be megabytes long or nested thousands deep).

    >>> shown([[[[1]]]]), shown("x" * 100)
    ('[[[...]]]', "'xxxxxxxxxxxxxxxxx...xxxxxxxxxxxxxxxxxx'")
    """
    return _SHOWN.repr(value)


def _is_null(value: object) -> bool:
    return value is pd.NA or (isinstance(value, float) and math.isnan(value))


def _present(raw: pd.Series) -> pd.Series:
    present = raw.notna()
    if raw.dtype == object:
        present &= raw.map(lambda v: not (isinstance(v, str) and v.strip() == ""))
    return present
