"""Run one hang-lab case for real: ranks on gloo (or a backend with NCCL's semantics), a real Prometheus with
trainhealth's rules, a real Alertmanager.

:func:`run_hang_case` starts the ranks (:mod:`trainhealth_lab.hangs.rank`), each with the
Monitor serving /metrics on 127.0.0.1; Prometheus scrapes them every
``scrape_s`` seconds and evaluates the generated rule file as often, sending to
Alertmanager, which routes with trainhealth's own routing tree to a webhook the
harness serves. Every ``poll_s`` seconds the harness runs the analyzer
(:class:`~trainhealth._internal.localize.analyzer.Analyzer` over
:class:`~trainhealth._internal.localize.sources.PrometheusSource`, as ``trainhealth analyze
--prometheus URL`` does) and reads the firing alerts. A case ends when its
target was named both ways and paged, or ``watch_s`` seconds after the onset, or (controls)
when the job finishes.

``two_jobs`` runs two jobs of the same logical name against the one Prometheus (two sets of
ranks, two rendezvous ports, torchrun's environment without a run id): the first hangs
(``host_stall``), the second is healthy and trains through the whole watch (``watch_s`` after the
onset, however soon the hung one is named). Each is judged on its own: the analyzer's result
for its job label (the analyzer judges every job Prometheus holds, each on its own), the
alerts and pages by the scrape target they came from (``instance``), so the healthy job
counts as named when both jobs share a job label.

The outcome records, from the onset the target rank wrote: when the analyzer first
said ``hang``, whom it named first and in which group; when a hang rule (every paging
rule that reads the hang watcher's series: :func:`hang_alerts`) first fired in Prometheus
naming whom, and when Alertmanager delivered the page and what it said; what the target's
watcher said about where it was stuck; the job labels each job's ranks exported; and, for
``two_jobs``, when (if ever) the healthy job was named.
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

from trainhealth._internal import catalog
from trainhealth._internal._ports import free_port
from trainhealth._internal.alerts.render import rule_file_yaml
from trainhealth._internal.localize.analyzer import Analyzer
from trainhealth._internal.localize.prometheus_api import PrometheusClient
from trainhealth._internal.localize.result import JobResults
from trainhealth._internal.localize.sources import PrometheusSource
from trainhealth._internal.store import MetricStore
from trainhealth_lab.hangs.backends import BACKENDS

__all__ = [
    "BACKENDS",
    "CONTROLS",
    "CRASHES",
    "GLOO_ONLY",
    "HANGS",
    "HANG_ALERTS",
    "HangCase",
    "HangOutcome",
    "hang_alerts",
    "run_hang_case",
]

#: the rules that named a hung or gone rank before issue 48 (the rule file's own list: :func:`hang_alerts`)
HANG_ALERTS = ("HungCollective", "RankMissing")
HANGS = ("host_stall", "other_group", "dead_open", "two_jobs", "churn_groups_hang", "disk_stall", "endless_pause")
#: cases that end the job within a second (gloo fails the peers' collective): named from the peers' dumps
CRASHES = ("exit_plain", "size_mismatch")
CONTROLS = (
    "checkpoint",
    "evaluation",
    "startup_barrier",
    "slow_loader",
    "setup_barriers",
    "hf_save",
    "long_collective",
    "churn_groups",
)
#: kinds that run on gloo only: a Hugging Face Trainer opens its own gloo group; the slow collective is a
#: host-side delay inside the call, which on a backend whose calls return at once would be no collective's
GLOO_ONLY = ("hf_save", "long_collective")
#: ``two_jobs``: the healthy job's steps, in the case's steps (it must outlast the watch)
HEALTHY_STEPS_FACTOR = 20
#: ``disk_stall``: how long after the disk is back the case still runs, for the evidence to be written
EVIDENCE_S = 15.0
#: the longest a disk stall may hold the page back (issue 48)
DISK_STALL_PAGE_S = 60.0
#: the series of the hang watcher: a paging rule that reads one of them is a hang rule
_WATCHER_SERIES = tuple(
    spec.prometheus_name
    for spec in (
        catalog.COMM_STARTED_SEQ,
        catalog.COMM_INFLIGHT_DURATION,
        catalog.COMM_STUCK_DURATION,
        catalog.COMM_WATCH_TIMESTAMP,
    )
)


def hang_alerts(rules: str) -> tuple[str, ...]:
    """The paging rules of a rule file (YAML text) that read the hang watcher's series: HungCollective,
    RankMissing, and whatever rule later reads them (a pause past its bound, a watcher that stopped)."""
    names = {
        rule["alert"]
        for group in yaml.safe_load(rules).get("groups", [])
        for rule in group.get("rules", [])
        if "alert" in rule
        and rule.get("labels", {}).get("severity") == "page"
        and any(series in rule.get("expr", "") for series in _WATCHER_SERIES)
    }
    return tuple(sorted(names))


@dataclass(frozen=True)
class HangCase:
    """One case: ``kind`` (a hang or a control), its ``target`` rank, the step it begins at, the ``backend``.

    ``pause_s`` is the length of the case's pause or fault (see :mod:`trainhealth_lab.hangs.rank`);
    ``pause_limit_s``, when set, is given to every rank's Monitor as ``comm_pause_limit``.
    """

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
    backend: str = "gloo"
    pause_limit_s: float | None = None

    def __post_init__(self) -> None:
        if self.kind not in (*HANGS, *CRASHES, *CONTROLS):
            raise ValueError(f"kind {self.kind!r} is not a hang, a crash or a control of the lab")
        if self.backend not in BACKENDS:
            raise ValueError(f"backend {self.backend!r} is not one of {', '.join(BACKENDS)}")
        if self.backend != "gloo" and self.kind in GLOO_ONLY:
            raise ValueError(f"{self.kind} runs on gloo only")

    @property
    def is_hang(self) -> bool:
        return self.kind in HANGS

    @property
    def is_crash(self) -> bool:
        return self.kind in CRASHES

    @property
    def name(self) -> str:
        """``kind-seed``, with the backend where it is not gloo: the case's directory under a run's output."""
        return f"{self.kind}-{self.seed}" + ("" if self.backend == "gloo" else f"-{self.backend}")

    @property
    def jobs(self) -> tuple[str, ...]:
        """What each job of the case runs (the rank's ``kind``): one job, or ``two_jobs``' hung and healthy."""
        return ("host_stall", "healthy") if self.kind == "two_jobs" else (self.kind,)

    @property
    def reason(self) -> str:
        """The pause reason a page of ``endless_pause`` must name."""
        return "checkpoint" if self.kind == "endless_pause" else ""


@dataclass
class HangOutcome:
    case: HangCase
    onset: float | None = None  # unix time the target began (or the pausing rank)
    analyzer_first_s: float | None = None  # seconds from onset to the first hang verdict
    analyzer_named: int | None = None  # the first suspect of that verdict
    analyzer_group: str = ""  # the hung group of that verdict (its first hang)
    analyzer_mismatch: dict[str, str] = field(default_factory=dict)  # its members inside another collective
    analyzer_verdicts: list[str] = field(default_factory=list)  # every verdict seen after the onset
    analyzer_evidence: str = ""
    cli_named: int | None = None  # `trainhealth analyze --prometheus URL --once --json`, run once at that moment
    cli_verdict: str = ""
    rule_first_s: float | None = None  # seconds from onset to the first hang alert firing in Prometheus
    rule_named: int | None = None
    rule_name: str = ""
    rule_alerts: list[str] = field(default_factory=list)  # every hang alert seen firing, "name:rank"
    page_first_s: float | None = None  # seconds from onset to the first page Alertmanager delivered
    page_alerts: list[str] = field(default_factory=list)
    page_text: str = ""  # the first hang page's reason label and summary
    pages_other: list[str] = field(default_factory=list)  # pages of other rules, "name:rank" (not scored)
    where: str = ""  # the target's trainhealth_comm_stuck_duration_seconds{where}
    stuck_state: str = ""  # ... and its {state}: in_collective, outside_collectives, in_pause
    stacks_files: int = 0
    groups_seen: int = 0  # the most groups the case's job exported positions of at once (churn_groups: bounded?)
    job_labels: dict[str, list[str]] = field(default_factory=dict)  # per job: the job labels its ranks exported
    job_names: dict[str, list[str]] = field(default_factory=dict)  # per job: trainhealth_rank_info's job_name
    healthy_judged: int = 0  # two_jobs: the analyzer's runs that judged the healthy job
    healthy_verdict_s: float | None = None  # two_jobs: seconds from onset to the healthy job's first hang verdict
    healthy_rule_s: float | None = None  # ... to a hang alert naming one of its ranks
    healthy_page_s: float | None = None  # ... to a page naming one of its ranks
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
    def named(self) -> bool:
        """The target named first by the analyzer and by a hang rule."""
        return self.analyzer_named == self.case.target and self.rule_named == self.case.target

    @property
    def labels_disjoint(self) -> bool | None:
        """``two_jobs``: every rank of each job exported one job label, and the jobs' labels differ (None: another
        case, or a job whose labels were never seen)."""
        if self.case.kind != "two_jobs":
            return None
        hung, healthy = self.job_labels.get("hung", []), self.job_labels.get("healthy", [])
        if not hung or not healthy:
            return None
        return len(hung) == 1 and len(healthy) == 1 and not set(hung) & set(healthy)

    @property
    def healthy_named(self) -> bool:
        """``two_jobs``: the healthy job got a hang verdict, a hang alert or a hang page."""
        return any(t is not None for t in (self.healthy_verdict_s, self.healthy_rule_s, self.healthy_page_s))

    @property
    def page_names_reason(self) -> bool:
        """The first hang page names the case's pause reason (``endless_pause``)."""
        return bool(self.case.reason) and self.case.reason in self.page_text

    @property
    def right(self) -> bool:
        """A hang named with the target first, by the analyzer and by the rules (``two_jobs``: and never the
        healthy job, whose labels differ; ``disk_stall``: and paged within :data:`DISK_STALL_PAGE_S`;
        ``endless_pause``: and paged with the pause's reason); a crash, by ``trainhealth localize`` on the dumps
        the surviving ranks wrote as their collective failed; a control with none."""
        kind = self.case.kind
        if self.case.is_crash:
            return self.fr_named == self.case.target
        if not self.case.is_hang:
            return self.analyzer_first_s is None and self.rule_first_s is None and self.page_first_s is None
        if kind == "two_jobs":
            return self.named and not self.healthy_named and bool(self.labels_disjoint)
        if kind == "disk_stall":
            return self.named and self.page_first_s is not None and self.page_first_s <= DISK_STALL_PAGE_S
        if kind == "endless_pause":
            return self.named and self.page_first_s is not None and self.page_names_reason
        return self.named

    def to_dict(self) -> dict[str, Any]:
        return {
            **asdict(self),
            "right": self.right,
            "fr_agrees": self.fr_agrees,
            "labels_disjoint": self.labels_disjoint,
            "healthy_named": self.healthy_named,
            "page_names_reason": self.page_names_reason,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> HangOutcome:
        """An outcome from its ``outcome.json`` (:meth:`to_dict`); fields it lacks (older runs) get defaults."""
        data = dict(data)
        for derived in ("right", "fr_agrees", "labels_disjoint", "healthy_named", "page_names_reason"):
            data.pop(derived, None)
        return cls(HangCase(**data.pop("case")), **data)


class _Webhook:
    """Alertmanager's webhook receiver: the time each firing alert of each delivery arrived, and the alert."""

    def __init__(self) -> None:
        self.received: list[tuple[float, str, dict[str, Any]]] = []
        owner = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802
                body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))) or b"{}")
                for alert in body.get("alerts", []):
                    if alert.get("status") == "firing":
                        owner.received.append((time.time(), self.path, alert))
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


