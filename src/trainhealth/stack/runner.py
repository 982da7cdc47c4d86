"""``trainhealth stack up`` / ``down``: Prometheus, Alertmanager and the demo as local processes, without docker.

``up`` writes the configs into a state directory (Prometheus scraping the demo's
ranks and analyzer on 127.0.0.1, trainhealth's alert rules with ``for`` capped
so a short demo shows them, Alertmanager routing to the demo's webhook),
starts the binaries found on PATH bound to 127.0.0.1, then the demo, and
records what it started in ``stack.json``: pid, command and the process's start
time. ``down`` stops exactly those processes (a pid whose start time differs is
someone else's and is left alone): the demo with SIGINT so it writes its report,
the others with SIGTERM, then SIGKILL after a grace period.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from importlib import resources
from pathlib import Path

import yaml

from trainhealth.alerts.render import rule_file_yaml
from trainhealth.errors import UsageError

__all__ = ["StackOptions", "find_binary", "stack_down", "stack_up", "write_configs"]

BINARIES = {"prometheus": ("prometheus",), "alertmanager": ("alertmanager", "prometheus-alertmanager")}
STATE = "stack.json"


@dataclass(frozen=True)
class StackOptions:
    directory: Path = Path(".trainhealth-stack")
    prometheus_port: int = 9090
    alertmanager_port: int = 9093
    webhook_port: int = 9096
    ranks: int = 4
    port_base: int = 9450
    analyzer_port: int = 9448
    scrape_interval_s: float = 5.0
    max_for_s: float = 30.0
    demo: bool = True
    demo_duration_s: float = 600.0
    demo_args: tuple[str, ...] = ()


@dataclass(frozen=True)
class Started:
    name: str
    pid: int
    start_time: str
    command: list[str]
    log: str


def find_binary(name: str) -> str:
    """The path of ``prometheus`` or ``alertmanager`` (Debian calls it prometheus-alertmanager)."""
    for candidate in BINARIES[name]:
        path = shutil.which(candidate)
        if path:
            return path
    raise UsageError(f"{name} not found on PATH (looked for {', '.join(BINARIES[name])}): install it "
                     f"(Debian/Ubuntu: apt-get install {BINARIES[name][-1]}; or prometheus.io/download), "
                     f"or use docker compose up")


def write_configs(options: StackOptions) -> dict[str, Path]:
    """prometheus.yml, trainhealth.rules.yml and alertmanager.yml in the state directory."""
    directory = options.directory
    directory.mkdir(parents=True, exist_ok=True)
    interval = f"{options.scrape_interval_s:g}s"
    prometheus = {
        "global": {"scrape_interval": interval, "evaluation_interval": interval},
        "rule_files": ["trainhealth.rules.yml"],
        "alerting": {"alertmanagers": [{"static_configs": [{"targets": [f"127.0.0.1:{options.alertmanager_port}"]}]}]},
        "scrape_configs": [
            {"job_name": "trainhealth-ranks", "honor_labels": True, "static_configs": [
                {"targets": [f"127.0.0.1:{options.port_base + r}" for r in range(options.ranks)]}]},
            {"job_name": "trainhealth-analyzer", "honor_labels": True, "static_configs": [
                {"targets": [f"127.0.0.1:{options.analyzer_port}"]}]},
        ],
    }
    paths = {"prometheus": directory / "prometheus.yml", "rules": directory / "trainhealth.rules.yml",
             "alertmanager": directory / "alertmanager.yml"}
    paths["prometheus"].write_text("# Written by trainhealth stack up.\n" + yaml.safe_dump(prometheus, sort_keys=False))
    paths["rules"].write_text(rule_file_yaml(max_for_s=options.max_for_s))
    template = resources.files("trainhealth.stack").joinpath("alertmanager.yml").read_text(encoding="utf-8")
    paths["alertmanager"].write_text(template.replace("127.0.0.1:9096", f"127.0.0.1:{options.webhook_port}"))
    return paths


def stack_up(options: StackOptions) -> list[Started]:
    directory = options.directory
    if (directory / STATE).is_file() and _alive(_load(directory)):
        raise UsageError(f"a stack from {directory} is still running: trainhealth stack down --dir {directory}")
    prometheus, alertmanager = find_binary("prometheus"), find_binary("alertmanager")
    paths = write_configs(options)
    commands = [
        ("prometheus", [prometheus, f"--config.file={paths['prometheus']}",
                        f"--storage.tsdb.path={directory / 'prometheus-data'}",
                        f"--web.listen-address=127.0.0.1:{options.prometheus_port}"]),
        ("alertmanager", [alertmanager, f"--config.file={paths['alertmanager']}",
                          f"--storage.path={directory / 'alertmanager-data'}",
                          f"--web.listen-address=127.0.0.1:{options.alertmanager_port}", "--cluster.listen-address="]),
    ]
    if options.demo:
        commands.append(("demo", [sys.executable, "-m", "trainhealth.cli", "demo", "--addr", "127.0.0.1",
                                  "--duration", f"{options.demo_duration_s:g}", "--ranks", str(options.ranks),
                                  "--port-base", str(options.port_base), "--analyzer-port", str(options.analyzer_port),
                                  "--webhook-port", str(options.webhook_port), "--out", str(directory / "demo"),
                                  *options.demo_args]))
    started: list[Started] = []
    try:
        for name, command in commands:
            log = directory / f"{name}.log"
            with log.open("ab") as handle:
                process = subprocess.Popen(command, stdout=handle, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                           start_new_session=True)
            started.append(Started(name, process.pid, _start_time(process.pid), command, str(log)))
            _save(directory, started)
            time.sleep(0.5)
            if process.poll() is not None:
                raise UsageError(f"{name} exited at once (status {process.returncode}); see {log}")
    except BaseException:
        stack_down(directory)
        raise
    return started


def stack_down(directory: Path, grace_s: float = 30.0) -> list[str]:
    """Stop what ``stack_up`` started from ``directory``; returns the names stopped."""
    if not (directory / STATE).is_file():
        return []
    started = _load(directory)
    stopped = []
    for entry in reversed(started):  # the demo first, so its last scrapes and pages still land
        if _start_time(entry.pid) != entry.start_time:
            continue  # gone, or the pid now belongs to someone else
        _signal(entry.pid, signal.SIGINT if entry.name == "demo" else signal.SIGTERM)
        deadline = time.monotonic() + grace_s
        while _start_time(entry.pid) == entry.start_time and time.monotonic() < deadline:
            _reap(entry.pid)
            time.sleep(0.2)
        if _start_time(entry.pid) == entry.start_time:
            _signal(entry.pid, signal.SIGKILL)
            _reap(entry.pid)
        stopped.append(entry.name)
    (directory / STATE).unlink()
    return stopped


def _start_time(pid: int) -> str:
    """The process's start time in clock ticks since boot (field 22 of /proc/PID/stat); '' when it is gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return ""
    fields = stat[stat.rindex(")") + 2:].split()
    return "" if fields[0] == "Z" else fields[19]


def _signal(pid: int, signum: int) -> None:
    try:
        os.kill(pid, signum)
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
    (directory / STATE).write_text(json.dumps([asdict(s) for s in started], indent=2))


def _load(directory: Path) -> list[Started]:
    try:
        return [Started(**entry) for entry in json.loads((directory / STATE).read_text())]
    except (OSError, ValueError, TypeError) as exc:
        raise UsageError(f"{directory / STATE}: unreadable ({exc})") from None
