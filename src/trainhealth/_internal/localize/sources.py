"""Where the analyzer reads a window of collective timings: trace files, or Prometheus's HTTP API.

Both return trace format v1 records, so one localizer serves both.

* :class:`TraceDirectory` reads the trace files ranks drop into a directory
  (``rank-<N>.<n>.jsonl.gz`` from ``trainhealth.comm``, or any v1 trace) and keeps the
  last ``window`` steps. A file that cannot be read (a rank still writing with
  another tool, a corrupt file) is skipped and reported, not fatal.
* :class:`PrometheusSource` asks Prometheus (through
  :class:`~trainhealth._internal.localize.prometheus_api.PrometheusClient`) for the per-rank aggregates every
  rank exports: the mean duration of each collective (op, group) over each
  ``step`` seconds — one "instance" of the group per interval, the same on every
  member — and each rank's compute per training step, as ``compute`` records:
  the compute the rank measures itself (step time less the time it was blocked
  in collectives, ``trainhealth_train_step_compute_seconds_total``), or, from
  ranks of older versions, the mean step time less the collective time per step.
  In this mode a trace "step" is one query interval. One Prometheus holds many jobs:
  it returns a window per job (the ``job`` label, the run's own id), each judged on
  its own, hangs included; ``job`` selects one, ``job_name`` the runs of one logical
  name (``trainhealth_rank_info``'s ``job_name``).

Neither raises anything but :class:`SourceError` (one line) for input it cannot use:
the analyzer counts that, keeps serving its last verdict and tries again.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from trainhealth._internal import catalog
from trainhealth._internal.knowledge.limits import PAUSE_HOLD_S
from trainhealth._internal.knowledge.promql import string_literal
from trainhealth._internal.localize.hangs import HangReport, judge_hangs, positions_by_job
from trainhealth._internal.localize.history import live_steps, usual_before
from trainhealth._internal.localize.prometheus_api import PrometheusClient, Series, SourceError, one_line
from trainhealth._internal.traces.format import TraceError, validate
from trainhealth._internal.traces.io import is_trace_file, read_trace_file
from trainhealth._internal.traces.topology import TOPOLOGY_FILE, Topology

#: the link probe's result, read from a trace directory beside the traces (``trainhealth probe --out``)
PROBE_FILE = "probe.json"

#: the longest a collective or a step's compute may plausibly take (a day); longer durations are left out
MAX_SECONDS = 86400.0
_IMPLAUSIBLE = object()  # a sample that cannot be a timing of the window

__all__ = [
    "MAX_SECONDS",
    "PROBE_FILE",
    "PrometheusClient",
    "PrometheusSource",
    "Series",
    "SourceError",
    "TraceDirectory",
    "Window",
    "load_probe",
]

log = logging.getLogger(__name__)

#: coarse intervals a rank's usual level is read in from Prometheus, before the history (``reference`` seconds)
REFERENCE_POINTS = 20


@dataclass(frozen=True)
class Window:
    """A window of records to localize, with the topology when one is known and notes for the log."""

    records: pd.DataFrame
    topology: Topology | None
    notes: tuple[str, ...] = ()
    probe: Any = None  # a ProbeResult found beside the traces (probe.json), naming a slow link
    judge_last: int | None = None  # judge only the last steps; those before are the run's history
    usual_before: int | None = None  # steps numbered below are the run's usual level, read before the history
    hangs: HangReport | None = None  # the ranks' positions judged for hangs (Prometheus: every rank's live state)
    job: str | None = None  # the job label of the job the window holds (Prometheus); None: the source names none
    job_name: str | None = None  # that job's logical name, where its ranks export one


@dataclass(frozen=True)
class TraceDirectory:
    """The last ``window`` steps of the trace files in ``directory``, judged against up to ``history`` steps
    (the window included) of the run before them and the run's first steps (each rank's usual level,
    :mod:`.history`): how far healthy members go, and who changed."""

    directory: Path
    window: int = 20
    history: int = 0

    def describe(self) -> str:
        return f"trace files in {self.directory}"

    def read(self) -> Window:
        if not self.directory.is_dir():
            raise SourceError(f"{self.directory}: no such directory")
        frames, notes = [], []
        try:
            paths = sorted(p for p in self.directory.iterdir() if p.is_file() and is_trace_file(p))
        except OSError as exc:
            raise SourceError(f"{self.directory}: cannot list it: {exc.strerror or exc}") from None
        for path in paths:
            try:
                frames.append(read_trace_file(path))
            except TraceError as exc:
                notes.append(f"skipped {exc}")
            except OSError as exc:  # unreadable, or gone between listing and reading
                notes.append(f"skipped {path}: {exc.strerror or exc}")
        if not frames:
            raise SourceError(f"{self.directory}: no readable trace files yet")
        records = pd.concat(frames, ignore_index=True) if len(frames) > 1 else frames[0]
        steps = live_steps(records["step"].to_numpy(), self.window, self.history)
        records = records[records["step"].isin(steps)].reset_index(drop=True)
        usual = usual_before(steps, self.window, self.history)
        topology = None
        if (self.directory / TOPOLOGY_FILE).is_file():
            try:
                topology = Topology.load(self.directory / TOPOLOGY_FILE)
            except TraceError as exc:
                notes.append(f"ignored {exc}")
            except OSError as exc:
                notes.append(f"ignored {self.directory / TOPOLOGY_FILE}: {exc.strerror or exc}")
        probe, problem = load_probe(self.directory / PROBE_FILE)
        if problem:
            notes.append(problem)
        judge_last = self.window if self.history > self.window else None
        return Window(records, topology, tuple(notes), probe, judge_last, usual_before=usual)


def load_probe(path: Path) -> tuple[Any, str | None]:
    """The link probe result at ``path`` when there is one, else None; a bad file is a note, not fatal."""
    if not path.is_file():
        return None, None
    from trainhealth._internal.exporters.collectives.probe import ProbeResult

    try:
        return ProbeResult.load(path), None
    except (OSError, ValueError) as exc:
        return None, f"ignored {path}: {exc}"


@dataclass(frozen=True)
class PrometheusSource:
    """Per-rank collective and step aggregates over the last ``window`` seconds, in ``step``-second intervals,
    a window per job, judged against ``history`` seconds (the window included) in the same intervals and, before
    them, ``reference`` seconds in :data:`REFERENCE_POINTS` coarse intervals: each rank's usual level, so that a
    fault older than the history is still a change (:mod:`.history`).

    ``job`` (the job label, the run's own id) is matched as a PromQL string literal
    (:func:`~trainhealth._internal.knowledge.promql.string_literal`), so any job label selects exactly that job;
    ``job_name`` keeps the jobs whose ranks export that logical name (``trainhealth_rank_info{job_name}``).
    Without either, every job Prometheus has is read, each judged on its own. Samples that cannot be timings
    of this window (an infinite or implausibly long duration, a time outside the window, a rank label that is
    not a rank) are left out and noted.
    """

    client: PrometheusClient
    job: str | None = None
    window: float = 600.0
    step: float = 30.0
    job_name: str | None = None
    history: float = 0.0
    reference: float = 0.0

    def describe(self) -> str:
        chosen = [f"job {one_line(repr(self.job))}"] if self.job else []
        chosen += [f"job_name {one_line(repr(self.job_name))}"] if self.job_name else []
        return f"Prometheus at {self.client.url}" + (f" ({', '.join(chosen)})" if chosen else "")

    def read(self) -> tuple[Window, ...]:
        """A window per job, hung jobs first (their window is their positions: the collectives stopped
        completing, so the time before the hang is beside the point); a job whose ranks report positions but
        completed no collective in the window (a long first collective) gets an empty window with them."""
        reports = self.hangs()  # first: the positions are the freshest news (and a run's first query)
        info = self.client.query(self._select(catalog.RANK_INFO.prometheus_name))
        names = {s.labels.get("job", ""): s.labels.get("job_name") or None for s in info}
        gpus = {(s.labels.get("job"), s.labels.get("rank")): s.labels.get("local_rank") for s in info}
        wanted = None
        if self.job_name is not None:
            wanted = {job for job, name in names.items() if name == self.job_name}
            if not wanted:
                raise SourceError(
                    f"no job named {one_line(repr(self.job_name))} in {self.describe()}: no "
                    f"{catalog.RANK_INFO.prometheus_name} series with that job_name"
                )
            reports = {job: report for job, report in reports.items() if job in wanted}
        hung = sorted(job for job, report in reports.items() if report.hangs)
        windows = [Window(pd.DataFrame(), None, hangs=reports[job], job=job, job_name=names.get(job)) for job in hung]
        try:
            judged, notes = self._windows(gpus, skip=set(hung), wanted=wanted)
        except SourceError:
            if not windows and not reports:
                raise
            judged, notes = {}, ()
        for job in sorted(judged.keys() | (reports.keys() - set(hung))):
            found = judged.get(job)
            if found is None:  # positions but no completed collective in the window
                found = Window(pd.DataFrame(), None, (f"job {job}: no collectives completed in the window",))
            windows.append(
                Window(
                    found.records,
                    None,
                    found.notes,
                    judge_last=found.judge_last,
                    usual_before=found.usual_before,
                    hangs=reports.get(job),
                    job=job,
                    job_name=names.get(job),
                )
            )
        if notes and windows:
            first = windows[0]
            windows[0] = dataclasses.replace(first, notes=first.notes + notes)
        return tuple(windows)

    #: the ranks' live positions; the last ones of a rank gone (its series stale) within this many seconds
    GONE_WITHIN_S = 600

    def hangs(self) -> dict[str, HangReport]:
        """Every running job's rank positions now (and the last ones of its ranks that stopped reporting), each
        job judged for hangs on its own, by job label."""
        names = (
            catalog.COMM_STARTED_SEQ,
            catalog.COMM_COMPLETED_SEQ,
            catalog.COMM_INFLIGHT_DURATION,
            catalog.COMM_GROUP_MEMBER,
            catalog.COMM_HANG_THRESHOLD,
            catalog.COMM_STUCK_DURATION,
            catalog.COMM_PAUSED,
        )
        queries = [(spec.prometheus_name, self._select(spec.prometheus_name)) for spec in names]
        # a pause holds the verdict a while after it ends (the peers' wait may be from an older scrape), unless the
        # rank is stuck in it past its bound
        paused, stuck = catalog.COMM_PAUSED.prometheus_name, catalog.COMM_STUCK_DURATION.prometheus_name
        queries[-1] = (
            paused,
            f'max_over_time({self._select(paused)}[{PAUSE_HOLD_S}s]) unless on (job, rank) {stuck}{{state="in_pause"}}',
        )
        samples = [
            (name, series.labels, value)
            for name, promql in queries
            for series in self.client.query(promql)
            for _, value in series.samples[-1:]
        ]
        gone = []
        for spec in (catalog.COMM_STARTED_SEQ, catalog.COMM_WATCH_TIMESTAMP, catalog.COMM_GROUP_MEMBER):
            selector = self._select(spec.prometheus_name)
            gone += [
                (spec.prometheus_name, series.labels, value)
                for series in self.client.query(f"last_over_time({selector}[{self.GONE_WITHIN_S}s]) unless {selector}")
                for _, value in series.samples[-1:]
            ]
        # a job none of whose ranks reports any more (it ended) has no position to judge
        return {job: judge_hangs(p) for job, p in positions_by_job(samples, gone).items() if p.states}

    def _windows(
        self, gpus: dict[tuple[Any, Any], Any], skip: set[str], wanted: set[str] | None
    ) -> tuple[dict[str, Window], tuple[str, ...]]:
        """The records of every job (but those in ``skip``, and only those ``wanted``), and notes."""
        end = time.time()
        recent = max(self.window, self.history)
        rows = self._rows(end - recent, end, self.step, gpus)
        if not rows:
            raise SourceError(
                f"no {catalog.COMM_OP_DURATION.prometheus_name} series in {self.describe()} over the "
                f"last {recent:g}s: are the ranks running trainhealth.comm and being scraped?"
            )
        judge_last = round(self.window / self.step) if self.history > self.window else None
        usual: int | None = None
        if judge_last is not None and self.reference > 0:
            coarse = max(self.step, self.reference / REFERENCE_POINTS)
            earlier = self._rows(end - recent - self.reference, end - recent, coarse, gpus)
            if earlier:  # the recent intervals are numbered after the reference's: the usual level comes first
                for row in rows:
                    if isinstance(row, dict):
                        row["step"] += REFERENCE_POINTS + 1
                rows = earlier + rows
                usual = REFERENCE_POINTS + 1
        dropped = sum(1 for row in rows if row is _IMPLAUSIBLE)
        notes: tuple[str, ...] = ()
        if dropped:
            notes = (
                (
                    f"left out {dropped} samples that cannot be timings of this window: a duration infinite or "
                    f"over {MAX_SECONDS:g} s, a time outside it or a rank label that is not a rank"
                ),
            )
        kept = [row for row in rows if isinstance(row, dict) and row["job"] not in skip]
        if wanted is not None:
            kept = [row for row in kept if row["job"] in wanted]
        frame = pd.DataFrame(kept)
        if frame.empty:
            raise SourceError(
                f"no collectives completed in {self.describe()} over the last {self.window:g}s"
                + (f"; {notes[0]}" if notes else "")
            )
        frame["seq"] = frame["step"].where(frame["op"] != "compute")
        frame.loc[frame["op"] == "compute", "group"] = None
        windows = {}
        for job, part in frame.groupby("job", sort=True):
            try:
                records = validate(part.drop(columns="job").reset_index(drop=True), f"{self.describe()} job {job}")
            except TraceError as exc:
                notes += (f"job {job}: {one_line(str(exc))}",)
                continue
            windows[str(job)] = Window(records, None, job=str(job), judge_last=judge_last, usual_before=usual)
        if not windows:
            raise SourceError(f"no usable window in {self.describe()}: " + "; ".join(notes))
        return windows, notes

    def _rows(
        self, start: float, end: float, step: float, gpus: dict[tuple[Any, Any], Any]
    ) -> list[dict[str, Any] | object | None]:
        """The records of every job between ``start`` and ``end`` in ``step``-second intervals (empty when no
        collective was timed then), numbered from ``start``."""
        comm_sum = catalog.COMM_OP_DURATION.prometheus_name + "_sum"
        comm_count = catalog.COMM_OP_DURATION.prometheus_name + "_count"
        step_sum = catalog.TRAIN_STEP_DURATION.prometheus_name + "_sum"
        step_count = catalog.TRAIN_STEP_DURATION.prometheus_name + "_count"
        by_op, by_rank = "job, host, rank, op, group", "job, host, rank"
        interval = f"[{max(int(step), 1)}s]"
        collectives = self.client.query_range(
            f"sum by ({by_op}) (rate({self._select(comm_sum)}{interval})) / "
            f"sum by ({by_op}) (rate({self._select(comm_count)}{interval}))",
            start,
            end,
            step,
        )
        if not collectives:
            return []
        compute = self._measured_compute(interval, start, end, by_rank, step)
        if not compute:  # ranks without the measured split: the mean step time minus the collective time per step
            step_mean = self.client.query_range(
                f"(sum by ({by_rank}) (rate({self._select(step_sum)}{interval})) / "
                f"sum by ({by_rank}) (rate({self._select(step_count)}{interval})))"
                + self._stepped(step_count, interval, by_rank),
                start,
                end,
                step,
            )
            comm_per_step = self.client.query_range(
                f"(sum by ({by_rank}) (rate({self._select(comm_sum)}{interval})) / "
                f"sum by ({by_rank}) (rate({self._select(step_count)}{interval})))"
                + self._stepped(step_count, interval, by_rank),
                start,
                end,
                step,
            )
        rows = [
            self._row(series.labels, t, value, start, end, step, gpus)
            for series in collectives
            for t, value in series.samples
        ]
        if compute:
            rows += [
                self._row({**series.labels, "op": "compute"}, t, value, start, end, step, gpus)
                for series in compute
                for t, value in series.samples
            ]
        else:
            rows += self._compute_rows(step_mean, comm_per_step, start, end, step, gpus)
        return rows

    def _measured_compute(self, interval: str, start: float, end: float, by_rank: str, step: float) -> list[Series]:
        """Per rank, seconds per step computing (step time less the time blocked in collectives), as the
        ranks measure it themselves (trainhealth_train_step_compute_seconds_total); empty when not exported."""
        compute_total = catalog.TRAIN_STEP_COMPUTE.prometheus_name
        steps_total = catalog.TRAIN_STEPS.prometheus_name
        return self.client.query_range(
            f"(sum by ({by_rank}) (rate({self._select(compute_total)}{interval})) / "
            f"sum by ({by_rank}) (rate({self._select(steps_total)}{interval})))"
            + self._stepped(steps_total, interval, by_rank),
            start,
            end,
            step,
        )

    def _stepped(self, steps: str, interval: str, by_rank: str) -> str:
        """Only the intervals in which a rank finished a step: a time per step is a rate of seconds over a rate
        of steps, and over a fraction of a step (a run's last scrapes, the edge of a store's window) it is no
        step's time (70,000,000x its peers' once, read through VictoriaMetrics at the end of the demo)."""
        return f" and on ({by_rank}) (sum by ({by_rank}) (increase({self._select(steps)}{interval})) >= 0.5)"

    def _select(self, metric: str) -> str:
        return f"{metric}{{job={string_literal(self.job)}}}" if self.job else metric

    def _row(
        self,
        labels: dict[str, str],
        t: float,
        value: float,
        start: float,
        end: float,
        step: float,
        gpus: dict[tuple[Any, Any], Any],
    ) -> dict[str, Any] | object | None:
        """One record; None for NaN (an interval without operations) and a negative difference (compute
        derived from two rates), ``_IMPLAUSIBLE`` for what cannot be a timing of the window."""
        if math.isnan(value) or -MAX_SECONDS <= value < 0:
            return None
        rank = labels.get("rank", "")
        if (
            not 0 <= value <= MAX_SECONDS
            or not start - step <= t <= end + step
            or not (rank.isascii() and rank.isdigit() and len(rank) <= 9)
        ):
            return _IMPLAUSIBLE
        row = {
            "job": labels.get("job", ""),
            "rank": int(rank),
            "step": round((t - start) / step),
            "op": labels.get("op", ""),
            "group": labels.get("group", ""),
            "start": t,
            "duration": value,
            "host": labels.get("host") or None,
        }
        gpu = gpus.get((labels.get("job"), rank))
        if gpu is not None and gpu.isascii() and gpu.isdigit() and len(gpu) <= 9:
            row["gpu"] = int(gpu)
        return row

    def _compute_rows(
        self,
        step_mean: list[Series],
        comm_per_step: list[Series],
        start: float,
        end: float,
        step: float,
        gpus: dict[tuple[Any, Any], Any],
    ) -> list[dict[str, Any] | object | None]:
        """Per rank and interval: the mean step time minus the collective time per step."""
        communication = {(s.labels.get("job"), s.labels.get("rank"), t): v for s in comm_per_step for t, v in s.samples}
        out = []
        for series in step_mean:
            labels = series.labels
            for t, value in series.samples:
                spent = communication.get((labels.get("job"), labels.get("rank"), t))
                if spent is None:
                    continue
                out.append(self._row({**labels, "op": "compute"}, t, value - spent, start, end, step, gpus))
        return out
