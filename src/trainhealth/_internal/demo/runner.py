"""Runs the demo: the ranks, the live terminal, the analyzer, a webhook for Alertmanager's pages, the report.

The analyzer localizes from the ranks' trace files every 10 s and serves
``trainhealth_suspect_score`` on the analyzer port; the webhook (127.0.0.1:9096
by default) receives Alertmanager's notifications when a monitoring stack runs
alongside (``trainhealth stack up`` or docker compose) and shows the pages.
Ctrl-C stops every rank at the same step and still writes the report.
"""

from __future__ import annotations

import json
import logging
import signal
import threading
import time
from collections import deque
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import TYPE_CHECKING, Any

from trainhealth._internal._files import output_directory
from trainhealth._internal._ports import free_port
from trainhealth._internal.demo.report import Incident, write_report
from trainhealth._internal.demo.worker import DemoConfig, rank_main
from trainhealth._internal.identity import new_run_id

if TYPE_CHECKING:
    from trainhealth._internal.faults import Fault

__all__ = ["DemoOptions", "run_demo"]


@dataclass(frozen=True)
class DemoOptions:
    ranks: int = 4
    duration_s: float = 150.0
    out: Path = Path("trainhealth-demo")
    addr: str = "127.0.0.1"
    port_base: int = 9450
    analyzer_port: int | None = 9448  # None: no analyzer
    webhook_port: int | None = 9096  # None: no webhook
    faults: list[Fault] | None = None  # None: the built-in schedule; []: a fault-free run
    master_port: int = 0  # the ranks' rendezvous port; 0: a free one, so two demos on one machine never meet
    seed: int = 0  # the model's initialisation and the batches


