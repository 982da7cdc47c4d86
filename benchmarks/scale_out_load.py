"""The scale-out stack under load: 1,024 to 8,192 GPUs' real series through sharded Prometheus agents into
VictoriaMetrics, the rules in vmalert, every dashboard query against the store.

    python benchmarks/scale_out_load.py                          # 1024 2048 4096 8192 GPUs, about 30 minutes
    python benchmarks/scale_out_load.py --gpus 1024 --measure-s 60

The pages served are the exporters' own /metrics text, captured at the start of the run:

- a training rank: a 4-rank gloo world split 2 x 2 into tensor- and data-parallel groups, each rank a
  32-block TinyGPT (Llama-7B's depth) under the Monitor with the collective logger, DDP's bucket
  all-reduces over its data-parallel group, an all_reduce and all_gather over its tensor-parallel group
  and a broadcast over the world every step; rank 1's page after 40 steps;
- a node exporter with 8 simulated GPUs (``trainhealth export --backend simulated``).

One target per rank and one per node of 8 GPUs, each on its own port of 127.0.0.1, served from
``--server-processes`` asyncio processes. Each scrape renders the page afresh: the host, rank and GPU
UUID labels are the target's own, counters grow by the amount they grew per step in the capture and
gauges move by up to 3 %, so the store sees values that change as a job's do.

The stack is ``trainhealth stack up --store victoriametrics --no-demo`` (``--shards`` Prometheus agents
with hashmod relabelling, or vmagents with ``--agent vmagent``; VictoriaMetrics, vmalert with the project's
rule file, Alertmanager), with the
shards' scrape jobs pointed at the synthetic targets (the configs rewritten by ``shard_config`` and
reloaded with SIGHUP). For each size, on a fresh store: wait until every target is up in the store, let
it run ``--warm-s``, then over ``--measure-s`` (at least 1.2 times the longest rule group's interval, so that
every group runs inside it) read

- samples/s ingested (VictoriaMetrics's ``vm_rows_inserted_total``), active series (its
  ``storage/hour_metric_ids`` cache: series with a sample in the last hour) and the agents' own count;
- resident memory of the store, each shard and vmalert (``/proc``, now and peak);
- scrape duration (the ``scrape_duration_seconds`` series in the store: mean and maximum);
- rule evaluation: vmalert's iteration duration per group (mean over the window, and the largest), and
  each rule's own evaluation times as vmalert reports them (``/api/v1/rules``, read every 3 s);
- then every dashboard query of ``trainhealth dashboards`` as Grafana sends it (``query_range`` over the
  last 10 minutes, one point per scrape interval; an instant table as one instant query), once with every variable at All and once with one
  host selected: p50, p99 and the slowest (at most ``--query-budget-s`` per mode: the rest are reported as
  not run).

Finally a least-squares line through the measured sizes extrapolates series, samples/s and memory to
10,000 GPUs (printed as extrapolated).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import multiprocessing
import os
import re
import shutil
import signal
import socket
import statistics
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import yaml

GPUS_PER_NODE = 8
JOB = "llm-pretrain"
COUNTER_SUFFIXES = ("_total", "_count", "_sum", "_bucket")
CAPTURE_STEPS = 40


# --- the pages ------------------------------------------------------------------------------------------


def _rank_main(rank: int, world: int, master_port: int, out: str) -> None:
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    os.environ.update(
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(master_port),
        RANK=str(rank),
        LOCAL_RANK=str(rank),
        WORLD_SIZE=str(world),
    )
    dist.init_process_group("gloo", rank=rank, world_size=world)
    from trainhealth._internal.demo.tiny_gpt import TinyGPT, synthetic_batch
    from trainhealth._internal.exporters.collectives import install as comm
    from trainhealth._internal.exporters.monitor import Monitor

    tensor_parallel = [dist.new_group([0, 1]), dist.new_group([2, 3])][rank // 2]
    data_parallel = [dist.new_group([0, 2]), dist.new_group([1, 3])][rank % 2]
    torch.manual_seed(0)
    model = TinyGPT(vocab=64, width=16, layers=32, heads=2, context=16)
    ddp = torch.nn.parallel.DistributedDataParallel(model, process_group=data_parallel)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    with Monitor(
        ddp,
        optimizer,
        run_id=JOB,  # the job label (TRAINHEALTH_RUN_ID): one run
        comm=True,
        gpu_backend="off",
        prometheus_addr="127.0.0.1",
        prometheus_port=0,
        stats_every=1,
        otel=False,
        comm_flush_interval=0.5,
    ) as monitor:
        comm.instrument_ddp(ddp)
        activations = torch.ones(64)
        for step in range(CAPTURE_STEPS):
            tokens = synthetic_batch(64, 16, 4, seed=step)
            logits = ddp(tokens[:, :-1])
            loss = torch.nn.functional.cross_entropy(logits.reshape(-1, 64), tokens[:, 1:].reshape(-1))
            loss.backward()
            dist.all_reduce(activations, group=tensor_parallel)
            dist.all_gather([torch.empty(64) for _ in range(2)], activations, group=tensor_parallel)
            dist.broadcast(activations, src=0)
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            monitor.step(loss=loss, tokens=tokens.numel(), step=step)
        time.sleep(1.5)  # the collective logger's flush thread writes its last records into the store
        monitor.flush()
        if rank == 1:
            page = urllib.request.urlopen(monitor.metrics_url, timeout=30).read().decode()
            Path(out, "rank.txt").write_text(page)
        dist.barrier()
    dist.destroy_process_group()


def capture_rank_page(directory: Path) -> str:
    context = multiprocessing.get_context("spawn")
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        master_port = probe.getsockname()[1]
    ranks = [context.Process(target=_rank_main, args=(r, 4, master_port, str(directory))) for r in range(4)]
    for process in ranks:
        process.start()
    for process in ranks:
        process.join(timeout=600)
    if any(process.exitcode != 0 for process in ranks):
        sys.exit(f"scale_out_load: capturing a rank's page failed (exit codes {[p.exitcode for p in ranks]})")
    return (directory / "rank.txt").read_text()


def capture_node_page() -> str:
    from trainhealth._internal.config import Settings
    from trainhealth._internal.events import EventLog
    from trainhealth._internal.exporters.gpu.telemetry import GpuTelemetry
    from trainhealth._internal.identity import Identity
    from trainhealth._internal.sinks.service import Sinks
    from trainhealth._internal.store import MetricStore

    settings = Settings.resolve(
        env={},
        gpu_backend="simulated",
        simulated_gpus=GPUS_PER_NODE,
        gpus="all",
        otel=False,
        prometheus_addr="127.0.0.1",
        prometheus_port=0,
        gpu_sample_interval=0.5,
        run_id=JOB,  # the job label (TRAINHEALTH_RUN_ID): one run
    )
    identity = Identity.node(settings=settings)
    store = MetricStore()
    sinks = Sinks.start(store, identity, settings)
    telemetry = GpuTelemetry.start(store, EventLog(logger=None), settings, identity, role="node")
    try:
        time.sleep(2.0)  # a few samples of every GPU
        return urllib.request.urlopen(sinks.metrics_url, timeout=30).read().decode()
    finally:
        if telemetry is not None:
            telemetry.close()
        sinks.close()


_SAMPLE = re.compile(r"^(?P<series>(?P<name>[a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{.*\})?) (?P<value>\S+)$")


_RENDERED: dict[int, dict[int, str]] = {}  # template id: scrape number: text (the last eight)


@dataclass(frozen=True)
class PageTemplate:
    """A captured /metrics page, ready to render for any target: the identity labels are placeholders,
    the values are computed per scrape.

    >>> page = 'x_total{host="vm",rank="1"} 40.0\\nx{host="vm",rank="1"} 2.0\\n'
    >>> template = PageTemplate.from_page(page, host="vm", rank="1")
    >>> print(template.render(scrape=3, host="node-7", rank="9").decode(), end="")
    x_total{host="node-7",rank="9"} 43
    x{host="node-7",rank="9"} 1.95459
    """

    text: str  # the page with %-placeholders for values, \x01H/\x01R/\x01U for host, rank and UUID prefix
    base: np.ndarray
    per_scrape: np.ndarray  # what a counter grows by per scrape; 0 for gauges
    gauge: np.ndarray  # True where the value is a gauge

    @classmethod
    def from_page(cls, page: str, host: str, rank: str, uuid_prefix: str | None = None) -> PageTemplate:
        lines, base, per_scrape, gauge = [], [], [], []
        for line in page.splitlines():
            line = line.replace("%", "%%")
            found = _SAMPLE.match(line)
            if line.startswith("#") or found is None:
                lines.append(line)
                continue
            series = found["series"].replace(f'host="{host}"', 'host="\x01H"')
            series = re.sub(rf'(\b(?:local_)?rank)="{re.escape(rank)}"', lambda m: f'{m[1]}="\x01R"', series)
            if uuid_prefix:
                series = series.replace(uuid_prefix, "\x01U")
            value = float(found["value"])
            counter = found["name"].endswith(COUNTER_SUFFIXES)
            lines.append(f"{series} %.6g")
            base.append(value if math.isfinite(value) else 0.0)
            per_scrape.append(value / CAPTURE_STEPS if counter else 0.0)
            gauge.append(not counter)
        return cls("\n".join(lines) + "\n", np.array(base), np.array(per_scrape), np.array(gauge))

    @property
    def samples(self) -> int:
        return len(self.base)

    def render(self, scrape: int, host: str, rank: str, uuid: str = "GPU-x") -> bytes:
        """The page of the target (host, rank, uuid prefix) at its ``scrape``-th scrape."""
        text = self._values_at(scrape)
        return text.replace("\x01H", host).replace("\x01R", rank).replace("\x01U", uuid).encode()

    def _values_at(self, scrape: int) -> str:
        """The page's text at ``scrape``, identities left as placeholders: the same for every target of the
        template, so formatted once per scrape number (the targets' scrapes are within one or two of each
        other), which keeps the load generator's share of the machine small."""
        cache = _RENDERED.setdefault(id(self), {})
        text = cache.get(scrape)
        if text is None:
            wobble = 1.0 + 0.03 * np.sin(scrape + np.arange(self.samples))
            values = np.where(self.gauge, self.base * wobble, self.base + scrape * self.per_scrape)
            text = cache[scrape] = self.text % tuple(values.tolist())
            while len(cache) > 8:  # a target far behind the others costs a formatting, never a failed scrape
                del cache[min(cache)]
        return text


