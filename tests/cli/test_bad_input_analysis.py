"""Generated bad input for the analysis commands: each case is refused in one line with exit status 2, with no
traceback and no hang, and leaves every file where it was as it was; good input is still accepted.

Commands: ``trace info``, ``trace convert``, ``localize``, ``sim``, ``detect``, ``bench nab``, ``metrics``,
``config``, ``selftest`` and ``probe`` (its options only: no probe runs). Readers: trace format v1 (``.jsonl``,
``.jsonl.gz``, ``.csv``, ``.csv.gz``, ``.parquet``), the topology sidecar, Flight Recorder dumps, StragglerAnalysis
traces and their meta YAML, link probe results, the series ``detect`` reads and NAB's data layout.

Hypothesis draws the cases (derandomized, a fixed number per test); every case is its own invocation of the real
command in a fresh interpreter. Pickles hold plain data only (dicts, lists, strings, numbers): nothing that runs
code when loaded.
"""

from __future__ import annotations

import gzip
import io
import json
import os
import pickle
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

hypothesis = pytest.importorskip("hypothesis")
pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")

from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from tests.cli.badinput import assert_refused, run_cli, snapshot  # noqa: E402
from tests.tiers import sweep  # noqa: E402

#: seconds a case may take before it counts as a hang (the slowest refusal takes about 2 s)
CASE_TIMEOUT_S = 120.0  # a hang, not a slow start on a busy machine: pandas and torch take seconds to import


def examples(count: int) -> settings:
    """A fixed, reproducible number of generated cases per test."""
    return settings(
        max_examples=count,
        derandomize=True,
        deadline=None,
        database=None,
        print_blob=False,
        suppress_health_check=list(HealthCheck),
    )


# --------------------------------------------------------------------------------------------------- cases


@dataclass(frozen=True)
class Fifo:
    """A named pipe: reading it blocks until a writer comes, which none does."""


@dataclass(frozen=True)
class Directory:
    pass


@dataclass(frozen=True)
class Link:
    target: str  # relative to the link's directory


Content = bytes | Fifo | Directory | Link


@dataclass(frozen=True)
class Case:
    """One invocation: ``{d}`` in the arguments, the environment and ``mentions`` is the case's directory."""

    args: tuple[str, ...]
    files: tuple[tuple[str, Content], ...] = ()
    mentions: tuple[str, ...] = ()  # what the error line must name (a file, a row, a column, an option)
    env: tuple[tuple[str, str], ...] = ()

    def with_files(self, *files: tuple[str, Content]) -> Case:
        return Case(self.args, self.files + files, self.mentions, self.env)


def _materialize(root: Path, files: tuple[tuple[str, Content], ...]) -> None:
    for name, content in files:
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(content, bytes):
            path.write_bytes(content)
        elif isinstance(content, Fifo):
            os.mkfifo(path)
        elif isinstance(content, Directory):
            path.mkdir(exist_ok=True)
        else:
            path.symlink_to(content.target)


def _tree(root: Path) -> tuple[dict[str, str], list[tuple[str, str]]]:
    """File digests, and every entry (directories, pipes, links included) with its kind."""
    entries = []
    for directory, names, files in os.walk(root):
        for name in names + files:
            path = Path(directory, name)
            kind = "link" if path.is_symlink() else "dir" if path.is_dir() else "file" if path.is_file() else "other"
            entries.append((str(path.relative_to(root)), kind))
    return snapshot(root), sorted(entries)


def _fill(text: str, root: Path) -> str:
    return text.replace("{d}", str(root))


def _run(case: Case, root: Path):
    return run_cli(
        *(_fill(arg, root) for arg in case.args),
        cwd=root,
        env={key: _fill(value, root) for key, value in case.env},
        timeout_s=CASE_TIMEOUT_S,
    )


def refuse(case: Case) -> None:
    """Run ``case``: exit 2, one ``trainhealth: error:`` line naming what it must, nothing changed."""
    with tempfile.TemporaryDirectory(prefix="badinput-") as tmp:
        root = Path(tmp)
        _materialize(root, case.files)
        before = _tree(root)
        result = _run(case, root)
        line = assert_refused(result)
        assert len(result.stderr.strip().splitlines()) == 1, result.stderr
        for mention in case.mentions:
            assert _fill(mention, root) in line, f"{line!r} does not name {_fill(mention, root)!r}"
        assert len(line) < 500, line
        assert _tree(root) == before, "the command changed or left files behind"


def accept(case: Case) -> str:
    """Run ``case``: exit 0, no traceback; its standard output."""
    with tempfile.TemporaryDirectory(prefix="goodinput-") as tmp:
        root = Path(tmp)
        _materialize(root, case.files)
        before = snapshot(root)
        result = _run(case, root)
        assert "Traceback" not in result.stderr, result.stderr
        assert result.returncode == 0, f"exit {result.returncode}: {result.stderr}"
        after = snapshot(root)
        assert {name: digest for name, digest in after.items() if name in before} == before, "an input changed"
        return result.stdout


# --------------------------------------------------------------------------------------- trace format v1

COLUMN_ORDER = ("rank", "step", "op", "group", "seq", "start", "duration", "bytes", "host", "gpu")
ARROW_TYPES = {
    "rank": pa.int64(),
    "step": pa.int64(),
    "op": pa.string(),
    "group": pa.string(),
    "seq": pa.int64(),
    "start": pa.float64(),
    "duration": pa.float64(),
    "bytes": pa.int64(),
    "host": pa.string(),
    "gpu": pa.int64(),
}
FORMATS = (".jsonl", ".jsonl.gz", ".csv", ".csv.gz", ".parquet")
TEXT_FORMATS = FORMATS[:4]


def good_rows() -> list[dict[str, Any]]:
    """Two ranks, three steps: a forward pass and a gradient all-reduce each."""
    rows = []
    for step in range(3):
        for rank in range(2):
            start = float(step) + 0.01 * rank
            common = {"rank": rank, "step": step, "host": f"node-{rank}", "gpu": 0}
            rows.append(
                {**common, "op": "forward", "group": None, "seq": None, "start": start, "duration": 0.25, "bytes": None}
            )
            rows.append(
                {
                    **common,
                    "op": "all_reduce",
                    "group": "dp0",
                    "seq": step,
                    "start": start + 0.3,
                    "duration": 0.1 + 0.01 * rank,
                    "bytes": 4096,
                }
            )
    return rows


def _csv_cell(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, str):
        return '"' + value.replace('"', '""') + '"' if any(c in value for c in ',"\n') else value
    text = repr(value)
    return '"' + text.replace('"', '""') + '"' if any(c in text for c in ',"\n') else text


def encode(rows: list[dict[str, Any]], suffix: str, columns: tuple[str, ...] = COLUMN_ORDER) -> bytes:
    """``rows`` as a trace file of type ``suffix`` (values written as they are, good or bad)."""
    if suffix.startswith(".jsonl"):
        data = "".join(
            json.dumps({k: v for k, v in row.items() if k in columns and v is not None}) + "\n" for row in rows
        ).encode()
    elif suffix.startswith(".csv"):
        lines = [",".join(columns)] + [",".join(_csv_cell(row.get(c)) for c in columns) for row in rows]
        data = ("\n".join(lines) + "\n").encode()
    else:
        table = pa.table({c: pa.array([row.get(c) for row in rows], type=ARROW_TYPES[c]) for c in columns})
        return parquet_bytes(table)
    return gzip.compress(data, mtime=0) if suffix.endswith(".gz") else data


