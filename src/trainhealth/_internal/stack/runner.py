"""``trainhealth stack up`` / ``down``: the monitoring stack and the demo as local processes, without docker.

``up`` writes the configs of the chosen topology (:mod:`trainhealth._internal.stack.topology`: one
Prometheus, or Prometheus shards writing into VictoriaMetrics with vmalert) into a state directory, with
trainhealth's alert rules (``for`` capped so a short demo shows them) and Alertmanager routing to the
demo's webhook; starts the binaries found on PATH bound to 127.0.0.1, then the demo, and records what it
started in ``stack.json``: pid, command line, the process's start time and a token put in its
environment. The state directory is new, empty or one an earlier ``up`` made (it holds
``.trainhealth-stack``): nothing else's files are overwritten.

``down`` reads ``stack.json`` as input: every entry must have a pid above 1 and
below the kernel's ``pid_max``, a start time, a command line; a bad file is
refused whole and nothing is signalled. A process whose start time differs is
gone (its pid may be someone else's now) and is left alone; one whose start time
matches but whose command line or token does not is not the one ``up`` started,
and the file is refused. Only positive pids are signalled, one process at a time
(never a process group): the demo with SIGINT so it writes its report, the
others with SIGTERM, then SIGKILL after a grace period.
"""

from __future__ import annotations

import json
import os
import secrets
import signal
import subprocess
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from trainhealth._internal._files import check_output_directory, check_output_files, write_json, write_text
from trainhealth._internal.errors import UsageError
from trainhealth._internal.stack.topology import (
    StackOptions,
    commands,
    config_names,
    find_binary,
    log_names,
    needed_binaries,
    write_configs,
)

__all__ = ["StackOptions", "find_binary", "stack_down", "stack_up", "write_configs"]

STATE = "stack.json"
#: Written by ``up`` into a state directory it made or found empty: the directory is trainhealth's.
MARKER = ".trainhealth-stack"
#: The environment variable carrying the token that ties a started process to its ``stack.json`` entry.
TOKEN_VARIABLE = "TRAINHEALTH_STACK_TOKEN"
#: A state file larger than this, or with more entries, is not one ``up`` wrote.
MAX_STATE_BYTES = 1 << 20
MAX_ENTRIES = 16


@dataclass(frozen=True)
class Started:
    """One process ``up`` started: one entry of ``stack.json``."""

    name: str
    pid: int
    start_time: str
    command: list[str]
    log: str
    token: str  # put in the process's environment (TRAINHEALTH_STACK_TOKEN): proof that up started it


def check_directory(directory: Path, options: StackOptions | None = None) -> None:
    """Refuse a state directory that is neither new, nor empty, nor one an earlier ``up`` made."""
    check_output_directory(directory, "--dir")  # new in an existing directory, or a writable directory, not a link
    marker = directory / MARKER
    ours = marker.is_file() and not marker.is_symlink()
    if directory.is_dir() and not ours and any(directory.iterdir()):
        raise UsageError(
            f"--dir {directory}: holds files that trainhealth stack up did not write; give a new or "
            f"empty directory (nothing there is overwritten)"
        )
    options = options or StackOptions(directory=directory)
    check_output_files(directory, (*config_names(options), STATE, MARKER, *log_names(options)), "--dir")


def demo_directory(directory: Path) -> Path:
    """Where the demo writes: ``demo`` in the state directory, or ``demo-2``, ... when an earlier run is there."""
    for number in range(1, 1000):
        candidate = directory / ("demo" if number == 1 else f"demo-{number}")
        if not candidate.exists() and not candidate.is_symlink():
            return candidate
        if candidate.is_dir() and not candidate.is_symlink() and not any(candidate.iterdir()):
            return candidate
    raise UsageError(f"--dir {directory}: demo-2 ... demo-999 all exist; use a new --dir")


def stack_up(options: StackOptions) -> list[Started]:
    directory = options.directory
    check_directory(directory, options)
    if (directory / STATE).exists() and _alive(_load(directory)):
        raise UsageError(f"a stack from {directory} is still running: trainhealth stack down --dir {directory}")
    for name in needed_binaries(options):
        find_binary(name)  # every one is there before anything starts
    directory.mkdir(exist_ok=True)
    write_text(directory / MARKER, "A state directory of trainhealth stack up.\n")
    write_configs(options)
    to_start = commands(options, demo_directory(directory))
    started: list[Started] = []
    try:
        for name, command in to_start:
            log = directory / f"{name}.log"
            token = secrets.token_hex(16)
            flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)
            handle = os.open(log, flags, 0o644)
            try:
                process = subprocess.Popen(
                    command,
                    stdout=handle,
                    stderr=subprocess.STDOUT,
                    stdin=subprocess.DEVNULL,
                    start_new_session=True,
                    env={**os.environ, TOKEN_VARIABLE: token},
                )
            finally:
                os.close(handle)
            started.append(Started(name, process.pid, _start_time(process.pid), command, str(log), token))
            _save(directory, started)
            time.sleep(0.5)
            if process.poll() is not None:
                raise UsageError(f"{name} exited at once (status {process.returncode}); see {log}")
    except BaseException:
        stack_down(directory)
        raise
    return started


def stack_down(directory: Path, grace_s: float = 30.0) -> list[str]:
    """Stop what ``stack_up`` started from ``directory``; returns the names stopped.

    The state file is checked whole before anything is signalled (see the module docstring).
    """
    state = directory / STATE
    if not state.exists() and not state.is_symlink():
        return []
    started = _load(directory)
    running = [entry for entry in started if _verified(entry, state)]
    stopped = []
    for entry in reversed(running):  # the demo first, so its last scrapes and pages still land
        _signal(entry, signal.SIGINT if entry.name == "demo" else signal.SIGTERM)
        deadline = time.monotonic() + grace_s
        while _start_time(entry.pid) == entry.start_time and time.monotonic() < deadline:
            _reap(entry.pid)
            time.sleep(0.2)
        if _start_time(entry.pid) == entry.start_time:
            _signal(entry, signal.SIGKILL)
            _reap(entry.pid)
        stopped.append(entry.name)
    state.unlink()  # written by up for this down
    return stopped


