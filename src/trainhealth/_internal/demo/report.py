"""The demo's incident report: one HTML page with PNG plots, the same in Markdown, and the data as JSON.

It opens with a table of every injected fault: when, what caught it first (and
the first page and verdict that named it), how late, and the advice (matching
and advice: :mod:`trainhealth._internal.demo.story`). Then the verdict over every
fault, the localizer's evidence in words, what to do, the pages and the plots
(matplotlib, written next to the page): a timeline of faults and detections per
rank; the loss with detected spikes marked; a per-rank step-time heatmap with
the culprit rank highlighted; the simulated GPUs' temperature, SM clock and
availability over time.
"""

from __future__ import annotations

import html
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from trainhealth._internal.demo import story
from trainhealth._internal.demo.worker import CHECKPOINT_EVERY
from trainhealth._internal.faults import Fault
from trainhealth._internal.localize.result import verdict_text

__all__ = ["Incident", "write_report"]


@dataclass
class Incident:
    """What the report is made of."""

    histories: dict[int, list[dict[str, Any]]]
    faults: list[str]
    events: list[dict[str, Any]]
    localization: dict[str, Any] | None
    pages: list[dict[str, Any]] = field(default_factory=list)  # from Alertmanager, when a stack was running
    interrupted: bool = False
    schedule: list[Fault] = field(default_factory=list)  # the faults as injected
    wall_s: float | None = None  # the demo's wall time up to the report, start-up included
    verdicts: list[dict[str, Any]] = field(default_factory=list)  # the live analyzer's, each change with its time


def write_report(out: Path, incident: Incident) -> Path:
    """Write report.html, report.md, report.json and the plots into ``out``; return the page's path."""
    import matplotlib

    matplotlib.use("Agg")
    out.mkdir(parents=True, exist_ok=True)
    culprit = _culprit(incident.localization)
    found = story.detections(
        incident.events, incident.histories, incident.pages, incident.localization, incident.verdicts
    )
    items = story.findings(incident.schedule, found, incident.histories, incident.localization, CHECKPOINT_EVERY)
    last_step = max((int(r["step"]) for rows in incident.histories.values() for r in rows), default=0)
    false_alarms = story.unexplained(incident.schedule, found, last_step)
    plots = [
        name
        for name, draw in (
            ("timeline.png", _plot_timeline),
            ("loss.png", _plot_loss),
            ("step_times.png", _plot_step_times),
            ("gpus.png", _plot_gpus),
        )
        if draw(out / name, incident, culprit)
    ]
    page = out / "report.html"
    page.write_text(_html(incident, plots, culprit, items, false_alarms), encoding="utf-8")
    (out / "report.md").write_text(_markdown(incident, plots, culprit, items, false_alarms), encoding="utf-8")
    (out / "report.json").write_text(
        json.dumps(
            {
                "schedule": [fault.to_dict() for fault in incident.schedule],
                "faults": incident.faults,
                "findings": [dict(zip(story.TABLE_HEADER, row)) for row in story.table_rows(items)],
                "false_alarms": [
                    {"source": d.source, "what": d.what, "rank": d.rank, "step": d.step} for d in false_alarms
                ],
                "events": incident.events,
                "localization": incident.localization,
                "pages": incident.pages,
                "verdicts": incident.verdicts,
                "interrupted": incident.interrupted,
                "wall_s": incident.wall_s,
            },
            indent=2,
            default=str,
        ),
        encoding="utf-8",
    )
    return page


def _culprit(localization: dict[str, Any] | None) -> int | None:
    for suspect in (localization or {}).get("suspects", []):
        ranks = suspect.get("ranks") or []
        if suspect.get("kind") == "gpu" and ranks:
            return int(ranks[0])
    return None


_MARKERS = {
    "event": ("v", "#d62728"),
    "telemetry": ("o", "#ff7f0e"),
    "page": ("s", "#9467bd"),
    "analyzer": ("D", "#2ca02c"),
}