@dataclass(frozen=True)
class Target:
    port: int
    kind: str  # "rank" or "node"
    host: str
    rank: str
    uuid: str


def targets(gpus: int, first_port: int) -> list[Target]:
    """One target per rank (a GPU each) and one per node of 8 GPUs, on consecutive ports."""
    found = [Target(first_port + r, "rank", f"node-{r // GPUS_PER_NODE:05d}", str(r), "") for r in range(gpus)]
    for node in range(gpus // GPUS_PER_NODE):
        found.append(Target(first_port + gpus + node, "node", f"node-{node:05d}", "", f"GPU-{node:08x}"))
    return found


# --- serving -------------------------------------------------------------------------------------------


class _Page(asyncio.Protocol):
    """HTTP/1.1 GET with keep-alive: each request gets the target's page at its next scrape."""

    def __init__(self, target: Target, template: PageTemplate, scrapes: dict[int, int]) -> None:
        self.target, self.template, self.scrapes = target, template, scrapes
        self.buffer = b""

    def connection_made(self, transport) -> None:  # type: ignore[override]
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        while b"\r\n\r\n" in self.buffer:
            _, self.buffer = self.buffer.split(b"\r\n\r\n", 1)
            target = self.target
            scrape = self.scrapes[target.port] = self.scrapes.get(target.port, 0) + 1
            body = self.template.render(scrape, target.host, target.rank, target.uuid)
            head = (
                b"HTTP/1.1 200 OK\r\nContent-Type: text/plain; version=0.0.4; charset=utf-8\r\n"
                b"Content-Length: %d\r\n\r\n" % len(body)
            )
            self.transport.write(head + body)


def _serve(serving: list[Target], templates: dict[str, PageTemplate], ready, stop) -> None:
    async def main() -> None:
        loop = asyncio.get_running_loop()
        scrapes: dict[int, int] = {}
        servers = [
            await loop.create_server(
                lambda t=target: _Page(t, templates[t.kind], scrapes), "127.0.0.1", target.port, backlog=64
            )
            for target in serving
        ]
        ready.put(len(servers))
        await loop.run_in_executor(None, stop.wait)
        for server in servers:
            server.close()

    asyncio.run(main())


# --- the stack -----------------------------------------------------------------------------------------


def _get(url: str, timeout: float = 60) -> bytes:
    with urllib.request.urlopen(url, timeout=timeout) as response:
        return response.read()


def _metrics(url: str) -> dict[str, float]:
    """A /metrics page as {series: value} (summed over duplicate series names without labels kept)."""
    values: dict[str, float] = {}
    for line in _get(url).decode().splitlines():
        found = _SAMPLE.match(line)
        if found and not line.startswith("#"):
            values[found["series"]] = float(found["value"])
    return values


def _sum(metrics: dict[str, float], name: str, **labels: str) -> float:
    wanted = [f'{key}="{value}"' for key, value in labels.items()]
    return sum(
        value
        for series, value in metrics.items()
        if series.split("{")[0] == name and all(label in series for label in wanted)
    )


def _query(store: str, promql: str, tries: int = 5) -> list[dict]:
    """An instant query of the script's own bookkeeping, tried again while the store is busy (HTTP 503: its
    concurrent searches are taken by the ruler); the dashboard queries are timed once, not tried again."""
    url = f"{store}/api/v1/query?{urllib.parse.urlencode({'query': promql})}"
    for attempt in range(tries):
        try:
            return json.loads(_get(url))["data"]["result"]
        except urllib.error.HTTPError as exc:
            if exc.code != 503 or attempt == tries - 1:
                raise
            time.sleep(3.0)
    raise AssertionError("unreachable")


def _scalar(store: str, promql: str) -> float:
    result = _query(store, promql)
    return float(result[0]["value"][1]) if result else float("nan")


def _rss_mib(pid: int) -> tuple[float, float]:
    """(resident now, peak) of a process, MiB."""
    fields = dict(line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines())
    return int(fields["VmRSS"].split()[0]) / 1024, int(fields["VmHWM"].split()[0]) / 1024


class DoesNotFit(Exception):
    """The size is too big for this machine: it ran low on memory, or the targets were not all up in time."""


def _held(processes: dict[str, int]) -> str:
    return ", ".join(
        f"{name} {_rss_mib(pid)[0]:,.0f}" for name, pid in processes.items() if Path(f"/proc/{pid}").exists()
    )


def _sleep_watching_memory(seconds: float, processes: dict[str, int], floor_mib: float = 1024) -> None:
    """Sleep, checking each second that the machine keeps ``floor_mib`` available (else DoesNotFit, naming
    what each process held), so a size too big for the machine is reported, not left to the OOM killer."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        time.sleep(min(1.0, max(0.0, deadline - time.monotonic())))
        meminfo = dict(line.split(":", 1) for line in Path("/proc/meminfo").read_text().splitlines())
        available = int(meminfo["MemAvailable"].split()[0]) / 1024
        if available < floor_mib:
            raise DoesNotFit(f"{available:,.0f} MiB left on the machine; resident MiB: {_held(processes)}")


def _scrape_config(serving: list[Target], interval_s: float) -> dict[str, object]:
    interval = f"{interval_s:g}s"
    jobs = []
    for kind, name in (("rank", "trainhealth-ranks"), ("node", "trainhealth-nodes")):
        addresses = [f"127.0.0.1:{t.port}" for t in serving if t.kind == kind]
        jobs.append({"job_name": name, "honor_labels": True, "static_configs": [{"targets": addresses}]})
    return {"global": {"scrape_interval": interval, "scrape_timeout": interval}, "scrape_configs": jobs}


@dataclass
class Measured:
    gpus: int
    targets: int
    up: float
    samples_per_scrape: float
    samples_per_s: float
    active_series: float
    agent_series: float
    store_mib: tuple[float, float]
    shards_mib: tuple[float, float]  # all shards together: now, peaks summed
    vmalert_mib: tuple[float, float]
    scrape_mean_ms: float
    scrape_max_ms: float
    rules_mean_ms: float
    rules_max_ms: float
    rules_slowest_group: str
    queries: dict[str, tuple[float, float, float, int, list[str]]]  # mode: p50, p99, max (ms), answered, failed
    window_s: float  # the measured window
    slowest_rules: list[tuple[float, int, str]]  # the ruler's mean seconds per rule, evaluations, "group: rule"
    rules_not_evaluated: list[str]  # rules the ruler did not evaluate in the window
    groups: dict[str, tuple[float, int, float]]  # rule group: mean evaluation (ms), evaluations, interval (s)
    cpu_cores: dict[str, float]  # process: cores used over the window (CPU seconds per second)
    shard_memory: list[ShardMemory]
    slowest_queries: dict[str, list[str]] = field(default_factory=dict)


def _dashboard_queries() -> list[tuple[str, str, bool]]:
    """(title, PromQL, instant) of every panel query and annotation: an instant panel (a table of the latest
    values) is sent as Grafana sends it, one instant query; the others over the time range."""
    from trainhealth._internal.alerts.rules import ALERTS
    from trainhealth._internal.dashboards.render import build_dashboards, panels, queries

    found = []
    for uid, board in build_dashboards(ALERTS).items():
        instant = {
            (panel.get("title", ""), t["expr"])
            for panel in panels(board)
            for t in panel.get("targets", [])
            if t.get("instant")
        }
        found += [(f"{uid}: {title}", expr, (title, expr) in instant) for title, expr in queries(board)]
    return found


def _with_variables(expr: str, host: str) -> str:
    """The query as Grafana sends it: every variable at All (``.*``), or one host and its GPUs, ranks at All."""
    for variable in ("job", "host", "rank", "gpu"):
        value = host if variable == "host" else ".*"
        expr = expr.replace(f"${{{variable}}}", value).replace(f"${variable}", value)
    return expr


def _time_queries(
    store: str, interval_s: float, host: str, budget_s: float = math.inf, slowest: list[str] | None = None
) -> tuple[float, float, float, int, list[str]]:
    """p50, p99 and the slowest (ms) of the dashboard queries that answered; how many did; the others, why.
    Queries not started within ``budget_s`` are not run (counted among the failed)."""
    end = time.time()
    timings, failed = [], []
    queries = _dashboard_queries()
    for number, (title, expr, instant) in enumerate(queries):
        if time.time() - end > budget_s:
            failed.append(f"{len(queries) - number} queries not run: the {budget_s:g} s budget was spent")
            break
        query = _with_variables(expr, host)
        if instant:
            path, params = "query", {"query": query, "time": end}
        else:
            path, params = "query_range", {"query": query, "start": end - 600, "end": end, "step": f"{interval_s:g}"}
        began = time.perf_counter()
        try:
            _get(f"{store}/api/v1/{path}?{urllib.parse.urlencode(params)}", timeout=120)
        except OSError as exc:
            failed.append(f"{title}: {_reason(exc)}")
            continue
        timings.append(1000 * (time.perf_counter() - began))
        if slowest is not None:
            slowest.append(f"{timings[-1] / 1000:.1f} s {title}")
    if slowest is not None:
        slowest.sort(key=lambda text: -float(text.split()[0]))
        del slowest[3:]
    if not timings:  # every query failed: the reasons say why
        return math.nan, math.nan, math.nan, 0, failed
    timings.sort()
    p99 = timings[min(len(timings) - 1, math.ceil(0.99 * len(timings)) - 1)]
    return statistics.median(timings), p99, timings[-1], len(timings), failed


def _reason(exc: OSError) -> str:
    if isinstance(exc, urllib.error.HTTPError):
        text = exc.read().decode(errors="replace").strip()
        return f"HTTP {exc.code} ...{text[-200:]}"  # the cause is at the end of VictoriaMetrics's message
    return f"{type(exc).__name__}: {exc}"


class _RuleWatch(threading.Thread):
    """Every rule's evaluation times as the ruler took them: vmalert's /api/v1/rules (each rule's last
    evaluation and how long it took) read every ``every_s`` over the measured window."""

    def __init__(self, vmalert: str, every_s: float = 3.0) -> None:
        super().__init__(daemon=True)
        self.url, self.every_s = f"{vmalert}/api/v1/rules", every_s
        self.seen: dict[tuple[str, str, str], float] = {}  # (group, rule, evaluated at): seconds it took
        self.done = threading.Event()

    def run(self) -> None:
        while not self.done.wait(self.every_s):
            try:
                groups = json.loads(_get(self.url, timeout=10))["data"]["groups"]
            except (OSError, ValueError, KeyError):
                continue  # busy: the next read
            for group in groups:
                for rule in group["rules"]:
                    if not rule.get("lastEvaluation", "").startswith("0001"):  # evaluated at least once
                        self.seen[(group["name"], rule["name"], rule["lastEvaluation"])] = rule["evaluationTime"]

    def slowest(self, first_evaluated_after: str) -> list[tuple[float, int, str]]:
        """(mean seconds, evaluations, "group: rule") of every rule evaluated in the window, slowest first."""
        self.done.set()
        times: dict[str, list[float]] = {}
        for (group, rule, at), seconds in self.seen.items():
            if at >= first_evaluated_after:
                times.setdefault(f"{group}: {rule}", []).append(seconds)
        return sorted(((statistics.fmean(t), len(t), name) for name, t in times.items()), reverse=True)


def _duration_s(text: str) -> float:
    """A Prometheus duration ('15s', '1m') in seconds."""
    units = {"ms": 0.001, "s": 1, "m": 60, "h": 3600}
    number, unit = re.fullmatch(r"(\d+(?:\.\d+)?)(ms|s|m|h)", text).groups()
    return float(number) * units[unit]


def _cpu_seconds(pid: int) -> float:
    """User and system CPU seconds a process has used (/proc/PID/stat)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


@dataclass(frozen=True)
class ShardSample:
    """A shard's memory at one moment, from /proc and from its own /metrics (MiB)."""

    seconds: float  # since the stack started
    resident: float
    heap_in_use: float  # Go heap spans in use: live objects and garbage not yet collected
    heap_idle_kept: float  # Go heap spans free but not yet returned to the OS
    pending_in_memory: float  # samples scraped, waiting in memory for the store (remote write blocks)
    pending_on_disk: float  # the same, spilled to -remoteWrite.tmpDataPath
    targets_up: float
    store_new_series_per_s: float  # series the store registered per second since the watch's last round
    store_series: float  # series the store had registered since it started


@dataclass(frozen=True)
class ShardMemory:
    """One shard over the run: its sample at its resident peak, and its last (steady) sample."""

    name: str
    peak: ShardSample
    steady: ShardSample
    heap_sites: list[tuple[float, str]]  # at the peak: (MiB in use, the vmagent function that allocated it)


class _ShardWatch(threading.Thread):
    """Samples each vmagent shard's memory every ``every_s`` from the stack's start (vmagent only: a Prometheus
    agent exports no remote-write queue in these terms)."""

    def __init__(self, shards: dict[str, tuple[int, str]], store: str, every_s: float = 2.0) -> None:
        super().__init__(daemon=True)
        self.shards, self.store, self.every_s, self.began = shards, store, every_s, time.monotonic()
        self.samples: dict[str, list[ShardSample]] = {name: [] for name in shards}
        self.profiles: dict[str, str] = {}  # shard: its heap profile at its last resident peak
        self._peaks: dict[str, tuple[float, float]] = {}  # shard: (resident MiB, seconds) when last profiled
        self.done = threading.Event()

    def run(self) -> None:
        before = (time.monotonic(), 0.0)
        while not self.done.wait(self.every_s):
            try:  # the store registering new series: what the shards' scrapes wait on while targets come up
                now = (time.monotonic(), _sum(_metrics(f"{self.store}/metrics"), "vm_new_timeseries_created_total"))
            except (OSError, KeyError, ValueError):
                continue
            store = (now[1], (now[1] - before[1]) / (now[0] - before[0]))
            before = now
            for name, (pid, url) in self.shards.items():
                try:
                    self.samples[name].append(self._sample(pid, url, *store))
                    self._profile_if_peak(name, url, self.samples[name][-1])
                except (OSError, KeyError, ValueError):
                    pass  # busy or gone: the next sample

    def _sample(self, pid: int, url: str, store_series: float, store_new_per_s: float) -> ShardSample:
        page = _metrics(url)
        mib = 1 / (1 << 20)
        return ShardSample(
            seconds=time.monotonic() - self.began,
            resident=_rss_mib(pid)[0],
            heap_in_use=page["go_memstats_heap_inuse_bytes"] * mib,
            heap_idle_kept=(page["go_memstats_heap_idle_bytes"] - page["go_memstats_heap_released_bytes"]) * mib,
            pending_in_memory=_sum(page, "vmagent_remotewrite_pending_data_bytes") * mib
            - _sum(page, "vm_persistentqueue_bytes_pending") * mib,
            pending_on_disk=_sum(page, "vm_persistentqueue_bytes_pending") * mib,
            targets_up=_sum(page, "vm_promscrape_targets", status="up"),
            store_new_series_per_s=store_new_per_s,
            store_series=store_series,
        )

    def memory(self) -> list[ShardMemory]:
        self.done.set()
        return [
            ShardMemory(
                name, max(samples, key=lambda s: s.resident), samples[-1], heap_sites(self.profiles.get(name, ""))
            )
            for name, samples in self.samples.items()
            if samples
        ]

    def _profile_if_peak(self, name: str, url: str, sample: ShardSample) -> None:
        """The shard's heap profile (Go's text form) at each new resident peak, 10 s apart at most."""
        peak, taken = self._peaks.get(name, (0.0, -math.inf))
        if sample.resident > 1.1 * peak and sample.seconds - taken >= 10:
            self.profiles[name] = _get(url.replace("/metrics", "/debug/pprof/heap?debug=1"), timeout=30).decode()
            self._peaks[name] = (sample.resident, sample.seconds)


def heap_sites(profile: str, count: int = 5) -> list[tuple[float, str]]:
    r"""Heap in use by allocating function, from a Go heap profile in its text form (``/debug/pprof/heap?debug=1``):
    each record's sampled bytes scaled up as Go's sampler (one sample per 512 KiB allocated) requires, then summed
    by the innermost VictoriaMetrics function of its stack and that function's caller (vmagent's own code, not
    the runtime).

    >>> heap_sites("heap profile: 1: 1048576 [1: 1048576] @ heap/1048576\n"
    ...            "2: 2097152 [2: 2097152] @ 0x1 0x2\n#\t0x1\truntime.mallocgc+0x1\t/go/malloc.go:1\n"
    ...            "#\t0x2\tgithub.com/VictoriaMetrics/VictoriaMetrics/lib/promscrape.(*scrapeWork).scrape+0x2\tx.go:9\n")
    [(2.3, 'lib/promscrape.(*scrapeWork).scrape')]
    """
    sites: dict[str, float] = {}
    for record in re.split(r"\n(?=\d+: \d+ \[)", profile):
        head = re.match(r"(\d+): (\d+) \[", record)
        if head is None or not int(head[1]):
            continue
        objects, in_use = int(head[1]), int(head[2])
        scaled = in_use / (1 - math.exp(-(in_use / objects) / 524288))
        frames = re.findall(r"#\t0x[0-9a-f]+\t(\S+)\+0x", record)
        ours = [f for f in frames if "VictoriaMetrics/VictoriaMetrics/" in f]
        named = [f.split("VictoriaMetrics/VictoriaMetrics/", 1)[1] for f in ours[:2]]  # the function, its caller
        site = " < ".join(named) if named else (frames[0] if frames else "?")
        sites[site] = sites.get(site, 0.0) + scaled / (1 << 20)
    return [(round(mib, 1), site) for site, mib in sorted(sites.items(), key=lambda kv: -kv[1])[:count]]


def measure(gpus: int, templates: dict[str, PageTemplate], args: argparse.Namespace) -> Measured:
    from trainhealth._internal.stack.runner import stack_down, stack_up
    from trainhealth._internal.stack.topology import StackOptions, shard_config

    serving = targets(gpus, args.first_port)
    context = multiprocessing.get_context("spawn")
    ready, stop = context.Queue(), context.Event()
    servers = [
        context.Process(target=_serve, args=(serving[n :: args.server_processes], templates, ready, stop))
        for n in range(args.server_processes)
    ]
    for server in servers:
        server.start()
    listening = sum(ready.get(timeout=600) for _ in servers)
    assert listening == len(serving), (listening, len(serving))
    directory = Path(tempfile.mkdtemp(prefix=f"scale-out-{gpus}-"))
    options = StackOptions(
        directory=directory,
        max_for_s=math.inf,  # the production rules: every `for` as written, the sustained groups once a minute
        store="victoriametrics",
        shards=args.shards,
        agent=args.agent,
        demo=False,
        scrape_interval_s=args.interval_s,
        prometheus_port=args.stack_port,
        store_port=args.stack_port + 10,
        vmalert_port=args.stack_port + 11,
        alertmanager_port=args.stack_port + 12,
        webhook_port=args.stack_port + 13,
    )
    store = f"http://127.0.0.1:{options.store_port}"
    started = {entry.name: entry for entry in stack_up(options)}
    watch = _ShardWatch(
        {
            f"shard-{n}": (started[f"shard-{n}"].pid, f"http://127.0.0.1:{options.prometheus_port + n}/metrics")
            for n in range(args.shards)
        }
        if args.agent == "vmagent"
        else {},
        store,
    )
    watch.start()
    try:
        config = _scrape_config(serving, args.interval_s)
        for shard in range(args.shards):
            sends_to = f"{store}/api/v1/write" if args.agent == "prometheus" else None  # vmagent: a flag
            agent = shard_config(config, shard, args.shards, sends_to)
            (directory / f"shard-{shard}.yml").write_text(yaml.safe_dump(agent, sort_keys=False))
            os.kill(started[f"shard-{shard}"].pid, signal.SIGHUP)  # Prometheus and vmagent reload their config
        processes = {name: entry.pid for name, entry in started.items()}
        deadline = time.monotonic() + args.up_timeout_s
        up = float("nan")  # before the first scrape lands, and while the store does not answer
        while not up >= len(serving):
            if time.monotonic() > deadline:
                raise DoesNotFit(
                    f"{up:,.0f} of {len(serving):,} targets up in the store after {args.up_timeout_s:g} s (nan: it "
                    f"did not answer the count within 60 s); resident MiB: {_held(processes)}"
                )
            _sleep_watching_memory(args.interval_s, processes)
            try:
                up = _scalar(store, 'count(up{job=~"trainhealth-(ranks|nodes)"} == 1)')
            except OSError:
                up = float("nan")
        print(
            f"  {gpus} GPUs: {up:,.0f} of {len(serving):,} targets up in the store; {args.warm_s:g} s more", flush=True
        )
        _sleep_watching_memory(args.warm_s, processes)

        def snapshot() -> tuple[float, dict[str, float], dict[str, float]]:
            return (
                time.monotonic(),
                _metrics(f"{store}/metrics"),
                _metrics(f"http://127.0.0.1:{options.vmalert_port}/metrics"),
            )

        rule_file = yaml.safe_load((directory / "trainhealth.rules.yml").read_text())
        intervals = {
            group["name"]: _duration_s(group.get("interval", f"{args.interval_s:g}s")) for group in rule_file["groups"]
        }
        # long enough for the slowest-running group to be evaluated inside it
        window_s = max(args.measure_s, 1.2 * max(intervals.values()))
        rules = _RuleWatch(f"http://127.0.0.1:{options.vmalert_port}")
        window_opened = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime())
        first = snapshot()
        rules.start()
        generators = {f"targets-{n}": server.pid for n, server in enumerate(servers)}  # the load, not the stack
        cpu_first = {name: _cpu_seconds(pid) for name, pid in {**processes, **generators}.items()}
        _sleep_watching_memory(window_s, processes)
        last = snapshot()
        slowest_rules = rules.slowest(window_opened)
        cpu_cores = {
            name: (_cpu_seconds(pid) - cpu_first[name]) / (last[0] - first[0])
            for name, pid in {**processes, **generators}.items()
        }
        seconds = last[0] - first[0]
        inserted = _sum(last[1], "vm_rows_inserted_total") - _sum(first[1], "vm_rows_inserted_total")
        groups = sorted(
            {
                re.search(r'group="([^"]*)"', s)[1]
                for s in last[2]
                if s.startswith("vmalert_iteration_duration_seconds_count")
            }
        )
        per_group = {}
        for group in groups:
            runs = _sum(last[2], "vmalert_iteration_duration_seconds_count", group=group) - _sum(
                first[2], "vmalert_iteration_duration_seconds_count", group=group
            )
            spent = _sum(last[2], "vmalert_iteration_duration_seconds_sum", group=group) - _sum(
                first[2], "vmalert_iteration_duration_seconds_sum", group=group
            )
            per_group[group] = (
                1000 * spent / runs if runs else float("nan"),
                runs,
                intervals.get(group, args.interval_s),
            )
        slowest = max(per_group, key=lambda g: per_group[g][0])
        agents = [_metrics(f"http://127.0.0.1:{options.prometheus_port + n}/metrics") for n in range(args.shards)]
        shards = [_rss_mib(started[f"shard-{n}"].pid) for n in range(args.shards)]
        window = f"{window_s:.0f}s"
        measured = Measured(
            gpus=gpus,
            targets=len(serving),
            up=_scalar(store, 'count(up{job=~"trainhealth-(ranks|nodes)"} == 1)'),
            samples_per_scrape=_scalar(store, 'sum(scrape_samples_scraped{job=~"trainhealth-(ranks|nodes)"})'),
            samples_per_s=inserted / seconds,
            active_series=_sum(last[1], "vm_cache_entries", type="storage/hour_metric_ids"),
            # (vmagent keeps no series: it forwards what it scrapes)
            agent_series=sum(_sum(a, "prometheus_agent_active_series") for a in agents)
            if args.agent == "prometheus"
            else math.nan,
            store_mib=_rss_mib(started["victoria-metrics"].pid),
            shards_mib=(sum(s[0] for s in shards), sum(s[1] for s in shards)),
            vmalert_mib=_rss_mib(started["vmalert"].pid),
            scrape_mean_ms=1000
            * _scalar(store, f'avg(avg_over_time(scrape_duration_seconds{{job=~"trainhealth-.*"}}[{window}]))'),
            scrape_max_ms=1000
            * _scalar(store, f'max(max_over_time(scrape_duration_seconds{{job=~"trainhealth-.*"}}[{window}]))'),
            rules_mean_ms=per_group[slowest][0],
            rules_max_ms=1000
            * max(
                (
                    v
                    for s, v in last[2].items()
                    if s.startswith("vmalert_iteration_duration_seconds{")
                    and 'quantile="0.99"' in s
                    and math.isfinite(v)
                ),
                default=float("nan"),
            ),
            rules_slowest_group=slowest,
            queries={},
            window_s=window_s,
            slowest_rules=slowest_rules,
            rules_not_evaluated=sorted(
                {f"{g['name']}: {r.get('record') or r['alert']}" for g in rule_file["groups"] for r in g["rules"]}
                - {name for *_, name in slowest_rules}
            ),
            groups=per_group,
            cpu_cores=cpu_cores,
            shard_memory=[],
        )
        for mode, host in (("all", ".*"), ("one host", "node-00003")):
            measured.slowest_queries[mode] = []
            measured.queries[mode] = _time_queries(
                store, args.interval_s, host, args.query_budget_s, measured.slowest_queries[mode]
            )
        measured.shard_memory = watch.memory()
        return measured
    finally:
        watch.done.set()
        stack_down(directory)
        shutil.rmtree(directory, ignore_errors=True)
        stop.set()
        for server in servers:
            server.join(timeout=60)


