"""The labels of a corpus run, from its plan and its recorded losses.

The window is where a detection counts as a detection of the event: 20 steps from the cause for
sharp events, to the collapse (or the run's end) for a divergence, to the shard's last step for a
bad shard and 50 steps from the cause for the loss bump after an optimizer reset (the other shift). The collapse is the first step from the cause whose loss is non-finite or at least
:data:`COLLAPSE_RATIO` times the pre-event loss (the median of the 50 steps before the cause).

>>> from trainhealth_lab.corpus.plan import plan_runs
>>> [plan] = plan_runs(["mlp"], ["lr_divergence"], [0], steps=1000)
>>> losses = [1.0] * plan.cause_step + [1.0 + 0.1 * i for i in range(1000 - plan.cause_step)]
>>> labels = run_labels(plan, losses, {})
>>> labels["kind"], labels["collapse_step"] - plan.cause_step, labels["window"][1] == labels["collapse_step"]
('divergence', 90, True)
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from typing import Any

from trainhealth_lab.corpus.plan import RunPlan
from trainhealth_lab.corpus.scenarios import SCENARIOS, EventKind

__all__ = ["BUMP_WINDOW", "COLLAPSE_RATIO", "PRE_EVENT_STEPS", "SHARP_WINDOW", "run_labels"]

COLLAPSE_RATIO = 10.0
PRE_EVENT_STEPS = 50
SHARP_WINDOW = 20  # steps after the cause
BUMP_WINDOW = 50  # steps after an optimizer reset


def _pre_event_loss(losses: Sequence[float], cause: int) -> float | None:
    finite = [loss for loss in losses[max(0, cause - PRE_EVENT_STEPS) : cause] if math.isfinite(loss)]
    return statistics.median(finite) if finite else None


def _collapse_step(losses: Sequence[float], cause: int, pre_event: float | None) -> int | None:
    for step in range(cause, len(losses)):
        if not math.isfinite(losses[step]) or (pre_event is not None and losses[step] >= COLLAPSE_RATIO * pre_event):
            return step
    return None


def _json_value(value: Any) -> Any:
    """Non-finite floats as the strings ``inf``, ``-inf``, ``nan`` (JSON has no such numbers)."""
    return str(value) if isinstance(value, float) and not math.isfinite(value) else value


def run_labels(plan: RunPlan, losses: Sequence[float], injection: dict[str, Any]) -> dict[str, Any]:
    """The ``labels.json`` object of the run ``plan`` whose losses were ``losses``."""
    kind = SCENARIOS[plan.scenario].kind
    cause, last = plan.cause_step, plan.steps - 1
    pre_event = collapse = window = None
    if cause is not None:
        pre_event = _pre_event_loss(losses, cause)
        if kind is EventKind.DIVERGENCE:
            collapse = _collapse_step(losses, cause, pre_event)
            window = [cause, last if collapse is None else collapse]
        elif kind is EventKind.SHIFT:
            window = [cause, plan.shard_end if plan.shard_end is not None else min(last, cause + BUMP_WINDOW)]
        else:
            window = [cause, min(last, cause + SHARP_WINDOW)]
    return {
        "run": plan.run_id,
        "model": plan.model,
        "seed": plan.seed,
        "scenario": plan.scenario,
        "variant": plan.variant,
        "kind": kind.value,
        "cause_step": cause,
        "window": window,
        "collapse_step": collapse,
        "pre_event_loss": pre_event,
        "warmup_steps": plan.schedule.warmup,
        "schedule": plan.schedule.kind,
        "schedule_changes": list(plan.schedule.changes),
        "checkpoint_steps": [step for step in range(plan.steps) if plan.is_checkpoint(step)],
        "healthy_until": plan.steps if cause is None else cause,
        "injection": {key: _json_value(value) for key, value in injection.items()},
    }