def parquet_bytes(table: Any) -> bytes:
    sink = io.BytesIO()
    pq.write_table(table, sink)
    return sink.getvalue()


def deep_list(depth: int) -> str:
    return "[" * depth + "]" * depth


#: Values no cell of the column may hold, in every text format; (value, formats it is bad in).
_INT_BAD = ["x", 1.5, -1, -(10**30), 10**30, 2**63, True, [1], {"a": 1}]
_FLOAT_BAD = ["abc", float("inf"), float("-inf"), True, [0.1], 1e300, -1e300]
_MISSING = [None, float("nan")]
BAD_CELLS: dict[str, list[Any]] = {
    "rank": _INT_BAD + _MISSING + [2**40],
    "step": _INT_BAD + _MISSING + [2**60],
    "start": _FLOAT_BAD + _MISSING,
    "duration": _FLOAT_BAD + _MISSING + [-0.5, 1e20],
    "op": [5, "bogus", None, "", True, ["all_reduce"], {"op": 1}],
    "group": [None, "", 5, True, ["dp0"], {"g": 1}],  # on a collective's row: it needs one
    "seq": [None, "x", -1, 1.5, 10**30, True, [0]],  # likewise
    "bytes": ["x", -1, 1.5, 10**30, 2**60, True, [4096]],
    "host": [5, True, ["node"], {"h": 1}],
    "gpu": ["x", -1, 1.5, 10**30, 2**40, True],
}
#: columns whose wrong types are still text in a CSV file (a CSV cell is always text)
_TEXT_COLUMNS = ("op", "group", "host")


@st.composite
def bad_cell_traces(draw: st.DrawFn) -> tuple[str, bytes, str]:
    """A good trace with one bad cell: (suffix, bytes, column)."""
    suffix = draw(st.sampled_from(TEXT_FORMATS))
    column = draw(st.sampled_from(sorted(BAD_CELLS)))
    values = BAD_CELLS[column]
    if suffix.startswith(".csv") and column in _TEXT_COLUMNS:
        values = [v for v in values if v is None or v == "" or v == "bogus"]
        if not values:
            column, values = "op", ["bogus", None, ""]
    value = draw(st.sampled_from(values))
    rows = good_rows()
    collective = [i for i, row in enumerate(rows) if row["op"] == "all_reduce"]
    index = draw(st.sampled_from(collective if column in ("group", "seq") else range(len(rows))))
    rows[index][column] = value
    return suffix, encode(rows, suffix), column


def _arrow_column(values: list[Any], kind: Any) -> Any:
    return pa.array(values, type=kind)


def _timestamps(n: int) -> Any:
    return pa.array([1_700_000_000_000_000 + i for i in range(n)], type=pa.timestamp("us"))


#: Parquet columns of the wrong type or with a bad value: column -> builders of the column from the good values.
PARQUET_BAD: dict[str, list[Callable[[list[Any]], Any]]] = {
    "rank": [
        lambda v: pa.array([str(x) for x in v[:-1]] + ["x"]),
        lambda v: pa.array([float(x) for x in v[:-1]] + [1.5]),
        lambda v: pa.array([float(x) for x in v[:-1]] + [float("nan")]),
        lambda v: pa.array(v[:-1] + [2**64 - 1], type=pa.uint64()),
        lambda v: pa.array(v[:-1] + [2**62], type=pa.int64()),
        lambda v: pa.array(v[:-1] + [-3], type=pa.int64()),
        lambda v: pa.array([bool(x) for x in v]),
        lambda v: pa.array([[x] for x in v]),
        lambda v: pa.array([{"r": x} for x in v]),
        lambda v: _timestamps(len(v)),
        lambda v: pa.nulls(len(v)),
    ],
    "step": [
        lambda v: pa.array(v[:-1] + [2**60], type=pa.int64()),
        lambda v: pa.array([float(x) + 0.5 for x in v]),
        lambda v: pa.array([str(x) for x in v[:-1]] + ["step"]),
        lambda v: pa.array([[x] for x in v]),
    ],
    "op": [
        lambda v: pa.array(list(range(len(v)))),
        lambda v: pa.array([[x] for x in v]),
        lambda v: pa.array(v[:-1] + ["bogus"]),
        lambda v: pa.array(v[:-1] + [None], type=pa.string()),
        lambda v: pa.array([x.encode() for x in v], type=pa.binary()),
        lambda v: pa.nulls(len(v), type=pa.string()),
    ],
    "start": [
        lambda v: pa.array([str(x) for x in v[:-1]] + ["soon"]),
        lambda v: pa.array(v[:-1] + [float("nan")]),
        lambda v: pa.array(v[:-1] + [float("inf")]),
        lambda v: pa.array(v[:-1] + [1e300]),
        lambda v: _timestamps(len(v)),
        lambda v: pa.array([[x] for x in v]),
    ],
    "duration": [
        lambda v: pa.array(v[:-1] + [-1.0]),
        lambda v: pa.array(v[:-1] + [float("nan")]),
        lambda v: pa.array(v[:-1] + [float("-inf")]),
        lambda v: pa.array([True] * len(v)),
        lambda v: pa.array([str(x) for x in v[:-1]] + ["long"]),
    ],
    "group": [
        lambda v: pa.nulls(len(v), type=pa.string()),
        lambda v: pa.array([7] * len(v)),
        lambda v: pa.array([[x] for x in v]),
    ],
    "seq": [
        lambda v: pa.nulls(len(v), type=pa.int64()),
        lambda v: pa.array(["x"] * len(v)),
        lambda v: pa.array([0.5] * len(v)),
        lambda v: pa.array([-1] * len(v)),
    ],
    "bytes": [
        lambda v: pa.array([-1] * len(v)),
        lambda v: pa.array([2**60] * len(v)),
        lambda v: pa.array(["many"] * len(v)),
    ],
    "gpu": [
        lambda v: pa.array([-1] * len(v)),
        lambda v: pa.array([2**40] * len(v)),
        lambda v: pa.array([0.5] * len(v)),
    ],
}


@st.composite
def bad_parquet_traces(draw: st.DrawFn) -> tuple[str, bytes, str]:
    rows = good_rows()
    columns = {c: _arrow_column([row[c] for row in rows], ARROW_TYPES[c]) for c in COLUMN_ORDER}
    column = draw(st.sampled_from(sorted(PARQUET_BAD)))
    builder = draw(st.sampled_from(PARQUET_BAD[column]))
    filler = {"group": "dp0", "seq": 0, "bytes": 0}.get(column)
    columns[column] = builder([filler if row[column] is None else row[column] for row in rows])
    return ".parquet", parquet_bytes(pa.table(columns)), column