@dataclass(frozen=True)
class _Job:
    """One job of a case: its name in the outcome, its directory (rank files, traces), what its ranks run."""

    name: str
    out: Path
    kind: str
    ports: tuple[int, ...]

    @property
    def instances(self) -> tuple[str, ...]:
        return tuple(f"127.0.0.1:{port}" for port in self.ports)


def _binary(*names: str) -> str:
    for name in names:
        found = shutil.which(name)
        if found:
            return found
    raise FileNotFoundError(f"{names[0]} is not installed (Debian package)")


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


def _services(stack: ExitStack, out: Path, case: HangCase, targets: list[str], webhook: _Webhook) -> str:
    """Alertmanager and Prometheus (scraping ``targets``) on 127.0.0.1; Prometheus's URL."""
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
    interval = f"{case.scrape_s:g}s"
    config = {
        "global": {"scrape_interval": interval, "evaluation_interval": interval, "scrape_timeout": interval},
        "rule_files": [str(out / "trainhealth.rules.yml")],
        "alerting": {"alertmanagers": [{"static_configs": [{"targets": [f"127.0.0.1:{am_port}"]}]}]},
        "scrape_configs": [
            {"job_name": "trainhealth-ranks", "honor_labels": True, "static_configs": [{"targets": targets}]}
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


def _rank_env(case: HangCase, job: _Job, rank: int, master: int) -> dict[str, str]:
    """torch.distributed's variables for ``rank``; ``two_jobs`` as torchrun without ``--rdzv-id`` sets them."""
    env = {
        **os.environ,
        "RANK": str(rank),
        "WORLD_SIZE": str(case.world),
        "LOCAL_RANK": str(rank),
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(master),
        "OMP_NUM_THREADS": "1",
        "TRAINHEALTH_COMM_FLUSH_INTERVAL": "1",
        "TORCH_FR_BUFFER_SIZE": "2000",
    }
    if case.kind != "two_jobs":
        env["TRAINHEALTH_JOB"] = f"hang-{case.kind}"
        return env
    for name in ("TRAINHEALTH_JOB", "TRAINHEALTH_RUN_ID", "SLURM_JOB_ID", "JOBSET_NAME", "PYTORCHJOB_NAME"):
        env.pop(name, None)
    env.update(
        {
            "TORCHELASTIC_RUN_ID": "none",  # torchrun's default: every run without --rdzv-id shares it
            "GROUP_RANK": "0",
            "ROLE_RANK": str(rank),
            "ROLE_NAME": "default",
            "LOCAL_WORLD_SIZE": str(case.world),
            "GROUP_WORLD_SIZE": "1",
            "ROLE_WORLD_SIZE": str(case.world),
            "TORCHELASTIC_RESTART_COUNT": "0",
            "TORCHELASTIC_MAX_RESTARTS": "0",
        }
    )
    return env


def run_hang_case(case: HangCase, out: Path) -> HangOutcome:
    """Run ``case`` with its files under ``out`` (made, and emptied first); the outcome is also ``outcome.json``."""
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    outcome = HangOutcome(case)
    names = ("hung", "healthy") if len(case.jobs) == 2 else ("job",)
    jobs = [
        _Job(name, out if len(case.jobs) == 1 else out / name, kind, tuple(free_port() for _ in range(case.world)))
        for name, kind in zip(names, case.jobs)
    ]
    rules = rule_file_yaml()
    (out / "trainhealth.rules.yml").write_text(rules)
    with ExitStack() as stack:
        webhook = _Webhook()
        stack.callback(webhook.close)
        url = _services(stack, out, case, [target for job in jobs for target in job.instances], webhook)
        ranks = []
        for job in jobs:
            job.out.mkdir(parents=True, exist_ok=True)
            spec = {**asdict(case), "kind": job.kind, "out": str(job.out), "metrics_ports": list(job.ports)}
            if job.kind == "healthy":  # it trains through the whole watch, never ending before the hung job is judged
                spec["steps"] = HEALTHY_STEPS_FACTOR * case.steps
            (job.out / "case.json").write_text(json.dumps(spec))
            master = free_port()
            for rank in range(case.world):
                command = [sys.executable, "-m", "trainhealth_lab.hangs.rank", str(job.out / "case.json")]
                env = _rank_env(case, job, rank, master)
                ranks.append(_start(stack, command, job.out / f"rank-{rank}.log", env))
        _Watch(case, jobs, url, hang_alerts(rules), webhook, outcome).run(ranks)
    if case.is_hang or case.is_crash:
        _flight_recorder(jobs[0].out / "traces" / "flight-recorder", outcome)
    (out / "outcome.json").write_text(json.dumps(outcome.to_dict(), indent=1))
    return outcome


class _Watch:
    """The harness's poll: the analyzer, the alerts and the pages, for each job of a case, from the onset on."""

    def __init__(
        self,
        case: HangCase,
        jobs: list[_Job],
        url: str,
        alerts: tuple[str, ...],
        webhook: _Webhook,
        outcome: HangOutcome,
    ) -> None:
        self.case, self.jobs, self.alerts, self.webhook, self.outcome = case, jobs, alerts, webhook, outcome
        self.client = PrometheusClient(url, timeout=10.0)
        self.instances = {instance: index for index, job in enumerate(jobs) for instance in job.instances}
        # every job Prometheus holds, each judged on its own, as `trainhealth analyze --prometheus URL`
        self.analyzer = Analyzer(PrometheusSource(self.client, window=120.0, step=10.0), MetricStore())

    def run(self, ranks: list[subprocess.Popen]) -> None:
        case, outcome = self.case, self.outcome
        out = self.jobs[0].out
        deadline = time.monotonic() + max(240.0, 165.0 + case.watch_s)  # start-up, onset and watching
        while time.monotonic() < deadline:
            began = time.monotonic()
            onset_file = next(iter(out.glob("onset-*.json")), None)
            if outcome.onset is None and onset_file is not None:
                try:
                    outcome.onset = float(json.loads(onset_file.read_text())["time"])
                except (ValueError, KeyError):
                    pass  # being written: read at the next poll
            if outcome.onset is not None:
                self.look()
                if (
                    case.is_hang
                    and len(self.jobs) == 1  # two jobs: the healthy one is watched for the whole watch_s
                    and (case.kind != "disk_stall" or time.time() - outcome.onset > case.pause_s + EVIDENCE_S)
                    and outcome.analyzer_named is not None
                    and outcome.rule_named is not None
                    and outcome.page_first_s is not None
                ):
                    break
                if time.time() - outcome.onset > case.watch_s:
                    break
            finished = sum(len(list(job.out.glob("done-*"))) for job in self.jobs) == case.world * len(self.jobs)
            if finished or all(r.poll() is not None for r in ranks):
                if outcome.onset is not None:
                    self.look()
                if not finished:
                    self._exited(ranks)
                break
            time.sleep(max(0.0, case.poll_s - (time.monotonic() - began)))
        else:
            outcome.notes.append("the case ran out of time")
            self._failed(ranks)
        stacks = out / "traces" / "stacks"
        outcome.stacks_files = len(list(stacks.glob("*.txt"))) if stacks.is_dir() else 0

    def _exited(self, ranks: list[subprocess.Popen]) -> None:
        """Every rank exited before the job finished: how, with the last line of each failed rank's log."""
        self.outcome.notes.append(
            "every rank exited before the job finished: "
            + ", ".join(f"rank {i % self.case.world} status {r.returncode}" for i, r in enumerate(ranks))
        )
        self._failed(ranks)

    def _failed(self, ranks: list[subprocess.Popen]) -> None:
        """The last line of each failed rank's log, by job."""
        for index, process in enumerate(ranks):
            job, rank = self.jobs[index // self.case.world], index % self.case.world
            if process.poll() not in (0, None):
                lines = [
                    line for line in (job.out / f"rank-{rank}.log").read_text(errors="replace").splitlines() if line
                ]
                self.outcome.notes.append(f"{job.name} rank {rank}: {(lines or [''])[-1][-300:]}")

    def _job_of(self, labels: dict[str, str]) -> set[int]:
        """The jobs a series came from: by its scrape target, else by its job label (both jobs when they share it)."""
        instance = labels.get("instance", "")
        if instance in self.instances:
            return {self.instances[instance]}
        if len(self.jobs) == 1:
            return {0}
        return {
            index
            for index, job in enumerate(self.jobs)
            if labels.get("job", "") in self.outcome.job_labels.get(job.name, [])
        }

    def _label(self, index: int) -> str | None:
        """The job label of job ``index``: None until its ranks were scraped, or when they exported several."""
        labels = self.outcome.job_labels.get(self.jobs[index].name, [])
        return labels[0] if len(labels) == 1 else None

    def _labels(self) -> None:
        """Each job's job labels and logical names, from ``trainhealth_rank_info`` by scrape target."""
        info = catalog.RANK_INFO.prometheus_name
        if all(self._label(index) is not None for index in range(len(self.jobs))):
            return
        try:
            series = self.client.query(info)
        except Exception as exc:  # a slow answer on a busy machine: asked again next time
            self.outcome.notes.append(f"Prometheus: {exc}")
            return
        labels: dict[str, set[str]] = {}
        names: dict[str, set[str]] = {}
        for one in series:
            index = self.instances.get(one.labels.get("instance", ""))
            if index is not None:
                labels.setdefault(self.jobs[index].name, set()).add(one.labels.get("job", ""))
                names.setdefault(self.jobs[index].name, set()).add(one.labels.get("job_name", ""))
        self.outcome.job_labels = {name: sorted(values) for name, values in labels.items()}
        self.outcome.job_names = {name: sorted(values) for name, values in names.items()}

    def look(self) -> None:
        case, outcome = self.case, self.outcome
        now = time.time()
        since = round(now - (outcome.onset or now), 1)
        self._labels()
        run = self.analyzer.run_once()
        if run is None:
            outcome.analyzer_errors += 1
        else:
            self._verdicts(run, since)
        target = self.jobs[0].instances[case.target]
        started = catalog.COMM_STARTED_SEQ.prometheus_name
        try:
            alerts = self.client.query('ALERTS{alertstate="firing"}')
            stuck = self.client.query(f'{catalog.COMM_STUCK_DURATION.prometheus_name}{{instance="{target}"}}')
            groups = self.client.query(f'count by (instance) ({started}{{instance="{target}"}})')
        except Exception as exc:  # a slow answer on a busy machine: look again next time
            outcome.notes.append(f"Prometheus: {exc}")
            return
        for series in alerts:
            name = series.labels.get("alertname", "")
            if name not in self.alerts:
                continue
            rank = series.labels.get("rank", "")
            jobs = self._job_of(series.labels)
            if jobs - {0} and outcome.healthy_rule_s is None:
                outcome.healthy_rule_s = since
            if 0 in jobs:
                if f"{name}:{rank}" not in outcome.rule_alerts:
                    outcome.rule_alerts.append(f"{name}:{rank}")
                if outcome.rule_first_s is None:
                    outcome.rule_first_s = since
                    outcome.rule_name = name
                    outcome.rule_named = int(rank) if rank.isdigit() else None
        for series in groups:
            outcome.groups_seen = max([outcome.groups_seen, *(int(value) for _, value in series.samples[-1:])])
        if stuck and not outcome.where:
            outcome.where = stuck[0].labels.get("where", "")
            outcome.stuck_state = stuck[0].labels.get("state", "")
        self._pages()

    def _verdicts(self, run: JobResults, since: float) -> None:
        """The analyzer's result for each job of the case (by its job label; the only result, for one job whose
        label is not known yet)."""
        outcome = self.outcome
        for index in range(len(self.jobs)):
            label = self._label(index)
            result = run.result(label) if label is not None else run.first if len(self.jobs) == 1 else None
            if result is None:
                continue  # its ranks not scraped yet, or not judged in this run
            if index > 0:
                outcome.healthy_judged += 1
                if result.verdict == "hang" and outcome.healthy_verdict_s is None:
                    outcome.healthy_verdict_s = since
                continue
            outcome.analyzer_verdicts.append(result.verdict)
            if result.verdict == "hang" and outcome.analyzer_first_s is None:
                outcome.analyzer_first_s = since
                outcome.analyzer_named = result.suspects[0].ranks[0] if result.suspects else None
                outcome.analyzer_evidence = result.suspects[0].evidence if result.suspects else ""
                first = (result.details.get("hangs") or [{}])[0]
                outcome.analyzer_group = str(first.get("group", ""))
                outcome.analyzer_mismatch = dict(first.get("mismatch") or {})
                _cli(self.client.url, outcome, label)

    def _pages(self) -> None:
        outcome = self.outcome
        pages = []
        for at, path, alert in self.webhook.received:
            labels = alert.get("labels", {})
            name = f"{labels.get('alertname', '')}:{labels.get('rank', '')}"
            if not path.endswith("/page"):
                continue
            if labels.get("alertname") not in self.alerts:
                if name not in outcome.pages_other:
                    outcome.pages_other.append(name)
                continue
            jobs = self._job_of(labels)
            if jobs - {0} and outcome.healthy_page_s is None:
                outcome.healthy_page_s = round(at - (outcome.onset or at), 1)
            if 0 in jobs:
                pages.append((at, name, alert))
        if pages and outcome.page_first_s is None:
            at, _, alert = pages[0]
            outcome.page_first_s = round(at - (outcome.onset or at), 1)
            labels, annotations = alert.get("labels", {}), alert.get("annotations", {})
            outcome.page_text = " | ".join(
                part
                for part in (
                    labels.get("reason", ""),
                    annotations.get("summary", ""),
                    annotations.get("description", ""),
                )
                if part
            )
        if pages:
            outcome.page_alerts = sorted({name for _, name, _ in pages})


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


def _cli(url: str, outcome: HangOutcome, job: str | None) -> None:
    """The same question through the command on-call runs (for the job's label, ``--job``, where it is known):
    its verdict and first suspect."""
    answer = _command(outcome, "analyze", "--prometheus", url, "--once", *(("--job", job) if job else ()))
    if answer is not None:
        results = answer.get("jobs") or [answer]  # a result per job judged
        result = next((r for r in results if job is None or r.get("job") == job), results[0])
        outcome.cli_verdict = result.get("verdict", "")
        outcome.cli_named = _first_rank(result)


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
