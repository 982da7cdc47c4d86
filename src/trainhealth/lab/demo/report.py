"""The demo's incident report: one HTML page with PNG plots, the faults injected, what was detected, the
localization verdict and the advice.

Plots (matplotlib, written next to the page): the loss with detected spikes
marked; a per-rank step-time heatmap with the culprit rank highlighted; the
simulated GPUs' temperature, SM clock and availability over time.
"""

from __future__ import annotations

import html
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

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


def write_report(out: Path, incident: Incident) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    out.mkdir(parents=True, exist_ok=True)
    culprit = _culprit(incident.localization)
    plots = [name for name, draw in (("loss.png", _plot_loss), ("step_times.png", _plot_step_times),
                                     ("gpus.png", _plot_gpus))
             if draw(out / name, incident, culprit)]
    page = out / "report.html"
    page.write_text(_html(incident, plots, culprit), encoding="utf-8")
    (out / "report.json").write_text(json.dumps({
        "faults": incident.faults, "events": incident.events, "localization": incident.localization,
        "pages": incident.pages, "interrupted": incident.interrupted}, indent=2, default=str), encoding="utf-8")
    return page


def _culprit(localization: dict[str, Any] | None) -> int | None:
    for suspect in (localization or {}).get("suspects", []):
        ranks = suspect.get("ranks") or []
        if suspect.get("kind") == "gpu" and ranks:
            return int(ranks[0])
    return None


def _plot_loss(path: Path, incident: Incident, culprit: int | None) -> bool:
    import matplotlib.pyplot as plt

    rows = incident.histories.get(0) or next(iter(incident.histories.values()), [])
    if not rows:
        return False
    figure, axes = plt.subplots(figsize=(9, 3.2))
    axes.plot([r["step"] for r in rows], [r["loss"] for r in rows], color="#1f77b4", linewidth=1, label="loss (rank 0)")
    spikes = sorted({e["step"] for e in incident.events
                     if e.get("event") == "anomaly" and e.get("signal") == "loss" and e.get("step") is not None})
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
    image = axes.imshow(grid, aspect="auto", interpolation="nearest", cmap="magma",
                        extent=(steps[0], steps[-1], len(ranks) - 0.5, -0.5))
    axes.set_yticks(range(len(ranks)), [f"rank {r}" for r in ranks])
    if culprit is not None and culprit in ranks:
        row = ranks.index(culprit)
        axes.add_patch(plt.Rectangle((steps[0], row - 0.5), steps[-1] - steps[0], 1, fill=False,
                                     edgecolor="#00e5ff", linewidth=2.5))
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


def _html(incident: Incident, plots: list[str], culprit: int | None) -> str:
    e = html.escape
    loc = incident.localization or {}
    suspects = loc.get("suspects", [])
    rows = "".join(f"<tr><td>{e(str(s.get('kind')))}</td><td>{e(str(s.get('component', '')))}</td>"
                   f"<td>{e(', '.join(str(r) for r in s.get('ranks', [])))}</td><td>{e(str(s.get('host', '')))}</td>"
                   f"<td>{float(s.get('score', 0)):.2f}</td><td>{e(str(s.get('evidence', '')))}</td></tr>"
                   for s in suspects)
    reasons = "".join(f"<li>{e(str(r))}</li>" for r in loc.get("reasons", []))
    events = "".join(f"<li>rank {e(str(ev.get('rank')))}: {e(str(ev.get('summary')))}</li>"
                     for ev in incident.events[:200])
    pages = "".join(f"<li>{e(str(p.get('labels', {}).get('alertname')))}: "
                    f"{e(str(p.get('annotations', {}).get('summary', '')))}<br><i>{e(str(p.get('annotations', {}).get('mitigation', '')))}</i></li>"
                    for p in incident.pages)
    advice = "".join(f"<li>{e(a)}</li>" for a in loc.get("advice", []))
    images = "".join(f'<p><img src="{e(p)}" alt="{e(p)}"></p>' for p in plots)
    faults = "".join(f"<li>{e(f)}</li>" for f in incident.faults)
    verdict = e(str(loc.get("verdict", "not localized (no collective trace)")))
    note = "<p><b>Interrupted</b> (Ctrl-C): the report covers the steps run.</p>" if incident.interrupted else ""
    return f"""<!doctype html>
<html><head><meta charset="utf-8"><title>trainhealth demo: incident report</title>
<style>body{{font-family:sans-serif;max-width:60em;margin:2em auto}}td,th{{padding:.2em .6em;border-bottom:1px solid #ddd}}</style>
</head><body>
<h1>trainhealth demo: incident report</h1>
<p>A real {len(incident.histories)}-rank training job on CPU (torch, gloo) with <b>simulated GPUs</b>
(every GPU series is labelled <code>backend="simulated"</code>).</p>{note}
<h2>Localization</h2>
<p>Verdict: <b>{verdict}</b>{f"; top suspect: rank {culprit}" if culprit is not None else ""}</p>
<table><tr><th>kind</th><th>component</th><th>ranks</th><th>host</th><th>score</th><th>evidence</th></tr>{rows}</table>
{f"<ul>{reasons}</ul>" if reasons else ""}
<h2>What to do</h2><ul>{advice or "<li>Nothing: no device is to blame.</li>"}</ul>
<h2>Faults injected (ground truth)</h2><ul>{faults}</ul>
<h2>Pages from Alertmanager</h2><ul>{pages or "<li>None received (no stack running, or nothing paged).</li>"}</ul>
<h2>Plots</h2>{images}
<h2>Detections</h2><ul>{events}</ul>
</body></html>
"""