def _plot_timeline(path: Path, incident: Incident, culprit: int | None) -> bool:
    """Faults as spans (step to until; a lasting GPU fault to the end) and detections as markers, per rank."""
    import matplotlib.pyplot as plt

    ranks = sorted(incident.histories)
    last = max((r["step"] for rows in incident.histories.values() for r in rows), default=0)
    if not ranks or not last:
        return False
    row = {rank: i for i, rank in enumerate(ranks)}
    figure, axes = plt.subplots(figsize=(9, 0.6 * len(ranks) + 1.8))
    colours = plt.get_cmap("tab10")
    lane = 0.7 / max(1, len(incident.schedule))  # each fault its own lane in a rank's row: overlaps stay visible
    for number, fault in enumerate(incident.schedule):
        start, until = fault.step, last if fault.until is None else fault.until
        end = last if fault.kind == "simulated_gpu" and until == start else until
        targets = [fault.params["gpu"]] if fault.kind == "simulated_gpu" else list(fault.ranks or ranks)
        label = fault.describe().split(": ", 1)[-1]
        for position, rank in enumerate(r for r in targets if r in row):
            axes.broken_barh(
                [(start, max(end - start, last / 200))],
                (row[rank] - 0.35 + number * lane, lane),
                alpha=0.5,
                color=colours(number % 10),
                label=label if position == 0 else None,
            )
    shown: set[str] = set()
    for found in story.detections(
        incident.events, incident.histories, incident.pages, incident.localization, incident.verdicts
    ):
        marker, colour = _MARKERS.get(found.source, ("x", "black"))
        for rank in [found.rank] if found.rank in row else ranks:
            axes.plot(
                last if found.step is None else found.step,
                row[rank],
                marker=marker,
                color=colour,
                linestyle="none",
                markersize=7,
                label=f"detection: {found.source}" if found.source not in shown else None,
            )
            shown.add(found.source)
    axes.set_yticks(range(len(ranks)), [f"rank {r}" for r in ranks])
    axes.set_ylim(len(ranks) - 0.5, -0.5)
    axes.set_xlim(0, last * 1.02)
    axes.set_xlabel("step")
    axes.set_title("faults injected (spans) and detections (markers)")
    axes.legend(loc="upper left", bbox_to_anchor=(1.01, 1), fontsize="small")
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    plt.close(figure)
    return True


def _plot_loss(path: Path, incident: Incident, culprit: int | None) -> bool:
    import matplotlib.pyplot as plt

    rows = incident.histories.get(0) or next(iter(incident.histories.values()), [])
    if not rows:
        return False
    figure, axes = plt.subplots(figsize=(9, 3.2))
    axes.plot([r["step"] for r in rows], [r["loss"] for r in rows], color="#1f77b4", linewidth=1, label="loss (rank 0)")
    spikes = sorted(
        {
            e["step"]
            for e in incident.events
            if e.get("event") == "anomaly" and e.get("signal") == "loss" and e.get("step") is not None
        }
    )
    for position, step in enumerate(spikes):
        axes.axvline(step, color="#d62728", alpha=0.6, linewidth=1, label="loss anomaly" if position == 0 else None)
    axes.set_xlabel("step")
    axes.set_ylabel("loss")
    axes.set_yscale("log")
    axes.legend(loc="upper right")
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    plt.close(figure)
    return True


def _plot_step_times(path: Path, incident: Incident, culprit: int | None) -> bool:
    import matplotlib.pyplot as plt
    import numpy as np

    ranks = sorted(incident.histories)
    steps = sorted({r["step"] for rows in incident.histories.values() for r in rows})
    if not ranks or not steps:
        return False
    index = {s: i for i, s in enumerate(steps)}
    grid = np.full((len(ranks), len(steps)), np.nan)
    for row_number, rank in enumerate(ranks):
        for r in incident.histories[rank]:
            grid[row_number, index[r["step"]]] = r["step_time"]
    figure, axes = plt.subplots(figsize=(9, 0.5 * len(ranks) + 1.6))
    image = axes.imshow(
        grid, aspect="auto", interpolation="nearest", cmap="magma", extent=(steps[0], steps[-1], len(ranks) - 0.5, -0.5)
    )
    axes.set_yticks(range(len(ranks)), [f"rank {r}" for r in ranks])
    if culprit is not None and culprit in ranks:
        row = ranks.index(culprit)
        axes.add_patch(
            plt.Rectangle(
                (steps[0], row - 0.5), steps[-1] - steps[0], 1, fill=False, edgecolor="#00e5ff", linewidth=2.5
            )
        )
        axes.set_title(f"step time by rank; suspect: rank {culprit} (outlined)")
    else:
        axes.set_title("step time by rank")
    axes.set_xlabel("step")
    figure.colorbar(image, ax=axes, label="seconds")
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    plt.close(figure)
    return True


