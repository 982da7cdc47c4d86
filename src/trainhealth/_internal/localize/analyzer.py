"""The analyzer service: localize periodically and serve the suspects as metrics.

Each run reads a fresh window from its source (Prometheus or trace files),
localizes it and replaces the published series: ``trainhealth_suspect_score``
per suspect (with ``trainhealth_suspect_slowdown`` and ``trainhealth_suspect_since_step``
where the localizer measured them), each rank's compute and wait per step
(``trainhealth_analysis_rank_compute_seconds`` / ``_wait_seconds``), ``trainhealth_analysis_verdict`` (1 for the current verdict),
what the window could have seen (``trainhealth_analysis_detectable_slowdown``, the ranks it could not
measure, the events that blamed nobody), and when and how long the last run was. It keeps no state between runs beyond
what it publishes, so it can be killed and restarted at any time: the next run
rebuilds everything from the source.

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
>>> result = Analyzer(Fixed(), store).run_once()
>>> [(labels, round(value, 2)) for labels, value in store.series(catalog.SUSPECT_SCORE)][:1]
[(('5', 'sim-node-0000', '5', 'gpu', 'gpu:rank-5'), 1.0)]
>>> class Gone:
...     def describe(self): return "a source that went away"
...     def read(self): raise SourceError("no such directory")
>>> analyzer = Analyzer(Gone(), store)
>>> analyzer.run_once() is None, store.value(catalog.ANALYSIS_STALE), analyzer.delay(30.0)
(True, 1.0, 60.0)
>>> store.value(catalog.ANALYSIS_VERDICT, ("compute",))  # the last verdict, still served
1.0
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Protocol

import pandas as pd

from trainhealth._internal import catalog
from trainhealth._internal.localize.hangs import hang_result
from trainhealth._internal.localize.localizer import Thresholds, localize
from trainhealth._internal.localize.result import VERDICTS, LocalizationResult, Suspect
from trainhealth._internal.localize.sources import SourceError, Window
from trainhealth._internal.store import MetricStore
from trainhealth._internal.traces.format import TraceError

__all__ = ["MAX_BACKOFF", "Analyzer", "Source"]

#: the longest wait between runs after failures, in intervals: a fresh verdict within two intervals of recovery
MAX_BACKOFF = 2.0

log = logging.getLogger(__name__)


class Source(Protocol):
    def describe(self) -> str: ...

    def read(self) -> Window: ...


class Analyzer:
    """Runs the localizer over ``source`` and publishes the result into ``store``."""

    def __init__(self, source: Source, store: MetricStore, thresholds: Thresholds | None = None) -> None:
        self.source = source
        self.store = store
        self.thresholds = thresholds or Thresholds()
        self.failures = 0  # runs failed in a row
        self._published: set[tuple[str, ...]] = set()
        self._ranks: set[tuple[str, ...]] = set()

    def run_once(self, strict: bool = False) -> LocalizationResult | None:
        """One run: read, localize, publish. A failure is logged in one line and counted, and the last result
        stays served, marked stale; with ``strict`` it is raised instead."""
        began = time.perf_counter()
        try:
            window = self.source.read()
            for note in window.notes:
                log.warning("trainhealth analyze: %s", _one_line(note))
            if window.hangs is not None and window.hangs.hangs:
                result = hang_result(window.hangs)
            else:
                result = localize(window.records, window.topology, self.thresholds, window.probe, window.judge_last)
                if window.hangs is not None and window.hangs.paused:
                    result.details.setdefault("notes", []).append(
                        "hang verdicts held: " + "; ".join(window.hangs.paused) + " (an announced pause)"
                    )
            self.publish(result, _gpus(window.records), time.perf_counter() - began)
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
        return result

    def delay(self, interval: float) -> float:
        """Seconds from the start of one run to the start of the next: ``interval``, doubled per failed run
        in a row up to ``MAX_BACKOFF`` intervals."""
        return interval * min(2.0 ** min(self.failures, 16), MAX_BACKOFF)

    def run(self, interval: float, stop: threading.Event) -> None:
        """Run every ``interval`` seconds (longer after failures: :meth:`delay`) until ``stop`` is set."""
        while not stop.is_set():
            began = time.monotonic()
            result = self.run_once()
            if result is not None:
                top = result.suspects[0].component if result.suspects else "-"
                log.info("trainhealth analyze: %s, top suspect %s", result.verdict, top)
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

    def publish(self, result: LocalizationResult, gpus: dict[int, int], seconds: float) -> None:
        for verdict in VERDICTS:
            self.store.set(catalog.ANALYSIS_VERDICT, 1.0 if verdict == result.verdict else 0.0, (verdict,))
        current = {_labels(suspect, gpus): suspect for suspect in result.suspects}
        for labels in self._published - set(current):
            for spec in (catalog.SUSPECT_SCORE, catalog.SUSPECT_SLOWDOWN, catalog.SUSPECT_SINCE_STEP):
                self.store.remove(spec, labels)
        for labels, suspect in current.items():
            self.store.set(catalog.SUSPECT_SCORE, suspect.score, labels)
            for spec, value in (
                (catalog.SUSPECT_SLOWDOWN, suspect.slowdown),
                (catalog.SUSPECT_SINCE_STEP, suspect.since_step),
            ):
                if value is None:
                    self.store.remove(spec, labels)
                else:
                    self.store.set(spec, float(value), labels)
        self._published = set(current)
        ranks = {
            (str(row["rank"]),): row
            for row in result.details.get("compute_and_wait", [])
            if row["compute_seconds"] is not None
        }
        for labels in self._ranks - set(ranks):
            self.store.remove(catalog.ANALYSIS_RANK_COMPUTE, labels)
            self.store.remove(catalog.ANALYSIS_RANK_WAIT, labels)
        for labels, row in ranks.items():
            self.store.set(catalog.ANALYSIS_RANK_COMPUTE, float(row["compute_seconds"]), labels)
            self.store.set(catalog.ANALYSIS_RANK_WAIT, float(row["wait_seconds"]), labels)
        self._ranks = set(ranks)
        self.store.set(catalog.ANALYSIS_IRREGULAR_STEPS, float(len(result.irregular_steps)))
        power = result.details.get("power")
        if power is None:
            self.store.remove(catalog.ANALYSIS_DETECTABLE_SLOWDOWN, ())
        else:
            self.store.set(catalog.ANALYSIS_DETECTABLE_SLOWDOWN, float(power["slowdown"]))
        self.store.set(catalog.ANALYSIS_UNCOVERED_RANKS, float(len(result.details.get("uncovered_ranks", []))))
        self.store.set(catalog.ANALYSIS_EVENTS, float(len(result.details.get("events", []))))
        self.store.set(catalog.ANALYSIS_RANKS, float(result.details.get("window", {}).get("ranks", 0)))
        self.store.set(catalog.ANALYSIS_DURATION, seconds)
        self.store.set(catalog.ANALYSIS_LAST_RUN_TIMESTAMP, time.time())


def _one_line(text: str, limit: int = 500) -> str:
    """A message on one log line (paths and upstream text may hold newlines), at most ``limit`` characters."""
    text = text.replace("\r", "\\r").replace("\n", "\\n")
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _labels(suspect: Suspect, gpus: dict[int, int]) -> tuple[str, ...]:
    """(rank, host, gpu, kind, component): one rank for a GPU or NIC, a host for a host, neither for a switch."""
    component = suspect.component or f"{suspect.kind}:{','.join(map(str, suspect.ranks))}"
    kind = component.split(":", 1)[0]
    single = len(suspect.ranks) == 1 and kind in ("gpu", "nic", "rank")
    rank = str(suspect.ranks[0]) if single else ""
    gpu = str(gpus[suspect.ranks[0]]) if single and suspect.ranks[0] in gpus else ""
    host = suspect.host or "" if kind != "switch" else ""
    return (rank, host, gpu, kind, component)


def _gpus(records: pd.DataFrame) -> dict[int, int]:
    """rank -> local GPU index, from the ``gpu`` column when the trace has one."""
    if "gpu" not in records.columns:
        return {}
    pairs = records[["rank", "gpu"]].dropna().drop_duplicates("rank")
    return {int(r): int(g) for r, g in zip(pairs["rank"], pairs["gpu"])}