class _Pages:
    """Alertmanager webhook notifications received, newest last."""

    def __init__(self) -> None:
        self.alerts: list[dict[str, Any]] = []
        self.lock = threading.Lock()

    def serve(self, addr: str, port: int) -> ThreadingHTTPServer | None:
        pages = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 (http.server's name)
                length = int(self.headers.get("Content-Length", "0"))
                try:
                    body = json.loads(self.rfile.read(length) or b"{}")
                    with pages.lock:
                        pages.alerts += [dict(alert, receiver=body.get("receiver")) for alert in body.get("alerts", [])]
                    self.send_response(200)
                except ValueError:
                    self.send_response(400)
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                return

        try:
            server = ThreadingHTTPServer((addr, port), Handler)
        except OSError:
            return None
        threading.Thread(target=server.serve_forever, name="trainhealth-demo-webhook", daemon=True).start()
        return server


def run_demo(options: DemoOptions) -> int:
    import multiprocessing

    import torch.multiprocessing as mp
    from rich.console import Console
    from rich.markup import escape

    began = time.monotonic()
    console = Console()
    out = output_directory(options.out, "out", empty=True)  # new or empty: nothing of anyone else's is touched
    context = multiprocessing.get_context("spawn")
    progress, stop = context.Queue(maxsize=10_000), context.Event()
    config = DemoConfig(
        ranks=options.ranks,
        duration_s=options.duration_s,
        out=str(out),
        addr=options.addr,
        port_base=options.port_base,
        faults=options.faults,
        master_port=options.master_port or free_port(),
        run_id=f"demo-{new_run_id()}",
        seed=options.seed,
    )
    verdicts: list[dict[str, Any]] = []
    analyzer, analyzer_stop, sinks = _start_analyzer(options, verdicts, config.run_id)
    pages = _Pages()
    webhook = pages.serve(options.addr, options.webhook_port) if options.webhook_port else None
    interrupted = threading.Event()

    def on_interrupt(*_: Any) -> None:
        interrupted.set()
        stop.set()

    previous = signal.signal(signal.SIGINT, on_interrupt)
    console.print(
        f"[bold]trainhealth demo[/bold]: {options.ranks} ranks on CPU (gloo), simulated GPUs, "
        f"~{options.duration_s:.0f} s; report in {escape(str(out))}/report.html"
    )
    # The ranks start with SIGINT blocked (the mask survives exec) and ignore it before unblocking: a Ctrl-C
    # while they import torch reaches only this process, which stops them all at the same step.
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    try:
        processes = mp.start_processes(
            rank_main, args=(config, progress, stop), nprocs=options.ranks, join=False, start_method="spawn"
        )
    finally:
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
    try:
        view = _Live(console, options, pages)
        view.run(progress, processes, interrupted)
    finally:
        stop.set()
        signal.signal(signal.SIGINT, previous)
        _join(processes)
        if analyzer_stop is not None:
            analyzer_stop.set()
    localization = _localize(out / "traces")
    if analyzer is not None and localization is not None:
        analyzer.run_once()  # publish the final verdict before the endpoint goes away
    if sinks is not None:
        sinks.close()
    if webhook is not None:
        webhook.shutdown()
    histories = _histories(out / "history")
    incident = Incident(
        histories,
        [f.describe() for f in view.schedule],
        view.events,
        localization,
        pages.alerts,
        interrupted.is_set(),
        schedule=view.schedule,
        verdicts=verdicts,
    )
    incident.wall_s = time.monotonic() - began
    page = write_report(out, incident)
    _summary(console, localization, page, view.failures)
    console.print(
        f"wall time: {time.monotonic() - began:.0f} s ({options.duration_s:g} s of training, then the report)",
        markup=False,
        highlight=False,
    )
    return 1 if view.failures else 0


# --- pieces -----------------------------------------------------------------------------
def _start_analyzer(
    options: DemoOptions, verdicts: list[dict[str, Any]], run_id: str | None
) -> tuple[Any, threading.Event | None, Any]:
    """The analyzer over the ranks' traces every 10 s; each change of its verdict is appended to ``verdicts``.
    Its verdicts carry the job label of the run (``run_id``), as the ranks' series do."""
    if options.analyzer_port is None:
        return None, None, None
    from trainhealth._internal.config import Settings
    from trainhealth._internal.identity import Identity
    from trainhealth._internal.localize.analyzer import Analyzer
    from trainhealth._internal.localize.sources import TraceDirectory
    from trainhealth._internal.sinks.service import Sinks
    from trainhealth._internal.store import MetricStore

    logging.getLogger("trainhealth._internal.localize").setLevel(
        logging.ERROR
    )  # "no trace files yet" is expected early on
    settings = Settings.resolve(
        env={}, job="demo", run_id=run_id, prometheus_addr=options.addr, prometheus_port=options.analyzer_port
    )
    store = MetricStore()
    identity = Identity.node(settings=settings)
    analyzer = Analyzer(TraceDirectory(options.out / "traces", 40), store, job=identity.job)
    sinks = Sinks.start(store, identity, settings)
    stop = threading.Event()
    threading.Thread(
        target=_analyze, args=(analyzer, stop, verdicts), name="trainhealth-demo-analyzer", daemon=True
    ).start()
    return analyzer, stop, sinks


def _analyze(analyzer: Any, stop: threading.Event, verdicts: list[dict[str, Any]], interval_s: float = 10.0) -> None:
    """Run the analyzer every ``interval_s`` until ``stop``, keeping each verdict that differs from the one before."""
    while not stop.is_set():
        began = time.monotonic()
        run = analyzer.run_once()
        if run is not None:
            result = run.first  # trace files: the demo's one job
            entry = {
                "time": time.time(),
                "verdict": result.verdict,
                "ranks": sorted({int(r) for s in result.suspects for r in s.ranks}),
                "component": result.suspects[0].component if result.suspects else None,
            }
            last = verdicts[-1] if verdicts else {}
            if (last.get("verdict"), last.get("ranks")) != (entry["verdict"], entry["ranks"]):
                verdicts.append(entry)
        stop.wait(max(0.0, began + analyzer.delay(interval_s) - time.monotonic()))


def _join(processes: Any, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    for process in processes.processes:
        process.join(max(0.1, deadline - time.monotonic()))
        if process.is_alive():
            process.kill()


def _localize(traces: Path) -> dict[str, Any] | None:
    from trainhealth._internal.localize.localizer import localize
    from trainhealth._internal.localize.sources import SourceError, TraceDirectory
    from trainhealth._internal.traces.format import TraceError

    try:
        window = TraceDirectory(traces, 100_000).read()
        return localize(window.records, window.topology).to_dict()
    except (SourceError, TraceError):
        return None


def _histories(directory: Path) -> dict[int, list[dict[str, Any]]]:
    histories = {}
    for path in sorted(directory.glob("rank-*.json")):
        data = json.loads(path.read_text())
        histories[int(data["rank"])] = data["steps"]
    return histories


def _summary(console: Any, localization: dict[str, Any] | None, page: Path, failures: list[str]) -> None:
    from rich.markup import escape

    from trainhealth._internal.localize.result import verdict_text

    for failure in failures:
        console.print(f"[red]{escape(failure)}[/red]")
    if localization is None:
        console.print("localization: no collective trace was written")
    else:
        suspects = localization.get("suspects", [])
        top = f"; top suspect {suspects[0]['kind']} {suspects[0].get('component', '')}" if suspects else ""
        verdict = verdict_text(str(localization["verdict"]), localization.get("in_this_run"))
        console.print(f"[bold]verdict: {escape(verdict)}[/bold]{escape(top)}", soft_wrap=True)
        for advice in localization.get("advice", [])[:2]:
            console.print(f"  - {advice}", markup=False, highlight=False)
    console.print(f"report: {page}", markup=False, highlight=False)


class _Live:
    """The terminal view: a table of ranks and the latest detections (plain lines when not a terminal)."""

    def __init__(self, console: Any, options: DemoOptions, pages: _Pages) -> None:
        self.console = console
        self.options = options
        self.pages = pages
        self.latest: dict[int, dict[str, Any]] = {}
        self.events: list[dict[str, Any]] = []
        self.recent: deque[str] = deque(maxlen=8)
        self.steps: int | None = None
        self.schedule: list[Fault] = []
        self.failures: list[str] = []
        self._shown_pages = 0

    def run(self, progress: Any, processes: Any, interrupted: threading.Event) -> None:
        from rich.live import Live

        done: set[int] = set()
        last_line = 0.0
        live = Live(self._table(), console=self.console, refresh_per_second=4) if self.console.is_terminal else None
        if live is not None:
            live.start()
        try:
            while len(done) < self.options.ranks:
                self._drain(progress, done)
                self._show_pages()
                if live is not None:
                    live.update(self._table())
                elif time.monotonic() - last_line > 10:
                    last_line = time.monotonic()
                    self.console.print(self._line(), markup=False, highlight=False)
                if not any(p.is_alive() for p in processes.processes):
                    self._drain(progress, done)
                    break
                time.sleep(0.25)
        finally:
            if live is not None:
                live.stop()
        for rank, process in enumerate(processes.processes):
            if process.exitcode not in (0, None) and rank not in done:
                self.failures.append(f"rank {rank} exited with status {process.exitcode}")

    def _drain(self, progress: Any, done: set[int]) -> None:
        import queue

        while True:
            try:
                message = progress.get_nowait()
            except queue.Empty:
                return
            rank = message["rank"]
            if "error" in message:
                self.failures.append(f"rank {rank}: {message['error']}")
            elif message.get("done"):
                done.add(rank)
            elif "steps" in message:
                self.steps = message["steps"]
                self.schedule = message["schedule"]
                if rank == 0:
                    self._note(f"{message['steps']} steps; metrics at {message['metrics_url']} (rank 0)")
            elif "event" in message:
                self.events.append(message)
                self._note(f"rank {rank}: {message['summary']}")
            else:
                self.latest[rank] = message

    def _note(self, text: str) -> None:
        self.recent.append(text)
        if not self.console.is_terminal:
            self.console.print(text, markup=False, highlight=False)

    def _show_pages(self) -> None:
        with self.pages.lock:
            new = self.pages.alerts[self._shown_pages :]
            self._shown_pages = len(self.pages.alerts)
        for alert in new:
            if alert.get("status") == "firing":
                labels, annotations = alert.get("labels", {}), alert.get("annotations", {})
                self._note(
                    f"{str(alert.get('receiver')).upper()} {labels.get('alertname')}: {annotations.get('summary')}"
                )

    def _line(self) -> str:
        parts = [
            f"rank {r}: step {m['step']} loss {m['loss']:.3f} compute {_ms(m.get('compute'))} wait {_ms(m.get('wait'))}"
            for r, m in sorted(self.latest.items())
        ]
        return " | ".join(parts) or "starting ranks..."

    def _table(self) -> Any:
        from rich.console import Group
        from rich.table import Table
        from rich.text import Text

        # Every rank's step takes as long as the slowest one's, so step time cannot name the straggler;
        # the split can: the straggler computes longest and waits least (its peers wait for it).
        table = Table(
            title=f"trainhealth demo ({self.steps or '?'} steps)",
            expand=False,
            caption="compute and wait per step: the straggler waits least",
        )
        for column in ("rank", "step", "loss", "compute", "wait", "GPU °C", "GPU up", "XIDs"):
            table.add_column(column, justify="right")
        for rank in range(self.options.ranks):
            m = self.latest.get(rank)
            if m is None:
                table.add_row(str(rank), "-", "-", "-", "-", "-", "-", "-")
                continue
            up = m.get("gpu_up")
            table.add_row(
                str(rank),
                str(m["step"]),
                f"{m['loss']:.3f}",
                _ms(m.get("compute")),
                _ms(m.get("wait")),
                "-" if m.get("temperature") is None else f"{m['temperature']:.0f}",
                "-" if up is None else ("[green]yes[/green]" if up else "[red]LOST[/red]"),
                f"{m.get('xids', 0):.0f}",
            )
        return Group(table, *(Text(line) for line in self.recent))  # text, not markup: ranks' errors hold brackets


def _ms(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds * 1000:.0f} ms"
