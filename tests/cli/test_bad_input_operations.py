"""Generated bad input for the operational commands: each case is refused in one line with exit status 2, with no
traceback and no hang, and leaves the files it was given, and the directory it ran in, as they were.

Commands: ``demo``, ``stack up``, ``stack down``, ``trainhealth-lab run``, ``score`` and ``corpus``, ``alerts``, ``dashboards`` and
``export``. Their numeric options are found in the parser, so a new option is covered (and must declare its range
with :class:`~trainhealth._internal.cli.numbers.Bounded`); hypothesis draws values outside each range (NaN, infinities,
zero, negatives, huge, non-numbers). Also: fault schedule files, ``stack.json`` state files (a bystander
``sleep`` must survive every one of them), lab results files and output paths (a missing parent, a file where a
directory goes, a symbolic link, a directory holding someone else's files).

Hypothesis draws the cases (derandomized, a fixed number per test); every case is its own invocation of the real
command in a fresh interpreter. The cheap commands are also run with good input, which must still succeed.
"""

from __future__ import annotations

import argparse
import io
import json
import math
import os
import queue
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

hypothesis = pytest.importorskip("hypothesis")

from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from tests.cli.badinput import REFUSAL_TIMEOUT_S, assert_refused, run_cli, snapshot  # noqa: E402
from tests.tiers import sweep  # noqa: E402
from trainhealth._internal.cli.main import build_parser  # noqa: E402
from trainhealth._internal.cli.numbers import Bounded  # noqa: E402
from trainhealth_lab.cli import build_parser as build_lab_parser  # noqa: E402

#: The commands this file covers; every subcommand under them is found in the parser.
COMMANDS = ("demo", "stack", "trainhealth-lab", "alerts", "dashboards", "export")


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


def refused(result: subprocess.CompletedProcess, *mentions: str) -> str:
    """Exit 2, one ``trainhealth: error:`` line naming each of ``mentions``, no traceback; the line."""
    line = assert_refused(result)
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr
    for mention in mentions:
        assert mention in line, (mention, line)
    return line


def tree(root: Path) -> dict[str, str]:
    """Every name under ``root`` (directories and links too) with the files' digests: what a run must not change."""
    names = {}
    for directory, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            path = Path(directory) / name
            names[str(path.relative_to(root))] = (
                f"link to {os.readlink(path)}" if path.is_symlink() else "directory" if path.is_dir() else "file"
            )
    return {**names, **snapshot(root)}


@contextmanager
def sandbox() -> Iterator[Path]:
    """A fresh directory holding a file of the user's (``keep.txt``), checked to be unchanged at the end."""
    with tempfile.TemporaryDirectory(prefix="th-bad-") as name:
        root = Path(name)
        (root / "keep.txt").write_text("the user's\n")
        before = tree(root)
        yield root
        assert tree(root) == before, "the command changed the files it was given"


# ------------------------------------------------------------------------------------------ the parsers


