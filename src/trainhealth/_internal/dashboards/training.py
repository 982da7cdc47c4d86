"""Training health: loss with anomalies marked, gradients, updates, learning rate, throughput against its
baseline, MFU, step time and time since the last step, δ-irregular steps, spike score, model signals, SDC
checks, checkpoints and goodput."""

from __future__ import annotations

from collections.abc import Iterable

from trainhealth._internal import catalog as c
from trainhealth._internal.dashboards.layout import RANK_FILTER as F
from trainhealth._internal.dashboards.layout import (
    RANKED_NOTE,
    AlertLike,
    annotation,
    arrange,
    dashboard,
    ranked,
    target,
)
from trainhealth._internal.dashboards.model import Dashboard, TimeSeries, unit_of
from trainhealth._internal.knowledge.recording import (
    ACTIVATION_RMS_BY_BLOCK,
    ENTROPY_BY_LAYER,
    LAST_STEP_MAX,
    MAX_LOGIT_BY_LAYER,
    THROUGHPUT_SUM,
)

__all__ = ["UID", "training_dashboard"]

UID = "trainhealth-training"
_JOB = 'job=~"$job"'


def _series(
    title: str,
    expr: str,
    legend: str = "rank {{rank}}",
    unit: str = "none",
    description: str = "",
    log: bool = False,
    worst: str | None = "above",
) -> TimeSeries:
    """A time series of ``expr``; one series per rank (``worst`` is where a rank's value is bad) is cut to the
    worst at All (:func:`~trainhealth._internal.dashboards.layout.ranked`); ``worst=None``: a job-wide series."""
    if worst is not None:
        expr, description = ranked(expr, worst), f"{description} {RANKED_NOTE}".strip()
    return TimeSeries(
        title=title,
        description=description,
        targets=[target(expr, legend)],
        unit=unit,
        scaleDistributionType="log" if log else "linear",
        scaleDistributionLog=10,
        tooltipMode="multi",
        tooltipSort="desc",
    )


def _throughput_against_baseline() -> TimeSeries:
    """The two comparisons of ThroughputDrop and ThroughputDegraded, as ratios (1 = as fast as before)."""
    tokens = f"{THROUGHPUT_SUM}{{{_JOB}}}"
    ratio = "sum by (job) (avg_over_time({t}[{now}])) / sum by (job) (avg_over_time({t}[{before}] offset {gap}))"
    return TimeSeries(
        title="Throughput against its baseline",
        unit="percentunit",
        tooltipMode="multi",
        tooltipSort="desc",
        description="Tokens/s of the last 5 minutes over the hour before the last 10 (ThroughputDrop), and of the "
        "last hour over the six hours before it (ThroughputDegraded), from the job's tokens/s recorded once a "
        "minute, as the alerts read them. Empty until a job has run that long: without a baseline there is no "
        "verdict.",
        targets=[
            target(ratio.format(t=tokens, now="5m", before="1h", gap="10m"), "{{job}} 5 min / hour before"),
            target(ratio.format(t=tokens, now="1h", before="6h", gap="1h"), "{{job}} hour / 6 h before", ref="B"),
        ],
    )


