"""The analyzer service: localize periodically and serve the suspects as metrics.

Each run reads a fresh window from its source (Prometheus or trace files) — one per
job: Prometheus holds many jobs, and each is judged on its own, never against another's
ranks — localizes each and replaces the published series: ``trainhealth_suspect_score``
per suspect (with ``trainhealth_suspect_slowdown`` and ``trainhealth_suspect_since_step``
where the localizer measured them), each rank's compute and wait per step
(``trainhealth_analysis_rank_compute_seconds`` / ``_wait_seconds``), ``trainhealth_analysis_verdict`` (1 for the current verdict),
what the window could have seen (``trainhealth_analysis_detectable_slowdown``, the ranks it could not
measure, the events that blamed nobody), all labelled with the job judged (``job``: a window
that names no job, trace files, takes the analyzer's own), and when and how long the last run was.
It keeps no state between runs beyond what it publishes, so it can be killed and restarted at any
time: the next run rebuilds everything from the source.

A hang (a member behind, gone or in another collective while its peers wait past the job's
threshold) is verdict ``hang``; a collective every member entered that is still running past it
is a slow collective, noted in the job's result (``slow_collectives``, ``reasons``), not a hang.

A run that fails — an unreadable source, a bad answer from Prometheus, anything
the localizer cannot use — never stops the service: it is logged in one line,
counted in ``trainhealth_exporter_errors_total{source="analyze"}``, and the last
verdict stays served, marked ``trainhealth_analysis_stale`` 1, with
``trainhealth_analysis_consecutive_failures`` runs failed since the last good one.
After a failure the next run waits twice the interval (start to start), so a
struggling Prometheus is asked half as often, and a fresh verdict comes at most
two intervals after it answers well again.

>>> from trainhealth._internal.simulator.cluster import ClusterLayout
>>> from trainhealth._internal.simulator.scenario import Scenario, cluster_fault
>>> from trainhealth._internal.simulator.simulate import simulate
>>> from trainhealth._internal.localize.sources import Window
>>> from trainhealth._internal.store import MetricStore
>>> layout = ClusterLayout(dp=4, pp=2, tp=2)
>>> trace = simulate(Scenario(layout, steps=12, seed=3, faults=(cluster_fault(layout, "gpu", 5, 1.5, step=6),)))
>>> class Fixed:
...     def describe(self): return "a fixed window"
...     def read(self): return Window(trace.records, None)
>>> store = MetricStore()
>>> run = Analyzer(Fixed(), store, job="sim-run").run_once()
>>> run.first.job, run.first.verdict
('sim-run', 'compute')
>>> [(labels, round(value, 2)) for labels, value in store.series(catalog.SUSPECT_SCORE)][:1]
[(('sim-run', '5', 'sim-node-0000', '5', 'gpu', 'gpu:rank-5'), 1.0)]
>>> class Gone:
...     def describe(self): return "a source that went away"
...     def read(self): raise SourceError("no such directory")
>>> analyzer = Analyzer(Gone(), store)
>>> analyzer.run_once() is None, store.value(catalog.ANALYSIS_STALE), analyzer.delay(30.0)
(True, 1.0, 60.0)
>>> store.value(catalog.ANALYSIS_VERDICT, ("sim-run", "compute"))  # the last verdict, still served
1.0
"""

from __future__ import annotations

import dataclasses
import logging
import math
import threading
import time
from collections.abc import Sequence
from typing import Protocol

import pandas as pd

from trainhealth._internal import catalog
from trainhealth._internal.identity import NODE_JOB
from trainhealth._internal.knowledge.advice import advice_for
from trainhealth._internal.localize.hangs import hang_result
from trainhealth._internal.localize.localizer import Thresholds, localize
from trainhealth._internal.localize.result import VERDICTS, JobResults, LocalizationResult, Suspect
from trainhealth._internal.localize.sources import SourceError, Window
from trainhealth._internal.store import Labels, MetricStore
from trainhealth._internal.traces.format import TraceError

__all__ = ["MAX_BACKOFF", "Analyzer", "Source"]

#: the longest wait between runs after failures, in intervals: a fresh verdict within two intervals of recovery
MAX_BACKOFF = 2.0

log = logging.getLogger(__name__)


class Source(Protocol):
    def describe(self) -> str: ...

    def read(self) -> Window | Sequence[Window]: ...  # one window, or one per job


#: what the analyzer publishes about each job: the job is each series' first label
_PER_JOB = (
    catalog.SUSPECT_SCORE,
    catalog.SUSPECT_SLOWDOWN,
    catalog.SUSPECT_SINCE_STEP,
    catalog.ANALYSIS_RANK_COMPUTE,
    catalog.ANALYSIS_RANK_WAIT,
    catalog.ANALYSIS_VERDICT,
    catalog.ANALYSIS_IRREGULAR_STEPS,
    catalog.ANALYSIS_DETECTABLE_SLOWDOWN,
    catalog.ANALYSIS_JOB_SLOWDOWN,
    catalog.ANALYSIS_UNCOVERED_RANKS,
    catalog.ANALYSIS_EVENTS,
    catalog.ANALYSIS_RANKS,
)


