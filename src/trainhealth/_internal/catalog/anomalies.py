"""Anomaly metrics, from the detectors (:mod:`trainhealth._internal.detectors`)."""

from __future__ import annotations

from trainhealth._internal.catalog.spec import _C, _G, MetricSpec, Unit

ANOMALIES = MetricSpec(
    "anomalies",
    _C,
    Unit.EVENTS,
    "Anomalies detected on this process's signals, by detector and signal",
    labels=("detector", "signal"),
)
ANOMALIES_ACTIVE = MetricSpec(
    "anomalies.active",
    _G,
    Unit.DIMENSIONLESS,
    "Anomalies still in progress (series currently anomalous)",
    labels=("detector", "signal"),
)
ANOMALIES_LAST_TIMESTAMP = MetricSpec(
    "anomalies.last.timestamp",
    _G,
    Unit.SECONDS,
    "Unix time the last anomaly of this detector and signal began",
    labels=("detector", "signal"),
)
TRAIN_SPIKE_SCORE = MetricSpec(
    "train.spike_score",
    _G,
    Unit.RATIO,
    "OLMo 2 spike score: fraction of steps at least 7 sigma from the mean of the previous 1000 values",
    labels=("signal",),
    availability="After 1,000 steps (the spike detector's window) on a watched signal.",
)
TRAIN_IRREGULARITY = MetricSpec(
    "train.irregularity",
    _G,
    Unit.RATIO,
    "Share of the last 100 steps that took delta (1.5) times longer than the recent average (Holmes)",
    labels=("signal",),
    availability="When the delta detector watches step_time.",
)
