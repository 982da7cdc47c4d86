"""What the demo injected, what caught each fault, how late, and what to do: the report's opening table.

Detections come from four places: the ranks' events (detector anomalies, XIDs, a
lost GPU), the simulated GPUs' telemetry in the step history (the SM clock
dropping, the GPU going down: the gauges the GPU alerts fire on), Alertmanager's
pages when a stack ran, and the localizer's final verdict (undated).

A detection matches a fault when it is on one of the fault's ranks (or
job-wide; a straggler's or slow link's timing anomalies and symptom pages
such as IrregularSteps on any rank, since a synchronous job waits for it
everywhere, while the analyzer and StragglerSuspect must name the right
rank), of a family that can show it (:data:`FAMILIES`), and dated from the
fault's ``step`` to its ``until`` plus :data:`GRACE_STEPS` (detectors need a
few steps of the new level before they fire). A GPU fault without ``until``
persists (the simulated GPU stays throttled or lost), so its window runs to
the end of the run. Undated detections match on rank and family alone.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from trainhealth._internal.faults import Fault
from trainhealth._internal.knowledge.advice import advice_for, rewind_advice, xid_advice

__all__ = [
    "FAMILIES",
    "GRACE_STEPS",
    "TABLE_HEADER",
    "Detection",
    "Finding",
    "advice",
    "detections",
    "findings",
    "match",
    "table_rows",
    "unexplained",
]

#: Steps after a fault's last step in which a detection still counts as catching it.
GRACE_STEPS = 30
#: The detection family that can show each fault kind (others: "numerics"; pages show any fault).
FAMILIES = {"delay": "timing", "collective_delay": "timing"}
_SLOW_GPU = ("thermal_throttle", "power_throttle", "slow_clocks")  # gpu faults shown by the clocks, not by errors
_SIGNAL_FAMILY = {
    "loss": "numerics",
    "grad_norm": "numerics",
    "step_time": "timing",
    "throughput": "timing",
    "comm_duration": "timing",
}
#: Alerts about a symptom every rank of a synchronous job shows when one rank is slow (naming it is
#: StragglerSuspect's part, which must name the right rank).
_TIMING_SYMPTOMS = ("IrregularSteps", "ThroughputDrop", "ThroughputDegraded")
_EVENT_FAMILY = {
    "gpu.xid": "gpu-error",
    "gpu.lost": "gpu-error",
    "sdc_suspect": "numerics",
    "loss_spike_unrecovered": "numerics",
    "nonfinite_origin": "numerics",
}
TABLE_HEADER = ("fault", "rank", "injected", "first detection", "delay", "advice")


@dataclass(frozen=True)
class Detection:
    """One thing that noticed something: ``source`` is event, telemetry, page or analyzer."""

    source: str
    what: str
    family: str  # gpu-clock, gpu-error, timing, numerics or any
    rank: int | None  # None: job-wide
    step: int | None  # None: undated (the final verdict)
    time: float | None = None


@dataclass(frozen=True)
class Finding:
    """One injected fault with its first detection per source (earliest first) and the advice for it."""

    fault: Fault
    description: str
    caught: tuple[Detection, ...]
    advice: tuple[str, ...]
    injected_at: float | None

    @property
    def first(self) -> Detection | None:
        return self.caught[0] if self.caught else None

    def delay(self) -> str:
        first = self.first
        if first is None:
            return "-"
        if first.step is None:
            return "at the end of the run"
        steps = first.step - self.fault.step
        text = f"{steps} step{'' if steps == 1 else 's'}"
        if first.time is not None and self.injected_at is not None:
            text += f" ({max(0.0, first.time - self.injected_at):.1f} s)"
        return text


def _fault_ranks(fault: Fault) -> list[int] | None:
    if fault.kind == "simulated_gpu":
        return [fault.params["gpu"]]  # the demo's rank r samples GPU r
    return list(fault.ranks) or None


def _families(fault: Fault) -> tuple[str, ...]:
    """The detection families that can show ``fault``."""
    if fault.kind == "simulated_gpu":
        return ("gpu-clock" if fault.params["fault"] in _SLOW_GPU else "gpu-error"), "any"
    return FAMILIES.get(fault.kind, "numerics"), "any"


def match(fault: Fault, found: list[Detection], last_step: int, grace: int = GRACE_STEPS) -> list[Detection]:
    """The detections of ``found`` that catch ``fault``, earliest first (undated ones last).

    >>> from trainhealth._internal.injectors.schedule_file import load_schedule
    >>> [straggler] = load_schedule([{"kind": "delay", "severity": 1, "step": 100, "until": 200, "ranks": [2]}])
    >>> seen = [Detection("event", "step_time anomaly", "timing", 2, 240),
    ...         Detection("event", "step_time anomaly", "timing", 2, 90),
    ...         Detection("event", "step_time anomaly", "timing", 1, 120),
    ...         Detection("event", "loss anomaly", "numerics", 2, 150),
    ...         Detection("analyzer", "compute suspect", "timing", 2, None),
    ...         Detection("analyzer", "compute suspect", "timing", 0, 150),
    ...         Detection("page", "Alertmanager: StragglerSuspect", "any", 0, 160),
    ...         Detection("page", "Alertmanager: IrregularSteps", "timing", 0, 170),
    ...         Detection("event", "step_time anomaly", "timing", 2, 210)]
    >>> [(d.source, d.rank, d.step) for d in match(straggler, seen, last_step=400)]
    [('event', 1, 120), ('page', 0, 170), ('event', 2, 210), ('analyzer', 2, None)]
    >>> [xid] = load_schedule([{"kind": "simulated_gpu", "fault": "xid", "xid": 79, "gpu": 3, "step": 300, "ranks": [3]}])
    >>> [d.step for d in match(xid, [Detection("page", "GPULost", "any", 3, 390)], last_step=400)]
    [390]
    """
    families = _families(fault)
    # a slow rank slows every rank of a synchronous job: its timing shows on all of them (naming it is the
    # localizer's part, judged by the ranks the analyzer names)
    job_wide = families[0] == "timing"
    ranks = _fault_ranks(fault)
    start, until = fault.step, last_step if fault.until is None else fault.until
    end = last_step if fault.kind == "simulated_gpu" and until == start else until + grace
    hits = [
        d
        for d in found
        if d.family in families
        and (
            ranks is None
            or d.rank is None
            or d.rank in ranks
            or (job_wide and d.family == "timing" and d.source in ("event", "page"))
        )
        and (d.step is None or start <= d.step <= end)
    ]
    return sorted(hits, key=lambda d: (d.step is None, d.step or 0))


def unexplained(schedule: Sequence[Fault], found: list[Detection], last_step: int) -> list[Detection]:
    """The detections that no injected fault explains: the run's false alarms, in step order.

    >>> from trainhealth._internal.injectors.schedule_file import load_schedule
    >>> [straggler] = load_schedule([{"kind": "delay", "severity": 1, "step": 100, "until": 200, "ranks": [2]}])
    >>> seen = [Detection("event", "step_time anomaly", "timing", 2, 150),
    ...         Detection("event", "loss anomaly", "numerics", 1, 40),
    ...         Detection("page", "Alertmanager: LossSpike", "any", None, 60)]
    >>> [(d.what, d.step) for d in unexplained([straggler], seen, last_step=400)]
    [('loss anomaly', 40), ('Alertmanager: LossSpike', 60)]
    >>> len(unexplained([], seen, last_step=400))
    3
    """
    explained = {id(d) for fault in schedule for d in match(fault, found, last_step)}
    return sorted((d for d in found if id(d) not in explained), key=lambda d: (d.step is None, d.step or 0))


def detections(
    events: list[dict[str, Any]],
    histories: dict[int, list[dict[str, Any]]],
    pages: list[dict[str, Any]],
    localization: dict[str, Any] | None,
    verdicts: Sequence[dict[str, Any]] = (),
) -> list[Detection]:
    """Every detection of the run: the events, the GPU telemetry, the pages, the live analyzer's verdicts
    other than healthy (each change, dated) and the final verdict (undated)."""
    found = []
    for event in events:
        name = str(event.get("event"))
        if name == "fault_injected":
            continue
        signal = event.get("signal")
        family = _SIGNAL_FAMILY.get(str(signal), "numerics") if name == "anomaly" else _EVENT_FAMILY.get(name, "any")
        what = f"{name} on {signal}" if signal else name
        step = event.get("step")
        time = event.get("time")
        if step is None and time is not None:
            step = _step_at(histories.get(int(event["rank"]), []), float(time))
        found.append(
            Detection(
                "event",
                what,
                family,
                int(event["rank"]),
                None if step is None else int(step),
                None if time is None else float(time),
            )
        )
    for rank, rows in histories.items():
        found += _telemetry(rank, rows)
    for page in pages:
        labels = page.get("labels", {})
        rank = labels.get("rank", labels.get("gpu"))
        time = _timestamp(page.get("startsAt"))
        rows = histories.get(int(rank), []) if rank is not None else next(iter(histories.values()), [])
        family = "timing" if labels.get("alertname") in _TIMING_SYMPTOMS else "any"
        found.append(
            Detection(
                "page",
                f"Alertmanager: {labels.get('alertname')}",
                family,
                None if rank is None else int(rank),
                None if time is None else _step_at(rows, time),
                time,
            )
        )
    first_rows = next(iter(histories.values()), [])
    for verdict in verdicts:
        if verdict.get("verdict") in ("healthy", "insufficient_data", None):
            continue
        time = float(verdict["time"])
        step = _step_at(first_rows, time)
        what = f"live analyzer: {verdict['verdict']}" + (
            f", suspect {verdict['component']}" if verdict.get("component") else ""
        )
        for rank in verdict.get("ranks") or [None]:
            found.append(Detection("analyzer", what, "timing", rank, step, time))
    loc = localization or {}
    for suspect in loc.get("suspects", []):
        for rank in suspect.get("ranks") or []:
            found.append(
                Detection(
                    "analyzer",
                    f"localizer: {loc.get('verdict')}, suspect {suspect.get('component')}",
                    "timing",
                    int(rank),
                    None,
                )
            )
    return found


def _telemetry(rank: int, rows: list[dict[str, Any]]) -> list[Detection]:
    """The first step the rank's GPU clock fell below 90% of its first reading, and the first it was down."""
    found = []
    clocks = [r for r in rows if r.get("sm_clock")]
    if clocks:
        nominal = float(clocks[0]["sm_clock"])
        slow = next((r for r in clocks if float(r["sm_clock"]) < 0.9 * nominal), None)
        if slow is not None:
            found.append(
                Detection(
                    "telemetry",
                    f"GPU telemetry: SM clock {nominal / 1e6:.0f} -> {float(slow['sm_clock']) / 1e6:.0f} MHz",
                    "gpu-clock",
                    rank,
                    int(slow["step"]),
                    float(slow["time"]),
                )
            )
    down = next((r for r in rows if r.get("gpu_up") == 0), None)
    if down is not None:
        found.append(
            Detection(
                "telemetry",
                "GPU telemetry: GPU down (gpu_up 0)",
                "gpu-error",
                rank,
                int(down["step"]),
                float(down["time"]),
            )
        )
    return found