def _plot_gpus(path: Path, incident: Incident, culprit: int | None) -> bool:
    import matplotlib.pyplot as plt

    if not incident.histories:
        return False
    figure, axes = plt.subplots(3, 1, figsize=(9, 6), sharex=True)
    for rank, rows in sorted(incident.histories.items()):
        steps = [r["step"] for r in rows]
        for axis, key in zip(axes, ("temperature", "sm_clock", "gpu_up")):
            values = [r.get(key) for r in rows]
            axis.plot(steps, [float("nan") if v is None else v for v in values], linewidth=1, label=f"GPU {rank}")
    for axis, label in zip(axes, ("temperature (°C)", "SM clock (Hz)", "GPU up")):
        axis.set_ylabel(label)
    axes[0].set_title("simulated GPUs (backend=simulated)")
    axes[0].legend(loc="upper left", ncols=4, fontsize="small")
    axes[-1].set_xlabel("step")
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    plt.close(figure)
    return True


def _localizer_verdict(loc: dict[str, Any]) -> str:
    """The whole run's verdict, its state now apart from the faults it had ("healthy now; in this run: gpu:rank-2
    3.18x slower in steps 285-571, recovered"): never a bare "healthy" beside a fault the run had."""
    return verdict_text(str(loc.get("verdict", "not localized (no collective trace)")), loc.get("in_this_run"))


def _evidence(loc: dict[str, Any]) -> list[str]:
    """The localizer's reasons (a healthy verdict's detection power, why the data could not tell), each
    suspect's evidence and the events that blamed nobody, in words."""
    lines = [str(r) for r in loc.get("reasons", [])]
    lines += [
        f"{s.get('component', s.get('kind'))} (score {float(s.get('score', 0)):.2f}): {s.get('evidence', '')}"
        for s in loc.get("suspects", [])
    ]
    lines += [f"event, not a fault: {e.get('component')}: {e.get('evidence', '')}" for e in loc.get("events", [])]
    if lines and loc.get("evidence_source"):
        lines.append(f"evidence from: {loc['evidence_source']}")
    return lines


def _verdict_lines(items: list[story.Finding]) -> list[str]:
    return [
        f"{item.description}: "
        + (f"caught by {item.first.what} after {item.delay()}" if item.first is not None else "NOT DETECTED")
        for item in items
    ]


def _false_alarm_lines(false_alarms: list[story.Detection]) -> list[str]:
    return [
        f"{d.what} on "
        + ("every rank" if d.rank is None else f"rank {d.rank}")
        + (f" at step {d.step}" if d.step is not None else " (end of run)")
        for d in false_alarms
    ]