def training_dashboard(alerts: Iterable[AlertLike]) -> Dashboard:
    anomalies = c.ANOMALIES.prometheus_name
    panels = [
        _series(
            "Loss",
            f"{c.TRAIN_LOSS.prometheus_name}{{{F}}}",
            unit=unit_of(c.TRAIN_LOSS),
            description="Red marks: loss anomalies (detectors); purple: unrecovered spikes.",
        ),
        _series("Gradient norm", f"{c.TRAIN_GRAD_NORM.prometheus_name}{{{F}}}", log=True),
        _series(
            "Update-to-parameter ratio",
            f"{c.TRAIN_UPDATE_RATIO.prometheus_name}{{{F}}}",
            log=True,
            description="Around 1e-3 is healthy for Adam; sustained growth precedes loss spikes.",
        ),
        _series(
            "Learning rate", f"{c.TRAIN_LEARNING_RATE.prometheus_name}{{{F}}}", "rank {{rank}} group {{param_group}}"
        ),
        _series(
            "Throughput",
            f"sum by (job) ({THROUGHPUT_SUM}{{{_JOB}}})",
            "{{job}}",
            unit=unit_of(c.TRAIN_THROUGHPUT),
            description="Tokens per second, summed over the job's ranks once a minute (a recording rule).",
            worst=None,
        ),
        _throughput_against_baseline(),
        _series("MFU", f"{c.TRAIN_MFU.prometheus_name}{{{F}}}", unit=unit_of(c.TRAIN_MFU), worst="below"),
        _series(
            "Step time",
            f"{c.TRAIN_LAST_STEP_DURATION.prometheus_name}{{{F}}}",
            unit=unit_of(c.TRAIN_LAST_STEP_DURATION),
            description="Orange marks: δ-irregular steps (1.5x the recent average).",
        ),
        _series(
            "Time since the last step",
            f"time() - {LAST_STEP_MAX}{{{_JOB}}}",
            "{{job}}",
            unit="s",
            description="TrainingStalled fires past ten step times, and never below the line drawn here.",
            worst=None,
        ),
        _series(
            "δ-irregular share of the last 100 steps",
            f'{c.TRAIN_IRREGULARITY.prometheus_name}{{{F},signal="step_time"}}',
            unit="percentunit",
        ),
        _series(
            "Spike score (OLMo 2)",
            f"{c.TRAIN_SPIKE_SCORE.prometheus_name}{{{F}}}",
            "rank {{rank}} {{signal}}",
            unit="percentunit",
        ),
        _series(
            "Non-finite steps",
            f"increase({c.TRAIN_NONFINITE_STEPS.prometheus_name}{{{F}}}[5m])",
            "rank {{rank}} {{signal}}",
            unit="short",
        ),
        _series(
            "Attention max logit",
            f"{MAX_LOGIT_BY_LAYER}{{{_JOB}}}",
            "{{job}} {{layer}}",
            description="The largest over the job's ranks, recorded once a minute. Growth comes before "
            "attention-logit blow-ups: QK-norm or QK-clip.",
            worst=None,
        ),
        _series(
            "Attention entropy",
            f"{ENTROPY_BY_LAYER}{{{_JOB}}}",
            "{{job}} {{layer}}",
            description="The lowest over the job's ranks, recorded once a minute. Entropy collapsing towards 0 "
            "precedes instability.",
            worst=None,
        ),
        _series(
            "Output log Z",
            f"{c.MODEL_OUTPUT_LOG_Z.prometheus_name}{{{F}}}",
            description="Drifting away from 0: z-loss keeps it there.",
        ),
        _series(
            "Activation RMS by block",
            f"{ACTIVATION_RMS_BY_BLOCK}{{{_JOB}}}",
            "{{job}} {{block}}",
            description="The largest over the job's ranks, recorded once a minute.",
            log=True,
            worst=None,
        ),
        _series(
            "SDC suspects",
            f"{c.SDC_SUSPECT.prometheus_name}{{{F}}}",
            "rank {{rank}} {{check}}",
            description="1: this rank computed different numbers from its data-parallel peers.",
        ),
        _series(
            "Local gradient norm over peers' median",
            f"{c.TRAIN_LOCAL_GRAD_NORM_PEER_RATIO.prometheus_name}{{{F}}}",
            log=True,
        ),
        _series(
            "Goodput",
            f"min by (job) ({c.TRAIN_GOODPUT.prometheus_name}{{{F}}})",
            "{{job}}",
            unit=unit_of(c.TRAIN_GOODPUT),
            worst=None,
        ),
        _series(
            "Checkpoint age",
            f"time() - max by (job) ({c.CHECKPOINT_LAST_TIMESTAMP.prometheus_name}{{{F}}})",
            "{{job}}",
            unit="s",
            worst=None,
        ),
    ]
    marks = [
        annotation(
            "Loss anomalies",
            f'changes({anomalies}{{{F},signal="loss",detector!="nonfinite"}}[1m]) > 0',
            "red",
            "loss anomaly on rank {{rank}} ({{detector}})",
        ),
        annotation(
            "δ-irregular steps",
            f'changes({anomalies}{{{F},signal="step_time",detector="delta"}}[1m]) > 0',
            "orange",
            "δ-irregular step on rank {{rank}}",
        ),
        annotation(
            "Unrecovered loss spikes",
            f"{c.TRAIN_LOSS_SPIKE_UNRECOVERED.prometheus_name}{{{F}}} == 1",
            "purple",
            "loss spike not recovered; rewind to the last checkpoint before it",
        ),
    ]
    return dashboard(
        UID,
        "trainhealth / Training health",
        "Loss, gradients, throughput and step times of a training job, with anomalies marked.",
        arrange(panels),
        alerts,
        annotations=marks,
    )