def _children(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def _leaves(parser: argparse.ArgumentParser, path: tuple[str, ...]) -> Iterator[tuple[tuple[str, ...], Any]]:
    children = _children(parser)
    if not children:
        yield path, parser
    for name, child in children.items():
        yield from _leaves(child, (*path, name))


#: The commands by first word; the lab's own command counts as one of them (``run_cli`` runs it).
PARSERS = {**_children(build_parser()), "trainhealth-lab": build_lab_parser()}
#: ``trainhealth-lab nab`` reads a data set; its bad input is covered in test_bad_input_analysis.py.
LEAVES = {
    path: parser
    for command in COMMANDS
    for path, parser in _leaves(PARSERS[command], (command,))
    if path != ("trainhealth-lab", "nab")
}

#: Arguments that make the rest of each command's line good and cheap: a bad value added after them is the only
#: thing wrong (argparse keeps an option's last value). ``{d}`` is the case's directory.
BASE = {
    ("demo",): ("--out", "{d}/out", "--no-analyzer", "--webhook-port", "0", "--ranks", "2", "--duration", "20"),
    ("stack", "up"): ("--dir", "{d}/stack", "--no-demo"),
    ("stack", "down"): ("--dir", "{d}/stack"),
    ("trainhealth-lab", "run"): ("--out", "{d}/lab", "--cases", "compute", "--seeds", "0"),
    ("trainhealth-lab", "score"): ("{d}/results.jsonl",),
    ("trainhealth-lab", "corpus"): (
        "--out",
        "{d}/corpus",
        "--seeds",
        "0",
        "--steps",
        "100",
        "--models",
        "mlp",
        "--scenarios",
        "clean",
        "--workers",
        "1",
    ),
    ("alerts",): ("--out", "{d}/alerts"),
    ("dashboards",): ("--out", "{d}/dashboards"),
    ("export",): (
        "--backend",
        "simulated",
        "--port",
        "0",
        "--addr",
        "127.0.0.1",
        "--simulated-gpus",
        "1",
        "--duration",
        "0.2",
    ),
}


def _args(path: tuple[str, ...], root: Path, *extra: str) -> list[str]:
    return [*path, *(arg.replace("{d}", str(root)) for arg in BASE[path]), *extra]


#: No prometheus on PATH: a ``stack up`` that wrongly accepted its input still starts nothing.
NO_BINARIES = {"PATH": "/nonexistent"}


NUMERIC = sorted(
    (path, option, action.type)
    for path, parser in LEAVES.items()
    for action in parser._actions
    for option in action.option_strings[-1:]
    if isinstance(action.type, Bounded) or action.type in (int, float)
)


def test_every_command_has_a_good_base_line():
    assert sorted(LEAVES) == sorted(BASE)


def test_every_numeric_option_declares_its_range():
    assert len(NUMERIC) >= 15
    undeclared = [f"{' '.join(path)} {option}" for path, option, kind in NUMERIC if not isinstance(kind, Bounded)]
    assert not undeclared, f"give these a Bounded type (a documented range): {undeclared}"


def _refuses(kind: Bounded, text: str) -> bool:
    try:
        kind(text)
    except argparse.ArgumentTypeError:
        return True
    return False


SPECIAL = (
    "nan",
    "NaN",
    "-nan",
    "inf",
    "-inf",
    "+Infinity",
    "1e309",
    "-1e309",
    "",
    " ",
    "ten",
    "1,5",
    "0x10",
    "5s",
    "-1",
    "0",
    "-0",
    "0.0",
    "1e30",
    "-1e30",
    str(10**30),
    "9" * 5000,
)
TEXT = st.text(st.characters(codec="utf-8", exclude_characters="\x00"), max_size=6)


def bad_numbers(kind: Bounded) -> st.SearchStrategy[str]:
    """Text that ``kind`` refuses: specials, numbers just and far outside the range, non-integers, words."""
    low, high = kind.low, kind.high
    strategies = [
        st.sampled_from([text for text in SPECIAL if _refuses(kind, text)]),
        st.floats(min_value=-1e300, max_value=low, allow_nan=False).map(repr),
        st.floats(min_value=high, max_value=1e300, allow_nan=False, exclude_min=True).map(repr),
        st.integers(min_value=int(high) + 1, max_value=10**30).map(str),
        st.integers(min_value=-(10**30), max_value=math.ceil(low) - 1).map(str),
        TEXT,
    ]
    if kind.kind is int:
        strategies.append(st.floats(min_value=low, max_value=high).filter(lambda v: not v.is_integer()).map(repr))
    return st.one_of(strategies).filter(lambda text: _refuses(kind, text))


@sweep(("path", "option", "kind"), NUMERIC, ids=[f"{' '.join(p)} {o}" for p, o, _ in NUMERIC])
@examples(7)
@given(data=st.data())
def test_a_number_outside_its_range_is_refused(path, option, kind, data):
    value = data.draw(bad_numbers(kind), label=option)
    with sandbox() as root:
        refused(run_cli(*_args(path, root, f"{option}={value}"), cwd=root, env=NO_BINARIES), option)


def test_cross_checked_numbers_are_refused():
    with sandbox() as root:
        refused(run_cli(*_args(("demo",), root, "--ranks", "4", "--port-base", "65534"), cwd=root), "--port-base")
        refused(
            run_cli(*_args(("demo",), root, "--port-base", "9000", "--webhook-port", "9001"), cwd=root),
            "--webhook-port",
        )
        refused(
            run_cli("demo", "--out", str(root / "out"), "--port-base", "9000", "--analyzer-port", "9001", cwd=root),
            "--analyzer-port",
        )
        refused(
            run_cli(
                *_args(("stack", "up"), root, "--prometheus-port", "9999", "--alertmanager-port", "9999"),
                cwd=root,
                env=NO_BINARIES,
            ),
            "--alertmanager-port",
        )
        refused(
            run_cli("stack", "up", "--dir", str(root / "stack"), "--webhook-port", "9451", cwd=root, env=NO_BINARIES),
            "--webhook-port",
        )


SETTINGS = {
    "export --gpus": (("export",), ("--gpus", "x"), "--gpus"),
    "export --gpus negative": (("export",), ("--gpus", "0,,-1"), "--gpus"),
    "export --addr": (("export",), ("--addr", "999.1.1.1"), "--addr"),
    "export --backend": (("export",), ("--backend", "cuda"), "--backend"),
    "export TLS files missing": (
        ("export",),
        ("--tls-certfile", "{d}/no.pem", "--tls-keyfile", "{d}/no.key"),
        "--tls-certfile",
    ),
    "export TLS file not PEM": (
        ("export",),
        ("--tls-certfile", "{d}/keep.txt", "--tls-keyfile", "{d}/keep.txt"),
        "--tls-certfile",
    ),
    "export password file a directory": (
        ("export",),
        ("--basic-auth-username", "u", "--basic-auth-password-file", "{d}"),
        "--basic-auth-password-file",
    ),
    "demo --addr": (("demo",), ("--addr", "999.1.1.1"), "--addr"),
    "alerts --runbook-base": (("alerts",), ("--runbook-base", "ftp://example.com/runbooks"), "--runbook-base"),
    "lab run --suite": (("trainhealth-lab", "run"), ("--suite", "huge"), "--suite"),
    "lab run --cases": (("trainhealth-lab", "run"), ("--cases", "no-such-case"), "--cases"),
}


@sweep("case", list(SETTINGS.values()), ids=list(SETTINGS))
def test_a_bad_setting_is_refused_naming_its_option(case):
    path, extra, option = case
    with sandbox() as root:
        refused(
            run_cli(*_args(path, root, *(arg.replace("{d}", str(root)) for arg in extra)), cwd=root, env=NO_BINARIES),
            option,
        )


# ------------------------------------------------------------------------------------------ fault schedules

#: A good entry of each kind, for ``demo --ranks 2`` (field: YAML text).
GOOD_ENTRIES = {
    "delay": {"kind": "delay", "severity": "0.5", "step": "10", "ranks": "[1]"},
    "collective_delay": {"kind": "collective_delay", "severity": "0.5", "step": "10", "until": "12"},
    "lr_scale": {"kind": "lr_scale", "severity": "30", "step": "10"},
    "batch": {"kind": "batch", "severity": "2", "step": "10"},
    "bitflip": {"kind": "bitflip", "target": "parameter", "tensor": "'*'", "bit": "30", "count": "2", "step": "10"},
    "nan": {"kind": "nan", "target": "gradient", "step": "10"},
    "simulated_gpu": {"kind": "simulated_gpu", "fault": "xid", "xid": "79", "gpu": "1", "step": "10", "ranks": "[1]"},
}
ALL = tuple(GOOD_ENTRIES)
#: field -> (the kinds it matters to, bad YAML values)
BAD_FIELDS = {
    "severity": (
        ("delay", "collective_delay", "lr_scale", "batch"),
        (".nan", ".inf", "-.inf", "1.0e+9", "-1.0e+7", "abc", "[1]", "{a: 1}", "true", "null"),
    ),
    "step": (ALL, (".nan", ".inf", "-.inf", "-1", "1.5", str(10**30), "1.0e+30", "true", "abc", "null", "[1]")),
    "until": (ALL, (".nan", ".inf", "3", "-1", "1.5", str(10**30), "abc")),
    "ranks": (ALL, ("[-1]", "[2]", "[.nan]", "[]", "all", "[1.5]", "[true]", str(10**30), "{a: 1}")),
    "count": (("bitflip", "nan"), ("0", "-1", ".nan", ".inf", "1.5", str(10**30), "abc")),
    "bit": (("bitflip",), ("64", "-1", "exponent-low", ".nan", "1.5", "[1]")),
    "target": (("bitflip", "nan"), ("weights", "[parameter]", "null")),
    "tensor": (("bitflip", "nan"), ("[a]", "{a: 1}", "null", "no.such.weight")),
    "gpu": (("simulated_gpu",), ("-1", "2", "1024", ".nan", ".inf", "abc")),
    "xid": (("simulated_gpu",), ("-1", ".inf", ".nan", "abc", "70000")),
    "fault": (("simulated_gpu",), ("meteor", "null", "[xid]")),
    "kind": (ALL, ("meteor", "null", "[delay]", "1")),
}


def _yaml(entries: list[dict[str, str]], wrapped: bool) -> str:
    lines = ["- {" + ", ".join(f"{key}: {value}" for key, value in entry.items()) + "}" for entry in entries]
    return "faults:\n" + "".join(f"  {line}\n" for line in lines) if wrapped else "".join(f"{line}\n" for line in lines)


def test_the_good_entries_are_good(tmp_path):
    from trainhealth._internal.injectors.schedule_file import load_schedule

    path = tmp_path / "faults.yaml"
    path.write_text(_yaml(list(GOOD_ENTRIES.values()), wrapped=False))
    specs = load_schedule(path)
    assert [spec.kind for spec in specs] == list(GOOD_ENTRIES)
    assert load_schedule([spec.to_dict() for spec in specs]) == specs  # as the demo's report.json keeps them


@st.composite
def bad_schedules(draw: st.DrawFn) -> tuple[str, str, int]:
    """(YAML text, the field at fault, the number of the bad entry)."""
    field = draw(st.sampled_from(sorted(BAD_FIELDS)))
    kinds, values = BAD_FIELDS[field]
    entry = dict(GOOD_ENTRIES[draw(st.sampled_from(kinds))])
    entry[field] = draw(st.sampled_from(values))
    before = draw(st.lists(st.sampled_from(ALL), max_size=2))
    entries = [GOOD_ENTRIES[kind] for kind in before] + [entry]
    return _yaml(entries, wrapped=draw(st.booleans())), field, len(entries)


@examples(30)
@given(case=bad_schedules())
@pytest.mark.slow
def test_a_bad_fault_schedule_is_refused_naming_the_file_and_field(case):
    text, field, number = case
    with sandbox() as root:
        faults = root / "faults.yaml"
        faults.write_text(text)
        (root / "out").mkdir()
        before = tree(root)
        line = refused(run_cli(*_args(("demo",), root, "--faults", str(faults)), cwd=root), str(faults), field)
        assert f"fault #{number}" in line, line
        assert tree(root) == before
        faults.unlink()
        (root / "out").rmdir()


SCHEDULE_FILES = {
    "empty": b"",
    "a mapping without faults": b"{}\n",
    "faults not a list": b"faults: 3\n",
    "entries not mappings": b"[1, 2]\n",
    "a mapping with more": b"{faults: [], colour: red}\n",
    "broken YAML": b"- [\n",
    "binary": b"\xff\xfe\x00\x01garbage",
    "nested deeply": b"[" * 20000 + b"]" * 20000,
    "larger than 1 MiB": b"# padding\n" * 120_000,
    "JSON with NaN": b'[{"kind": "delay", "severity": NaN, "step": 3}]',
    "an unknown field": b"- {kind: delay, severity: 1, step: 3, colour: red}\n",
}


@sweep("content", list(SCHEDULE_FILES.values()), ids=list(SCHEDULE_FILES))
def test_a_file_that_is_no_schedule_is_refused(content):
    with sandbox() as root:
        faults = root / "faults.yaml"
        faults.write_bytes(content)
        (root / "out").mkdir()
        refused(run_cli(*_args(("demo",), root, "--faults", str(faults)), cwd=root), str(faults))
        faults.unlink()
        (root / "out").rmdir()


@pytest.mark.parametrize("kind", ["missing", "directory", "fifo", "dangling link"])
def test_a_schedule_path_that_is_no_file_is_refused(kind):
    with sandbox() as root:
        faults = root / "faults.yaml"
        if kind == "directory":
            faults.mkdir()
        elif kind == "fifo":
            os.mkfifo(faults)
        elif kind == "dangling link":
            faults.symlink_to(root / "nowhere")
        refused(run_cli(*_args(("demo",), root, "--faults", str(faults)), cwd=root), str(faults))
        if kind == "directory":
            faults.rmdir()
        elif kind != "missing":
            faults.unlink()


# ------------------------------------------------------------------------------------------ stack.json


@pytest.fixture(scope="module")
def bystander() -> Iterator[subprocess.Popen]:
    """A live process that is not the stack's: no state file may get it signalled."""
    process = subprocess.Popen(["sleep", "600"])
    yield process
    assert process.poll() is None, f"the bystander was signalled (status {process.returncode})"
    process.kill()
    process.wait()


def _start_time(pid: int) -> str:
    stat = Path(f"/proc/{pid}/stat").read_text()
    return stat[stat.rindex(")") + 2 :].split()[19]


def _entry(**changes: Any) -> dict[str, Any]:
    entry = {
        "name": "prometheus",
        "pid": 2**15 - 7,
        "start_time": "1",
        "command": ["prometheus"],
        "log": "prometheus.log",
        "token": "ab" * 16,
    }
    entry.update(changes)
    return {key: value for key, value in entry.items() if value is not ...}


def _contained() -> list[str]:
    """``unshare`` into a new pid namespace, where a stray kill(-1) could only reach the command itself; [] when
    this machine does not allow it."""
    command = ["unshare", "--pid", "--fork", "--mount-proc", "--kill-child"]
    if shutil.which("unshare") is None:
        return []
    probe = subprocess.run([*command, "true"], capture_output=True, timeout=30)
    return command if probe.returncode == 0 else []


CONTAINED = _contained()


def _stack_down(root: Path, state: Any, *, contained: bool = False) -> subprocess.CompletedProcess:
    directory = root / "stack"
    directory.mkdir(exist_ok=True)
    text = state if isinstance(state, (str, bytes)) else json.dumps(state)
    (directory / "stack.json").write_bytes(text.encode() if isinstance(text, str) else text)
    if contained and CONTAINED:
        return subprocess.run(
            [*CONTAINED, sys.executable, "-m", "trainhealth._internal.cli", "stack", "down", "--dir", str(directory)],
            capture_output=True,
            text=True,
            timeout=REFUSAL_TIMEOUT_S,
            stdin=subprocess.DEVNULL,
        )
    return run_cli("stack", "down", "--dir", str(directory), cwd=root)


def _cleanup_stack(root: Path) -> None:
    shutil.rmtree(root / "stack")  # the test's own


BAD_PIDS = st.one_of(
    st.integers(max_value=1),
    st.integers(min_value=4_194_305, max_value=10**30),
    st.floats(allow_nan=True),
    st.booleans(),
    st.none(),
    TEXT,
    st.lists(st.integers(), max_size=2),
)


@examples(10)
@given(pid=BAD_PIDS, start_time=st.sampled_from(["", "0", "1"]))
def test_a_state_file_with_a_bad_pid_is_refused_and_nothing_signalled(bystander, pid, start_time):
    with sandbox() as root:
        result = _stack_down(root, [_entry(pid=pid, start_time=start_time)], contained=True)
        refused(result, "stack.json", "pid")
        _cleanup_stack(root)
    assert bystander.poll() is None


STATE_FILES = {
    "pid -1 (every process)": [_entry(pid=-1, start_time="")],
    "pid 0 (the process group)": [_entry(pid=0, start_time="")],
    "pid 1": [_entry(pid=1)],
    "a huge pid": [_entry(pid=10**30)],
    "a pid as text": [_entry(pid="1234")],
    "no start time": [_entry(start_time="")],
    "a start time that is no number": [_entry(start_time="yesterday")],
    "a command that is text": [_entry(command="prometheus")],
    "a command of numbers": [_entry(command=[1, 2])],
    "no token": [_entry(token=...)],
    "an empty token": [_entry(token="")],
    "an unknown field": [_entry(colour="red")],
    "a missing field": [_entry(command=...)],
    "an entry that is a list": [[1, 2]],
    "an object": {"pid": 5},
    "too many entries": [_entry()] * 17,
    "not JSON": "pid: 5",
    "binary": b"\xff\x00\xfe",
    "nested deeply": "[" * 50000 + "]" * 50000,
    "larger than 1 MiB": "[" + " " * (1 << 20) + "]",
}


@sweep("state", list(STATE_FILES.values()), ids=list(STATE_FILES))
def test_a_bad_state_file_is_refused_and_nothing_signalled(bystander, state):
    with sandbox() as root:
        refused(_stack_down(root, state, contained=True), "stack.json")
        _cleanup_stack(root)
    assert bystander.poll() is None


def test_a_state_file_naming_someone_elses_live_process_is_refused(bystander):
    start = _start_time(bystander.pid)
    command = ["sleep", "600"]
    with sandbox() as root:
        for entry in (
            _entry(pid=bystander.pid, start_time=start),  # another command line
            _entry(pid=bystander.pid, start_time=start, command=command),  # no token of ours
            _entry(
                name="demo",
                pid=os.getpid(),
                start_time=_start_time(os.getpid()),
                command=Path(f"/proc/{os.getpid()}/cmdline").read_bytes().decode().split("\0")[:-1],
            ),
        ):
            refused(_stack_down(root, [entry]), "stack.json", f"pid {entry['pid']}")
            assert bystander.poll() is None
        _cleanup_stack(root)
        # its start time differs: the pid is someone else's now, and is left alone
        done = _stack_down(root, [_entry(pid=bystander.pid, start_time=str(int(start) + 1), command=command)])
        assert done.returncode == 0 and "nothing running" in done.stdout, done.stderr
        assert not (root / "stack" / "stack.json").exists()  # the state file of a stack that is gone
        (root / "stack").rmdir()
    assert bystander.poll() is None


def test_a_state_file_that_is_a_link_or_a_directory_is_refused(bystander):
    with sandbox() as root:
        directory = root / "stack"
        directory.mkdir()
        (root / "elsewhere.json").write_text(
            json.dumps([_entry(pid=bystander.pid, start_time=_start_time(bystander.pid))])
        )
        (directory / "stack.json").symlink_to(root / "elsewhere.json")
        refused(run_cli("stack", "down", "--dir", str(directory), cwd=root), "stack.json")
        (directory / "stack.json").unlink()
        (directory / "stack.json").mkdir()
        refused(run_cli("stack", "down", "--dir", str(directory), cwd=root), "stack.json")
        shutil.rmtree(directory)
        (root / "elsewhere.json").unlink()
        refused(run_cli("stack", "down", "--dir", str(root / "keep.txt"), cwd=root), "--dir")
    assert bystander.poll() is None


# ------------------------------------------------------------------------------------------ lab results

GOOD_ROW = {
    "case": "c",
    "status": "ok",
    "reason": "",
    "run_dir": "/nonexistent/run",
    "wall_s": 1.0,
    "truth": {
        "kind": "compute",
        "pattern": "persistent",
        "layout": "ddp",
        "severity_band": "high",
        "target": 1,
        "severity": 2.0,
        "onset": 5,
        "fault": {"kind": "compute", "ranks": [1], "step": 5, "severity": 2.0},
    },
    "localize": {"verdict": "compute", "verdict_right": True, "top1": True, "false_blame": False},
    "baseline_compute": {"top1": True, "false_blame": False},
    "baseline_wait": {"top1": False, "false_blame": False},
    "live_detection_delay": 3,
    "localize_probe": None,
}
#: where in a row -> the types a good value has
ROW_FIELDS = {
    ("case",): (str,),
    ("status",): (str,),
    ("reason",): (str,),
    ("run_dir",): (str,),
    ("wall_s",): (int, float),
    ("truth",): (dict,),
    ("truth", "kind"): (str,),
    ("truth", "target"): (int, None),
    ("truth", "layout"): (str,),
    ("truth", "severity"): (int, float, None),
    ("truth", "fault"): (dict,),
    ("localize",): (dict,),
    ("localize", "top1"): (bool, None),
    ("baseline_wait",): (dict,),
    ("live_detection_delay",): (int, None),
    ("localize_probe",): (dict, None),
}
WRONG = st.sampled_from([None, True, "x", [], {}, 3, 1.5, [1, "a"], {"a": 1}])


def _wrong_for(kinds: tuple[Any, ...], value: Any) -> bool:
    if value is None:
        return None not in kinds
    if isinstance(value, bool):
        return bool not in kinds
    return not isinstance(value, tuple(kind for kind in kinds if kind is not None))


@st.composite
def bad_rows(draw: st.DrawFn) -> tuple[str, str]:
    """(results file text, the field at fault)."""
    where = draw(st.sampled_from(sorted(ROW_FIELDS)))
    row = json.loads(json.dumps(GOOD_ROW))
    holder = row
    for key in where[:-1]:
        holder = holder[key]
    if draw(st.booleans()) and None not in ROW_FIELDS[where]:
        del holder[where[-1]]
    else:
        holder[where[-1]] = draw(WRONG.filter(lambda value: _wrong_for(ROW_FIELDS[where], value)))
    good = draw(st.integers(0, 2))
    return "".join(json.dumps(GOOD_ROW) + "\n" for _ in range(good)) + json.dumps(row) + "\n", where[-1]


@examples(12)
@given(case=bad_rows())
@pytest.mark.slow
def test_a_bad_lab_results_row_is_refused_naming_the_line_and_field(case):
    text, field = case
    with sandbox() as root:
        results = root / "results.jsonl"
        results.write_text(text)
        before = tree(root)
        line = refused(run_cli("trainhealth-lab", "score", str(results), cwd=root), str(results), field)
        assert f"line {text.count(chr(10))}" in line
        assert tree(root) == before
        results.unlink()


@sweep(
    "content",
    [
        b"not json\n",
        b"[1, 2]\n",
        b'"a row"\n',
        b"\xff\xfe\n",
        b"[" * 100_000 + b"]" * 100_000 + b"\n",
        b'{"status": "ok"}\n',
    ],
    ids=["text", "a list", "a string", "binary", "nested deeply", "a partial row"],
)
def test_a_file_that_is_no_lab_results_file_is_refused(content):
    with sandbox() as root:
        results = root / "results.jsonl"
        results.write_bytes(content)
        refused(run_cli("trainhealth-lab", "score", str(results), cwd=root), str(results))
        results.unlink()
        refused(run_cli("trainhealth-lab", "score", str(root), cwd=root), str(root))  # no results.jsonl there


@pytest.mark.parametrize("kind", ["gpu", "links", "Compute"])
def test_a_lab_results_row_of_a_fault_the_lab_does_not_inject_is_refused_naming_it(kind):
    # was scored: "gpu" as the lab's compute fault, "links" as a link fault (it began with "link")
    row = json.loads(json.dumps(GOOD_ROW))
    row["truth"]["kind"] = kind
    with sandbox() as root:
        results = root / "results.jsonl"
        results.write_text(json.dumps(GOOD_ROW) + "\n" + json.dumps(row) + "\n")
        line = refused(run_cli("trainhealth-lab", "score", str(results), cwd=root), str(results), repr(kind))
        assert "line 2" in line
        results.unlink()


@pytest.mark.parametrize(
    "words", [["0-2000000000"], ["calibration", "5-1004"], ["0-999", "1000"], ["3-x"], ["-5"]], ids=str
)
def test_seed_words_are_sized_and_checked_before_a_range_is_built(words):
    # "0-2000000000" was built as a list of two billion seeds (tens of GB) before anything looked at its size
    from trainhealth._internal.errors import UsageError
    from trainhealth_lab.cli import MAX_SEEDS, seed_words

    with pytest.raises(UsageError, match="--seeds"):
        seed_words(words, range(10), range(100, 110))
    assert seed_words(["calibration", "3-4", "held-out", "7"], range(2), range(100, 102)) == [0, 1, 3, 4, 100, 101, 7]
    assert len(seed_words([f"0-{MAX_SEEDS - 1}"], range(2), range(2))) == MAX_SEEDS


def _bad_seeds(text: str) -> bool:
    from trainhealth._internal.errors import UsageError
    from trainhealth_lab.cli import parse_seeds

    try:
        parse_seeds(text)
    except UsageError:
        return text != ""  # an empty --seeds is the default
    return False


@examples(10)
@given(
    seeds=st.one_of(
        st.sampled_from(
            ["-1", "nan", "inf", "1e3", "0-", "-", "5-2", "0,0", "0-1000", str(2**31), "0-100000000000", "1,,2", "a-b"]
        ),
        TEXT,
    ).filter(_bad_seeds)
)
@pytest.mark.slow
def test_bad_seeds_are_refused(seeds):
    with sandbox() as root:
        refused(run_cli(*_args(("trainhealth-lab", "run"), root, f"--seeds={seeds}"), cwd=root), "--seeds")


# ------------------------------------------------------------------------------------------ output paths

#: option -> (the command line without it, whether the option names a file rather than a directory,
#: whether the directory must be new or empty)
OUTPUTS = {
    "demo --out": (("demo",), False, True),
    "lab run --out": (("trainhealth-lab", "run"), False, True),
    "stack up --dir": (("stack", "up"), False, True),
    "alerts --out": (("alerts",), False, False),
    "alerts --runbooks": (("alerts",), False, False),
    "alerts --operator-out": (("alerts",), False, False),
    "dashboards --out": (("dashboards",), False, False),
    "dashboards --configmap": (("dashboards",), True, False),
}
KINDS = ("missing parent", "under a file", "a file", "a directory", "a link", "a dangling link", "not empty")


def _make(root: Path, kind: str) -> Path:
    """A bad output path of ``kind`` in ``root``."""
    victim = root / "victim"
    victim.mkdir()
    (victim / "precious.txt").write_text("keep me\n")
    if kind == "missing parent":
        return root / "missing" / "out"
    if kind == "under a file":
        return root / "keep.txt" / "out"
    if kind == "a file":
        return root / "keep.txt"
    if kind == "a directory":
        return victim
    if kind == "a link":
        (root / "link").symlink_to(victim)
        return root / "link"
    if kind == "a dangling link":
        (root / "dangling").symlink_to(root / "nowhere")
        return root / "dangling"
    return victim  # not empty


def _bad_for(kind: str, is_file: bool, fresh: bool) -> bool:
    if kind == "a directory":
        return is_file
    if kind == "a file":
        return not is_file
    if kind == "not empty":
        return fresh and not is_file
    return True


CASES = [
    (name, kind) for name, (_, is_file, fresh) in OUTPUTS.items() for kind in KINDS if _bad_for(kind, is_file, fresh)
]


@sweep(("name", "kind"), CASES, ids=[f"{n}: {k}" for n, k in CASES])
def test_a_bad_output_path_is_refused(name, kind):
    path, _, _ = OUTPUTS[name]
    option = name.split()[-1]
    with sandbox() as root:
        target = _make(root, kind)
        before = tree(root)
        refused(run_cli(*_args(path, root, option, str(target)), cwd=root, env=NO_BINARIES), option)
        assert tree(root) == before
        shutil.rmtree(root / "victim")
        for link in ("link", "dangling"):
            (root / link).unlink(missing_ok=True)


@pytest.mark.parametrize("command", ["alerts", "dashboards", "stack up"])
def test_a_link_planted_where_a_file_is_written_is_refused(command):
    with sandbox() as root:
        (root / "victim.txt").write_text("keep me\n")
        out = root / "out"
        out.mkdir()
        name = {"alerts": "trainhealth.rules.yml", "dashboards": "trainhealth-gpu.json", "stack up": "prometheus.yml"}[
            command
        ]
        if command == "stack up":
            (out / ".trainhealth-stack").write_text("A state directory of trainhealth stack up.\n")
        (out / name).symlink_to(root / "victim.txt")
        before = tree(root)
        option = "--dir" if command == "stack up" else "--out"
        refused(
            run_cli(
                *command.split(),
                option,
                str(out),
                *(["--no-demo"] if command == "stack up" else []),
                cwd=root,
                env=NO_BINARIES,
            ),
            name,
        )
        assert tree(root) == before
        shutil.rmtree(out)
        (root / "victim.txt").unlink()


# ------------------------------------------------------------------------------------------ good input


def test_good_input_still_works(tmp_path):
    alerts = run_cli("alerts", "--out", str(tmp_path / "rules"), "--runbooks", str(tmp_path / "runbooks"), cwd=tmp_path)
    assert alerts.returncode == 0, alerts.stderr
    assert (tmp_path / "rules" / "trainhealth.rules.yml").is_file() and (tmp_path / "runbooks" / "README.md").is_file()
    again = run_cli("alerts", "--out", str(tmp_path / "rules"), cwd=tmp_path)  # regenerating in place is fine
    assert again.returncode == 0, again.stderr
    dashboards = run_cli(
        "dashboards", "--out", str(tmp_path / "dash"), "--configmap", str(tmp_path / "cm.yaml"), cwd=tmp_path
    )
    assert dashboards.returncode == 0, dashboards.stderr
    assert len(list((tmp_path / "dash").glob("*.json"))) >= 4 and (tmp_path / "cm.yaml").is_file()
    assert not list(tmp_path.rglob("*.partial")), "a temporary file was left behind"
    export = run_cli(
        "export",
        "--backend",
        "simulated",
        "--port",
        "0",
        "--addr",
        "127.0.0.1",
        "--simulated-gpus",
        "1",
        "--interval",
        "0.5",
        "--duration",
        "0.5",
        cwd=tmp_path,
    )
    assert export.returncode == 0 and "1 GPU(s) through simulated" in export.stdout, export.stderr
    results = tmp_path / "results.jsonl"
    results.write_text(
        json.dumps({**GOOD_ROW, "status": "error", "reason": "it broke"}) + "\n" + json.dumps(GOOD_ROW) + "\n"
    )
    score = run_cli("trainhealth-lab", "score", str(results), cwd=tmp_path)
    assert score.returncode == 0 and "runs: 2 (1 scored, 0 skipped, 1 failed)" in score.stdout, score.stderr
    down = run_cli("stack", "down", "--dir", str(tmp_path / "no-stack"), cwd=tmp_path)
    assert down.returncode == 0 and "nothing running" in down.stdout, down.stderr


# ------------------------------------------------------------------------------------------ the demo's view


def test_a_ranks_error_text_with_markup_is_shown_as_text():
    pytest.importorskip("rich")
    from rich.console import Console

    from trainhealth._internal.demo.runner import DemoOptions, _Live, _Pages, _summary

    for terminal in (False, True):
        console = Console(file=io.StringIO(), force_terminal=terminal, color_system=None, width=160)
        view = _Live(console, DemoOptions(ranks=2), _Pages())
        messages: queue.Queue = queue.Queue()
        messages.put({"rank": 0, "error": "ValueError: a [/bold] tag and [red]colour"})
        messages.put({"rank": 1, "event": "anomaly", "summary": "loss [/] odd [link=x]"})
        view._drain(messages, set())
        console.print(view._table())
        _summary(
            console,
            {"verdict": "[/v]", "suspects": [{"kind": "[/k]", "component": "[x]"}], "advice": ["[/a]"]},
            Path("[/p].html"),
            view.failures,
        )
        printed = console.file.getvalue()
        assert "a [/bold] tag and [red]colour" in printed and "loss [/] odd" in printed and "[/a]" in printed


@pytest.mark.slow
def test_ctrl_c_while_the_ranks_start_prints_no_traceback(tmp_path):
    pytest.importorskip("torch")
    pytest.importorskip("matplotlib")
    from tests.e2e.stack_checks import consecutive_free

    demo = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "trainhealth._internal.cli",
            "demo",
            "--ranks",
            "2",
            "--duration",
            "20",
            "--no-analyzer",
            "--webhook-port",
            "0",
            "--port-base",
            str(consecutive_free(2)),
            "--out",
            str(tmp_path / "d"),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
        cwd=tmp_path,
    )
    try:
        time.sleep(3.0)  # the ranks are importing torch
        os.killpg(demo.pid, signal.SIGINT)  # a Ctrl-C reaches the whole foreground group
        output, _ = demo.communicate(timeout=240)
    finally:
        if demo.poll() is None:
            os.killpg(demo.pid, signal.SIGKILL)
            demo.wait()
    assert "Traceback" not in output and "KeyboardInterrupt" not in output, output