class Analyzer:
    """Runs the localizer over ``source`` and publishes the results into ``store``, a result per job; ``job``
    labels the results of windows that name no job (trace files): the analyzer's own job label."""

    def __init__(
        self, source: Source, store: MetricStore, thresholds: Thresholds | None = None, job: str = NODE_JOB
    ) -> None:
        self.source = source
        self.store = store
        self.thresholds = thresholds or Thresholds()
        self.job = job
        self.failures = 0  # runs failed in a row
        self._published: dict[catalog.MetricSpec, set[Labels]] = {spec: set() for spec in _PER_JOB}

    def run_once(self, strict: bool = False) -> JobResults | None:
        """One run: read, localize each job, publish. A failure is logged in one line and counted, and the last
        results stay served, marked stale; with ``strict`` it is raised instead. A job whose localization
        fails keeps its last series while the others are published (logged and counted too)."""
        began = time.perf_counter()
        try:
            read = self.source.read()
            windows = (read,) if isinstance(read, Window) else tuple(read)
            results, failed = [], set()
            problem: Exception | None = None
            for window in windows:
                for note in window.notes:
                    log.warning("trainhealth analyze: %s", _one_line(note))
                job = window.job or self.job
                try:
                    results.append(self._judge(window, job))
                except Exception as exc:
                    if strict or len(windows) == 1:
                        raise
                    problem = exc
                    failed.add(job)
                    log.warning("trainhealth analyze: job %s: %s", job, _one_line(f"{type(exc).__name__}: {exc}"))
                    self.store.inc(catalog.EXPORTER_ERRORS, 1.0, ("analyze",))
            if not results:
                raise problem if problem is not None else SourceError(f"nothing to judge in {self.source.describe()}")
            run = JobResults.of(results)
            self.publish(
                run, {w.job or self.job: _gpus(w.records) for w in windows}, time.perf_counter() - began, failed
            )
        except (SourceError, TraceError) as exc:
            if strict:
                raise
            self._failed(str(exc))
            return None
        except Exception as exc:  # whatever the input did to the localizer, the service stays up
            if strict:
                raise
            self._failed(f"{type(exc).__name__}: {exc}", exc)
            return None
        self.failures = 0
        self.store.set(catalog.ANALYSIS_STALE, 0.0)
        self.store.set(catalog.ANALYSIS_CONSECUTIVE_FAILURES, 0.0)
        return run

    def _judge(self, window: Window, job: str) -> LocalizationResult:
        """One job's result: ``hang`` when a member holds a group past the threshold, else the localization of
        its window, with its slow collectives and held hang verdicts noted."""
        report = window.hangs
        if report is not None and report.hangs:
            result = hang_result(report)
        elif window.records.empty:  # positions, but no collective completed in the window (a long first one)
            result = LocalizationResult(
                "insufficient_data",
                (),
                (),
                advice_for("insufficient_data"),
                {"reasons": ["no collective completed in the window"]},
            )
        else:
            result = localize(
                window.records, window.topology, self.thresholds, window.probe, window.judge_last, window.usual_before
            )
        if report is not None and report.paused:
            result.details.setdefault("notes", []).append(
                "hang verdicts held: " + "; ".join(report.paused) + " (an announced pause)"
            )
        if report is not None and report.slow:
            result.details["slow_collectives"] = [h.to_dict() for h in report.slow]
            result.details["reasons"] = list(result.details.get("reasons", [])) + [h.verdict for h in report.slow]
        return dataclasses.replace(result, job=job, job_name=window.job_name)

    def delay(self, interval: float) -> float:
        """Seconds from the start of one run to the start of the next: ``interval``, doubled per failed run
        in a row up to ``MAX_BACKOFF`` intervals."""
        return interval * min(2.0 ** min(self.failures, 16), MAX_BACKOFF)

    def run(self, interval: float, stop: threading.Event) -> None:
        """Run every ``interval`` seconds (longer after failures: :meth:`delay`) until ``stop`` is set."""
        while not stop.is_set():
            began = time.monotonic()
            run = self.run_once()
            for result in () if run is None else run.results:
                top = result.suspects[0].component if result.suspects else "-"
                log.info("trainhealth analyze: job %s: %s, top suspect %s", result.job, result.verdict, top)
            stop.wait(max(0.0, began + self.delay(interval) - time.monotonic()))

    def _failed(self, message: str, exc: BaseException | None = None) -> None:
        """Log one line, count the error, mark what is served as stale. Every failure is logged: runs are an
        interval or two apart, so the log stays small (``MetricStore.record_error`` would add a second line)."""
        self.failures += 1
        log.warning(
            "trainhealth analyze: %s (%d failed run%s in a row; %s)",
            _one_line(message),
            self.failures,
            "" if self.failures == 1 else "s",
            "serving the last verdict, stale" if self._served() else "no verdict yet",
        )
        if exc is not None:
            log.debug("trainhealth analyze: the failed run's traceback", exc_info=exc)
        self.store.inc(catalog.EXPORTER_ERRORS, 1.0, ("analyze",))
        self.store.set(catalog.ANALYSIS_STALE, 1.0)
        self.store.set(catalog.ANALYSIS_CONSECUTIVE_FAILURES, float(self.failures))

    def _served(self) -> bool:
        return self.store.value(catalog.ANALYSIS_LAST_RUN_TIMESTAMP) is not None

    def publish(
        self,
        run: JobResults,
        gpus: dict[str, dict[int, int]],
        seconds: float,
        keep: set[str] | frozenset[str] = frozenset(),
    ) -> None:
        """Replace every job's series with ``run``'s; jobs in ``keep`` (their localization failed) keep theirs,
        jobs no longer seen lose theirs."""
        values: dict[catalog.MetricSpec, dict[Labels, float]] = {spec: {} for spec in _PER_JOB}
        for result in run.results:
            job = result.job or self.job
            for verdict in VERDICTS:
                values[catalog.ANALYSIS_VERDICT][(job, verdict)] = 1.0 if verdict == result.verdict else 0.0
            for suspect in result.suspects:
                labels = _labels(job, suspect, gpus.get(job, {}))
                values[catalog.SUSPECT_SCORE][labels] = suspect.score
                for spec, value in (
                    (catalog.SUSPECT_SLOWDOWN, suspect.slowdown),
                    (catalog.SUSPECT_SINCE_STEP, suspect.since_step),
                ):
                    if value is not None:
                        values[spec][labels] = float(value)
            for row in result.details.get("compute_and_wait", []):
                if row["compute_seconds"] is not None:
                    values[catalog.ANALYSIS_RANK_COMPUTE][(job, str(row["rank"]))] = float(row["compute_seconds"])
                    values[catalog.ANALYSIS_RANK_WAIT][(job, str(row["rank"]))] = float(row["wait_seconds"])
            values[catalog.ANALYSIS_IRREGULAR_STEPS][(job,)] = float(len(result.irregular_steps))
            power = result.details.get("power")
            if power is not None:  # null: not even 3x was blamed in every injection, +Inf served
                slowdown = power["slowdown"]
                values[catalog.ANALYSIS_DETECTABLE_SLOWDOWN][(job,)] = math.inf if slowdown is None else float(slowdown)
            if "window" in result.details and result.verdict not in ("hang", "insufficient_data"):
                job_wide = result.details.get("job_wide")
                values[catalog.ANALYSIS_JOB_SLOWDOWN][(job,)] = float(job_wide["slowdown"]) if job_wide else 1.0
            uncovered = float(len(result.details.get("uncovered_ranks", [])))
            values[catalog.ANALYSIS_UNCOVERED_RANKS][(job,)] = uncovered
            values[catalog.ANALYSIS_EVENTS][(job,)] = float(len(result.details.get("events", [])))
            values[catalog.ANALYSIS_RANKS][(job,)] = float(result.details.get("window", {}).get("ranks", 0))
        for spec, current in values.items():
            published = self._published[spec]
            kept = {labels for labels in published if labels[0] in keep}
            for labels in published - set(current) - kept:
                self.store.remove(spec, labels)
            for labels, value in current.items():
                self.store.set(spec, value, labels)
            self._published[spec] = set(current) | kept
        self.store.set(catalog.ANALYSIS_DURATION, seconds)
        self.store.set(catalog.ANALYSIS_LAST_RUN_TIMESTAMP, time.time())


