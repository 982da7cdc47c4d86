"""Did each cause have its effect? A per-scenario table over a corpus, read back from disk.

An event run is compared with its clean twin: the clean run of the same model, seed and schedule, which
saw the same initial weights and the same batches (the runs are identical up to the cause step). Per
run: the largest ratio of its loss to the twin's in the event's window (a non-finite loss counts as an
infinite ratio), the largest gradient norm in the window against the median of the 50 steps before the
cause, and for a divergence the steps from the cause to the collapse. A run shows its effect when it
collapses (a divergence), or when the loss ratio reaches :data:`VISIBLE_LOSS_RATIO` or the gradient
norm jumps by :data:`VISIBLE_GRAD_JUMP`. Clean runs count their non-finite steps (none expected).

>>> import pandas as pd
>>> from trainhealth_lab.corpus.store import CorpusRun
>>> def run(scenario, kind, loss, grad, cause=None):
...     labels = {"model": "mlp", "seed": 0, "schedule": "step", "scenario": scenario, "kind": kind,
...               "cause_step": cause, "window": cause and [cause, cause], "collapse_step": None}
...     return CorpusRun(f"mlp-{scenario}-s0", labels, pd.DataFrame({"loss": loss, "grad_norm": grad}))
>>> clean = run("clean", "none", [1.0] * 61, [0.5] * 61)
>>> corrupted = run("corrupted_batch", "sharp", [1.0] * 60 + [4.0], [0.5] * 60 + [9.0], cause=60)
>>> [effect.loss_ratio for effect in run_effects([clean, corrupted])]
[nan, 4.0]
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from trainhealth_lab.corpus.store import CorpusRun

__all__ = ["VISIBLE_GRAD_JUMP", "VISIBLE_LOSS_RATIO", "RunEffect", "effect_table", "run_effects"]

VISIBLE_LOSS_RATIO = 1.2
VISIBLE_GRAD_JUMP = 2.0


@dataclass(frozen=True)
class RunEffect:
    run_id: str
    scenario: str
    loss_ratio: float  # largest loss / clean twin's loss in the window (nan: no twin, or a clean run)
    grad_jump: float  # largest gradient norm in the window / median of the 50 steps before the cause
    collapse_steps: float  # divergence: steps from cause to collapse (nan: no collapse, or no divergence)
    non_finite_steps: int  # clean runs: steps with a non-finite loss or gradient norm
    visible: bool


def _twin_key(labels: dict[str, Any]) -> tuple[Any, ...]:
    return labels["model"], labels["seed"], labels["schedule"]


def _largest(values: np.ndarray) -> float:
    return math.inf if not np.isfinite(values).all() else float(values.max())


def _effect(run: CorpusRun, twin: CorpusRun | None) -> RunEffect:
    labels = run.labels
    loss, grad = run.signals["loss"].to_numpy(float), run.signals["grad_norm"].to_numpy(float)
    if labels["kind"] == "none":
        bad = int((~np.isfinite(loss) | ~np.isfinite(grad)).sum())
        return RunEffect(run.run_id, labels["scenario"], math.nan, math.nan, math.nan, bad, bad == 0)
    cause, (first, last) = labels["cause_step"], labels["window"]
    window = slice(first, last + 1)
    ratio = math.nan
    if twin is not None:
        with np.errstate(invalid="ignore", divide="ignore"):
            ratio = _largest(loss[window] / twin.signals["loss"].to_numpy(float)[window])
    before = grad[max(0, cause - 50) : cause]
    grad_jump = _largest(grad[window]) / float(np.median(before[np.isfinite(before)]))
    collapse = math.nan if labels["collapse_step"] is None else float(labels["collapse_step"] - cause)
    if labels["kind"] == "divergence":
        visible = not math.isnan(collapse)
    else:
        visible = ratio >= VISIBLE_LOSS_RATIO or grad_jump >= VISIBLE_GRAD_JUMP
    return RunEffect(run.run_id, labels["scenario"], ratio, grad_jump, collapse, 0, visible)


def run_effects(runs: Sequence[CorpusRun]) -> list[RunEffect]:
    """The effect of every run's cause, against its clean twin where the corpus holds one."""
    twins = {_twin_key(run.labels): run for run in runs if run.labels["kind"] == "none"}
    return [_effect(run, twins.get(_twin_key(run.labels))) for run in runs]


def _spread(values: Sequence[float]) -> str:
    shown = np.array([value for value in values if not math.isnan(value)])
    return f"{np.median(shown):.3g} [{shown.min():.3g}, {shown.max():.3g}]" if len(shown) else "-"


def effect_table(effects: Sequence[RunEffect]) -> str:
    """One line per scenario: runs with a visible effect, then the medians and ranges [min, max] of
    the loss ratio to the clean twin, the gradient-norm jump and the steps from cause to collapse."""
    lines = [f"{'scenario':<16} {'effect':>7}  {'loss / clean twin':<26} {'grad norm jump':<26} cause->collapse"]
    for scenario in dict.fromkeys(effect.scenario for effect in effects):
        mine = [effect for effect in effects if effect.scenario == scenario]
        visible = f"{sum(effect.visible for effect in mine):>3}/{len(mine):<3}"
        if scenario == "clean":
            lines.append(f"{scenario:<16} {visible}  non-finite steps {_spread([e.non_finite_steps for e in mine])}")
            continue
        lines.append(
            f"{scenario:<16} {visible}  {_spread([e.loss_ratio for e in mine]):<26} "
            f"{_spread([e.grad_jump for e in mine]):<26} {_spread([e.collapse_steps for e in mine])}"
        )
    return "\n".join(lines)