# --- reporting -----------------------------------------------------------------------------------------


def _line(m: Measured) -> str:
    q_all, q_host = m.queries["all"], m.queries["one host"]
    return (
        f"| {m.gpus:,} | {m.targets:,} ({m.up:,.0f} up) | {m.active_series / 1e6:.2f} M | {m.samples_per_s:,.0f} "
        f"| {m.store_mib[0]:,.0f} ({m.store_mib[1]:,.0f}) | {m.shards_mib[0]:,.0f} ({m.shards_mib[1]:,.0f}) "
        f"| {m.vmalert_mib[0]:,.0f} | {m.scrape_mean_ms:.0f} / {m.scrape_max_ms:.0f} "
        f"| {m.rules_mean_ms:.0f} / {m.rules_max_ms:.0f} | {q_all[0]:.0f} / {q_all[1]:.0f} / {q_all[2]:.0f} "
        f"| {q_host[0]:.0f} / {q_host[1]:.0f} / {q_host[2]:.0f} |"
    )


HEADER = (
    "| GPUs | targets | active series | samples/s | store MiB (peak) | shards MiB (peak) | vmalert MiB "
    "| scrape ms mean / max | rules ms mean / p99 | queries, All: p50 / p99 / max ms | one host: p50 / p99 / max ms |\n"
    "|---|---|---|---|---|---|---|---|---|---|---|"
)