def _step_at(rows: list[dict[str, Any]], time: float) -> int | None:
    return next((int(r["step"]) for r in rows if float(r["time"]) >= time), None)


def _timestamp(text: Any) -> float | None:
    try:
        return datetime.fromisoformat(str(text)[:26].rstrip("Z") + "+00:00").timestamp()
    except ValueError:
        return None


def advice(fault: Fault, localization: dict[str, Any] | None, checkpoint_every: int) -> tuple[str, ...]:
    """What to do about ``fault``: the knowledge base's entry, or the localizer's advice when it named the rank."""
    kind = fault.kind
    loc = localization or {}
    named = {int(r) for s in loc.get("suspects", []) for r in s.get("ranks") or []}
    if kind == "simulated_gpu" and fault.params["fault"] == "xid":
        xid = xid_advice(fault.params["xid"] or 0)
        extra = advice_for("gpu_lost") if xid.xid == 79 else advice_for(f"xid_{xid.severity}")
        return (f"XID {xid.xid} ({xid.meaning}): {xid.action}. {xid.follow_up}", *extra)
    if kind == "simulated_gpu":
        key = {
            "thermal_throttle": "thermal",
            "power_throttle": "power",
            "pcie_replays": "pcie",
            "nvlink_crc": "nvlink",
            "nvlink_down": "nvlink",
            "slow_clocks": "compute",
        }.get(fault.params["fault"])
        return tuple(advice_for(key or fault.params["fault"]) or advice_for("xid_critical"))
    if kind in ("delay", "collective_delay"):
        if named & set(_fault_ranks(fault) or named) and loc.get("advice"):
            return tuple(f"(localizer) {a}" for a in loc["advice"])
        return tuple(advice_for("compute" if kind == "delay" else "communication"))
    if kind == "lr_scale":
        onset = fault.step
        checkpoint = (onset - 1) // checkpoint_every * checkpoint_every
        return (rewind_advice(onset, checkpoint if checkpoint > 0 else None), *advice_for("loss_spike")[1:])
    if kind in ("nan", "inf"):
        return tuple(advice_for("nonfinite"))
    return tuple(advice_for("sdc"))


