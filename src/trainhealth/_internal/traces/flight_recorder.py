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
cannot run code. Every field used is checked for its type and range (names are
text, sequence ids and times numbers, sizes lists of dimensions): a dump that
does not hold what Flight Recorder writes is refused with the file and entry
named, never half-read.
"""

from __future__ import annotations

import io
import math
import os
import pickle
import re
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pandas as pd

from trainhealth._internal.traces.files import read_bytes
from trainhealth._internal.traces.format import MAX_COUNT, MAX_RANK, TraceError, shown, validate
from trainhealth._internal.traces.io import Trace
from trainhealth._internal.traces.topology import Topology

__all__ = ["import_flight_recorder", "looks_like_flight_recorder"]

_OPS = {
    "all_reduce": "all_reduce",
    "allreduce": "all_reduce",
    "allreduce_coalesced": "all_reduce",
    "all_reduce_coalesced": "all_reduce",
    "all_gather": "all_gather",
    "allgather": "all_gather",
    "_allgather_base": "all_gather",
    "all_gather_into_tensor": "all_gather",
    "all_gather_into_tensor_coalesced": "all_gather",
    "allgather_into_tensor_coalesced": "all_gather",
    "reduce_scatter": "reduce_scatter",
    "_reduce_scatter_base": "reduce_scatter",
    "reduce_scatter_tensor": "reduce_scatter",
    "reduce_scatter_tensor_coalesced": "reduce_scatter",
    "all_to_all": "all_to_all",
    "alltoall": "all_to_all",
    "alltoall_base": "all_to_all",
    "all_to_all_single": "all_to_all",
    "broadcast": "broadcast",
    "reduce": "reduce",
    "barrier": "barrier",
    "send": "send",
    "recv": "recv",
}
_DTYPE_BYTES = {
    "Float": 4,
    "Double": 8,
    "Half": 2,
    "BFloat16": 2,
    "Long": 8,
    "Int": 4,
    "Short": 2,
    "Char": 1,
    "Byte": 1,
    "Bool": 1,
    "Float8_e4m3fn": 1,
    "Float8_e5m2": 1,
    "ComplexFloat": 8,
    "ComplexDouble": 16,
}
_PEER = re.compile(r"(\d+)\s*(?:->|<-)\s*(\d+)")


class _PlainUnpickler(pickle.Unpickler):
    """Builds dicts, lists, tuples, strings and numbers; refuses every class."""

    def find_class(self, module: str, name: str) -> Any:
        raise pickle.UnpicklingError(f"refusing to load {module}.{name}: a Flight Recorder dump holds only plain data")


#: Digits a rank has at most (a minus sign included).
_RANK_DIGITS = len(str(MAX_RANK)) + 1
#: The largest dump read: Flight Recorder keeps 2,000 entries per rank by default, a few MiB.
MAX_DUMP_BYTES = 1 << 30


def looks_like_flight_recorder(path: str | os.PathLike[str]) -> bool:
    """Whether ``path`` is a regular file that starts as a pickle does (never opens a pipe or a device)."""
    try:
        descriptor = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    except OSError:
        return False
    try:
        return os.path.isfile(path) and os.read(descriptor, 1) == b"\x80"
    except OSError:
        return False
    finally:
        os.close(descriptor)


def _rank_of(path: Path) -> int:
    match = re.search(r"(\d+)(?:\.\w+)?$", path.name)
    if match is None:
        raise TraceError(str(path), "cannot tell the rank: Flight Recorder dump names end with it (nccl_trace_rank_3)")
    if len(match.group(1)) > 10 or int(match.group(1)) > MAX_RANK:
        raise TraceError(
            str(path), f"rank {shown(int(match.group(1)))} in the file name is out of range (at most {MAX_RANK})"
        )
    return int(match.group(1))


def _load(path: Path) -> dict[str, Any]:
    data = read_bytes(path, max_bytes=MAX_DUMP_BYTES)
    try:
        dump = _PlainUnpickler(io.BytesIO(data)).load()
    except RecursionError:
        raise TraceError(str(path), "not a readable Flight Recorder dump: nested too deeply") from None
    except Exception as exc:  # a malformed pickle raises almost anything (KeyError, IndexError, MemoryError, ...)
        raise TraceError(
            str(path),
            f"not a readable Flight Recorder dump (truncated or not a pickle?): "
            f"{type(exc).__name__}: {shown(str(exc))}",
        ) from None
    if not isinstance(dump, dict) or "entries" not in dump:
        raise TraceError(str(path), "not a Flight Recorder dump: no 'entries'")
    if not isinstance(dump["entries"], list):
        raise TraceError(str(path), f"not a Flight Recorder dump: 'entries' is {shown(dump['entries'])}, not a list")
    return dump


def _group_members(config: Any, path: Path) -> dict[str, tuple[int, ...]]:
    """``pg_config``: process group name -> member ranks (torch writes the ranks as a list or its text)."""
    if config is None:
        return {}
    if not isinstance(config, dict):
        raise TraceError(str(path), f"pg_config must be a dictionary, got {shown(config)}")
    groups = {}
    for name, entry in config.items():
        if not isinstance(entry, dict):
            raise TraceError(str(path), f"pg_config[{shown(name)}] must be a dictionary, got {shown(entry)}")
        members = entry.get("ranks")
        if isinstance(members, str):
            members = _ranks_in(members)
        if members is None:
            continue
        if not isinstance(members, (list, tuple)) or not all(
            isinstance(r, int) and not isinstance(r, bool) and 0 <= r <= MAX_RANK for r in members
        ):
            raise TraceError(
                str(path),
                f"pg_config[{shown(name)}].ranks must list ranks from 0 to {MAX_RANK}, got {shown(entry.get('ranks'))}",
            )
        if members:  # torch 2.13's gloo dumps file the default group (named "0") under an empty name
            groups[str(name) or "0"] = tuple(sorted(members))
    return groups


def _ranks_in(text: str) -> list[int] | str:
    """The ranks torch writes as text (``"[0, 1, 2]"``); ``text`` itself, to be refused, where a number is too long
    to be a rank (``int`` of 5,000 digits raises) or there are more numbers than ranks can be."""
    ranks: list[int] = []
    for number in re.finditer(r"-?\d+", text):
        if len(number.group()) > _RANK_DIGITS or len(ranks) > MAX_RANK:
            return text
        ranks.append(int(number.group()))
    return ranks


def _bytes(entry: dict[str, Any], fail: Any) -> int | None:
    """The message size from ``input_sizes`` and ``input_dtypes``; None when a dtype is unknown."""
    sizes, dtypes = entry.get("input_sizes"), entry.get("input_dtypes")
    if sizes is None or dtypes is None:
        return None
    if not isinstance(sizes, list) or not all(
        isinstance(shape, (list, tuple))
        and all(isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape)
        for shape in sizes
    ):
        raise fail(f"input_sizes must be a list of shapes (lists of dimensions), got {shown(sizes)}")
    if not isinstance(dtypes, list) or not all(isinstance(d, str) for d in dtypes):
        raise fail(f"input_dtypes must be a list of type names, got {shown(dtypes)}")
    if not sizes or len(sizes) != len(dtypes) or any(d not in _DTYPE_BYTES for d in dtypes):
        return None
    total = sum(math.prod(shape) * _DTYPE_BYTES[dtype] for shape, dtype in zip(sizes, dtypes))
    if total > MAX_COUNT:
        raise fail(f"input_sizes give {shown(total)} bytes: out of range (at most {MAX_COUNT})")
    return int(total)


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
        groups.update(_group_members(dump.get("pg_config"), path))
        for position, entry in enumerate(dump["entries"]):
            if not isinstance(entry, dict):
                raise TraceError(str(path), f"an entry is not a dictionary: {shown(entry)}", row=position + 1)
            name = entry.get("profiling_name", "")
            if not isinstance(name, str):
                raise TraceError(str(path), f"profiling_name must be text, got {shown(name)}", row=position + 1)
            kind = name.split(":", 1)[-1].split(" ", 1)[0]
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
    def fail(problem: str) -> TraceError:
        return TraceError(path, problem, row=position + 1)

    def number(key: str, limit: float) -> float | None:
        value = entry.get(key)
        if value is None:
            return None
        if (
            isinstance(value, bool)
            or not isinstance(value, (int, float))
            or not math.isfinite(value)
            or abs(value) > limit
        ):
            raise fail(f"{key} must be a finite number up to {limit:g}, got {shown(value)}")
        return value

    process_group = entry.get("process_group")
    if process_group is None:
        process_group = (entry.get("pg_id", ""), "")
    if (
        not isinstance(process_group, (tuple, list))
        or not 1 <= len(process_group) <= 2
        or not all(isinstance(part, (str, int)) and not isinstance(part, bool) for part in process_group)
    ):
        raise fail(f"process_group must be (name, description), got {shown(process_group)}")
    is_p2p = bool(entry.get("is_p2p")) or op in ("send", "recv")
    seq = entry.get("p2p_seq_id" if is_p2p else "collective_seq_id")
    created = number("time_created_ns", 1e21)  # nanoseconds: within 10^12 s of the epoch, as trace starts are
    started = number("time_discovered_started_ns", 1e21)
    completed = number("time_discovered_completed_ns", 1e21)
    duration_ms = number("duration_ms", 1e12)
    begun = started if started is not None else created
    if begun is None:
        raise TraceError(path, "entry has no time", row=position + 1, column="time_created_ns")
    if duration_ms is not None:
        duration = duration_ms / 1e3
    elif started is not None and completed is not None:
        duration = max(0.0, (completed - started) / 1e9)
    else:
        duration = 0.0
    peer = None
    if is_p2p:
        match = _PEER.search(str(entry.get("profiling_name", "")))
        if match:
            if max(len(match.group(1)), len(match.group(2))) > 10 or max(map(int, match.groups()[:2])) > MAX_RANK:
                raise fail(f"profiling_name {shown(entry.get('profiling_name'))} names a rank above {MAX_RANK}")
            first, second = int(match.group(1)), int(match.group(2))
            peer = second if first == rank else first
    state = entry.get("state", "")
    return {
        "rank": rank,
        "step": 0,
        "op": op,
        "group": str(process_group[0]),
        "seq": seq,
        "start": begun / 1e9,
        "duration": duration,
        "bytes": _bytes(entry, fail),
        "peer": peer,
        "state": state if isinstance(state, str) else shown(state),
        "pg_desc": str(process_group[1]) if len(process_group) > 1 else "",
    }
