"""Where the analyzer reads a window of collective timings: trace files, or Prometheus's HTTP API.

Both return trace format v1 records, so one localizer serves both.

* :class:`TraceDirectory` reads the trace files ranks drop into a directory
  (``rank-<N>.<n>.jsonl.gz`` from ``trainhealth.comm``, or any v1 trace) and keeps the
  last ``window`` steps. A file that cannot be read (a rank still writing with
  another tool, a corrupt file) is skipped and reported, not fatal.
* :class:`PrometheusSource` asks Prometheus for the per-rank aggregates every
  rank exports: the mean duration of each collective (op, group) over each
  ``step`` seconds — one "instance" of the group per interval, the same on every
  member — and each rank's compute per training step, as ``compute`` records:
  the compute the rank measures itself (step time less the time it was blocked
  in collectives, ``trainhealth_train_step_compute_seconds_total``), or, from
  ranks of older versions, the mean step time less the collective time per step.
  In this mode a trace "step" is one query interval.
"""

from __future__ import annotations

import base64
import json
import logging
import math
import ssl
import time
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from trainhealth import catalog
from trainhealth.traces.format import TraceError, validate
from trainhealth.traces.io import is_trace_file, read_trace_file
from trainhealth.traces.topology import TOPOLOGY_FILE, Topology

#: the link probe's result, read from a trace directory beside the traces (``trainhealth probe --out``)
PROBE_FILE = "probe.json"

__all__ = ["PROBE_FILE", "PrometheusClient", "PrometheusSource", "SourceError", "TraceDirectory", "Window", "load_probe"]

log = logging.getLogger(__name__)


class SourceError(Exception):
    """The input could not be read this time (one line; the analyzer retries on its next run)."""


@dataclass(frozen=True)
class Window:
    """A window of records to localize, with the topology when one is known and notes for the log."""

    records: pd.DataFrame
    topology: Topology | None
    notes: tuple[str, ...] = ()
    probe: Any = None  # a ProbeResult found beside the traces (probe.json), naming a slow link


@dataclass(frozen=True)
class TraceDirectory:
    """The last ``window`` steps of the trace files in ``directory``."""

    directory: Path
    window: int = 20

    def describe(self) -> str:
        return f"trace files in {self.directory}"

    def read(self) -> Window:
        if not self.directory.is_dir():
            raise SourceError(f"{self.directory}: no such directory")
        frames, notes = [], []
        for path in sorted(p for p in self.directory.iterdir() if p.is_file() and is_trace_file(p)):
            try:
                frames.append(read_trace_file(path))
            except TraceError as exc:
                notes.append(f"skipped {exc}")
        if not frames:
            raise SourceError(f"{self.directory}: no readable trace files yet")
        records = pd.concat(frames, ignore_index=True) if len(frames) > 1 else frames[0]
        steps = np.sort(records["step"].unique())[-self.window:]
        records = records[records["step"].isin(steps)].reset_index(drop=True)
        topology = None
        if (self.directory / TOPOLOGY_FILE).is_file():
            try:
                topology = Topology.load(self.directory / TOPOLOGY_FILE)
            except TraceError as exc:
                notes.append(f"ignored {exc}")
        probe, problem = load_probe(self.directory / PROBE_FILE)
        if problem:
            notes.append(problem)
        return Window(records, topology, tuple(notes), probe)


def load_probe(path: Path) -> tuple[Any, str | None]:
    """The link probe result at ``path`` when there is one, else None; a bad file is a note, not fatal."""
    if not path.is_file():
        return None, None
    from trainhealth.exporters.collectives.probe import ProbeResult

    try:
        return ProbeResult.load(path), None
    except (OSError, ValueError) as exc:
        return None, f"ignored {path}: {exc}"


@dataclass(frozen=True)
class PrometheusClient:
    """A minimal client of Prometheus's HTTP API (``/api/v1/query`` and ``/api/v1/query_range``)."""

    url: str
    timeout: float = 10.0
    ca_file: str | None = None
    bearer_token_file: str | None = None
    basic_auth_username: str | None = None
    basic_auth_password_file: str | None = field(default=None, repr=False)

    def query(self, promql: str) -> list[dict[str, Any]]:
        return self._get("/api/v1/query", {"query": promql})

    def query_range(self, promql: str, start: float, end: float, step: float) -> list[dict[str, Any]]:
        return self._get("/api/v1/query_range", {"query": promql, "start": f"{start:.3f}", "end": f"{end:.3f}",
                                                 "step": f"{step:g}"})

    def _get(self, path: str, params: dict[str, str]) -> list[dict[str, Any]]:
        request = urllib.request.Request(f"{self.url.rstrip('/')}{path}?{urllib.parse.urlencode(params)}")
        for name, value in self._headers().items():
            request.add_header(name, value)
        context = ssl.create_default_context(cafile=self.ca_file) if self.url.startswith("https") else None
        try:
            with urllib.request.urlopen(request, timeout=self.timeout, context=context) as response:
                body = json.loads(response.read())
        except urllib.error.HTTPError as exc:
            detail = ""
            try:
                detail = json.loads(exc.read()).get("error", "")
            except (ValueError, OSError):
                pass
            raise SourceError(f"Prometheus at {self.url} answered {exc.code}: {detail or exc.reason}") from None
        except (urllib.error.URLError, OSError, ValueError) as exc:
            reason = getattr(exc, "reason", exc)
            raise SourceError(f"cannot query Prometheus at {self.url}: {reason}") from None
        if body.get("status") != "success":
            raise SourceError(f"Prometheus at {self.url}: {body.get('error', 'query failed')}")
        return list(body["data"]["result"])

    def _headers(self) -> dict[str, str]:
        if self.bearer_token_file:
            return {"Authorization": f"Bearer {_read_secret(self.bearer_token_file)}"}
        if self.basic_auth_username and self.basic_auth_password_file:
            pair = f"{self.basic_auth_username}:{_read_secret(self.basic_auth_password_file)}".encode()
            return {"Authorization": "Basic " + base64.b64encode(pair).decode()}
        return {}


