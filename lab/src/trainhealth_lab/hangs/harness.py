"""Run one hang-lab case for real: gloo ranks, a real Prometheus with trainhealth's rules, a real Alertmanager.

:func:`run_hang_case` starts the ranks (:mod:`trainhealth_lab.hangs.rank`), each with the
Monitor serving /metrics on 127.0.0.1; Prometheus scrapes them every
``scrape_s`` seconds and evaluates the generated rule file as often, sending to
Alertmanager, which routes with trainhealth's own routing tree to a webhook the
harness serves. Every ``poll_s`` seconds the harness runs the analyzer
(:class:`~trainhealth._internal.localize.analyzer.Analyzer` over
:class:`~trainhealth._internal.localize.sources.PrometheusSource`, as ``trainhealth analyze
--prometheus URL`` does) and reads the firing alerts. A case ends when its
target was named both ways, or ``watch_s`` seconds after the onset, or (controls)
when the job finishes.

The outcome records, from the onset the target rank wrote: when the analyzer first
said ``hang`` and whom it named first; when a hang rule (HungCollective,
RankMissing) first fired in Prometheus naming whom, and when Alertmanager
delivered the page; and what the target's watcher said about where it was stuck.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from contextlib import ExitStack
from dataclasses import asdict, dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from importlib import resources
from pathlib import Path
from typing import Any

import yaml

from trainhealth._internal._ports import free_port
from trainhealth._internal.alerts.render import rule_file_yaml
from trainhealth._internal.localize.analyzer import Analyzer
from trainhealth._internal.localize.prometheus_api import PrometheusClient
from trainhealth._internal.localize.sources import PrometheusSource
from trainhealth._internal.store import MetricStore

__all__ = ["HANG_ALERTS", "HangCase", "HangOutcome", "run_hang_case"]

#: the rules that name a hung or gone rank
HANG_ALERTS = ("HungCollective", "RankMissing")
HANGS = ("host_stall", "other_group", "dead_open")
#: cases that end the job within a second (gloo fails the peers' collective): named from the peers' dumps
CRASHES = ("exit_plain", "size_mismatch")
CONTROLS = ("checkpoint", "evaluation", "startup_barrier", "slow_loader")


@dataclass(frozen=True)
class HangCase:
    """One case: ``kind`` (a hang or a control), its ``target`` rank, the step it begins at."""

    kind: str
    seed: int = 0
    world: int = 4
    target: int = 2
    partner: int = 1
    onset_step: int = 60
    steps: int = 200
    step_s: float = 0.03
    pause_s: float = 25.0
    watch_s: float = 75.0
    scrape_s: float = 2.0
    poll_s: float = 2.0
    collective_timeout_s: float = 600.0

    @property
    def is_hang(self) -> bool:
        return self.kind in HANGS

    @property
    def is_crash(self) -> bool:
        return self.kind in CRASHES


@dataclass
class HangOutcome:
    case: HangCase
    onset: float | None = None  # unix time the target began (or the pausing rank)
    analyzer_first_s: float | None = None  # seconds from onset to the first hang verdict
    analyzer_named: int | None = None  # the first suspect of that verdict
    analyzer_verdicts: list[str] = field(default_factory=list)  # every verdict seen after the onset
    analyzer_evidence: str = ""
    cli_named: int | None = None  # `trainhealth analyze --prometheus URL --once --json`, run once at that moment
    cli_verdict: str = ""
    rule_first_s: float | None = None  # seconds from onset to the first hang alert firing in Prometheus
    rule_named: int | None = None
    rule_name: str = ""
    page_first_s: float | None = None  # seconds from onset to the first page Alertmanager delivered
    page_alerts: list[str] = field(default_factory=list)
    where: str = ""  # the target's trainhealth_comm_stuck_duration_seconds{where}
    stacks_files: int = 0
    fr_named: int | None = None  # `trainhealth localize` on the Flight Recorder dumps the watchers wrote
    fr_ours: list[Any] = field(default_factory=list)  # [group, seq, lagging ranks] of its first hang
    fr_torch: list[Any] = field(default_factory=list)  # torch's fr_trace on the same dumps: [[group, seq, missing]]
    # (group and seq None: it named ranks that left no dump and could not decide more)
    analyzer_errors: int = 0
    notes: list[str] = field(default_factory=list)

    @property
    def fr_agrees(self) -> bool | None:
        """Whether torch's analyzer reports the hang our verdict names (None: no dumps to compare)."""
        if not self.fr_ours or not self.fr_torch:
            return None
        group, seq, lagging = self.fr_ours[0], self.fr_ours[1], sorted(self.fr_ours[2])
        return any(
            (g is None or g == group) and (s is None or s == seq) and sorted(missing) == lagging
            for g, s, missing in self.fr_torch
        )

    @property
    def right(self) -> bool:
        """A hang named with the target first, by the analyzer and by the rules; a crash, by ``trainhealth
        localize`` on the dumps the surviving ranks wrote as their collective failed; a control with none."""
        if self.case.is_crash:
            return self.fr_named == self.case.target
        if self.case.is_hang:
            return self.analyzer_named == self.case.target and self.rule_named == self.case.target
        return self.analyzer_first_s is None and self.rule_first_s is None and self.page_first_s is None

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "right": self.right, "fr_agrees": self.fr_agrees}


