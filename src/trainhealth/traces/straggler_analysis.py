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
next to ``trace-<trial>.parquet`` supplies the parallel sizes for the topology.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import yaml

from trainhealth.traces.format import TraceError, validate
from trainhealth.traces.io import Trace
from trainhealth.traces.topology import Topology

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
        names = set(pq.read_schema(path).names)
    except (pa.ArrowException, OSError):
        return False
    return {"optype", "dp_rank", "stage", "start_ts"} <= names


def _meta(path: Path) -> dict[str, int]:
    candidate = path.with_name(path.name.replace("trace-", "meta-", 1)).with_suffix(".yaml")
    if candidate == path or not candidate.is_file():
        return {}
    try:
        meta = yaml.safe_load(candidate.read_text(encoding="utf-8")) or {}
    except yaml.YAMLError as exc:
        raise TraceError(str(candidate), f"not valid YAML: {exc}") from None
    return {key[: -len("_size")]: int(value) for key, value in meta.items()
            if key.endswith("_size") and key != "world_size" and isinstance(value, int)}


def import_straggler_analysis(path: str | os.PathLike[str]) -> Trace:
    """A StragglerAnalysis parquet trace as trace format v1 records with a topology."""
    path = Path(path)
    source = str(path)
    try:
        frame = pq.read_table(path).to_pandas()
    except (pa.ArrowException, OSError) as exc:
        raise TraceError(source, f"not a readable Parquet file (truncated or corrupt?): {exc}") from None
    missing = [name for name in COLUMNS if name not in frame.columns]
    if missing:
        raise TraceError(source, "missing StragglerAnalysis column(s)", column=", ".join(missing))
    if frame.empty:
        raise TraceError(source, "no records (empty trace)")
    optype = frame["optype"].astype(str)
    unknown = ~optype.isin(list(OPTYPES))
    if unknown.any():
        row = int(np.flatnonzero(unknown.to_numpy())[0])
        raise TraceError(source, f"unknown optype {optype.iloc[row]!r}", row=row + 1, column="optype")

    meta = _meta(path)
    tp = meta.get("tp", 1)
    dp = frame["dp_rank"].astype(np.int64).to_numpy()
    stage = frame["stage"].astype(np.int64).to_numpy()
    rank = frame["rank"].astype(np.int64).to_numpy()
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
    peers = pd.array([rank_at.get((d, ps, t)) if (snd or rcv) else None
                      for d, ps, t, snd, rcv in zip(dp, peer_stage, tp_index, is_send, is_recv)], dtype="Int64")

    steps = frame["step"].astype(np.int64).to_numpy()
    relative = frame["start_ts"].astype(np.float64).to_numpy()
    duration = frame["duration"].astype(np.float64).to_numpy()
    span = pd.Series(relative + duration).groupby(steps).max()
    origin = dict(zip(span.index, np.concatenate([[0.0], np.cumsum(span.to_numpy())[:-1]])))
    start = relative + np.array([origin[s] for s in steps])

    records = pd.DataFrame({
        "rank": rank, "step": steps, "op": op, "group": groups, "seq": pd.array([None] * len(frame), dtype="Int64"),
        "start": start, "duration": duration, "peer": peers,
        "dp_rank": dp, "stage": stage,
        "mb_id": frame["mb_id"].astype(np.int64).to_numpy() if "mb_id" in frame.columns else -1,
    })
    records["seq"] = _instance_numbers(records, instance_kind, frame["seq_id"].astype(np.int64).to_numpy())
    records = validate(records, source)
    parallelism = {"dp": int(dp.max()) + 1, "pp": int(stage.max()) + 1, "tp": tp} | {k: v for k, v in meta.items() if v > 1}
    members = records.dropna(subset=["group"]).groupby("group")["rank"].unique()
    topology = Topology(groups={str(g): tuple(sorted(int(r) for r in m)) for g, m in members.items()},
                        parallelism=parallelism)
    return Trace(records, topology, (source,))


def _instance_numbers(records: pd.DataFrame, instance_kind: np.ndarray, seq_id: np.ndarray) -> pd.Series:
    """Number each group's instances in time order; the members of one instance share the number."""
    communication = records["group"].notna().to_numpy()
    keys = pd.DataFrame({
        "group": records["group"], "step": records["step"], "kind": instance_kind, "seq_id": seq_id,
        "start": records["start"],
    })[communication]
    first_start = keys.groupby(["group", "step", "kind", "seq_id"], sort=False)["start"].transform("min")
    keys = keys.assign(first=first_start)
    order = (keys.drop_duplicates(["group", "step", "kind", "seq_id"])
             .sort_values(["group", "step", "first", "kind", "seq_id"]))
    order["number"] = order.groupby("group").cumcount()
    numbered = keys.merge(order[["group", "step", "kind", "seq_id", "number"]],
                          on=["group", "step", "kind", "seq_id"], how="left")
    out = pd.Series(pd.array([None] * len(records), dtype="Int64"))
    out[np.flatnonzero(communication)] = numbered["number"].to_numpy()
    return out
