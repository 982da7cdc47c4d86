"""Reading any supported trace (v1, Flight Recorder, StragglerAnalysis) and writing v1.

``trainhealth trace convert`` and ``trainhealth trace info`` go through :func:`load_any`.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

import pandas as pd

from trainhealth._internal.traces.files import kind_of
from trainhealth._internal.traces.flight_recorder import import_flight_recorder, looks_like_flight_recorder
from trainhealth._internal.traces.format import TraceError
from trainhealth._internal.traces.io import Trace, is_trace_file, read_trace, write_trace
from trainhealth._internal.traces.straggler_analysis import import_straggler_analysis, looks_like_straggler_analysis
from trainhealth._internal.traces.topology import TOPOLOGY_FILE, Topology

__all__ = ["INPUT_KINDS", "detect_kind", "load_any", "outputs_of", "save"]

INPUT_KINDS = ("auto", "v1", "flight-recorder", "straggler-analysis")


def detect_kind(path: Path) -> str:
    if kind_of(path) == "directory" and _flight_recorder_files(path):
        return "flight-recorder"
    if kind_of(path) != "file":  # a directory of v1 files; anything else the v1 reader refuses by name
        return "v1"
    if looks_like_straggler_analysis(path):
        return "straggler-analysis"
    if not is_trace_file(path) and looks_like_flight_recorder(path):
        return "flight-recorder"
    return "v1"


def load_any(
    paths: Sequence[str | os.PathLike[str]],
    kind: str = "auto",
    topology: str | os.PathLike[str] | None = None,
    categorical: bool = False,
    unread: frozenset[str] = frozenset(),
) -> tuple[Trace, list[str]]:
    """All inputs as one v1 trace, with notes for the user (skipped entries and the like); ``categorical``
    and ``unread`` apply to v1 files (see :func:`.io.read_trace_file`)."""
    if kind not in INPUT_KINDS:
        raise TraceError(
            ", ".join(map(str, paths)), f"unknown input kind {kind!r}; expected one of {', '.join(INPUT_KINDS)}"
        )
    by_kind: dict[str, list[Path]] = {}
    for path in map(Path, paths):
        if kind_of(path) is None:
            raise TraceError(str(path), "no such file or directory")
        by_kind.setdefault(detect_kind(path) if kind == "auto" else kind, []).append(path)
    traces, notes = [], []
    for found, files in by_kind.items():
        if found == "flight-recorder":
            dumps = []
            for file in files:
                found_dumps = _flight_recorder_files(file) if file.is_dir() else [file]
                if not found_dumps:
                    raise TraceError(
                        str(file),
                        "no Flight Recorder dumps in this directory (one file per rank, "
                        "named with the rank at its end: rank_3)",
                    )
                dumps += found_dumps
            trace, skipped = import_flight_recorder(dumps)
            notes += [
                f"skipped {count} Flight Recorder entr{'y' if count == 1 else 'ies'} of unrecognised operation {name!r}"
                for name, count in sorted(skipped.items())
            ]
        elif found == "straggler-analysis":
            imported = [import_straggler_analysis(file) for file in files]
            trace = imported[0] if len(imported) == 1 else _merge(imported)
        else:
            trace = read_trace(files, topology, categorical, unread)
        traces.append(trace)
    return (traces[0] if len(traces) == 1 else _merge(traces)), notes


def _merge(traces: list[Trace]) -> Trace:
    records = pd.concat([t.records for t in traces], ignore_index=True)
    groups: dict[str, tuple[int, ...]] = {}
    hosts: dict[int, str] = {}
    parallelism: dict[str, int] = {}
    for t in traces:
        if t.topology is not None:
            groups.update(t.topology.groups)
            hosts.update(t.topology.hosts)
            parallelism.update(t.topology.parallelism)
    topology = Topology(groups, hosts, parallelism) if (groups or hosts or parallelism) else None
    return Trace(records, topology, tuple(s for t in traces for s in t.sources))


def outputs_of(output: str | os.PathLike[str]) -> list[Path]:
    """The files :func:`save` writes for ``output`` (a trace file, or a directory's trace and topology)."""
    output = Path(output)
    return [output] if is_trace_file(output) else [output / "trace.parquet", output / TOPOLOGY_FILE]


def save(trace: Trace, output: str | os.PathLike[str]) -> list[Path]:
    """Write ``trace`` to a file (the extension picks the format) or, for a directory, to
    ``trace.parquet`` plus ``topology.json``. Returns the files written."""
    output = Path(output)
    if is_trace_file(output):
        write_trace(trace.records, output)
        return [output]
    output.mkdir(parents=True, exist_ok=True)
    written = [output / "trace.parquet"]
    write_trace(trace.records, written[0])
    if trace.topology is not None:
        trace.topology.save(output / TOPOLOGY_FILE)
        written.append(output / TOPOLOGY_FILE)
    return written


def _flight_recorder_files(directory: Path) -> list[Path]:
    """The Flight Recorder dumps of a directory (one per rank, named ``<prefix><rank>``), when every file in it
    that is not hidden is one; else none."""
    files = sorted(p for p in directory.iterdir() if not p.name.startswith(".")) if directory.is_dir() else []
    if files and all(p.is_file() and p.name[-1:].isdigit() and looks_like_flight_recorder(p) for p in files):
        return files
    return []
