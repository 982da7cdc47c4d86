"""Importer for PyTorch Flight Recorder dumps (one pickle per rank).

Flight Recorder keeps the last ``TORCH_FR_BUFFER_SIZE`` (formerly
``TORCH_NCCL_TRACE_BUFFER_SIZE``) collectives of every process group and dumps
them on a timeout (``TORCH_NCCL_DUMP_ON_TIMEOUT``) or on request
(``torch._C._distributed_c10d._dump_fr_trace()``), one file per rank whose name
ends with the rank (``nccl_trace_rank_3``). Each entry has ``profiling_name``
(``nccl:all_reduce``), ``process_group`` (name, description),
``collective_seq_id`` / ``p2p_seq_id``, ``time_created_ns``,
``time_discovered_started_ns`` / ``..._completed_ns``, optionally ``duration_ms``,
input sizes and dtypes, and ``state``.

Mapping to trace format v1: ``group`` is the process group's name (the same on
every member), and for a send or receive ``<name>:<src>-><dst>``; ``seq`` is the
collective sequence id, and for sends and receives their order within that
direction; ``start`` the
discovered start time, else the creation time; ``duration`` is ``duration_ms``,
else completed minus started, else 0 with the extra column ``state`` telling why
(gloo records only that a collective was scheduled). ``step`` is 0: Flight
Recorder knows no steps. The extra columns ``state`` and ``pg_desc`` are kept.
Dumps are read with an unpickler that only builds plain containers, so a dump
cannot run code.
"""

from __future__ import annotations

import io
import os
import pickle
import re
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from trainhealth.traces.format import TraceError, validate
from trainhealth.traces.io import Trace
from trainhealth.traces.topology import Topology

__all__ = ["import_flight_recorder", "looks_like_flight_recorder"]

_OPS = {
    "all_reduce": "all_reduce", "allreduce": "all_reduce", "allreduce_coalesced": "all_reduce",
    "all_reduce_coalesced": "all_reduce",
    "all_gather": "all_gather", "allgather": "all_gather", "_allgather_base": "all_gather",
    "all_gather_into_tensor": "all_gather", "all_gather_into_tensor_coalesced": "all_gather",
    "allgather_into_tensor_coalesced": "all_gather",
    "reduce_scatter": "reduce_scatter", "_reduce_scatter_base": "reduce_scatter",
    "reduce_scatter_tensor": "reduce_scatter", "reduce_scatter_tensor_coalesced": "reduce_scatter",
    "all_to_all": "all_to_all", "alltoall": "all_to_all", "alltoall_base": "all_to_all",
    "all_to_all_single": "all_to_all",
    "broadcast": "broadcast", "reduce": "reduce", "barrier": "barrier",
    "send": "send", "recv": "recv",
}
_DTYPE_BYTES = {"Float": 4, "Double": 8, "Half": 2, "BFloat16": 2, "Long": 8, "Int": 4, "Short": 2, "Char": 1,
                "Byte": 1, "Bool": 1, "Float8_e4m3fn": 1, "Float8_e5m2": 1, "ComplexFloat": 8, "ComplexDouble": 16}
_PEER = re.compile(r"(\d+)\s*(?:->|<-)\s*(\d+)")


class _PlainUnpickler(pickle.Unpickler):
    """Builds dicts, lists, tuples, strings and numbers; refuses every class."""

    def find_class(self, module: str, name: str) -> Any:
        raise pickle.UnpicklingError(f"refusing to load {module}.{name}: a Flight Recorder dump holds only plain data")


def looks_like_flight_recorder(path: str | os.PathLike[str]) -> bool:
    try:
        with open(path, "rb") as handle:
            return handle.read(1) == b"\x80"
    except OSError:
        return False


def _rank_of(path: Path) -> int:
    match = re.search(r"(\d+)(?:\.\w+)?$", path.name)
    if match is None:
        raise TraceError(str(path), "cannot tell the rank: Flight Recorder dump names end with it (nccl_trace_rank_3)")
    return int(match.group(1))


def _load(path: Path) -> dict[str, Any]:
    try:
        data = _PlainUnpickler(io.BytesIO(path.read_bytes())).load()
    except (pickle.UnpicklingError, EOFError, ValueError, TypeError, AttributeError) as exc:
        raise TraceError(str(path), f"not a readable Flight Recorder dump (truncated or not a pickle?): {exc}") from None
    if not isinstance(data, dict) or "entries" not in data:
        raise TraceError(str(path), "not a Flight Recorder dump: no 'entries'")
    return data


