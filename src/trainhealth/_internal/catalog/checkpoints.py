"""Checkpoint and goodput metrics, from ``Monitor.checkpoint_saved``."""

from __future__ import annotations

from trainhealth._internal.catalog.spec import _C, _G, MetricSpec, Unit

CHECKPOINT_LAST_STEP = MetricSpec(
    "checkpoint.last.step",
    _G,
    Unit.DIMENSIONLESS,
    "Training step of the last checkpoint saved",
    availability="After the first Monitor.checkpoint_saved().",
)
CHECKPOINT_LAST_TIMESTAMP = MetricSpec(
    "checkpoint.last.timestamp",
    _G,
    Unit.SECONDS,
    "Unix time the last checkpoint was saved",
    availability="After the first Monitor.checkpoint_saved().",
)
CHECKPOINT_LAST_DURATION = MetricSpec(
    "checkpoint.last.duration",
    _G,
    Unit.SECONDS,
    "Time the last checkpoint took to save",
    availability="When Monitor.checkpoint_saved() is given a duration.",
)
CHECKPOINT_SAVES = MetricSpec(
    "checkpoint.saves",
    _C,
    Unit.EVENTS,
    "Checkpoints saved since the process started",
)
TRAIN_GOODPUT = MetricSpec(
    "train.goodput",
    _G,
    Unit.RATIO,
    "Share of the wall time since the process started that moved training forward (not startup, stalls or "
    "redone steps)",
)
TRAIN_LOST_TIME = MetricSpec(
    "train.lost_time",
    _C,
    Unit.SECONDS,
    "Wall time that did not move training forward, by reason: startup, stall, redone",
    labels=("reason",),
)
TRAIN_RESTARTS = MetricSpec(
    "train.restarts",
    _G,
    Unit.DIMENSIONLESS,
    "Times this job's workers were restarted (TORCHELASTIC_RESTART_COUNT, or the restarts setting)",
)