def _fit(xs: list[float], ys: list[float], at: float) -> tuple[float, float]:
    """(slope, value at ``at``) of the least-squares line through the points."""
    slope, intercept = np.polyfit(xs, ys, 1)
    return float(slope), float(slope * at + intercept)


@dataclass(frozen=True)
class FitPoint:
    """What the extrapolation reads of a measured size."""

    gpus: int
    active_series: float
    samples_per_s: float
    store_peak_mib: float
    shards_peak_mib: float

    @classmethod
    def of(cls, m: Measured) -> FitPoint:
        return cls(m.gpus, m.active_series, m.samples_per_s, m.store_mib[1], m.shards_mib[1])


def extrapolate(points: list[FitPoint], gpus: float = 10_000) -> list[str]:
    xs = [p.gpus for p in points]
    lines = []
    for label, ys, unit in (
        ("active series", [p.active_series for p in points], "series"),
        ("samples/s", [p.samples_per_s for p in points], "samples/s"),
        ("store memory", [p.store_peak_mib for p in points], "MiB"),
        ("shards' memory", [p.shards_peak_mib for p in points], "MiB"),
    ):
        slope, value = _fit(xs, ys, gpus)
        lines.append(f"  {label}: {slope:,.1f} {unit} per GPU; at {gpus:,.0f} GPUs {value:,.0f} {unit} (extrapolated)")
    return lines