def _bytes(entry: dict[str, Any]) -> int | None:
    sizes, dtypes = entry.get("input_sizes") or [], entry.get("input_dtypes") or []
    if not sizes or len(sizes) != len(dtypes) or any(d not in _DTYPE_BYTES for d in dtypes):
        return None
    return int(sum(int(np.prod(shape)) * _DTYPE_BYTES[dtype] for shape, dtype in zip(sizes, dtypes)))


def import_flight_recorder(paths: Iterable[str | os.PathLike[str]]) -> tuple[Trace, dict[str, int]]:
    """Flight Recorder dumps as v1 records, and the count of entries skipped per unrecognised operation."""
    rows: list[dict[str, Any]] = []
    groups: dict[str, tuple[int, ...]] = {}
    skipped: dict[str, int] = {}
    sources = []
    for path in map(Path, paths):
        sources.append(str(path))
        rank = _rank_of(path)
        dump = _load(path)
        for name, config in (dump.get("pg_config") or {}).items():
            members = config.get("ranks") if isinstance(config, dict) else None
            if isinstance(members, str):
                members = [int(part) for part in re.findall(r"\d+", members)]
            if members:
                groups[str(name)] = tuple(sorted(members))
        for position, entry in enumerate(dump["entries"]):
            if not isinstance(entry, dict):
                raise TraceError(str(path), "an entry is not a dictionary", row=position + 1)
            kind = str(entry.get("profiling_name", "")).split(":", 1)[-1].split(" ", 1)[0]
            op = _OPS.get(kind)
            if op is None:
                skipped[kind or "(none)"] = skipped.get(kind or "(none)", 0) + 1
                continue
            rows.append(_row(entry, rank, op, str(path), position))
    if not rows:
        raise TraceError(", ".join(sources), "no collectives in these Flight Recorder dumps")
    frame = _number_p2p(pd.DataFrame.from_records(rows))
    records = validate(frame, ", ".join(sources))
    # pg_config names the members where its keys match the entries' group names (torch leaves the
    # default group's key empty); elsewhere the members are the ranks that recorded the group.
    observed = records.groupby("group")["rank"].unique()
    members = {str(g): groups.get(str(g), tuple(sorted(int(r) for r in ranks))) for g, ranks in observed.items()}
    return Trace(records, Topology(groups=members), tuple(sources)), skipped


def _number_p2p(frame: pd.DataFrame) -> pd.DataFrame:
    """Give sends and receives a group per direction (``pg:src->dst``) numbered in order on each side,
    so a send and its receive share (group, seq) as trace format v1 requires."""
    p2p = frame["op"].isin(["send", "recv"]) & frame["peer"].notna()
    if not p2p.any():
        return frame
    sub = frame[p2p]
    source = sub["rank"].where(sub["op"] == "send", sub["peer"]).astype(int)
    target = sub["peer"].where(sub["op"] == "send", sub["rank"]).astype(int)
    frame.loc[p2p, "group"] = sub["group"] + ":" + source.astype(str) + "->" + target.astype(str)
    frame.loc[p2p, "seq"] = frame[p2p].sort_values("start", kind="stable").groupby(["rank", "group"]).cumcount()
    return frame


def _row(entry: dict[str, Any], rank: int, op: str, path: str, position: int) -> dict[str, Any]:
    process_group = entry.get("process_group") or (entry.get("pg_id", ""), "")
    is_p2p = bool(entry.get("is_p2p")) or op in ("send", "recv")
    seq = entry.get("p2p_seq_id" if is_p2p else "collective_seq_id")
    created = entry.get("time_created_ns")
    started = entry.get("time_discovered_started_ns")
    completed = entry.get("time_discovered_completed_ns")
    begun = started if started is not None else created
    if begun is None:
        raise TraceError(path, "entry has no time", row=position + 1, column="time_created_ns")
    if entry.get("duration_ms") is not None:
        duration = float(entry["duration_ms"]) / 1e3
    elif started is not None and completed is not None:
        duration = max(0.0, (completed - started) / 1e9)
    else:
        duration = 0.0
    peer = None
    if is_p2p:
        match = _PEER.search(str(entry.get("profiling_name", "")))
        if match:
            first, second = int(match.group(1)), int(match.group(2))
            peer = second if first == rank else first
    return {
        "rank": rank, "step": 0, "op": op, "group": str(process_group[0]), "seq": seq,
        "start": begun / 1e9, "duration": duration,
        "bytes": _bytes(entry), "peer": peer, "state": str(entry.get("state", "")),
        "pg_desc": str(process_group[1]) if len(process_group) > 1 else "",
    }