class _Webhook:
    """Alertmanager's webhook receiver: the time each alert of each delivery arrived."""

    def __init__(self) -> None:
        self.received: list[tuple[float, str, dict[str, Any]]] = []
        owner = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802
                body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))) or b"{}")
                for alert in body.get("alerts", []):
                    if alert.get("status") == "firing":
                        owner.received.append((time.time(), self.path, alert.get("labels", {})))
                self.send_response(200)
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def _binary(*names: str) -> str:
    for name in names:
        found = shutil.which(name)
        if found:
            return found
    raise FileNotFoundError(f"{names[0]} is not installed (Debian package)")


def _get(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=5) as response:
        return json.loads(response.read())


def _wait_ready(url: str, process: subprocess.Popen, log: Path, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"{url} exited: {log.read_text()[-1000:]}")
        try:
            with urllib.request.urlopen(url, timeout=2):
                return
        except OSError:
            time.sleep(0.3)
    raise TimeoutError(f"{url} not ready after {timeout_s} s")


def _start(stack: ExitStack, command: list[str], log: Path, env: dict[str, str] | None = None) -> subprocess.Popen:
    process = subprocess.Popen(command, stdout=log.open("w"), stderr=subprocess.STDOUT, env=env, start_new_session=True)

    def stop() -> None:
        try:
            os.killpg(process.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        process.wait(timeout=30)

    stack.callback(stop)
    return process


def _services(stack: ExitStack, out: Path, case: HangCase, ports: list[int], webhook: _Webhook) -> str:
    """Alertmanager and Prometheus on 127.0.0.1; Prometheus's URL."""
    am_port, prom_port = free_port(), free_port()
    template = resources.files("trainhealth._internal.stack").joinpath("alertmanager.yml").read_text(encoding="utf-8")
    (out / "alertmanager.yml").write_text(template.replace("127.0.0.1:9096", f"127.0.0.1:{webhook.port}"))
    alertmanager = _start(
        stack,
        [
            _binary("alertmanager", "prometheus-alertmanager"),
            f"--config.file={out / 'alertmanager.yml'}",
            f"--storage.path={out / 'am-data'}",
            f"--web.listen-address=127.0.0.1:{am_port}",
            "--cluster.listen-address=",
        ],
        out / "alertmanager.log",
    )
    (out / "trainhealth.rules.yml").write_text(rule_file_yaml())
    interval = f"{case.scrape_s:g}s"
    config = {
        "global": {"scrape_interval": interval, "evaluation_interval": interval, "scrape_timeout": interval},
        "rule_files": [str(out / "trainhealth.rules.yml")],
        "alerting": {"alertmanagers": [{"static_configs": [{"targets": [f"127.0.0.1:{am_port}"]}]}]},
        "scrape_configs": [
            {
                "job_name": "trainhealth-ranks",
                "honor_labels": True,
                "static_configs": [{"targets": [f"127.0.0.1:{p}" for p in ports]}],
            }
        ],
    }
    (out / "prometheus.yml").write_text(yaml.safe_dump(config))
    prometheus = _start(
        stack,
        [
            _binary("prometheus"),
            f"--config.file={out / 'prometheus.yml'}",
            f"--storage.tsdb.path={out / 'data'}",
            f"--web.listen-address=127.0.0.1:{prom_port}",
        ],
        out / "prometheus.log",
    )
    _wait_ready(f"http://127.0.0.1:{am_port}/-/ready", alertmanager, out / "alertmanager.log")
    _wait_ready(f"http://127.0.0.1:{prom_port}/-/ready", prometheus, out / "prometheus.log")
    return f"http://127.0.0.1:{prom_port}"


def run_hang_case(case: HangCase, out: Path) -> HangOutcome:
    """Run ``case`` with its files under ``out`` (made, and emptied first); the outcome is also ``outcome.json``."""
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    outcome = HangOutcome(case)
    ports = [free_port() for _ in range(case.world)]
    spec = {**asdict(case), "out": str(out), "metrics_ports": ports}
    (out / "case.json").write_text(json.dumps(spec))
    with ExitStack() as stack:
        webhook = _Webhook()
        stack.callback(webhook.close)
        url = _services(stack, out, case, ports, webhook)
        master = free_port()
        ranks = []
        for rank in range(case.world):
            env = {
                **os.environ,
                "RANK": str(rank),
                "WORLD_SIZE": str(case.world),
                "LOCAL_RANK": str(rank),
                "MASTER_ADDR": "127.0.0.1",
                "MASTER_PORT": str(master),
                "TRAINHEALTH_JOB": f"hang-{case.kind}",
                "OMP_NUM_THREADS": "1",
                "TRAINHEALTH_COMM_FLUSH_INTERVAL": "1",
                "TORCH_FR_BUFFER_SIZE": "2000",
            }
            ranks.append(
                _start(
                    stack,
                    [sys.executable, "-m", "trainhealth_lab.hangs.rank", str(out / "case.json")],
                    out / f"rank-{rank}.log",
                    env,
                )
            )
        _watch(case, out, url, ranks, webhook, outcome)
    if case.is_hang or case.is_crash:
        _flight_recorder(out / "traces" / "flight-recorder", outcome)
    (out / "outcome.json").write_text(json.dumps(outcome.to_dict(), indent=1))
    return outcome


def _watch(
    case: HangCase, out: Path, url: str, ranks: list[subprocess.Popen], webhook: _Webhook, outcome: HangOutcome
) -> None:
    client = PrometheusClient(url, timeout=10.0)
    analyzer = Analyzer(PrometheusSource(client, window=120.0, step=10.0), MetricStore())
    deadline = time.monotonic() + 240.0  # start-up, onset and watching, whatever the case does
    while time.monotonic() < deadline:
        began = time.monotonic()
        onset_file = next(iter(out.glob("onset-*.json")), None)
        if outcome.onset is None and onset_file is not None:
            outcome.onset = float(json.loads(onset_file.read_text())["time"])
        if outcome.onset is not None:
            _look(case, client, analyzer, webhook, outcome)
            if (
                case.is_hang
                and outcome.analyzer_named is not None
                and outcome.rule_named is not None
                and outcome.page_first_s is not None
            ):
                break
            if time.time() - outcome.onset > case.watch_s:
                break
        finished = len(list(out.glob("done-*"))) == case.world
        if finished or all(r.poll() is not None for r in ranks):
            if outcome.onset is not None:
                _look(case, client, analyzer, webhook, outcome)
            if not finished:
                outcome.notes.append(
                    "every rank exited before the job finished: "
                    + ", ".join(f"rank {i} status {r.returncode}" for i, r in enumerate(ranks))
                )
            break
        time.sleep(max(0.0, case.poll_s - (time.monotonic() - began)))
    else:
        outcome.notes.append("the case ran out of time")
    outcome.stacks_files = len(list((out / "traces" / "stacks").glob("*.txt"))) if (out / "traces").exists() else 0


def _look(
    case: HangCase, client: PrometheusClient, analyzer: Analyzer, webhook: _Webhook, outcome: HangOutcome
) -> None:
    now = time.time()
    since = now - (outcome.onset or now)
    result = analyzer.run_once()
    if result is None:
        outcome.analyzer_errors += 1
    else:
        outcome.analyzer_verdicts.append(result.verdict)
        if result.verdict == "hang" and outcome.analyzer_first_s is None:
            outcome.analyzer_first_s = round(since, 1)
            outcome.analyzer_named = result.suspects[0].ranks[0] if result.suspects else None
            outcome.analyzer_evidence = result.suspects[0].evidence if result.suspects else ""
            _cli(client.url, outcome)
    try:
        alerts = client.query('ALERTS{alertstate="firing"}')
        stuck = client.query(f'trainhealth_comm_stuck_duration_seconds{{rank="{case.target}"}}')
    except Exception as exc:  # a slow answer on a busy machine: look again next time
        outcome.notes.append(f"Prometheus: {exc}")
        return
    for series in alerts:
        name = series.labels.get("alertname", "")
        if name in HANG_ALERTS and outcome.rule_first_s is None:
            outcome.rule_first_s = round(since, 1)
            outcome.rule_name = name
            rank = series.labels.get("rank", "")
            outcome.rule_named = int(rank) if rank.isdigit() else None
    if stuck and not outcome.where:
        outcome.where = stuck[0].labels.get("where", "")
    pages = [
        (t, labels)
        for t, path, labels in webhook.received
        if path.endswith("/page") and labels.get("alertname") in HANG_ALERTS
    ]
    if pages and outcome.page_first_s is None:
        outcome.page_first_s = round(pages[0][0] - (outcome.onset or pages[0][0]), 1)
        outcome.page_alerts = sorted(
            {labels.get("alertname", "") + ":" + labels.get("rank", "") for _, labels in pages}
        )


def _command(outcome: HangOutcome, *args: str) -> dict[str, Any] | None:
    """``trainhealth ARGS`` (with ``--json``) as on-call runs it: its answer, or None (noted) when it gave none."""
    done = subprocess.run(
        [sys.executable, "-m", "trainhealth._internal.cli", *args, "--json"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    try:
        return dict(json.loads(done.stdout))
    except (json.JSONDecodeError, TypeError, ValueError):
        outcome.notes.append(f"trainhealth {args[0]} exited {done.returncode}: {done.stderr.strip()[-300:]}")
        return None


def _first_rank(answer: dict[str, Any]) -> int | None:
    return ((answer.get("suspects") or [{}])[0].get("ranks") or [None])[0]


def _cli(url: str, outcome: HangOutcome) -> None:
    """The same question through the command on-call runs: its verdict and first suspect."""
    answer = _command(outcome, "analyze", "--prometheus", url, "--once")
    if answer is not None:
        outcome.cli_verdict = answer.get("verdict", "")
        outcome.cli_named = _first_rank(answer)


def _flight_recorder(dumps: Path, outcome: HangOutcome) -> None:
    """The hang through Flight Recorder: `trainhealth localize` on the dumps the watchers wrote, and torch's
    ``fr_trace`` on the same dumps."""
    if not dumps.is_dir() or not list(dumps.glob("rank_*")):
        outcome.notes.append("no Flight Recorder dumps")
        return
    answer = _command(outcome, "localize", str(dumps))
    if answer is None:
        return
    if answer.get("verdict") == "hang":
        outcome.fr_named = _first_rank(answer)
        first = answer["hangs"][0]
        outcome.fr_ours = [first["group"], first["seq"], first["lagging_ranks"]]
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "torch.distributed.flight_recorder.fr_trace",
            str(dumps),
            "--prefix",
            "rank_",
            "--allow-incomplete-ranks",
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    said = done.stdout + done.stderr
    for block in said.split("Not all ranks joining collective")[1:]:
        seq = re.search(r"sequence number: (\d+)", block)
        group = re.search(r"group info: ([^:\s]+)", block)
        missing = re.search(r"missing ranks: \{([\d, ]*)\}", block)
        if seq and group and missing:
            outcome.fr_torch.append(
                [group.group(1), int(seq.group(1)), sorted(int(r) for r in missing.group(1).split(",") if r.strip())]
            )
    # a rank that left no dump: torch's analyzer names it and says it cannot decide more
    undecided = re.search(r"missed FR dumps from ranks \(\{([\d, ]*)\}\)", said)
    if undecided:
        outcome.fr_torch.append([None, None, sorted(int(r) for r in undecided.group(1).split(",") if r.strip())])
    if not outcome.fr_torch:
        outcome.notes.append(f"fr_trace reported no hang (exit {done.returncode}): {said.strip()[-300:]}")