def findings(
    schedule: Sequence[Fault],
    found: list[Detection],
    histories: dict[int, list[dict[str, Any]]],
    localization: dict[str, Any] | None,
    checkpoint_every: int,
) -> list[Finding]:
    """Every injected fault, in schedule order, with what caught it (first per source) and the advice."""
    last_step = max((int(r["step"]) for rows in histories.values() for r in rows), default=0)
    result = []
    for fault in schedule:
        first_per_source: dict[str, Detection] = {}
        for detection in match(fault, found, last_step):
            first_per_source.setdefault(detection.source, detection)
        caught = sorted(first_per_source.values(), key=lambda d: (d.step is None, d.step or 0))
        ranks = _fault_ranks(fault)
        rows = histories.get(ranks[0] if ranks else 0, [])
        injected = next((float(r["time"]) for r in rows if int(r["step"]) >= fault.step), None)
        result.append(
            Finding(fault, fault.describe(), tuple(caught), advice(fault, localization, checkpoint_every), injected)
        )
    return result


def table_rows(items: list[Finding]) -> list[tuple[str, ...]]:
    """The opening table's rows as plain text, the same in the HTML page and in Markdown."""
    rows: list[tuple[str, ...]] = []
    for item in items:
        ranks = _fault_ranks(item.fault)
        caught = (
            "; ".join(
                f"{d.what} (" + (f"step {d.step}" if d.step is not None else "end of run") + ")" for d in item.caught
            )
            or "not detected"
        )
        rows.append(
            (
                item.description.split(": ", 1)[-1],
                "all" if ranks is None else ", ".join(map(str, ranks)),
                f"step {item.fault.step}",
                caught,
                item.delay() if item.caught else "not detected",
                item.advice[0] if item.advice else "-",
            )
        )
    return rows