def _html(
    incident: Incident,
    plots: list[str],
    culprit: int | None,
    items: list[story.Finding],
    false_alarms: list[story.Detection],
) -> str:
    e = html.escape
    loc = incident.localization or {}
    suspects = loc.get("suspects", [])
    header = "".join(f"<th>{e(h)}</th>" for h in story.TABLE_HEADER)
    findings = "".join(
        "<tr>" + "".join(f"<td>{e(cell)}</td>" for cell in row) + "</tr>" for row in story.table_rows(items)
    )
    verdicts = "".join(f"<li>{e(line)}</li>" for line in _verdict_lines(items))
    rows = "".join(
        f"<tr><td>{e(str(s.get('kind')))}</td><td>{e(str(s.get('component', '')))}</td>"
        f"<td>{e(', '.join(str(r) for r in s.get('ranks', [])))}</td><td>{e(str(s.get('host', '')))}</td>"
        f"<td>{float(s.get('score', 0)):.2f}</td><td>{e(str(s.get('evidence', '')))}</td></tr>"
        for s in suspects
    )
    reasons = "".join(f"<li>{e(line)}</li>" for line in _evidence(loc))
    events = "".join(
        f"<li>rank {e(str(ev.get('rank')))}: {e(str(ev.get('summary')))}</li>" for ev in incident.events[:200]
    )
    pages = "".join(
        f"<li>{e(str(p.get('labels', {}).get('alertname')))}: "
        f"{e(str(p.get('annotations', {}).get('summary', '')))}<br><i>{e(str(p.get('annotations', {}).get('mitigation', '')))}</i></li>"
        for p in incident.pages
    )
    todo = "".join(
        f"<li><b>{e(item.description)}</b><ul>{''.join(f'<li>{e(a)}</li>' for a in item.advice)}</ul></li>"
        for item in items
    )
    images = "".join(f'<p><img src="{e(p)}" alt="{e(p)}"></p>' for p in plots)
    alarms = "".join(f"<li>{e(line)}</li>" for line in _false_alarm_lines(false_alarms))
    verdict = e(_localizer_verdict(loc))
    note = "<p><b>Interrupted</b> (Ctrl-C): the report covers the steps run.</p>" if incident.interrupted else ""
    return f"""<!doctype html>
<html><head><meta charset="utf-8"><title>trainhealth demo: incident report</title>
<style>body{{font-family:sans-serif;max-width:70em;margin:2em auto}}td,th{{padding:.2em .6em;border-bottom:1px solid #ddd;vertical-align:top}}img{{max-width:100%}}</style>
</head><body>
<h1>trainhealth demo: incident report</h1>
<p>A real {len(incident.histories)}-rank training job on CPU (torch, gloo) with <b>simulated GPUs</b>
(every GPU series is labelled <code>backend="simulated"</code>){_took(incident)}.</p>{note}
<h2>Faults injected and what caught them</h2>
<table id="faults"><tr>{header}</tr>{findings or '<tr><td colspan="6">No fault was injected.</td></tr>'}</table>
<p>A detection counts when it is on the fault's rank, of a kind that can show it, and within the fault's steps
plus {story.GRACE_STEPS} (a lasting GPU fault: to the end of the run).</p>
<h2>Verdict</h2><ul>{verdicts or "<li>No fault was injected.</li>"}</ul>
<h2>False alarms</h2><p>Detections that no injected fault explains: {len(false_alarms)}.</p><ul id="false-alarms">{alarms}</ul>
<p>Localizer: <b>{verdict}</b>{f"; top suspect: rank {culprit}" if culprit is not None else ""}</p>
<h2>The localizer's evidence</h2>
<ul>{reasons or "<li>None: the localizer gave no reasons.</li>"}</ul>
<table><tr><th>kind</th><th>component</th><th>ranks</th><th>host</th><th>score</th><th>evidence</th></tr>{rows}</table>
<h2>What to do</h2><ul>{todo or "<li>Nothing: no fault was injected.</li>"}</ul>
<h2>Pages from Alertmanager</h2><ul>{pages or "<li>None received (no stack running, or nothing paged).</li>"}</ul>
<h2>Plots</h2>{images}
<h2>Detections</h2><ul>{events}</ul>
</body></html>
"""


def _took(incident: Incident) -> str:
    return "" if incident.wall_s is None else f"; the demo took {incident.wall_s:.0f} s, start-up included"


def _markdown(
    incident: Incident,
    plots: list[str],
    culprit: int | None,
    items: list[story.Finding],
    false_alarms: list[story.Detection],
) -> str:
    def cell(text: str) -> str:
        return text.replace("|", "\\|").replace("\n", " ")

    loc = incident.localization or {}
    lines = [
        "# trainhealth demo: incident report",
        "",
        f"A real {len(incident.histories)}-rank training job on CPU with simulated GPUs{_took(incident)}."
        + (" Interrupted (Ctrl-C): the report covers the steps run." if incident.interrupted else ""),
        "",
        "## Faults injected and what caught them",
        "",
        "| " + " | ".join(story.TABLE_HEADER) + " |",
        "|" + "---|" * len(story.TABLE_HEADER),
    ]
    lines += ["| " + " | ".join(cell(c) for c in row) + " |" for row in story.table_rows(items)]
    lines += [
        "",
        "## Verdict",
        "",
        *(f"- {line}" for line in _verdict_lines(items)),
        "",
        "## False alarms",
        "",
        f"Detections that no injected fault explains: {len(false_alarms)}.",
        "",
        *(f"- {line}" for line in _false_alarm_lines(false_alarms)),
        "",
        f"Localizer: **{_localizer_verdict(loc)}**" + (f"; top suspect: rank {culprit}" if culprit is not None else ""),
        "",
        "## The localizer's evidence",
        "",
        *(f"- {line}" for line in _evidence(loc)),
        "",
        "## What to do",
        "",
    ]
    for item in items:
        lines += [f"- **{item.description}**", *(f"  - {a}" for a in item.advice)]
    lines += ["", "## Pages from Alertmanager", ""]
    lines += [
        f"- {p.get('labels', {}).get('alertname')}: {p.get('annotations', {}).get('summary', '')}"
        for p in incident.pages
    ] or ["- None received (no stack running, or nothing paged)."]
    lines += ["", "## Plots", "", *(f"![{p}]({p})" for p in plots), ""]
    return "\n".join(lines)