def _read_secret(path: str) -> str:
    try:
        return Path(path).read_text(encoding="utf-8").strip()
    except OSError as exc:
        raise SourceError(f"cannot read {path}: {exc.strerror or exc}") from None


@dataclass(frozen=True)
class PrometheusSource:
    """Per-rank collective and step aggregates over the last ``window`` seconds, in ``step``-second intervals."""

    client: PrometheusClient
    job: str | None = None
    window: float = 600.0
    step: float = 30.0

    def describe(self) -> str:
        return f"Prometheus at {self.client.url}" + (f" (job {self.job})" if self.job else "")

    def read(self) -> Window:
        end = time.time()
        start = end - self.window
        comm_sum = catalog.COMM_OP_DURATION.prometheus_name + "_sum"
        comm_count = catalog.COMM_OP_DURATION.prometheus_name + "_count"
        step_sum = catalog.TRAIN_STEP_DURATION.prometheus_name + "_sum"
        step_count = catalog.TRAIN_STEP_DURATION.prometheus_name + "_count"
        by_op, by_rank = "job, host, rank, op, group", "job, host, rank"
        interval = f"[{max(int(self.step), 1)}s]"
        collectives = self.client.query_range(
            f"sum by ({by_op}) (rate({self._select(comm_sum)}{interval})) / "
            f"sum by ({by_op}) (rate({self._select(comm_count)}{interval}))", start, end, self.step)
        if not collectives:
            raise SourceError(f"no {catalog.COMM_OP_DURATION.prometheus_name} series in {self.describe()} over the "
                              f"last {self.window:g}s: are the ranks running trainhealth.comm and being scraped?")
        compute = self._measured_compute(interval, start, end, by_rank)
        if not compute:  # ranks without the measured split: the mean step time minus the collective time per step
            step_mean = self.client.query_range(
                f"sum by ({by_rank}) (rate({self._select(step_sum)}{interval})) / "
                f"sum by ({by_rank}) (rate({self._select(step_count)}{interval}))", start, end, self.step)
            comm_per_step = self.client.query_range(
                f"sum by ({by_rank}) (rate({self._select(comm_sum)}{interval})) / "
                f"sum by ({by_rank}) (rate({self._select(step_count)}{interval}))", start, end, self.step)
        gpus = {(row["metric"].get("job"), row["metric"].get("rank")): row["metric"].get("local_rank")
                for row in self.client.query(self._select(catalog.RANK_INFO.prometheus_name))}
        rows = [self._row(series["metric"], t, value, start, gpus)
                for series in collectives for t, value in series["values"]]
        if compute:
            rows += [self._row({**series["metric"], "op": "compute"}, t, value, start, gpus)
                     for series in compute for t, value in series["values"]]
        else:
            rows += self._compute_rows(step_mean, comm_per_step, start, gpus)
        frame = pd.DataFrame([row for row in rows if row is not None])
        if frame.empty:
            raise SourceError(f"no collectives completed in {self.describe()} over the last {self.window:g}s")
        frame["seq"] = frame["step"].where(frame["op"] != "compute")
        frame.loc[frame["op"] == "compute", "group"] = None
        return Window(validate(frame, self.describe()), None)

    def _measured_compute(self, interval: str, start: float, end: float, by_rank: str) -> list[dict[str, Any]]:
        """Per rank, seconds per step computing (step time less the time blocked in collectives), as the
        ranks measure it themselves (trainhealth_train_step_compute_seconds_total); empty when not exported."""
        compute_total = catalog.TRAIN_STEP_COMPUTE.prometheus_name
        steps_total = catalog.TRAIN_STEPS.prometheus_name
        return self.client.query_range(
            f"sum by ({by_rank}) (rate({self._select(compute_total)}{interval})) / "
            f"sum by ({by_rank}) (rate({self._select(steps_total)}{interval}))", start, end, self.step)

    def _select(self, metric: str) -> str:
        return f'{metric}{{job="{self.job}"}}' if self.job else metric

    def _row(self, labels: dict[str, str], t: float, value: str, start: float,
             gpus: dict[tuple[Any, Any], Any]) -> dict[str, Any] | None:
        duration = float(value)
        if not math.isfinite(duration) or duration < 0 or not labels.get("rank", "").isdigit():
            return None
        row = {"rank": int(labels["rank"]), "step": round((float(t) - start) / self.step),
               "op": labels.get("op", ""), "group": labels.get("group", ""), "start": float(t), "duration": duration,
               "host": labels.get("host") or None}
        gpu = gpus.get((labels.get("job"), labels.get("rank")))
        if gpu is not None and str(gpu).isdigit():
            row["gpu"] = int(gpu)
        return row

    def _compute_rows(self, step_mean: list[dict[str, Any]], comm_per_step: list[dict[str, Any]], start: float,
                      gpus: dict[tuple[Any, Any], Any]) -> list[dict[str, Any] | None]:
        """Per rank and interval: the mean step time minus the collective time per step."""
        communication = {(s["metric"].get("job"), s["metric"].get("rank"), float(t)): float(v)
                         for s in comm_per_step for t, v in s["values"]}
        out = []
        for series in step_mean:
            labels = series["metric"]
            for t, value in series["values"]:
                spent = communication.get((labels.get("job"), labels.get("rank"), float(t)))
                if spent is None:
                    continue
                out.append(self._row({**labels, "op": "compute"}, t, str(float(value) - spent), start, gpus))
        return out