@st.composite
def bad_structure_traces(draw: st.DrawFn) -> tuple[str, bytes, str | None]:
    """Whole-file problems: garbage, truncation, emptiness, nesting, missing or repeated columns, no rows."""
    suffix = draw(st.sampled_from(FORMATS))
    good = encode(good_rows(), suffix)
    kinds = ["garbage", "truncated", "empty", "missing", "no rows"]
    if suffix != ".parquet":
        kinds += ["nested", "not an object" if suffix.startswith(".jsonl") else "repeated column", "bad utf-8"]
    kind = draw(st.sampled_from(kinds))
    if kind == "garbage":
        return suffix, draw(st.binary(min_size=1, max_size=48)), None
    if kind == "truncated":
        if suffix in (".jsonl", ".csv"):  # inside the first line: no whole record is left
            first = good.index(b"\n")
            return suffix, good[: draw(st.integers(1, first - 1))], None
        return suffix, good[: draw(st.integers(1, len(good) - 1))], None
    if kind == "empty":
        return suffix, b"", None
    if kind == "missing":
        column = draw(st.sampled_from(["rank", "step", "op", "start", "duration"]))
        return suffix, encode(good_rows(), suffix, tuple(c for c in COLUMN_ORDER if c != column)), column
    if kind == "no rows":
        return suffix, encode([], suffix), None
    text = (gzip.decompress(good) if suffix.endswith(".gz") else good).decode()
    if kind == "nested":
        nested = deep_list(draw(st.sampled_from([50, 5_000, 200_000])))
        if suffix.startswith(".csv"):
            text += f'"{nested}",0,forward,,,0.0,0.1,,node-0,0\n'
        elif draw(st.booleans()):
            text += f'{{"rank": {nested}, "step": 0, "op": "forward", "start": 0.0, "duration": 0.1}}\n'
        else:
            text += nested + "\n"
    elif kind == "not an object":
        text += draw(st.sampled_from(["[1, 2]", "3", "null", '"rank"', "true"])) + "\n"
    elif kind == "repeated column":
        text = "rank,step,op,start,duration,duration\n0,0,forward,0.0,0.1,0.2\n"
    data = text.encode()
    if kind == "bad utf-8":
        data = data.replace(b"forward", b"forw\xffard", 1)
    return suffix, gzip.compress(data, mtime=0) if suffix.endswith(".gz") else data, None


def trace_command(name: str, draw: st.DrawFn) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """Arguments of a command reading the trace at ``{d}/name``, and what the error must mention."""
    command = draw(st.sampled_from(["info", "convert", "localize"]))
    if command == "info":
        return ("trace", "info", "{d}/" + name), ()
    if command == "convert":
        out = draw(st.sampled_from(["out.parquet", "out.jsonl", "out-dir"]))
        return ("trace", "convert", "{d}/" + name, "-o", "{d}/" + out), ()
    return ("localize", "{d}/" + name), ()


@given(st.data())
@examples(24)
@pytest.mark.slow
def test_bad_cells_of_v1_traces(data):
    suffix, content, column = data.draw(st.one_of(bad_cell_traces(), bad_parquet_traces()))
    name = "trace" + suffix
    args, _ = trace_command(name, data.draw)
    refuse(Case(args, (("trace" + suffix, content),), mentions=(name, f"column '{column}'")))


@given(st.data())
@examples(16)
@pytest.mark.slow
def test_bad_v1_files(data):
    suffix, content, column = data.draw(bad_structure_traces())
    name = "trace" + suffix
    args, _ = trace_command(name, data.draw)
    mentions = (name,) + ((column,) if column else ())
    refuse(Case(args, ((name, content),), mentions=mentions))


# --------------------------------------------------------------------------------------------- topology

GOOD_TRACE = ("trace.jsonl", encode(good_rows(), ".jsonl"))
_RANKS_BAD = [None, "0,1", 5, [0, -1], [0, "1"], [0, 1.5], [True, 1], [0, 2**31], [0, 10**30], [[0]], {"0": 1}]
_NAMES_BAD = [
    None,
    ["node"],
    {"x": "h"},
    {"-1": "h"},
    {"\u00b2": "h"},
    {"0": 5},
    {"0": None},
    {"99999999999999999999": "h"},
    {"0": ["h"]},
]
BAD_TOPOLOGIES: list[Any] = (
    [{"groups": {"dp0": members}} for members in _RANKS_BAD]
    + [{"groups": groups} for groups in (None, [], "dp0", 5, [["dp0", [0, 1]]])]
    + [{"hosts": hosts} for hosts in _NAMES_BAD]
    + [{"switches": switches} for switches in _NAMES_BAD[:6]]
    + [
        {"parallelism": p}
        for p in ({"dp": 0}, {"dp": -1}, {"dp": 1.5}, {"dp": True}, {"dp": 10**30}, {"dp": "2"}, None, [2])
    ]
    + [{"simulated": flag} for flag in ("yes", 1, None)]
    + [[], None, 5, "topology"]
)


@st.composite
def bad_topology_files(draw: st.DrawFn) -> bytes:
    kind = draw(st.sampled_from(["value", "value", "value", "deep", "syntax"]))
    if kind == "value":
        return json.dumps(draw(st.sampled_from(BAD_TOPOLOGIES))).encode()
    if kind == "deep":
        return ('{"groups": {"dp0": ' + deep_list(draw(st.sampled_from([5_000, 200_000]))) + "}}").encode()
    return draw(
        st.sampled_from(
            [
                b"",
                b"{not json",
                b'{"groups": {"dp0": [0, 1]',
                b"\xff\xfe{}",
                b"\x00" * 8,
                b'{"groups": {"dp0": [0, 1]}}\n{"again": 1}',
            ]
        )
    )


@given(st.data())
@examples(12)
@pytest.mark.slow
def test_bad_topologies(data):
    content = data.draw(bad_topology_files())
    inside = data.draw(st.booleans())  # topology.json in the trace directory, or --topology
    if inside:
        files = (("run/" + GOOD_TRACE[0], GOOD_TRACE[1]), ("run/topology.json", content))
        target, extra = "{d}/run", ()
    else:
        files = (GOOD_TRACE, ("topo.json", content))
        target, extra = "{d}/trace.jsonl", ("--topology", "{d}/topo.json")
    command = data.draw(st.sampled_from([("trace", "info"), ("trace", "convert"), ("localize",)]))
    args = command + (target,) + (("-o", "{d}/out.parquet") if command[-1] == "convert" else ()) + extra
    refuse(Case(args, files, mentions=("topology.json" if inside else "topo.json",)))


# ------------------------------------------------------------------------------------------ Flight Recorder


def fr_entry(index: int, rank: int) -> dict[str, Any]:
    created = 1_700_000_000_000_000_000 + index * 2_000_000 + rank * 1_000
    return {
        "record_id": index,
        "pg_id": 0,
        "process_group": ("0", "default_pg"),
        "collective_seq_id": index + 1,
        "p2p_seq_id": 0,
        "op_id": index + 1,
        "profiling_name": "nccl:all_reduce",
        "time_created_ns": created,
        "time_discovered_started_ns": created + 1_000,
        "time_discovered_completed_ns": created + 900_000,
        "duration_ms": 0.9,
        "input_sizes": [[256]],
        "input_dtypes": ["Float"],
        "output_sizes": [[256]],
        "output_dtypes": ["Float"],
        "state": "completed",
        "is_p2p": False,
        "retired": True,
    }


def fr_dump(rank: int) -> dict[str, Any]:
    return {
        "version": "2.4",
        "pg_config": {"0": {"name": "0", "desc": "default_pg", "ranks": "[0, 1]"}},
        "pg_status": {"0": {"last_enqueued_collective": 3}},
        "entries": [fr_entry(i, rank) for i in range(3)],
    }


def plain_pickle(value: Any) -> bytes:
    """Only containers, strings and numbers go in (nothing that names a class or runs code when loaded)."""
    return pickle.dumps(value, protocol=4)