def _verified(entry: Started, state: Path) -> bool:
    """Whether ``entry``'s process still runs (its start time matches); a UsageError when the process with that
    pid and start time is not the one ``up`` started (its command line or token differs)."""
    if _start_time(entry.pid) != entry.start_time:
        return False  # gone; the pid may be someone else's now
    where = f"{state}: {entry.name} (pid {entry.pid})"
    if _command_line(entry.pid) != entry.command:
        raise UsageError(
            f"{where}: the process with that pid and start time runs another command line; nothing was signalled"
        )
    if _environment(entry.pid).get(TOKEN_VARIABLE) != entry.token:
        raise UsageError(
            f"{where}: the process with that pid was not started by trainhealth stack up "
            f"(its token differs); nothing was signalled"
        )
    return True


def _start_time(pid: int) -> str:
    """The process's start time in clock ticks since boot (field 22 of /proc/PID/stat); '' when it is gone."""
    if pid <= 0:
        return ""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text(errors="replace")
        fields = stat[stat.rindex(")") + 2 :].split()
        return "" if fields[0] in ("Z", "X") else fields[19]
    except (OSError, ValueError, IndexError):
        return ""


def _command_line(pid: int) -> list[str] | None:
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return None
    return [os.fsdecode(part) for part in raw.split(b"\0")[:-1]]


def _environment(pid: int) -> dict[str, str]:
    try:
        raw = Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return {}
    pairs = (os.fsdecode(part).partition("=") for part in raw.split(b"\0") if part)
    return {key: value for key, _, value in pairs}


def _signal(entry: Started, signum: int) -> None:
    """Signal the one process of ``entry``: a pid above 1 only (never -1, 0 or a group), and only while its start
    time still matches."""
    if entry.pid <= 1 or entry.pid == os.getpid():
        raise UsageError(f"refusing to signal pid {entry.pid}")
    if _start_time(entry.pid) != entry.start_time:
        return
    try:
        os.kill(entry.pid, signum)
    except ProcessLookupError:
        pass


def _reap(pid: int) -> None:
    try:
        os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        pass


def _alive(started: list[Started]) -> bool:
    return any(_start_time(entry.pid) == entry.start_time for entry in started)


def _save(directory: Path, started: list[Started]) -> None:
    write_json(directory / STATE, [asdict(s) for s in started])


def _pid_max() -> int:
    try:
        return int(Path("/proc/sys/kernel/pid_max").read_text())
    except (OSError, ValueError):
        return 1 << 22


def _load(directory: Path) -> list[Started]:
    """The entries of ``stack.json``, each checked; a UsageError naming the file, the entry and the field."""
    state = directory / STATE
    try:
        if state.is_symlink() or not state.is_file():
            raise UsageError(f"{state}: not a regular file; not a state file of trainhealth stack up")
        with state.open("rb") as handle:
            raw = handle.read(MAX_STATE_BYTES + 1)
    except OSError as exc:
        raise UsageError(f"{state}: unreadable ({exc.strerror or exc})") from None
    if len(raw) > MAX_STATE_BYTES:
        raise UsageError(f"{state}: larger than {MAX_STATE_BYTES} bytes; not a state file of trainhealth stack up")
    try:
        data = json.loads(raw.decode("utf-8"))
    except (ValueError, RecursionError) as exc:
        problem = "nested too deeply" if isinstance(exc, RecursionError) else "not JSON"
        raise UsageError(f"{state}: {problem}; not a state file of trainhealth stack up") from None
    if not isinstance(data, list) or len(data) > MAX_ENTRIES:
        raise UsageError(f"{state}: expected a list of at most {MAX_ENTRIES} processes")
    return [_entry(item, f"{state}: entry {number}") for number, item in enumerate(data, 1)]


def _entry(item: Any, where: str) -> Started:
    if not isinstance(item, dict):
        raise UsageError(f"{where}: expected an object, got {type(item).__name__}")
    fields = {"name", "pid", "start_time", "command", "log", "token"}
    unknown = sorted(str(key) for key in item if key not in fields)
    missing = sorted(fields - set(item))
    if unknown or missing:
        raise UsageError(
            f"{where}: "
            + "; ".join(
                ([f"unknown field(s) {', '.join(unknown)}"] if unknown else [])
                + ([f"missing field(s) {', '.join(missing)}"] if missing else [])
            )
        )
    pid, highest = item["pid"], _pid_max()
    if isinstance(pid, bool) or not isinstance(pid, int) or not 1 < pid <= highest:
        raise UsageError(f"{where}: pid must be an integer from 2 to {highest}, got {pid!r}")
    start_time = item["start_time"]
    if not isinstance(start_time, str) or not start_time.isdigit() or not start_time.isascii():
        raise UsageError(f"{where}: start_time must be the clock ticks from /proc/PID/stat, got {start_time!r}")
    command = item["command"]
    if not isinstance(command, list) or not all(isinstance(part, str) for part in command):
        raise UsageError(f"{where}: command must be a list of strings")
    for field in ("name", "log", "token"):
        if not isinstance(item[field], str) or not item[field]:
            raise UsageError(f"{where}: {field} must be a non-empty string, got {item[field]!r}")
    return Started(item["name"], pid, start_time, command, item["log"], item["token"])