def _rows(output: str) -> list[FitPoint]:
    """The measured sizes of a saved output's table (the columns the extrapolation uses)."""
    points = {}
    for line in output.splitlines():
        cells = [cell.strip() for cell in line.strip("| ").split("|")]
        if len(cells) != 11 or not cells[0].replace(",", "").isdigit():
            continue
        store, shards = (float(re.search(r"\(([\d,]+)\)", cells[i])[1].replace(",", "")) for i in (4, 5))
        gpus = int(cells[0].replace(",", ""))
        active, samples = float(cells[2].split()[0]) * 1e6, float(cells[3].replace(",", ""))
        points[gpus] = FitPoint(gpus, active, samples, store, shards)
    return sorted(points.values(), key=lambda p: p.gpus)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gpus", type=int, nargs="+", default=[1024, 2048, 4096, 8192])
    parser.add_argument("--shards", type=int, default=2)
    parser.add_argument(
        "--agent",
        choices=("prometheus", "vmagent"),
        default="prometheus",
        help="what the shards are (default prometheus)",
    )
    parser.add_argument(
        "--query-budget-s",
        type=float,
        default=math.inf,
        help="time the dashboard queries for this long at most per mode; the rest are not run",
    )
    parser.add_argument("--interval-s", type=float, default=15.0, help="scrape and rule interval (default 15)")
    parser.add_argument("--warm-s", type=float, default=60.0, help="after every target is up (default 60)")
    parser.add_argument(
        "--measure-s",
        type=float,
        default=120.0,
        help="the measured window (default 120; at least 1.2 times the longest rule interval)",
    )
    parser.add_argument("--server-processes", type=int, default=2)
    parser.add_argument("--first-port", type=int, default=20000, help="targets on this port and the next ones")
    parser.add_argument("--stack-port", type=int, default=19900, help="the stack on this port and the next 13")
    parser.add_argument("--up-timeout-s", type=float, default=600.0, help="for every target to be up (default 600)")
    parser.add_argument(
        "--refit", type=Path, metavar="OUTPUT", help="print the extrapolation from the table rows of a saved output"
    )
    args = parser.parse_args()
    if args.refit:
        print("\n".join(extrapolate(_rows(args.refit.read_text()))))
        return
    if any(g % GPUS_PER_NODE or g <= 0 for g in args.gpus):
        parser.error(f"--gpus: whole nodes of {GPUS_PER_NODE} GPUs")

    with tempfile.TemporaryDirectory() as scratch:
        rank_page = capture_rank_page(Path(scratch))
    node_page = capture_node_page()
    host = re.search(r'host="([^"]*)"', node_page)[1]
    uuid = re.search(r'uuid="(GPU-[0-9a-f]+)-', node_page)[1]
    templates = {
        "rank": PageTemplate.from_page(rank_page, host=host, rank="1"),
        "node": PageTemplate.from_page(node_page, host=host, rank="", uuid_prefix=uuid),
    }
    rank, node = templates["rank"].samples, templates["node"].samples
    print(
        f"pages: a training rank {rank} series, a node of {GPUS_PER_NODE} GPUs {node} series "
        f"= {rank + node / GPUS_PER_NODE:.0f} series per GPU; scrape every {args.interval_s:g} s, {args.shards} shards "
        f"({args.agent})",
        flush=True,
    )
    runs = []
    for gpus in args.gpus:
        try:
            runs.append(measure(gpus, templates, args))
        except DoesNotFit as exc:
            print(f"| {gpus:,} | does not fit this machine: {exc} |", flush=True)
            break
        print(_line(runs[-1]), flush=True)
    print(HEADER)
    for m in runs:
        print(_line(m))
    for m in runs:
        print(
            f"  {m.gpus:,} GPUs: slowest rule group {m.rules_slowest_group}; agents' active series {m.agent_series:,.0f}; "
            f"samples per scrape round {m.samples_per_scrape:,.0f}"
        )
        print(
            "    slowest rules, as the ruler evaluated them in the window (mean over its evaluations): "
            + ", ".join(f"{name} {seconds:.2f} s ({n})" for seconds, n, name in m.slowest_rules[:12])
            + (
                f"; not evaluated in the window: {', '.join(m.rules_not_evaluated)}"
                if m.rules_not_evaluated
                else "; every rule evaluated"
            )
        )
        print("    rule groups, mean evaluation against a third of the interval:")
        for group, (mean_ms, evaluations, interval_s) in sorted(m.groups.items()):
            if not evaluations:
                print(f"      {group}: not evaluated in the window (interval {interval_s:g} s)")
                continue
            verdict = "within" if mean_ms <= 1000 * interval_s / 3 else "OVER"
            print(
                f"      {group}: {mean_ms / 1000:.2f} s mean over {evaluations:.0f} evaluations, interval "
                f"{interval_s:g} s: {verdict} a third ({interval_s / 3:.1f} s)"
            )
        ingest = sum(cores for name, cores in m.cpu_cores.items() if name.startswith(("shard-", "victoria-metrics")))
        ruler = sum(mean_ms / 1000 * n for mean_ms, n, _ in m.groups.values() if n) / m.window_s
        print(
            "    cores used over the window: "
            + ", ".join(
                f"{name} {cores:.2f}" for name, cores in sorted(m.cpu_cores.items()) if not name.startswith("targets-")
            )
            + "; the load generator (the targets' servers, not the stack) "
            + f"{sum(c for name, c in m.cpu_cores.items() if name.startswith('targets-')):.2f}"
            + (f"; GPUs per core: ingestion (shards and store) {m.gpus / ingest:,.0f}" if ingest > 0 else "")
            + (f", rules (the ruler's busy time, wall) {m.gpus / ruler:,.0f}" if ruler > 0 else "")
        )
        for shard in m.shard_memory:
            peak, steady = shard.peak, shard.steady
            print(
                f"    {shard.name}: resident peak {peak.resident:,.0f} MiB at {peak.seconds:.0f} s ({peak.targets_up:,.0f} "
                f"targets up): Go heap in use {peak.heap_in_use:,.0f}, kept idle {peak.heap_idle_kept:,.0f}, "
                f"samples pending in memory {peak.pending_in_memory:,.0f} (on disk {peak.pending_on_disk:,.0f}); "
                f"the store then registering {peak.store_new_series_per_s:,.0f} new series/s "
                f"({peak.store_series / 1e6:.2f} M so far); "
                f"steady {steady.resident:,.0f} MiB (heap in use {steady.heap_in_use:,.0f}, pending in memory "
                f"{steady.pending_in_memory:,.0f}); peak / steady {peak.resident / steady.resident:.2f}"
            )
            if shard.heap_sites:
                print(
                    f"      {shard.name}'s heap in use near its peak, by allocating function (MiB): "
                    + ", ".join(f"{site} {mib:,.0f}" for mib, site in shard.heap_sites)
                )
        for mode, (*_, answered, failed) in m.queries.items():
            print(
                f"    dashboard queries ({mode}): {answered} answered"
                + "".join(f"; failed: {why}" for why in failed)
                + "; slowest: "
                + ", ".join(m.slowest_queries.get(mode, []))
            )
    if len(runs) >= 2:
        print("extrapolated from the measured sizes:")
        print("\n".join(extrapolate([FitPoint.of(m) for m in runs])))


if __name__ == "__main__":
    main()