def _one_line(text: str, limit: int = 500) -> str:
    """A message on one log line (paths and upstream text may hold newlines), at most ``limit`` characters."""
    text = text.replace("\r", "\\r").replace("\n", "\\n")
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _labels(job: str, suspect: Suspect, gpus: dict[int, int]) -> tuple[str, ...]:
    """(job, rank, host, gpu, kind, component): one rank for a GPU or NIC, a host for a host, neither for a
    switch; the job the suspect belongs to."""
    component = suspect.component or f"{suspect.kind}:{','.join(map(str, suspect.ranks))}"
    kind = component.split(":", 1)[0]
    single = len(suspect.ranks) == 1 and kind in ("gpu", "nic", "rank")
    rank = str(suspect.ranks[0]) if single else ""
    gpu = str(gpus[suspect.ranks[0]]) if single and suspect.ranks[0] in gpus else ""
    host = suspect.host or "" if kind != "switch" else ""
    return (job, rank, host, gpu, kind, component)


def _gpus(records: pd.DataFrame) -> dict[int, int]:
    """rank -> local GPU index, from the ``gpu`` column when the trace has one."""
    if "gpu" not in records.columns:
        return {}
    pairs = records[["rank", "gpu"]].dropna().drop_duplicates("rank")
    return {int(r): int(g) for r, g in zip(pairs["rank"], pairs["gpu"])}