def deep_pickle(depth: int) -> bytes:
    """``{"entries": [{"profiling_name": [[[...]]], ...}]}`` nested ``depth`` deep, built opcode by opcode
    (pickling so deep a list would itself recurse too far)."""
    entry = fr_entry(0, 0)
    entry["profiling_name"] = "@@DEEP@@"
    data = pickle.dumps({"entries": [entry]}, protocol=2)
    marker = b"X" + len(b"@@DEEP@@").to_bytes(4, "little") + b"@@DEEP@@"
    assert data.count(marker) == 1
    return data.replace(marker, b"]" * depth + b"a" * (depth - 1))


_ENTRY_BAD: dict[str, list[Any]] = {
    "profiling_name": [5, None, ["nccl:all_reduce"], {"name": "x"}, b"nccl:all_reduce"],
    "process_group": [5, "0", (), [{"name": 0}], ([0],), (None, None)],
    "collective_seq_id": ["x", -1, 10**30, 2**64, 1.5, float("nan"), [1], True, None],
    "time_created_ns": ["soon", [1], {"t": 1}, 10**40, -(10**40), float("inf"), float("nan"), True],
    "time_discovered_started_ns": ["soon", [1], 10**40, float("nan")],
    "time_discovered_completed_ns": ["late", [1]],
    "duration_ms": ["slow", -5.0, float("inf"), float("nan"), [1.0], 1e300],
    "input_sizes": ["256", [256], [["x"]], [[-1]], [[10**30]], 5, [[2**40, 2**40]]],
    "input_dtypes": ["Float", 5, [5], [["Float"]]],
}
_DUMP_BAD: list[Any] = [
    [],
    None,
    5,
    "dump",
    {"version": "2.4"},
    {"entries": None},
    {"entries": 5},
    {"entries": "abc"},
    {"entries": {"0": fr_entry(0, 0)}},
    {"entries": [5, "x"]},
    {"entries": [None]},
    {"entries": [fr_entry(0, 0)], "pg_config": 5},
    {"entries": [fr_entry(0, 0)], "pg_config": ["0"]},
    {"entries": [fr_entry(0, 0)], "pg_config": {"0": {"ranks": 5}}},
    {"entries": [fr_entry(0, 0)], "pg_config": {"0": {"ranks": [0, "x"]}}},
    {"entries": [fr_entry(0, 0)], "pg_config": {"0": {"ranks": [-1, 0]}}},
    {"entries": [fr_entry(0, 0)], "pg_config": {"0": {"ranks": [0, 10**30]}}},
    {"entries": [fr_entry(0, 0)], "pg_config": {"0": "ranks"}},
]


