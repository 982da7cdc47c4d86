"""Running detectors over a recorded series (``trainhealth detect``).

>>> import pandas as pd
>>> frame = pd.DataFrame({"loss": [2.0 + 0.01 * (i % 3) for i in range(60)] + [4.0] + [2.0] * 10})
>>> [(a.detector, a.start_step, a.value) for a in detect(frame, "loss", parse_spec("loss=zscore"))]
[('zscore', 60, 4.0)]
"""

from __future__ import annotations

import os
import stat
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pandas as pd

from trainhealth._internal.detectors.spec import DEFAULT_SPEC, WatchSpec, parse_item, parse_spec
from trainhealth._internal.detectors.watch import Anomaly, Watch

__all__ = ["DEFAULT_OFFLINE", "default_detectors", "detect", "load_series", "parse_spec"]

#: For a column that is none of the Monitor's signals. Quiet on healthy training signals: thresholds chosen on
#: the calibration seeds of the real-run corpus (benchmarks/training_corpus.py); ``level_shift`` (both ways)
#: fired on the loss's descent, and ``divergence`` on a gradient norm's rise during learning-rate warm-up.
DEFAULT_OFFLINE = ("zscore(threshold=12)", "iqr(threshold=8)", "nonfinite")


def default_detectors(column: str) -> list[WatchSpec]:
    """What ``trainhealth detect`` runs on ``column`` when no detector is named: the Monitor's defaults for a
    column named after one of its signals (``loss``, ``grad_norm``, ``step_time``, ...), else :data:`DEFAULT_OFFLINE`.

    >>> [spec.detector.name for spec in default_detectors("loss")]
    ['divergence', 'zscore', 'spike', 'nonfinite']
    >>> [spec.detector.name for spec in default_detectors("queue_depth")]
    ['zscore', 'iqr', 'nonfinite']
    """
    monitored = [spec for spec in parse_spec(DEFAULT_SPEC) if spec.signal == column]
    return monitored or [parse_item(item, column) for item in DEFAULT_OFFLINE]


class SeriesError(ValueError):
    """A problem with the input file or its columns; the message names them."""


def load_series(path: str | os.PathLike[str]) -> pd.DataFrame:
    """A CSV (optionally .gz) or Parquet file as a data frame; ``SeriesError`` naming the file when it is not
    a readable regular file of that type, has no rows, or names a column twice."""
    path = Path(path)
    try:
        mode = os.stat(path).st_mode
    except OSError as exc:
        raise SeriesError(f"{path}: {'no such file' if isinstance(exc, FileNotFoundError) else exc.strerror}") from None
    if not stat.S_ISREG(mode):
        raise SeriesError(f"{path}: not a regular file")
    try:
        if path.suffix.lower() == ".parquet":
            frame = pd.read_parquet(path, use_threads=False)  # Arrow's threads can abort at exit (apache/arrow#34314)
        elif path.name.lower().endswith((".csv", ".csv.gz")):
            frame = pd.read_csv(path)
            header = pd.read_csv(path, nrows=1, header=None, dtype=str).iloc[0].tolist()
            repeated = sorted({str(name) for name in header if header.count(name) > 1})
            if repeated:
                raise SeriesError(f"{path}: the header names column {', '.join(map(repr, repeated))} twice")
        else:
            raise SeriesError(f"{path}: unknown file type; expected .csv, .csv.gz or .parquet")
    except SeriesError:
        raise
    except Exception as exc:
        raise SeriesError(
            f"{path}: not readable: {str(exc).splitlines()[0][:200] if str(exc) else type(exc).__name__}"
        ) from None
    if frame.empty:
        raise SeriesError(f"{path}: no rows")
    return frame


def detect(
    frame: pd.DataFrame,
    column: str,
    specs: Sequence[WatchSpec],
    *,
    series_column: str | None = None,
    time_column: str | None = None,
) -> list[Anomaly]:
    """Every anomaly the detectors find in ``column``, in order of start.

    With ``series_column`` the rows are one value per (time, series) and every
    series is watched at once (one vector per time); otherwise row ``i`` is step ``i``.
    """
    for name in filter(None, (column, series_column, time_column)):
        if name not in frame.columns:
            raise SeriesError(f"no column {name!r}; columns: {', '.join(map(str, frame.columns))}")
    raw = frame[column]
    values = pd.to_numeric(raw.map(_number) if raw.dtype == object else raw, errors="coerce")
    bad = values.isna() & raw.notna() & ~raw.astype(str).str.lower().isin(["nan", "inf", "-inf"])
    if pd.api.types.is_bool_dtype(raw.dtype) or pd.api.types.is_datetime64_any_dtype(raw.dtype):
        bad = raw.notna()
    if bad.any():
        row = int(np.flatnonzero(bad.to_numpy())[0])
        raise SeriesError(f"column {column!r}, row {row + 1}: not a number: {str(raw.iloc[row])[:60]!r}")
    data = frame.assign(_value=values)
    if series_column is None:
        data = data.assign(_series="")
        series_column = "_series"
    if time_column is None:
        data = data.assign(_time=data.groupby(series_column).cumcount())
        time_column = "_time"
    table = data.pivot_table(index=time_column, columns=series_column, values="_value", aggfunc="last", dropna=False)
    keys = [str(key) for key in table.columns]
    times = _seconds(table.index)
    anomalies: list[Anomaly] = []
    for spec in specs:
        watch = Watch(column, spec.detector.clone(), decision=spec.decision(), series=keys, critical=spec.critical)
        for step, (when, row) in enumerate(zip(times, table.to_numpy())):
            update = watch.update(row, step=step, time=when)
            anomalies += update.closed
        anomalies += watch.active
    return sorted(anomalies, key=lambda a: (a.start_time, a.detector, a.series))


def _number(value: object) -> object:
    """A number, or text a number can be read from; anything else (lists, booleans) as NaN."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (str, int, float, np.number)):
        return np.nan
    return value


def _seconds(index: pd.Index) -> list[float]:
    if pd.api.types.is_datetime64_any_dtype(index):
        return list((index.astype("int64") / 1e9).astype(float))
    numeric = pd.to_numeric(pd.Series(index), errors="coerce")
    if numeric.notna().all():
        return [float(v) for v in numeric]
    parsed = pd.to_datetime(pd.Series(index), errors="coerce")
    if parsed.notna().all():
        return [float(v) for v in parsed.astype("int64") / 1e9]
    return [float(i) for i in range(len(index))]
