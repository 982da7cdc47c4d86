"""Training health: loss with anomalies marked, gradients, updates, learning rate, throughput, MFU, step time
with δ-irregular steps marked, spike score, model signals, SDC checks, checkpoints and goodput."""

from __future__ import annotations

from grafanalib import core as g

from trainhealth import catalog as c
from trainhealth.dashboards.layout import RANK_FILTER as F
from trainhealth.dashboards.layout import annotation, arrange, dashboard, target

__all__ = ["training_dashboard"]


def _series(title: str, expr: str, legend: str = "rank {{rank}}", unit: str = "short", description: str = "",
            log: bool = False) -> g.TimeSeries:
    return g.TimeSeries(title=title, description=description, targets=[target(expr, legend)], unit=unit,
                        dataSource="${datasource}", scaleDistributionType="log" if log else "linear",
                        scaleDistributionLog=10 if log else 2)


def training_dashboard() -> g.Dashboard:
    anomalies = c.ANOMALIES.prometheus_name
    panels = [
        _series("Loss", f"{c.TRAIN_LOSS.prometheus_name}{{{F}}}",
                description="Red marks: loss anomalies (detectors); purple: unrecovered spikes."),
        _series("Gradient norm", f"{c.TRAIN_GRAD_NORM.prometheus_name}{{{F}}}", log=True),
        _series("Update-to-parameter ratio", f"{c.TRAIN_UPDATE_RATIO.prometheus_name}{{{F}}}", log=True,
                description="Around 1e-3 is healthy for Adam; sustained growth precedes loss spikes."),
        _series("Learning rate", f"{c.TRAIN_LEARNING_RATE.prometheus_name}{{{F}}}", "rank {{rank}} group {{param_group}}"),
        _series("Throughput", f"sum by (job) ({c.TRAIN_THROUGHPUT.prometheus_name}{{{F}}})", "{{job}}",
                unit="short", description="Tokens per second, summed over the selected ranks."),
        _series("MFU", f"{c.TRAIN_MFU.prometheus_name}{{{F}}}", unit="percentunit"),
        _series("Step time", f"{c.TRAIN_LAST_STEP_DURATION.prometheus_name}{{{F}}}", unit="s",
                description="Orange marks: δ-irregular steps (1.5x the recent average)."),
        _series("δ-irregular share of the last 100 steps",
                f'{c.TRAIN_IRREGULARITY.prometheus_name}{{{F},signal="step_time"}}', unit="percentunit"),
        _series("Spike score (OLMo 2)", f"{c.TRAIN_SPIKE_SCORE.prometheus_name}{{{F}}}",
                "rank {{rank}} {{signal}}", unit="percentunit"),
        _series("Non-finite steps", f"increase({c.TRAIN_NONFINITE_STEPS.prometheus_name}{{{F}}}[5m])",
                "rank {{rank}} {{signal}}"),
        _series("Attention max logit", f"max by (layer) ({c.MODEL_ATTENTION_MAX_LOGIT.prometheus_name}{{{F}}})",
                "{{layer}}", description="Growth comes before attention-logit blow-ups: QK-norm or QK-clip."),
        _series("Attention entropy", f"min by (layer) ({c.MODEL_ATTENTION_ENTROPY.prometheus_name}{{{F}}})",
                "{{layer}}", description="Entropy collapsing towards 0 precedes instability."),
        _series("Output log Z", f"{c.MODEL_OUTPUT_LOG_Z.prometheus_name}{{{F}}}",
                description="Drifting away from 0: z-loss keeps it there."),
        _series("Activation RMS by block", f"max by (block) ({c.MODEL_ACTIVATION_RMS.prometheus_name}{{{F}}})",
                "{{block}}", log=True),
        _series("SDC suspects", f"{c.SDC_SUSPECT.prometheus_name}{{{F}}}", "rank {{rank}} {{check}}",
                description="1: this rank computed different numbers from its data-parallel peers."),
        _series("Local gradient norm over peers' median",
                f"{c.TRAIN_LOCAL_GRAD_NORM_PEER_RATIO.prometheus_name}{{{F}}}", log=True),
        _series("Goodput", f"min by (job) ({c.TRAIN_GOODPUT.prometheus_name}{{{F}}})", "{{job}}", unit="percentunit"),
        _series("Checkpoint age", f"time() - max by (job) ({c.CHECKPOINT_LAST_TIMESTAMP.prometheus_name}{{{F}}})",
                "{{job}}", unit="s"),
    ]
    marks = [
        annotation("Loss anomalies", f'changes({anomalies}{{{F},signal="loss",detector!="nonfinite"}}[1m]) > 0',
                   "red", "loss anomaly on rank {{rank}} ({{detector}})"),
        annotation("δ-irregular steps", f'changes({anomalies}{{{F},signal="step_time",detector="delta"}}[1m]) > 0',
                   "orange", "δ-irregular step on rank {{rank}}"),
        annotation("Unrecovered loss spikes", f"{c.TRAIN_LOSS_SPIKE_UNRECOVERED.prometheus_name}{{{F}}} == 1",
                   "purple", "loss spike not recovered; rewind to the last checkpoint before it"),
    ]
    return dashboard("trainhealth-training", "trainhealth / Training health",
                     "Loss, gradients, throughput and step times of a training job, with anomalies marked.",
                     arrange(panels), annotations=marks)