@st.composite
def bad_flight_recorder_dumps(draw: st.DrawFn) -> tuple[str, bytes]:
    """(file name, dump): a dump of plain data with something of an unexpected type or size."""
    kind = draw(st.sampled_from(["entry", "entry", "entry", "dump", "name", "bytes", "deep"]))
    name = "nccl_trace_rank_0"
    if kind == "entry":
        dump = fr_dump(0)
        key = draw(st.sampled_from(sorted(_ENTRY_BAD)))
        dump["entries"][draw(st.integers(0, 2))][key] = draw(st.sampled_from(_ENTRY_BAD[key]))
        return name, plain_pickle(dump)
    if kind == "dump":
        return name, plain_pickle(draw(st.sampled_from(_DUMP_BAD)))
    if kind == "name":
        return draw(
            st.sampled_from(["nccl_trace_rank_99999999999999999999999", "nccl_trace_rank_4294967296", "nccl_trace"])
        ), plain_pickle(fr_dump(0))
    if kind == "deep":
        return name, deep_pickle(draw(st.sampled_from([3_000, 200_000])))
    good = plain_pickle(fr_dump(0))
    return name, draw(
        st.sampled_from(
            [
                good[: len(good) // 2],
                good[:2],
                b"\x80\x04garbage",
                b"\x80" + bytes(range(40)),
                b"\x80\x05\x95\xff\xff\xff\xff\xff\xff\xff\x7f",
            ]
        )
    )


@given(st.data())
@examples(18)
@pytest.mark.slow
def test_bad_flight_recorder_dumps(data):
    name, content = data.draw(bad_flight_recorder_dumps())
    files = ((name, content), ("nccl_trace_rank_1", plain_pickle(fr_dump(1))))
    inputs = tuple("{d}/" + n for n, _ in files)
    command = data.draw(st.sampled_from([("trace", "info"), ("trace", "convert"), ("localize",)]))
    forced = ("--from", "flight-recorder") if data.draw(st.booleans()) else ()
    args = command + inputs + forced + (("-o", "{d}/out.parquet") if command[-1] == "convert" else ())
    refuse(Case(args, files, mentions=(name,)))


# --------------------------------------------------------------------------------------- StragglerAnalysis

SA_COLUMNS = ("dp_rank", "stage", "rank", "step", "optype", "start_ts", "duration", "seq_id", "mc", "gmc", "mb_id")


def sa_rows() -> list[dict[str, Any]]:
    """dp 2 x pp 2, two sampled steps: compute, and the data-parallel reduce-scatter."""
    rows = []
    for step in (3, 7):
        for stage in range(2):
            for dp in range(2):
                rank = stage * 2 + dp
                t = 0.001 * rank
                for optype, duration in (
                    ("forward-compute", 0.02),
                    ("backward-compute", 0.04),
                    ("grads-reduce-scatter", 0.01),
                    ("optimizer", 0.005),
                ):
                    rows.append(
                        {
                            "dp_rank": dp,
                            "stage": stage,
                            "rank": rank,
                            "step": step,
                            "optype": optype,
                            "start_ts": t,
                            "duration": duration,
                            "seq_id": 0,
                            "mc": 0,
                            "gmc": 0,
                            "mb_id": 0,
                        }
                    )
                    t += duration + 0.001
    return rows


def sa_table(rows: list[dict[str, Any]], replace: dict[str, Any] | None = None, drop: str | None = None) -> bytes:
    columns = {c: pa.array([row[c] for row in rows]) for c in SA_COLUMNS if c != drop}
    columns.update(replace or {})
    return parquet_bytes(pa.table(columns))


def _sa_bad_columns(n: int) -> list[tuple[str, Any]]:
    return [
        ("dp_rank", pa.array(["x"] * n)),
        ("dp_rank", pa.array([float("nan")] * n)),
        ("dp_rank", pa.array([-1] * n)),
        ("stage", pa.array([0.5] * n)),
        ("stage", pa.array([2**62] * n)),
        ("stage", pa.nulls(n, pa.int64())),
        ("rank", pa.array([2**62] * n)),
        ("rank", pa.array(["r"] * n)),
        ("rank", pa.array([-2] * n)),
        ("step", pa.array([10**18] * n)),
        ("step", pa.array([[1]] * n)),
        ("optype", pa.array([1] * n)),
        ("optype", pa.array(["teleport"] * n)),
        ("optype", pa.nulls(n, pa.string())),
        ("start_ts", pa.array(["t"] * n)),
        ("start_ts", pa.array([float("nan")] * n)),
        ("start_ts", pa.array([float("inf")] * n)),
        ("duration", pa.array([-0.1] * n)),
        ("duration", pa.array([float("nan")] * n)),
        ("duration", pa.array(["d"] * n)),
        ("seq_id", pa.array(["s"] * n)),
        ("seq_id", pa.array([float("nan")] * n)),
        ("mb_id", pa.array(["m"] * n)),
        ("mb_id", pa.array([float("nan")] * n)),
    ]


_META_BAD = [
    b"tp_size: 0\n",
    b"tp_size: -1\n",
    b"tp_size: 1000000000000000000000000000000\n",
    b"tp_size: x\n",
    b"tp_size: 1.5\n",
    b"tp_size: true\n",
    b"tp_size: null\n",
    b"dp_size: 0\n",
    b"pp_size: [2]\n",
    b"- tp_size: 2\n",
    b"just text\n",
    b"7\n",
    b"tp_size: [\n",
    b"1: 2\n",
    b"\xff\xfe",
    b"tp_size: " + b"[" * 5000 + b"]" * 5000 + b"\n",
]


@st.composite
def bad_straggler_analysis(draw: st.DrawFn) -> tuple[tuple[tuple[str, Content], ...], str]:
    """(files, the file the error must name)."""
    rows = sa_rows()
    kind = draw(st.sampled_from(["column", "column", "missing", "meta", "meta", "empty"]))
    trace = "trace-XY.parquet"
    if kind == "column":
        column, values = draw(st.sampled_from(_sa_bad_columns(len(rows))))
        return ((trace, sa_table(rows, {column: values})),), trace
    if kind == "missing":
        column = draw(st.sampled_from(["rank", "step", "duration", "seq_id"]))
        return ((trace, sa_table(rows, drop=column)),), trace
    if kind == "empty":
        return ((trace, sa_table([])),), trace
    return ((trace, sa_table(rows)), ("meta-XY.yaml", draw(st.sampled_from(_META_BAD)))), "meta-XY.yaml"


@given(st.data())
@examples(14)
@pytest.mark.slow
def test_bad_straggler_analysis_traces(data):
    files, named = data.draw(bad_straggler_analysis())
    command = data.draw(st.sampled_from([("trace", "info"), ("trace", "convert"), ("localize",)]))
    forced = ("--from", "straggler-analysis") if data.draw(st.booleans()) else ()
    args = command + ("{d}/trace-XY.parquet",) + forced + (("-o", "{d}/out") if command[-1] == "convert" else ())
    refuse(Case(args, files, mentions=(named,)))


# ------------------------------------------------------------------------------------------------- paths

#: inputs that are not readable files of their kind: (files, the path given)
BAD_INPUT_PATHS: list[tuple[tuple[tuple[str, Content], ...], str]] = [
    ((), "missing.jsonl"),
    ((("empty-dir", Directory()),), "empty-dir"),
    ((("pipe.jsonl", Fifo()),), "pipe.jsonl"),
    ((("pipe.parquet", Fifo()),), "pipe.parquet"),
    ((("nccl_trace_rank_0", Fifo()),), "nccl_trace_rank_0"),
    ((("dir.jsonl", Directory()),), "dir.jsonl"),
    ((("dangling.jsonl", Link("nowhere.jsonl")),), "dangling.jsonl"),
    ((("loop.jsonl", Link("loop.jsonl")),), "loop.jsonl"),
    ((), "x" * 300 + ".jsonl"),
    ((("file.jsonl", b"{}"),), "file.jsonl/trace.jsonl"),
    ((("notes.txt", b"hello\n"),), "notes.txt"),
    ((("empty.csv", b""),), "empty.csv"),
    ((("run/pipe.jsonl", Fifo()),), "run"),
    ((("run/sub.jsonl", Directory()),), "run"),
]


@given(st.data())
@examples(12)
@pytest.mark.slow
def test_bad_input_paths(data):
    files, given_path = data.draw(st.sampled_from(BAD_INPUT_PATHS))
    command = data.draw(st.sampled_from([("trace", "info"), ("trace", "convert"), ("localize",), ("detect",)]))
    forced = (
        data.draw(st.sampled_from([(), ("--from", "flight-recorder"), ("--from", "straggler-analysis")]))
        if command[0] != "detect"
        else ()
    )
    target = "{d}/" + given_path
    if command == ("detect",):
        args = ("detect", target, "--column", "duration")
    else:
        args = command + (target,) + forced + (("-o", "{d}/out.parquet") if command[-1] == "convert" else ())
    refuse(Case(args, files, mentions=(given_path.split("/")[0][:40],)))


@given(st.data())
@examples(6)
@pytest.mark.slow
def test_bad_topology_paths(data):
    files, given_path = data.draw(
        st.sampled_from(
            [case for case in BAD_INPUT_PATHS if case[1] not in ("notes.txt", "empty-dir", "run")]
            + [((("topology-dir", Directory()),), "topology-dir")]
        )
    )
    command = data.draw(st.sampled_from([("trace", "info"), ("trace", "convert"), ("localize",)]))
    args = (
        command
        + ("{d}/trace.jsonl", "--topology", "{d}/" + given_path)
        + (("-o", "{d}/out.parquet") if command[-1] == "convert" else ())
    )
    refuse(Case(args, files + (GOOD_TRACE,), mentions=(given_path.split("/")[0][:40],)))


SERIES = (
    "series.csv",
    b"step,loss,rank\n" + b"".join(f"{i},{2.0 + 0.01 * (i % 5)},{i % 2}\n".encode() for i in range(40)),
)

#: (command arguments, files besides the good inputs, what the error names): outputs that cannot be written,
#: or would overwrite an input
BAD_OUTPUTS: list[tuple[tuple[str, ...], tuple[tuple[str, Content], ...], str]] = [
    (("trace", "convert", "{d}/trace.jsonl", "-o", "{d}/missing/out.parquet"), (), "missing"),
    (("trace", "convert", "{d}/trace.jsonl", "-o", "{d}/out.parquet"), (("out.parquet", Directory()),), "out.parquet"),
    (("trace", "convert", "{d}/trace.jsonl", "-o", "{d}/trace.jsonl"), (), "trace.jsonl"),
    (
        ("trace", "convert", "{d}/run", "-o", "{d}/run"),
        (("run/trace.parquet", encode(good_rows(), ".parquet")),),
        "run",
    ),
    (("trace", "convert", "{d}/trace.jsonl", "-o", "{d}/trace.jsonl/out.csv"), (), "trace.jsonl"),
    (("trace", "convert", "{d}/trace.jsonl", "-o", "{d}/notes.txt"), (("notes.txt", b"keep me\n"),), "notes.txt"),
    (("trace", "convert", "{d}/trace.jsonl", "-o", "{d}/" + "o" * 300 + ".parquet"), (), "ooo"),
    (
        ("trace", "convert", "{d}/trace.jsonl", "-o", "{d}/dir/topology.json.parquet"),
        (("dir/topology.json.parquet", Link("../trace.jsonl")),),
        "topology.json.parquet",
    ),
    (("sim", "--dp", "2", "--pp", "1", "--tp", "1", "-o", "{d}/file"), (("file", b"keep me\n"),), "file"),
    (("sim", "--dp", "2", "--pp", "1", "--tp", "1", "-o", "{d}/missing/sim"), (), "missing"),
    (("sim", "--dp", "2", "--pp", "1", "--tp", "1", "-o", "{d}/trace.jsonl/sim"), (), "trace.jsonl"),
    (("detect", "{d}/series.csv", "--column", "loss", "--out", "{d}/missing/a.csv"), (), "missing"),
    (("detect", "{d}/series.csv", "--column", "loss", "--out", "{d}/adir"), (("adir", Directory()),), "adir"),
    (("detect", "{d}/series.csv", "--column", "loss", "--out", "{d}/series.csv"), (), "series.csv"),
    (("selftest", "--device", "cpu", "--size", "16", "--metrics-file", "{d}/missing/m.prom"), (), "missing"),
    (("selftest", "--device", "cpu", "--size", "16", "--metrics-file", "{d}/adir"), (("adir", Directory()),), "adir"),
    (("trainhealth-lab", "nab", "--data", "{d}/nab", "--out", "{d}/trace.jsonl"), (), "trace.jsonl"),
    (("trainhealth-lab", "nab", "--data", "{d}/nab", "--out", "{d}/missing/results"), (), "missing"),
    (("probe", "--out", "{d}/missing/probe.json"), (), "missing"),
    (("probe", "--out", "{d}/adir"), (("adir", Directory()),), "adir"),
]


@given(st.data())
@examples(14)
@pytest.mark.slow
def test_bad_output_paths(data):
    args, files, named = data.draw(st.sampled_from(BAD_OUTPUTS))
    base = (GOOD_TRACE, SERIES) + nab_layout()
    refuse(Case(args, base + files, mentions=(named,)))


# -------------------------------------------------------------------------------------- numeric options

_INT_OPTION_BAD = ["0", "-1", str(10**30), "nan", "inf", "1.5", "", "1e3"]
_FLOAT_OPTION_BAD = ["nan", "inf", "-inf", "-1", "0", "1e309", "1e300", "", "x"]

#: (command prefix, option, bad values); every numeric option of the commands here
NUMERIC_OPTIONS: list[tuple[tuple[str, ...], str, list[str]]] = (
    [(("localize", "{d}/trace.jsonl"), "--last", _INT_OPTION_BAD)]
    + [
        (("localize", "{d}/trace.jsonl"), f"--{name}-z", _FLOAT_OPTION_BAD)
        for name in ("gpu", "collectives", "link", "straggler", "path")
    ]
    + [
        (("sim", "-o", "{d}/sim"), f"--{name}", _INT_OPTION_BAD)
        for name in ("dp", "pp", "tp", "cp", "ep", "steps", "microbatches", "gpus-per-host", "hosts-per-leaf")
    ]
    + [(("sim", "-o", "{d}/sim"), "--seed", ["-1", str(10**30), "nan", "inf", "1.5", ""])]
    + [(("selftest", "--device", "cpu"), "--size", _INT_OPTION_BAD + ["15", "100000"])]
    + [(("selftest", "--device", "cpu", "--size", "16"), "--seed", ["-1", str(10**30), "nan", "1.5"])]
    + [(("probe", "--out", "{d}/probe.json"), "--repeats", _INT_OPTION_BAD)]
    + [(("probe", "--out", "{d}/probe.json"), "--timeout", _FLOAT_OPTION_BAD)]
    + [
        (
            ("probe", "--out", "{d}/probe.json"),
            "--sizes",
            ["0,4096", "-1,4096", "4096,4096", "4096", "x,y", f"4096,{10**30}", "nan,4096", "4096,,8192"],
        )
    ]
)
#: the variables a probe reads (so that only the options can be wrong)
PROBE_ENV = (("RANK", "0"), ("WORLD_SIZE", "1"), ("MASTER_ADDR", "127.0.0.1"), ("MASTER_PORT", "1"))


@sweep("prefix, option, values", NUMERIC_OPTIONS, ids=lambda v: v if isinstance(v, str) else "")
@given(data=st.data())
@examples(2)
def test_bad_numeric_options(prefix, option, values, data):
    value = data.draw(st.sampled_from(values))
    env = PROBE_ENV if prefix[0] == "probe" else ()
    refuse(Case(prefix + (f"{option}={value}",), (GOOD_TRACE,), mentions=(option,), env=env))


#: --fault specs the simulator cannot run: (spec, what the error names)
BAD_FAULTS = [
    "gpu:0:nan",
    "gpu:0:inf",
    "gpu:0:-2",
    "gpu:0:0",
    "gpu:0:1e300",
    "gpu:-1:2",
    f"gpu:{10**30}:2",
    "gpu:0:2:-1",
    f"gpu:0:2:{10**30}",
    "gpu:0:2:5:3",
    "gpu:0:2:3:3",
    "gpu:0:2:0:-4",
    "nic:0:2:100",
    "gpu:0:2:0:1:2",
    "gpu",
    "host:99:2",
    "switch:5:2",
    "gpu:0:nan:0",
]


@given(st.sampled_from(BAD_FAULTS))
@examples(8)
@pytest.mark.slow
def test_bad_simulated_faults(spec):
    refuse(
        Case(
            ("sim", "--dp", "2", "--pp", "1", "--tp", "2", "--steps", "10", "--fault", spec, "-o", "{d}/sim"),
            mentions=("--fault",),
        )
    )


@given(
    st.sampled_from(
        [
            ("--dp", "65536", "--pp", "65536"),
            ("--steps", "100000000"),
            ("--microbatches", "1000000"),
            ("--gpus-per-host", "1000000000"),
            ("--dp", "256", "--tp", "256", "--steps", "10000", "--microbatches", "64"),
        ]
    )
)
@examples(3)
def test_simulations_too_large(options):
    refuse(Case(("sim", "-o", "{d}/sim") + options, mentions=("sim",)))


# ------------------------------------------------------------------------------------------ detect, bench

#: detector parameters no detector accepts: (detector, parameter, values)
BAD_DETECTOR_PARAMETERS: list[tuple[str, str, list[str]]] = [
    ("zscore", "threshold", ["nan", "inf", "-inf", "0", "-1", "x"]),
    ("zscore", "window", ["0", "-5", str(10**30), "1e300", "nan", "2.5", "x"]),
    ("zscore", "warmup", ["0", "-1", str(10**30), "nan"]),
    ("zscore", "min_std", ["nan", "inf", "-1"]),
    ("zscore", "direction", ["sideways", "1"]),
    ("zscore", "cooldown", ["-1", "nan", str(10**30), "1.5"]),
    ("zscore", "min_consecutive", ["0", "-1", str(10**30), "inf"]),
    ("zscore", "max_protected", ["0", str(10**30)]),
    ("zscore", "max_protected_share", ["nan", "-0.1", "2", "inf"]),
    ("zscore", "release", ["nan", "-inf", "x"]),
    ("zscore", "critical", ["nan", "inf", "-1"]),
    ("zscore", "protect", ["maybe", "2"]),
    ("iqr", "window", ["0", str(10**30), "nan"]),
    ("iqr", "refresh", ["0", "-1", str(10**30)]),
    ("robust_z", "min_scale", ["nan", "-1"]),
    ("level_shift", "k", ["nan", "-1", "inf"]),
    ("level_shift", "clip", ["nan", "inf"]),
    ("level_shift", "adapt_after", ["-1", str(10**30)]),
    ("delta", "delta", ["nan", "inf", "1", "0"]),
    ("delta", "rate_window", ["0", str(10**30)]),
    ("spike", "sigmas", ["nan", "-1", "inf"]),
    ("spike", "window", ["0", str(10**30)]),
    ("stl", "period", ["1", "-1", str(10**30), "nan"]),
    ("stl", "refit_every", ["0", str(10**30)]),
    ("peer", "min_peers", ["0", str(10**30), "nan"]),
    ("peer", "min_relative", ["nan", "-1", "inf"]),
]
BAD_DETECTOR_SPECS = [
    "zscore(",
    "zscore(threshold)",
    "zscore(threshold=)",
    "zscor",
    "zscore(bogus=1)",
    "zscore)(",
    "",
    "ZSCORE",
    "zscore(window=10,window=20)",
]


@st.composite
def bad_detector_specs(draw: st.DrawFn) -> tuple[str, str]:
    """(spec, what the error names)."""
    if draw(st.integers(0, 4)) == 0:
        spec = draw(st.sampled_from(BAD_DETECTOR_SPECS))
        return spec, spec.split("(")[0] or "--detector"
    name, parameter, values = draw(st.sampled_from(BAD_DETECTOR_PARAMETERS))
    return f"{name}({parameter}={draw(st.sampled_from(values))})", parameter


@given(bad_detector_specs())
@examples(16)
@pytest.mark.slow
def test_bad_detector_specs(spec_and_name):
    spec, named = spec_and_name
    refuse(Case(("detect", "{d}/series.csv", "--column", "loss", "--detector", spec), (SERIES,), mentions=(named,)))


BAD_SERIES: list[tuple[tuple[str, ...], tuple[tuple[str, Content], ...], str]] = [
    (("--column", "nope"), (SERIES,), "nope"),
    (("--column", "loss", "--series-column", "nope"), (SERIES,), "nope"),
    (("--column", "loss", "--time-column", "nope"), (SERIES,), "nope"),
    (("--column", "loss"), (("series.csv", b"step,loss\n0,1.0\n1,abc\n2,1.0\n"),), "row 2"),
    (("--column", "loss"), (("series.csv", b"step,loss\n0,[1]\n"),), "loss"),
    (("--column", "loss"), (("series.csv", b"step,loss\n"),), "series.csv"),
    (("--column", "loss"), (("series.csv", b""),), "series.csv"),
    (("--column", "loss"), (("series.csv", b"\x00\xff\xfe garbage"),), "series.csv"),
    (("--column", "loss"), (("series.csv", b'step,loss\n0,"1.0\n'),), "series.csv"),
    (("--column", "loss"), (("series.csv.gz", b"\x1f\x8b\x08\x00truncated"),), "series.csv.gz"),
    (("--column", "loss"), (("series.parquet", b"PAR1 not really"),), "series.parquet"),
    (("--column", "loss"), (("series.txt", b"step,loss\n0,1\n"),), "series.txt"),
    (("--column", "loss"), (("series.csv", b"step,loss,loss\n0,1.0,2.0\n"),), "loss"),
    (("--column", "loss"), (("series.csv", Fifo()),), "series.csv"),
]


@given(st.sampled_from(BAD_SERIES))
@examples(8)
@pytest.mark.slow
def test_bad_series(case):
    options, files, named = case
    refuse(Case(("detect", "{d}/" + files[0][0]) + options, files, mentions=(named,)))


def nab_layout(values: int = 200) -> tuple[tuple[str, Content], ...]:
    """A NAB directory with one small data file and one labelled window."""
    rows = "".join(
        f"2020-01-01 {i // 60:02d}:{i % 60:02d}:00,{1.0 + (5.0 if i == 150 else 0.01 * (i % 3))}\n"
        for i in range(values)
    )
    windows = {"demo/one.csv": [["2020-01-01 02:25:00", "2020-01-01 02:35:00"]]}
    return (
        ("nab/data/demo/one.csv", ("timestamp,value\n" + rows).encode()),
        ("nab/labels/combined_windows.json", json.dumps(windows).encode()),
    )


BAD_NAB_DATA: list[tuple[str, bytes]] = [
    ("labels/combined_windows.json", b"{not json"),
    ("labels/combined_windows.json", b"[]"),
    ("labels/combined_windows.json", b'{"demo/one.csv": 5}'),
    ("labels/combined_windows.json", b'{"demo/one.csv": [["soon", "later"]]}'),
    ("labels/combined_windows.json", b'{"demo/missing.csv": []}'),
    ("labels/combined_windows.json", b'{"../../../etc/passwd": []}'),
    ("labels/combined_windows.json", b'{"demo/one.csv": ' + deep_list(100_000).encode() + b"}"),
    ("data/demo/one.csv", b"time,val\n1,2\n"),
    ("data/demo/one.csv", b"timestamp,value\nnot a time,1\n"),
    ("data/demo/one.csv", b"timestamp,value\n2020-01-01 00:00:00,abc\n"),
    ("data/demo/one.csv", b"\x00\xff"),
]


@sweep("name, content", BAD_NAB_DATA, ids=[f"{n}:{c[:24]!r}" for n, c in BAD_NAB_DATA])
def test_every_bad_nab_file_is_refused_naming_it(name, content):
    """Each bad file, not only those drawn below: one line naming the file at fault (no pandas warning)."""
    files = tuple(f for f in nab_layout() if f[0] != "nab/" + name) + (("nab/" + name, content),)
    refuse(Case(("trainhealth-lab", "nab", "--data", "{d}/nab", "--out", "{d}/results"), files, mentions=(name,)))


@given(st.data())
@examples(8)
@pytest.mark.slow
def test_bad_bench_inputs(data):
    kind = data.draw(st.sampled_from(["data", "data", "detector", "no data"]))
    files = nab_layout()
    args = ("trainhealth-lab", "nab", "--data", "{d}/nab", "--out", "{d}/results")
    if kind == "data":
        name, content = data.draw(st.sampled_from(BAD_NAB_DATA))
        files = tuple(f for f in files if f[0] != "nab/" + name) + (("nab/" + name, content),)
        refuse(Case(args, files, mentions=("nab",)))
    elif kind == "detector":
        spec, named = data.draw(bad_detector_specs())
        refuse(Case(args + ("--detector", spec), files, mentions=(named,)))
    else:
        where = data.draw(st.sampled_from(["{d}/none", "{d}/file", "{d}/empty"]))
        refuse(
            Case(
                ("trainhealth-lab", "nab", "--data", where, "--out", "{d}/results"),
                (("file", b"x"), ("empty", Directory())),
                mentions=(where,),
            )
        )


# ------------------------------------------------------------------------------ probe, metrics, config


@given(
    st.sampled_from(
        [
            (("metrics", "--json", "--markdown"), "not allowed with"),
            (("metrics", "extra"), "unrecognized"),
            (("metrics", "--bogus"), "--bogus"),
            (("config", "--json", "--markdown"), "not allowed with"),
            (("config", "--bogus=1"), "--bogus"),
            (("trace",), "trace"),
            (("trace", "info"), "TRACE"),
            (("trace", "convert", "x.jsonl"), "-o/--output"),
            (("trace", "info", "x.jsonl", "--from", "pickle"), "--from"),
            (("trainhealth-lab",), "COMMAND"),
            (("detect", "x.csv"), "--column"),
            (("probe",), "--out"),
            (("probe", "--out", "{d}/probe.json"), "RANK"),
        ]
    )
)
@examples(8)
def test_bad_command_lines(case):
    args, named = case
    refuse(Case(args, mentions=(named,)))


#: settings as the environment gives them to `trainhealth config`: (variable, value)
BAD_SETTINGS = [
    ("TRAINHEALTH_DETECTORS", "loss=zscore(threshold=nan)"),
    ("TRAINHEALTH_DETECTORS", "loss=zscore(window=0)"),
    ("TRAINHEALTH_DETECTORS", f"loss=zscore(window={10**30})"),
    ("TRAINHEALTH_DETECTORS", "loss=spike(sigmas=inf)"),
    ("TRAINHEALTH_DETECTORS", "loss=zscore(max_protected_share=nan)"),
    ("TRAINHEALTH_DETECTORS", "weather=zscore"),
    ("TRAINHEALTH_DETECTORS", "loss=zscore(" + "(" * 10_000),
    ("TRAINHEALTH_STATS_EVERY", "0"),
    ("TRAINHEALTH_STATS_EVERY", str(10**30)),
    ("TRAINHEALTH_GPU_SAMPLE_INTERVAL", "nan"),
    ("TRAINHEALTH_GPU_SAMPLE_INTERVAL", "inf"),
    ("TRAINHEALTH_GPU_SAMPLE_INTERVAL", "1e-300"),
    ("TRAINHEALTH_GPU_SAMPLE_INTERVAL", "-1"),
    ("TRAINHEALTH_TRACE_WRITE_INTERVAL", "inf"),
    ("TRAINHEALTH_COMM_FLUSH_INTERVAL", "nan"),
    ("TRAINHEALTH_COMM_RING_SIZE", str(10**30)),
    ("TRAINHEALTH_COMM_RING_SIZE", "0"),
    ("TRAINHEALTH_MAX_SERIES_PER_METRIC", "-1"),
    ("TRAINHEALTH_SIMULATED_GPUS", str(10**30)),
    ("TRAINHEALTH_SDC_INTERVAL", "-1"),
    ("TRAINHEALTH_PROMETHEUS_PORT", "70000"),
    ("TRAINHEALTH_RANK", "-1"),
    ("TRAINHEALTH_RANK", str(10**30)),
    ("TRAINHEALTH_WORLD_SIZE", "0"),
]


@given(st.sampled_from(BAD_SETTINGS))
@examples(10)
def test_bad_settings(setting):
    variable, value = setting
    refuse(
        Case(("config", "--json"), env=((variable, value),), mentions=(variable.removeprefix("TRAINHEALTH_").lower(),))
    )


# ---------------------------------------------------------------------------------------------- bad probe


BAD_PROBES = [
    b"{not json",
    b"[]",
    b'{"format": "something else"}',
    b"\xff",
    b'{"format": "trainhealth.probe/v1", "measurements": 5}',
    b'{"format": "trainhealth.probe/v1", "measurements": [' + deep_list(100_000).encode() + b"]}",
]


@given(st.sampled_from(BAD_PROBES + [Fifo(), Directory()]))
@examples(5)
@pytest.mark.slow
def test_bad_probe_files(content):
    refuse(
        Case(
            ("localize", "{d}/trace.jsonl", "--probe", "{d}/probe.json"),
            (GOOD_TRACE, ("probe.json", content)),
            mentions=("probe.json",),
        )
    )


# --------------------------------------------------------------------------------------------- good input


def test_good_traces_are_accepted_in_every_format():
    files = tuple((f"t{i}{suffix}", encode(good_rows(), suffix)) for i, suffix in enumerate(FORMATS))
    out = accept(Case(("trace", "info", "--json") + tuple("{d}/" + name for name, _ in files), files))
    assert json.loads(out)["records"] == 5 * len(good_rows())
    accept(Case(("trace", "convert", "{d}/t0.jsonl", "-o", "{d}/run"), files))
    accept(Case(("localize", "{d}/t4.parquet", "--json", "--last", "2", "--gpu-z", "5"), files))


def test_good_imports_are_accepted():
    dumps = (("nccl_trace_rank_0", plain_pickle(fr_dump(0))), ("nccl_trace_rank_1", plain_pickle(fr_dump(1))))
    out = accept(Case(("trace", "info", "--json", "{d}/nccl_trace_rank_0", "{d}/nccl_trace_rank_1"), dumps))
    assert json.loads(out)["records"] == 6
    sa = (("trace-XY.parquet", sa_table(sa_rows())), ("meta-XY.yaml", b"tp_size: 1\ndp_size: 2\npp_size: 2\n"))
    out = accept(Case(("trace", "info", "--json", "{d}/trace-XY.parquet"), sa))
    assert json.loads(out)["ranks"] == [0, 1, 2, 3]
    topology = (
        "run/topology.json",
        json.dumps(
            {"groups": {"dp0": [0, 1]}, "hosts": {"0": "node-0", "1": "node-1"}, "parallelism": {"dp": 2}}
        ).encode(),
    )
    accept(Case(("localize", "{d}/run"), (("run/" + GOOD_TRACE[0], GOOD_TRACE[1]), topology)))


def test_good_commands_are_accepted():
    accept(
        Case(
            (
                "sim",
                "--dp",
                "2",
                "--pp",
                "2",
                "--tp",
                "1",
                "--steps",
                "4",
                "--gpus-per-host",
                "2",
                "--fault",
                "gpu:1:2:1:3",
                "-o",
                "{d}/sim",
            )
        )
    )
    accept(
        Case(
            (
                "detect",
                "{d}/series.csv",
                "--column",
                "loss",
                "--series-column",
                "rank",
                "--time-column",
                "step",
                "--detector",
                "zscore(window=20,warmup=5,threshold=3.5,cooldown=0)",
                "--out",
                "{d}/found.json",
            ),
            (SERIES,),
        )
    )
    accept(
        Case(
            ("trainhealth-lab", "nab", "--data", "{d}/nab", "--out", "{d}/results", "--detector", "zscore(window=50)"),
            nab_layout(),
        )
    )
    accept(Case(("metrics", "--json")))
    accept(Case(("config", "--json"), env=(("TRAINHEALTH_DETECTORS", "loss=zscore(threshold=5)"),)))
    accept(Case(("selftest", "--device", "cpu", "--size", "16", "--metrics-file", "{d}/selftest.prom")))


# ------------------------------------------------------------------------------- found by the outside audit


def test_a_flight_recorder_send_to_a_rank_beyond_any_rank_is_refused():
    dump = fr_dump(0)
    dump["entries"][1].update(profiling_name=f"nccl:send 0->{10**30}", is_p2p=True, p2p_seq_id=1)
    refuse(
        Case(
            ("localize", "{d}/nccl_trace_rank_0", "{d}/nccl_trace_rank_1"),
            (("nccl_trace_rank_0", plain_pickle(dump)), ("nccl_trace_rank_1", plain_pickle(fr_dump(1)))),
            mentions=("nccl_trace_rank_0",),
        )
    )


def test_a_flight_recorder_group_whose_ranks_text_holds_a_number_too_long_for_a_rank_is_refused():
    dump = fr_dump(0)
    dump["pg_config"]["0"]["ranks"] = "[0, " + "9" * 5000 + "]"  # int() of 5,000 digits raised: a traceback, exit 1
    refuse(
        Case(
            ("localize", "{d}/nccl_trace_rank_0", "{d}/nccl_trace_rank_1"),
            (("nccl_trace_rank_0", plain_pickle(dump)), ("nccl_trace_rank_1", plain_pickle(fr_dump(1)))),
            mentions=("nccl_trace_rank_0", "pg_config['0'].ranks"),
        )
    )


@pytest.mark.parametrize(
    "args",
    [
        ("analyze", "--prometheus", "", "--once"),  # was a TypeError traceback
        ("analyze", "--prometheus", "http://127.0.0.1:9", "--interval", "1e-300"),  # was accepted
        ("analyze", "--prometheus", "http://127.0.0.1:9", "--step", "1e-300", "--once"),
        ("analyze", "--prometheus", "http://127.0.0.1:9", "--prometheus-timeout", "1e-300", "--once"),
    ],
)
def test_analyze_refuses_an_empty_url_and_intervals_no_service_can_keep(args):
    refuse(Case(args, mentions=(args[-2] if args[-1] != "--once" else args[-3],)))
