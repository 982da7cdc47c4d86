"""The analyzer service: localize periodically and serve the suspects as metrics.

Each run reads a fresh window from its source (Prometheus or trace files),
localizes it and replaces the published series: ``trainhealth_suspect_score``
per suspect (with ``trainhealth_suspect_slowdown`` and ``trainhealth_suspect_since_step``
where the localizer measured them), each rank's compute and wait per step
(``trainhealth_analysis_rank_compute_seconds`` / ``_wait_seconds``), ``trainhealth_analysis_verdict`` (1 for the current verdict),
and when and how long the last run was. It keeps no state between runs beyond
what it publishes, so it can be killed and restarted at any time: the next run
rebuilds everything from the source.

>>> from trainhealth.lab.simulator.cluster import ClusterLayout
>>> from trainhealth.lab.simulator.simulate import ClusterFaultKind, InjectedFault, Scenario, simulate
>>> from trainhealth.localize.sources import Window
>>> from trainhealth.store import MetricStore
>>> trace = simulate(Scenario(ClusterLayout(dp=4, pp=2, tp=2), steps=12, seed=3,
...                           faults=(InjectedFault(ClusterFaultKind.GPU, target=5, severity=1.5, start_step=6),)))
>>> class Fixed:
...     def describe(self): return "a fixed window"
...     def read(self): return Window(trace.records, None)
>>> store = MetricStore()
>>> result = Analyzer(Fixed(), store).run_once()
>>> [(labels, round(value, 2)) for labels, value in store.series(catalog.SUSPECT_SCORE)][:1]
[(('5', 'sim-node-0000', '5', 'gpu', 'gpu:rank-5'), 1.0)]
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Protocol

import pandas as pd

from trainhealth import catalog
from trainhealth.localize.localizer import Thresholds, localize
from trainhealth.localize.result import VERDICTS, LocalizationResult, Suspect
from trainhealth.localize.sources import SourceError, Window
from trainhealth.store import MetricStore
from trainhealth.traces.format import TraceError

__all__ = ["Analyzer", "Source"]

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
        self._published: set[tuple[str, ...]] = set()
        self._ranks: set[tuple[str, ...]] = set()

    def run_once(self, strict: bool = False) -> LocalizationResult | None:
        """One run: read, localize, publish. A failed read is logged and counted (the last result stays),
        or with ``strict`` raised."""
        began = time.perf_counter()
        try:
            window = self.source.read()
            result = localize(window.records, window.topology, self.thresholds, window.probe)
        except (SourceError, TraceError) as exc:
            if strict:
                raise
            log.warning("trainhealth analyze: %s", exc)
            self.store.record_error("analyze")
            return None
        for note in window.notes:
            log.warning("trainhealth analyze: %s", note)
        self.publish(result, _gpus(window.records), time.perf_counter() - began)
        return result

    def run(self, interval: float, stop: threading.Event) -> None:
        """Run every ``interval`` seconds until ``stop`` is set."""
        while not stop.is_set():
            result = self.run_once()
            if result is not None:
                top = result.suspects[0].component if result.suspects else "-"
                log.info("trainhealth analyze: %s, top suspect %s", result.verdict, top)
            stop.wait(interval)

    def publish(self, result: LocalizationResult, gpus: dict[int, int], seconds: float) -> None:
        for verdict in VERDICTS:
            self.store.set(catalog.ANALYSIS_VERDICT, 1.0 if verdict == result.verdict else 0.0, (verdict,))
        current = {_labels(suspect, gpus): suspect for suspect in result.suspects}
        for labels in self._published - set(current):
            for spec in (catalog.SUSPECT_SCORE, catalog.SUSPECT_SLOWDOWN, catalog.SUSPECT_SINCE_STEP):
                self.store.remove(spec, labels)
        for labels, suspect in current.items():
            self.store.set(catalog.SUSPECT_SCORE, suspect.score, labels)
            for spec, value in ((catalog.SUSPECT_SLOWDOWN, suspect.slowdown),
                                (catalog.SUSPECT_SINCE_STEP, suspect.since_step)):
                if value is None:
                    self.store.remove(spec, labels)
                else:
                    self.store.set(spec, float(value), labels)
        self._published = set(current)
        ranks = {(str(row["rank"]),): row for row in result.details.get("compute_and_wait", [])}
        for labels in self._ranks - set(ranks):
            self.store.remove(catalog.ANALYSIS_RANK_COMPUTE, labels)
            self.store.remove(catalog.ANALYSIS_RANK_WAIT, labels)
        for labels, row in ranks.items():
            self.store.set(catalog.ANALYSIS_RANK_COMPUTE, float(row["compute_seconds"]), labels)
            self.store.set(catalog.ANALYSIS_RANK_WAIT, float(row["wait_seconds"]), labels)
        self._ranks = set(ranks)
        self.store.set(catalog.ANALYSIS_IRREGULAR_STEPS, float(len(result.irregular_steps)))
        self.store.set(catalog.ANALYSIS_RANKS, float(result.details.get("window", {}).get("ranks", 0)))
        self.store.set(catalog.ANALYSIS_DURATION, seconds)
        self.store.set(catalog.ANALYSIS_LAST_RUN_TIMESTAMP, time.time())


def _labels(suspect: Suspect, gpus: dict[int, int]) -> tuple[str, ...]:
    """(rank, host, gpu, kind, component): one rank for a GPU or NIC, a host for a host, neither for a switch."""
    component = suspect.component or f"{suspect.kind}:{','.join(map(str, suspect.ranks))}"
    kind = component.split(":", 1)[0]
    single = len(suspect.ranks) == 1 and kind in ("gpu", "nic")
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
