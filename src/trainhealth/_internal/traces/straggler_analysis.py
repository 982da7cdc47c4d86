"""Importer for ByteDance's StragglerAnalysis traces (the OSDI'25 "what-if" straggler study).

Those traces have one row per operation of a Megatron-LM job with columns
``dp_rank, stage, rank, step, optype, start_ts, duration, seq_id, mc, gmc, mb_id``;
times are seconds from the start of each sampled step. The importer maps them
to trace format v1:

* ``optype`` -> ``op``: ``forward-compute`` -> forward, ``backward-compute`` -> backward,
  ``*-send``/``*-recv`` -> send/recv, ``params-all-gather`` -> all_gather,
  ``grads-reduce-scatter`` -> reduce_scatter, ``*-grads-all-reduce`` -> all_reduce,
  ``optimizer*`` -> optimizer, ``gc`` -> compute;
* groups follow Megatron's process groups: ``dp-s<stage>-t<tp>`` (data parallel, for the
  parameter all-gather and gradient reduce-scatter), ``tp-d<dp>-s<stage>`` (the layernorm
  all-reduce), ``emb-d<dp>-t<tp>`` (first and last stage, embedding all-reduce) and
  ``pp-d<dp>-t<tp>-s<a>-<b>`` (pipeline sends and receives between stages a and b);
* ``seq`` numbers the instances of each group in time order, so one collective, or one
  send and its receive, has the same (group, seq) on every member; ``peer`` is the
  other rank of a send or receive;
* the sampled steps are laid end to end on one clock, in step order.

The columns ``dp_rank``, ``stage`` and ``mb_id`` are kept. A ``meta-<trial>.yaml``
next to ``trace-<trial>.parquet`` supplies the parallel sizes for the topology: every
``*_size`` in it must be a positive integer. Columns of the wrong type, values out of
range and a malformed meta file are refused with the file, row and column named.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import yaml

from trainhealth._internal.traces.files import kind_of, read_bytes, regular_file
from trainhealth._internal.traces.format import MAX_COUNT, MAX_RANK, TraceError, shown, validate
from trainhealth._internal.traces.io import Trace
from trainhealth._internal.traces.topology import Topology

__all__ = ["COLUMNS", "OPTYPES", "import_straggler_analysis", "looks_like_straggler_analysis"]

COLUMNS = ("dp_rank", "stage", "rank", "step", "optype", "start_ts", "duration", "seq_id")

#: optype -> (v1 op, group kind, instance kind): the instance kind tells instances apart within a group.
OPTYPES: dict[str, tuple[str, str | None, str]] = {
    "forward-compute": ("forward", None, ""),
    "backward-compute": ("backward", None, ""),
    "forward-send": ("send", "pp", "forward"),
    "forward-recv": ("recv", "pp", "forward"),
    "backward-send": ("send", "pp", "backward"),
    "backward-recv": ("recv", "pp", "backward"),
    "params-all-gather": ("all_gather", "dp", "params-all-gather"),
    "grads-reduce-scatter": ("reduce_scatter", "dp", "grads-reduce-scatter"),
    "layernorm-grads-all-reduce": ("all_reduce", "tp", "layernorm-grads-all-reduce"),
    "embedding-grads-all-reduce": ("all_reduce", "emb", "embedding-grads-all-reduce"),
    "optimizer": ("optimizer", None, ""),
    "optimizer-clip-main-grad": ("optimizer", None, ""),
    "gc": ("compute", None, ""),
    "first-op": ("compute", None, ""),
}


def looks_like_straggler_analysis(path: str | os.PathLike[str]) -> bool:
    path = Path(path)
    if path.suffix.lower() != ".parquet":
        return False
    try:
        if kind_of(path) != "file":  # never opens a pipe, a device or a directory
            return False
        names = set(pq.read_schema(path).names)
    except (pa.ArrowException, OSError, TraceError):
        return False
    return {"optype", "dp_rank", "stage", "start_ts"} <= names


def _meta(path: Path) -> dict[str, int]:
    candidate = path.with_name(path.name.replace("trace-", "meta-", 1)).with_suffix(".yaml")
    if candidate == path or kind_of(candidate) is None:
        return {}
    source = str(candidate)
    try:
        meta = yaml.safe_load(read_bytes(candidate, max_bytes=1 << 20).decode("utf-8"))
    except yaml.YAMLError as exc:
        raise TraceError(source, f"not valid YAML: {shown(str(exc).splitlines()[0] if str(exc) else exc)}") from None
    except UnicodeDecodeError:
        raise TraceError(source, "not valid YAML: not UTF-8 text") from None
    except RecursionError:
        raise TraceError(source, "not valid YAML: nested too deeply") from None
    if meta is None:
        return {}
    if not isinstance(meta, dict):
        raise TraceError(source, f"expected a mapping of keys to values, got {shown(meta)}")
    sizes = {}
    for key, value in meta.items():
        if not isinstance(key, str):
            raise TraceError(source, f"expected text keys, got {shown(key)}")
        if not key.endswith("_size"):
            continue
        if not isinstance(value, int) or isinstance(value, bool) or not 1 <= value <= MAX_RANK + 1:
            raise TraceError(source, f"{key} must be a positive integer up to {MAX_RANK + 1}, got {shown(value)}")
        if key != "world_size":
            sizes[key[: -len("_size")]] = value
    return sizes


#: StragglerAnalysis columns: (kind, smallest value, largest value)
_CHECKS = {
    "dp_rank": ("int", 0, MAX_RANK),
    "stage": ("int", 0, MAX_RANK),
    "rank": ("int", 0, MAX_RANK),
    "step": ("int", 0, MAX_COUNT),
    "seq_id": ("int", 0, MAX_COUNT),
    "mb_id": ("int", -1, MAX_COUNT),
    "start_ts": ("float", -1e12, 1e12),
    "duration": ("float", 0.0, 1e9),
}


def _checked(frame: pd.DataFrame, name: str, source: str) -> np.ndarray:
    """Column ``name`` as int64 or float64 values, or a :class:`TraceError` naming its first bad row."""
    kind, low, high = _CHECKS[name]
    raw = frame[name]
    if pd.api.types.is_bool_dtype(raw.dtype) or not (
        pd.api.types.is_numeric_dtype(raw.dtype) or raw.dtype == object or isinstance(raw.dtype, pd.CategoricalDtype)
    ):
        raise TraceError(source, f"expected numbers, got a column of {raw.dtype}", row=1, column=name)
    values = pd.to_numeric(
        raw if pd.api.types.is_numeric_dtype(raw.dtype) else raw.astype(object).map(_float_or_nan), errors="coerce"
    )
    numbers = values.to_numpy(dtype=np.float64, na_value=np.nan)
    bad = ~np.isfinite(numbers) | (numbers < low) | (numbers > high)
    if kind == "int":
        bad |= numbers % 1 != 0
    if bad.any():
        row = int(np.flatnonzero(bad)[0])
        expected = "an integer" if kind == "int" else "a number"
        raise TraceError(
            source,
            f"expected {expected} from {low:g} to {high:g}, got {shown(raw.iloc[row])}",
            row=row + 1,
            column=name,
        )
    return numbers.astype(np.int64) if kind == "int" else numbers


def _float_or_nan(value: object) -> float:
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, float, np.number)):
        return float("nan")
    return float(value)


def import_straggler_analysis(path: str | os.PathLike[str]) -> Trace:
    """A StragglerAnalysis parquet trace as trace format v1 records with a topology."""
    path = Path(path)
    source = str(path)
    if regular_file(path) == 0:
        raise TraceError(source, "empty file")
    try:
        with open(path, "rb") as handle:
            # one thread: Arrow's reader threads can abort the interpreter at exit (apache/arrow#34314)
            frame = pq.read_table(handle, use_threads=False).to_pandas()
    except (pa.ArrowException, OSError) as exc:
        raise TraceError(
            source,
            f"not a readable Parquet file (truncated or corrupt?): "
            f"{shown(str(exc).splitlines()[0] if str(exc) else exc)}",
        ) from None
    missing = [name for name in COLUMNS if name not in frame.columns]
    if missing:
        raise TraceError(source, "missing StragglerAnalysis column(s)", column=", ".join(missing))
    if frame.empty:
        raise TraceError(source, "no records (empty trace)")
    unknown = ~frame["optype"].map(lambda name: isinstance(name, str) and name in OPTYPES).to_numpy(dtype=bool)
    if unknown.any():
        row = int(np.flatnonzero(unknown)[0])
        raise TraceError(source, f"unknown optype {shown(frame['optype'].iloc[row])}", row=row + 1, column="optype")
    optype = frame["optype"].astype(str)
    checked = {name: _checked(frame, name, source) for name in _CHECKS if name in frame.columns}

    meta = _meta(path)
    tp = meta.get("tp", 1)
    dp, stage, rank = checked["dp_rank"], checked["stage"], checked["rank"]
    tp_index = rank % tp
    mapped = optype.map(lambda name: OPTYPES[name])
    op = mapped.map(lambda item: item[0]).to_numpy(dtype=object)
    group_kind = mapped.map(lambda item: item[1]).to_numpy(dtype=object)
    instance_kind = mapped.map(lambda item: item[2]).to_numpy(dtype=object)
    is_send = op == "send"
    is_recv = op == "recv"
    forward = np.array([name.startswith("forward") for name in optype])
    # the other stage of a pipeline transfer: forward goes up a stage, backward comes back down
    peer_stage = np.where(forward == is_send, stage + 1, stage - 1)
    low, high = np.minimum(stage, peer_stage), np.maximum(stage, peer_stage)

    groups = np.empty(len(frame), dtype=object)
    for index in range(len(frame)):
        kind = group_kind[index]
        if kind == "dp":
            groups[index] = f"dp-s{stage[index]}-t{tp_index[index]}"
        elif kind == "tp":
            groups[index] = f"tp-d{dp[index]}-s{stage[index]}"
        elif kind == "emb":
            groups[index] = f"emb-d{dp[index]}-t{tp_index[index]}"
        elif kind == "pp":
            groups[index] = f"pp-d{dp[index]}-t{tp_index[index]}-s{low[index]}-{high[index]}"
        else:
            groups[index] = None

    rank_at = {(d, s, t): r for d, s, t, r in zip(dp, stage, tp_index, rank)}
    peers = pd.array(
        [
            rank_at.get((d, ps, t)) if (snd or rcv) else None
            for d, ps, t, snd, rcv in zip(dp, peer_stage, tp_index, is_send, is_recv)
        ],
        dtype="Int64",
    )

    steps, relative, duration = checked["step"], checked["start_ts"], checked["duration"]
    span = pd.Series(relative + duration).groupby(steps).max()
    origin = dict(zip(span.index, np.concatenate([[0.0], np.cumsum(span.to_numpy())[:-1]])))
    start = relative + np.array([origin[s] for s in steps])

    records = pd.DataFrame(
        {
            "rank": rank,
            "step": steps,
            "op": op,
            "group": groups,
            "seq": pd.array([None] * len(frame), dtype="Int64"),
            "start": start,
            "duration": duration,
            "peer": peers,
            "dp_rank": dp,
            "stage": stage,
            "mb_id": checked["mb_id"] if "mb_id" in checked else -1,
        }
    )
    records["seq"] = _instance_numbers(records, instance_kind, checked["seq_id"])
    records = validate(records, source)
    parallelism = {"dp": int(dp.max()) + 1, "pp": int(stage.max()) + 1, "tp": tp} | {
        k: v for k, v in meta.items() if v > 1
    }
    members = records.dropna(subset=["group"]).groupby("group")["rank"].unique()
    topology = Topology(
        groups={str(g): tuple(sorted(int(r) for r in m)) for g, m in members.items()}, parallelism=parallelism
    )
    return Trace(records, topology, (source,))


def _instance_numbers(records: pd.DataFrame, instance_kind: np.ndarray, seq_id: np.ndarray) -> pd.Series:
    """Number each group's instances in time order; the members of one instance share the number."""
    communication = records["group"].notna().to_numpy()
    keys = pd.DataFrame(
        {
            "group": records["group"],
            "step": records["step"],
            "kind": instance_kind,
            "seq_id": seq_id,
            "start": records["start"],
        }
    )[communication]
    first_start = keys.groupby(["group", "step", "kind", "seq_id"], sort=False)["start"].transform("min")
    keys = keys.assign(first=first_start)
    order = keys.drop_duplicates(["group", "step", "kind", "seq_id"]).sort_values(
        ["group", "step", "first", "kind", "seq_id"]
    )
    order["number"] = order.groupby("group").cumcount()
    numbered = keys.merge(
        order[["group", "step", "kind", "seq_id", "number"]], on=["group", "step", "kind", "seq_id"], how="left"
    )
    out = pd.Series(pd.array([None] * len(records), dtype="Int64"))
    out[np.flatnonzero(communication)] = numbered["number"].to_numpy()
    return out
