"""Prometheus alert rules, declared from the metric catalogue, with severity, runbook and mitigation.

Every expression is built from :mod:`trainhealth._internal.catalog` constants, so a rule
cannot name a metric that is not exported. Each rule has a severity (``page``:
wake someone; ``ticket``: fix in working hours; ``info``: context for the
others), a ``for``, a summary, a description that carries the value and the
rank / host / gpu, a ``runbook_url`` (docs/runbooks/<Alert>.md, generated from
the same declarations) and a ``mitigation`` taken from the advice catalogue.

Baselines of relative rules are taken with an ``offset``, so a drop is compared
with the time before it and does not drag its own baseline down: the baseline of
Andrew Newdigate's "How to use Prometheus for anomaly detection in GitLab" (GitLab
blog, 2019, https://about.gitlab.com/blog/2019/07/23/anomaly-detection-using-prometheus/),
with Prometheus's offset modifier
(https://prometheus.io/docs/prometheus/latest/querying/basics/#offset-modifier).

Each rule also names the dashboard panel that explains it (``panel``: dashboard
uid and the panel's title, its key there; the ``dashboard_url`` annotation links to
the panel's id, which follows from the title alone) and, where
it compares a value with a number, that number (``limit``). The number is a named
constant here, used to write the expression; the dashboards draw the same limit
on the same panel (``trainhealth._internal.dashboards.layout``), so what a panel shows as
the line is what fires.

>>> rule = by_name("GpuLost")
>>> rule.severity, rule.for_
('page', '1m')
>>> rule.expr
'trainhealth_gpu_up == 0'
>>> by_name("IrregularSteps").limit
Limit(value=0.05, bad='above')
>>> by_name("GpuLost").to_rule()["annotations"]["dashboard_url"]
'http://127.0.0.1:3000/d/trainhealth-gpu?viewPanel=panel-1566511428'
"""

from __future__ import annotations

from dataclasses import dataclass

from trainhealth._internal import catalog as c
from trainhealth._internal.events import Severity
from trainhealth._internal.knowledge.advice import ADVICE
from trainhealth._internal.knowledge.limits import (
    GRAFANA_URL,
    HANG_FLOOR_S,
    HUNG_COLLECTIVE_S,
    PAUSE_HOLD_S,
    WATCHER_STALE_S,
    Limit,
    PanelRef,
)
from trainhealth._internal.knowledge.promql import counted
from trainhealth._internal.knowledge.recording import (
    ANOMALIES_5M,
    GROUP_HUNG,
    GROUP_STARTED_MAX,
    LAST_STEP_DURATION_MAX,
    LAST_STEP_MAX,
    NVLINK_ERRORS_10M,
    PCIE_REPLAYS_RATE,
    THROUGHPUT_SUM,
)
from trainhealth._internal.knowledge.xid import known_xids

__all__ = [
    "ALERTS",
    "ANALYZER_STALE_S",
    "GRAFANA_URL",
    "HANG_FLOOR_S",
    "HUNG_COLLECTIVE_S",
    "IRREGULAR_SHARE",
    "PCIE_REPLAYS_PER_MIN",
    "RUNBOOK_BASE",
    "STALL_MIN_S",
    "STALL_STEPS",
    "STRAGGLER_SCORE",
    "SUSTAINED_FOR_S",
    "THROUGHPUT_DEGRADED",
    "THROUGHPUT_DROP",
    "AlertRule",
    "Limit",
    "PanelRef",
    "by_name",
    "counted",
]

#: Where runbook_url points; ``trainhealth alerts --runbook-base`` changes it (a fork, a wiki).
RUNBOOK_BASE = "https://github.com/trainhealth/trainhealth/blob/main/docs/runbooks"

# The numbers the rules compare with (each also the ``limit`` of its rule, drawn on its panel).
#: IrregularSteps: share of the last 100 steps that took 1.5x the recent average.
IRREGULAR_SHARE = 0.05
#: ThroughputDrop: tokens/s of the last 5 minutes under this fraction of the hour before.
THROUGHPUT_DROP = 0.7
#: ThroughputDegraded: tokens/s of the last hour under this fraction of the six hours before.
THROUGHPUT_DEGRADED = 0.9
#: StragglerSuspect: the analyzer's score from which it blames a component.
STRAGGLER_SCORE = 0.5
#: GpuPcieReplays: PCIe replays per minute, averaged over 10 minutes.
PCIE_REPLAYS_PER_MIN = 1
#: TrainingStalled: no step for this many step times, and at least STALL_MIN_S seconds.
STALL_STEPS = 10
STALL_MIN_S = 300
#: AnalyzerStale: seconds since trainhealth analyze last finished.
ANALYZER_STALE_S = 600
#: Rules that wait this long or longer before firing, the ``info`` rules (context for the others, never a page
#: or a ticket) and the rules marked ``every_minute`` run in their wing's sustained group, once a minute: a
#: minute's delay on a 5-minute ``for`` changes nothing on-call sees, and it divides their cost by four. What
#: stays in the fast groups is what on-call must see within seconds: the hang pages, XIDs, lost GPUs, ECC.
SUSTAINED_FOR_S = 300
PAGE, TICKET, INFO = "page", "ticket", "info"
WHERE = "rank {{ $labels.rank }} on {{ $labels.host }}"
GPU_WHERE = "GPU {{ $labels.gpu }} on {{ $labels.host }}"
_RANK_KEYS = "job, host, rank"


@dataclass(frozen=True)
class AlertRule:
    """One alerting rule; ``advice`` is the key of its entry in the advice catalogue; ``panel`` the dashboard
    panel that explains it; ``limit`` the number its expression compares with, where there is one."""

    name: str
    group: str
    expr: str
    for_: str
    severity: str
    summary: str
    description: str
    advice: str
    explanation: str  # for the runbook: what the rule measures and why it fires
    panel: PanelRef | None = None
    limit: Limit | None = None
    #: its window or threshold spans minutes, so evaluating it once a minute changes nothing on-call sees
    every_minute: bool = False

    @property
    def sustained(self) -> bool:
        """Whether it runs in its wing's sustained group (a ``for`` of SUSTAINED_FOR_S or more, ``info``, or
        ``every_minute``)."""
        return self.every_minute or _seconds(self.for_) >= SUSTAINED_FOR_S or self.severity == INFO

    @property
    def mitigation(self) -> str:
        return " ".join(ADVICE[self.advice].steps)

    def to_rule(
        self, runbook_base: str = RUNBOOK_BASE, max_for_s: float | None = None, grafana_url: str = GRAFANA_URL
    ) -> dict[str, object]:
        """The rule as Prometheus reads it (one entry of a group's ``rules``); ``max_for_s`` caps ``for``
        (demos and tests, where minutes of patience would hide everything)."""
        rule: dict[str, object] = {"alert": self.name, "expr": self.expr}
        duration = self.for_
        if max_for_s is not None and _seconds(duration) > max_for_s:
            duration = f"{max_for_s:g}s"
        if duration != "0m":
            rule["for"] = duration
        rule["labels"] = {"severity": self.severity}
        annotations = {
            "summary": self.summary,
            "description": self.description,
            "runbook_url": f"{runbook_base.rstrip('/')}/{self.name}.md",
            "mitigation": self.mitigation,
        }
        if self.panel is not None:
            annotations["dashboard_url"] = self.panel.url(grafana_url)
        rule["annotations"] = annotations
        return rule


def _seconds(duration: str) -> float:
    units = {"s": 1, "m": 60, "h": 3600, "d": 86400}
    return float(duration[:-1]) * units[duration[-1]]


def _xid_description(severity: Severity) -> str:
    """A template naming the XID's meaning and NVIDIA's action, chosen by the xid label."""
    branches: list[str] = []
    for info in known_xids():
        if info.severity is severity:
            keyword = "if" if not branches else "else if"
            branches.append(
                f'{{{{ {keyword} eq $labels.xid "{info.xid}" }}}}XID {info.xid}: {info.meaning}; '
                f"action: {info.action.value}."
            )
    return (
        f'{GPU_WHERE} reported {{{{ $value | printf "%.0f" }}}} XID {{{{ $labels.xid }}}} error(s) in 10 minutes. '
        + "".join(branches)
        + "{{ end }}"
    )


def _xids(severity: Severity) -> str:
    return "|".join(str(info.xid) for info in known_xids() if info.severity is severity)


_TRAINING, _GPU = "trainhealth-training", "trainhealth-gpu"
_COMMUNICATION, _INCIDENTS = "trainhealth-communication", "trainhealth-incidents"
_THERMAL = "hw_thermal_slowdown|sw_thermal_slowdown|hw_slowdown"
_POWER = "sw_power_cap|hw_power_brake_slowdown"
_STARTED = c.COMM_STARTED_SEQ.prometheus_name

ALERTS: tuple[AlertRule, ...] = (
    # --- hardware ----------------------------------------------------------------------
    AlertRule(
        "GpuXidCritical",
        "hardware",
        counted(f'{c.GPU_XID_ERRORS.prometheus_name}{{xid=~"{_xids(Severity.CRITICAL)}"}}', "10m"),
        "0m",
        PAGE,
        "Critical XID {{ $labels.xid }} on " + GPU_WHERE,
        _xid_description(Severity.CRITICAL),
        "xid_critical",
        "An XID that NVIDIA's catalogue treats as a hardware or driver fault needing a reset, a reboot or service "
        "(the critical entries of trainhealth's XID catalogue). The job on this GPU is failing or about to.",
        panel=PanelRef(_GPU, "XIDs in the last hour"),
    ),
    AlertRule(
        "GpuXidWarning",
        "hardware",
        counted(f'{c.GPU_XID_ERRORS.prometheus_name}{{xid=~"{_xids(Severity.WARNING)}"}}', "10m"),
        "0m",
        TICKET,
        "XID {{ $labels.xid }} on " + GPU_WHERE,
        _xid_description(Severity.WARNING),
        "xid_warning",
        "An XID that usually points at the application or a recoverable memory error; one occurrence is a ticket, "
        "repeats on the same GPU are a hardware suspect.",
        panel=PanelRef(_GPU, "XIDs in the last hour"),
    ),
    AlertRule(
        "GpuEccUncorrectable",
        "hardware",
        counted(f'{c.GPU_ECC_ERRORS.prometheus_name}{{error_type="uncorrected",counter_type="volatile"}}', "10m"),
        "0m",
        PAGE,
        "Uncorrectable ECC error on " + GPU_WHERE,
        GPU_WHERE + ' had {{ $value | printf "%.0f" }} uncorrectable ECC error(s) in 10 minutes: its results are '
        "not trustworthy.",
        "ecc_uncorrectable",
        "Uncorrectable (double-bit) ECC errors since the last reset. The data in that memory was lost; the process "
        "using it usually crashes, and row remapping may be needed.",
        panel=PanelRef(_GPU, "Uncorrectable ECC errors (volatile)"),
    ),
    AlertRule(
        "GpuRowRemapFailure",
        "hardware",
        f"{c.GPU_ROW_REMAP_FAILURE.prometheus_name} == 1",
        "0m",
        PAGE,
        "Row remapping failed on " + GPU_WHERE,
        GPU_WHERE + " could not remap a failing memory row: the GPU needs service.",
        "row_remap_failure",
        "The GPU ran out of spare rows (or remapping failed): uncorrectable memory errors will recur.",
        panel=PanelRef(_GPU, "Row remap pending / failed"),
    ),
    AlertRule(
        "GpuRowRemapPending",
        "hardware",
        f"{c.GPU_ROW_REMAP_PENDING.prometheus_name} == 1",
        "15m",
        TICKET,
        "Row remap pending on " + GPU_WHERE,
        GPU_WHERE + " has a row remap waiting for the next GPU reset.",
        "row_remap_pending",
        "A memory row was marked for remapping; it takes effect at the next GPU reset.",
        panel=PanelRef(_GPU, "Row remap pending / failed"),
    ),
    AlertRule(
        "GpuLost",
        "hardware",
        f"{c.GPU_UP.prometheus_name} == 0",
        "1m",
        PAGE,
        "GPU lost: " + GPU_WHERE,
        GPU_WHERE + " does not answer NVML (lost, fallen off the bus or needing a reset).",
        "gpu_lost",
        "NVML reports the GPU lost or needing a reset (often with XID 79). Every job using it is stuck or dead.",
        panel=PanelRef(_GPU, "GPU up"),
    ),
    AlertRule(
        "GpuThermalThrottling",
        "hardware",
        f'max by (job, host, gpu, backend) ({c.GPU_CLOCKS_EVENT_ACTIVE.prometheus_name}{{reason=~"{_THERMAL}"}}) == 1',
        "10m",
        TICKET,
        "Thermal throttling on " + GPU_WHERE,
        GPU_WHERE + " has held its clocks down for heat for 10 minutes: it is slower than its peers and drags "
        "every synchronous step.",
        "thermal",
        "A thermal or hardware slowdown clocks-event reason has been active for 10 minutes.",
        panel=PanelRef(_GPU, "Throttle (clocks-event) reasons active"),
        limit=Limit(1, "above"),
    ),
    AlertRule(
        "GpuPowerThrottling",
        "hardware",
        f'max by (job, host, gpu, backend) ({c.GPU_CLOCKS_EVENT_ACTIVE.prometheus_name}{{reason=~"{_POWER}"}}) == 1',
        "30m",
        INFO,
        "Power capping on " + GPU_WHERE,
        GPU_WHERE + " has been power capped for 30 minutes.",
        "power",
        "A power cap or power brake has held the clocks down for 30 minutes; common under full load, a problem "
        "when one GPU is capped and its peers are not.",
        panel=PanelRef(_GPU, "Throttle (clocks-event) reasons active"),
        limit=Limit(1, "above"),
    ),
    AlertRule(
        "GpuPcieReplays",
        "hardware",
        f"{PCIE_REPLAYS_RATE} * 60 > {PCIE_REPLAYS_PER_MIN:g}",
        "10m",
        TICKET,
        "PCIe replays on " + GPU_WHERE,
        GPU_WHERE + ' retransmits {{ $value | printf "%.1f" }} PCIe packets a minute: a marginal link or riser.',
        "pcie",
        "The PCIe link retransmits packets (replays) steadily: a degrading link that slows host-device copies.",
        panel=PanelRef(_GPU, "PCIe replays per minute"),
        limit=Limit(PCIE_REPLAYS_PER_MIN, "above"),
    ),
    AlertRule(
        "GpuNvlinkErrors",
        "hardware",
        f"{NVLINK_ERRORS_10M} > 0",
        "5m",
        TICKET,
        "NVLink errors on " + GPU_WHERE + " link {{ $labels.link }}",
        GPU_WHERE + ' link {{ $labels.link }} had {{ $value | printf "%.0f" }} errors in 10 minutes.',
        "nvlink",
        "NVLink replay, recovery or CRC errors on a link; they slow collectives among the GPUs of a node.",
        panel=PanelRef(_GPU, "NVLink errors per minute"),
    ),
    AlertRule(
        "GpuSelftestFailed",
        "hardware",
        f"{c.SELFTEST_PASSED.prometheus_name} == 0",
        "0m",
        PAGE,
        "Self-test {{ $labels.check }} failed on {{ $labels.device }} of {{ $labels.host }}",
        "{{ $labels.device }} on {{ $labels.host }} got the {{ $labels.check }} check wrong against the golden "
        "reference: silent data corruption.",
        "sdc",
        "trainhealth selftest compares GEMM, reduction and elementwise results with a float64 reference and "
        "across devices; a failure means the device computes wrong numbers.",
        panel=PanelRef(_INCIDENTS, "SDC suspects and failed self-tests"),
    ),
    # --- training -----------------------------------------------------------------------
    AlertRule(
        "LossSpike",
        "training",
        f'max by (job) ({ANOMALIES_5M}{{signal="loss"}})',
        "0m",
        INFO,
        "Loss spike in {{ $labels.job }}",
        "The loss of {{ $labels.job }} spiked; trainhealth follows whether it recovers (LossSpikeNotRecovered).",
        "loss_spike",
        "A loss detector (z-score by default) flagged a spike. Most recover within tens of steps.",
        panel=PanelRef(_TRAINING, "Loss"),
    ),
    AlertRule(
        "LossSpikeNotRecovered",
        "training",
        f"max by (job) ({c.TRAIN_LOSS_SPIKE_REWIND_STEP.prometheus_name} and on ({_RANK_KEYS}) "
        f"{c.TRAIN_LOSS_SPIKE_UNRECOVERED.prometheus_name} == 1) or max by (job) "
        f"({c.TRAIN_LOSS_SPIKE_UNRECOVERED.prometheus_name} == 1) * -1",
        "0m",
        PAGE,
        "Loss spike in {{ $labels.job }} has not recovered",
        "The loss of {{ $labels.job }} is still high 50 steps after the spike. "
        '{{ if ge $value 0.0 }}Rewind to the checkpoint of step {{ $value | printf "%.0f" }}, the last one before '
        "the spike.{{ else }}No checkpoint before the spike was reported (Monitor.checkpoint_saved).{{ end }}",
        "loss_spike",
        "A loss spike has not come back within 50 steps; training continues from a worse place. The value is the "
        "step of the last checkpoint before the spike (-1 when none was reported).",
        panel=PanelRef(_TRAINING, "Loss"),
        every_minute=True,  # 50 steps after the spike: a minute more changes nothing
    ),
    AlertRule(
        "NonFiniteTraining",
        "training",
        counted(c.TRAIN_NONFINITE_STEPS.prometheus_name, "5m"),
        "0m",
        PAGE,
        "Non-finite {{ $labels.signal }} on " + WHERE,
        '{{ $labels.signal }} was NaN or infinite on {{ $value | printf "%.0f" }} step(s) of '
        + WHERE
        + "; the rank whose trainhealth_train_nonfinite_origin_first_step has where=local produced it (the lowest "
        "step if several); ranks with where=received got it through the gradient all-reduce.",
        "nonfinite",
        "The loss or the gradient norm was NaN or infinite: the optimizer step that follows corrupts the weights.",
        panel=PanelRef(_TRAINING, "Non-finite steps"),
        every_minute=True,  # its 5-minute window keeps every NaN step; the remedy is a restore, minutes long
    ),
    AlertRule(
        "GradNormSpike",
        "training",
        f'max by (job) ({ANOMALIES_5M}{{signal="grad_norm"}})',
        "0m",
        INFO,
        "Gradient-norm spike in {{ $labels.job }}",
        "The gradient norm of {{ $labels.job }} spiked; loss spikes often follow.",
        "loss_spike",
        "A detector flagged the total gradient norm; a precursor of loss spikes.",
        panel=PanelRef(_TRAINING, "Gradient norm"),
    ),
    AlertRule(
        "IrregularSteps",
        "training",
        f'max by (job, host, rank) ({c.TRAIN_IRREGULARITY.prometheus_name}{{signal="step_time"}}) '
        f"> {IRREGULAR_SHARE:g}",
        "10m",
        TICKET,
        "δ-irregular steps on " + WHERE,
        "{{ $value | humanizePercentage }} of the last 100 steps of " + WHERE + " took 1.5× the recent average.",
        "compute",
        "Holmes's δ-irregularity: training goes on, but many iterations take much longer. The analyzer's suspects "
        "(StragglerSuspect) name the GPU or link behind it.",
        panel=PanelRef(_TRAINING, "δ-irregular share of the last 100 steps"),
        limit=Limit(IRREGULAR_SHARE, "above"),
    ),
    AlertRule(
        "ThroughputDrop",
        "training",
        f"sum by (job) (avg_over_time({THROUGHPUT_SUM}[5m])) < {THROUGHPUT_DROP:g} * sum by (job) "
        f"(avg_over_time({THROUGHPUT_SUM}[1h] offset 10m)) and on (job) max_over_time({THROUGHPUT_SUM}[5m] offset 70m)",
        "5m",
        TICKET,
        "Throughput of {{ $labels.job }} dropped",
        '{{ $labels.job }} processes {{ $value | printf "%.0f" }} tokens/s, under '
        + f"{THROUGHPUT_DROP:.0%}"
        + " of its last hour.",
        "compute",
        f"Tokens/s summed over the ranks fell below {THROUGHPUT_DROP:.0%} of the hour before (the baseline is "
        "offset, so the drop does not lower it); silent until the job has a full baseline hour (70 minutes).",
        panel=PanelRef(_TRAINING, "Throughput against its baseline"),
        limit=Limit(THROUGHPUT_DROP, "below"),
    ),
    AlertRule(
        "ThroughputDegraded",
        "training",
        f"sum by (job) (avg_over_time({THROUGHPUT_SUM}[1h])) < {THROUGHPUT_DEGRADED:g} * sum by (job) "
        f"(avg_over_time({THROUGHPUT_SUM}[6h] offset 1h))",
        "1h",
        TICKET,
        "Throughput of {{ $labels.job }} degraded for an hour",
        '{{ $labels.job }} has run at {{ $value | printf "%.0f" }} tokens/s for an hour, under '
        + f"{THROUGHPUT_DEGRADED:.0%}"
        + " of the six hours before.",
        "compute",
        "A persistent slowdown: a throttled GPU, a slow link or a degraded node that does not fail.",
        panel=PanelRef(_TRAINING, "Throughput against its baseline"),
        limit=Limit(THROUGHPUT_DEGRADED, "below"),
    ),
    AlertRule(
        "TrainingStalled",
        "training",
        f"time() - {LAST_STEP_MAX} > clamp_min({STALL_STEPS} * {LAST_STEP_DURATION_MAX}, {STALL_MIN_S})",
        "2m",
        PAGE,
        "{{ $labels.job }} has made no step progress",
        "No rank of {{ $labels.job }} has finished a step for {{ $value | humanizeDuration }}.",
        "hang",
        "No step for ten step times (at least five minutes): a hang, a dead rank or a stuck collective.",
        panel=PanelRef(_TRAINING, "Time since the last step"),
        limit=Limit(STALL_MIN_S, "above"),
        every_minute=True,  # no step for 5 minutes at least
    ),
    AlertRule(
        "HungCollective",
        "training",
        f"{_STARTED} < on (job, group) group_left {GROUP_STARTED_MAX} and on (job, group) {GROUP_HUNG}",
        "10s",
        PAGE,
        "Collective in {{ $labels.group }} waits for " + WHERE,
        "Ranks of {{ $labels.job }} wait in a {{ $labels.group }} collective that " + WHERE + " never entered "
        '(it is at sequence {{ $value | printf "%.0f" }}); its stack: trainhealth_comm_stuck_duration_seconds '
        "and the stacks/ files beside its trace.",
        "hang",
        "Members of a process group have waited in one collective longer than the job's hang threshold (3x the "
        f"ranks' longest recent step, collective or checkpoint save, at least {HANG_FLOOR_S} s); the ranks whose "
        "started sequence number is behind the group's are the ones holding it up. Silent while a rank is in an "
        f"announced pause (Monitor.pause), and for {PAUSE_HOLD_S} s after it.",
        panel=PanelRef(_COMMUNICATION, "Time inside the current collective"),
        limit=Limit(HANG_FLOOR_S, "above"),
    ),
    AlertRule(
        "RankMissing",
        "training",
        f"(last_over_time({_STARTED}[10m]) unless on (job, rank, group) {_STARTED}) and on (job, group) {GROUP_HUNG}",
        "10s",
        PAGE,
        "Rank {{ $labels.rank }} of {{ $labels.job }} is gone while {{ $labels.group }} waits for it",
        "Rank {{ $labels.rank }} on {{ $labels.host }} stopped reporting (last at sequence "
        '{{ $value | printf "%.0f" }} of {{ $labels.group }}) while its peers wait in the group\'s collective: '
        "a dead process or a lost host.",
        "hang",
        "A member of a process group stopped being scraped (its series went stale) while the others have waited in "
        "a collective longer than the job's hang threshold: the rank is dead or its host lost, and the job will not "
        "move until it is replaced.",
        panel=PanelRef(_COMMUNICATION, "Time inside the current collective"),
    ),
    AlertRule(
        "PauseOverrun",
        "training",
        f'{c.COMM_STUCK_DURATION.prometheus_name}{{state="in_pause"}}',
        "0m",
        PAGE,
        "Rank {{ $labels.rank }} of {{ $labels.job }} is stuck in a pause ({{ $labels.op }})",
        "Rank {{ $labels.rank }} on {{ $labels.host }} has been in its announced pause ({{ $labels.op }}) for "
        "{{ $value | humanizeDuration }}, past the pause's bound; its peers wait for it. Where: {{ $labels.where }}; "
        "the stacks/ file beside its trace says since when.",
        "pause_overrun",
        "A rank has stayed in a pause it announced (Monitor.pause: a checkpoint save, an evaluation) longer than 3x "
        "the longest earlier pause of the same reason (comm_pause_limit, 30 minutes by default, before any ended): a "
        "save hung on a shared filesystem, an evaluation that never returns. The pause no longer holds the hang "
        "rules once past its bound.",
        panel=PanelRef(_COMMUNICATION, "Time inside the current collective"),
    ),
    AlertRule(
        "StragglerSuspect",
        "training",
        f"{c.SUSPECT_SCORE.prometheus_name} >= {STRAGGLER_SCORE:g}",
        "5m",
        TICKET,
        "{{ $labels.kind }} suspect: {{ $labels.component }}",
        "The analyzer blames {{ $labels.kind }} {{ $labels.component }} (rank {{ $labels.rank }}, host "
        "{{ $labels.host }}, GPU {{ $labels.gpu }}) for slow iterations of {{ $labels.job }}, score "
        '{{ $value | printf "%.2f" }}.',
        "compute",
        "trainhealth analyze localized δ-irregular iterations to a GPU, NIC, host or switch from collective "
        f"timings (Holmes's rules) with a score of {STRAGGLER_SCORE:g} or more for 5 minutes.",
        panel=PanelRef(_INCIDENTS, "Ranked suspects"),
        limit=Limit(STRAGGLER_SCORE, "above"),
    ),
    AlertRule(
        "SdcSuspect",
        "training",
        f"max_over_time({c.SDC_SUSPECT.prometheus_name}[15m]) == 1",
        "0m",
        PAGE,
        "Silent data corruption suspected on " + WHERE,
        WHERE + " computed different numbers from its data-parallel peers ({{ $labels.check }} check).",
        "sdc",
        "A cross-replica check put this rank in the minority: its parameters differ from the other replicas' "
        "(fingerprint) or its gradient norm before the all-reduce is far from theirs (grad_norm).",
        panel=PanelRef(_TRAINING, "SDC suspects"),
        limit=Limit(1, "above"),
        every_minute=True,  # its 15-minute window keeps every finding; remedy: drain the host, minutes long
    ),
    # --- telemetry ----------------------------------------------------------------------
    AlertRule(
        "TrainhealthTargetDown",
        "telemetry",
        'up{job=~"trainhealth.*"} == 0',
        "5m",
        TICKET,
        "Scrape target {{ $labels.instance }} is down",
        "Prometheus cannot scrape {{ $labels.instance }} ({{ $labels.job }}): its metrics and alerts are blind.",
        "telemetry",
        "A trainhealth endpoint (a rank's /metrics, a node exporter, the analyzer) has not answered for 5 minutes.",
        panel=PanelRef(_INCIDENTS, "Scrape targets up"),
    ),
    AlertRule(
        "TrainhealthMetricsAbsent",
        "telemetry",
        f'(up{{job=~"trainhealth.*"}} == 1) unless on (instance) group by (instance) '
        f"({c.RANK_INFO.prometheus_name} or {c.EXPORTER_GPU_BACKEND_UP.prometheus_name} "
        f"or {c.ANALYSIS_LAST_RUN_TIMESTAMP.prometheus_name})",
        "10m",
        TICKET,
        "{{ $labels.instance }} answers without trainhealth metrics",
        "{{ $labels.instance }} is up but exports none of trainhealth's identity metrics: a wrong port, or "
        "something else is listening there.",
        "telemetry",
        "A scraped target answers but exposes none of the metrics every trainhealth endpoint has.",
        panel=PanelRef(_INCIDENTS, "Scrape targets up"),
    ),
    AlertRule(
        "GpuTelemetryDown",
        "telemetry",
        f"{c.EXPORTER_GPU_BACKEND_UP.prometheus_name} == 0",
        "5m",
        TICKET,
        "GPU telemetry down on {{ $labels.host }}",
        "The {{ $labels.backend }} backend on {{ $labels.host }} is not sampling: GPU alerts there are blind.",
        "telemetry",
        "NVML or DCGM could not be initialised or stopped answering.",
        panel=PanelRef(_GPU, "GPU telemetry up"),
    ),
    AlertRule(
        "AnalyzerStale",
        "telemetry",
        f"time() - {c.ANALYSIS_LAST_RUN_TIMESTAMP.prometheus_name} > {ANALYZER_STALE_S}",
        "5m",
        TICKET,
        "The trainhealth analyzer has not localized for 10 minutes",
        "trainhealth analyze for {{ $labels.job }} last finished {{ $value | humanizeDuration }} ago: suspects "
        "are stale.",
        "telemetry",
        "trainhealth analyze is stuck or has no input (Prometheus unreachable, no trace files).",
        panel=PanelRef(_INCIDENTS, "Time since the analyzer's last localization"),
        limit=Limit(ANALYZER_STALE_S, "above"),
    ),
    AlertRule(
        "HangWatcherStopped",
        "telemetry",
        f"time() - {c.COMM_WATCH_TIMESTAMP.prometheus_name} > {WATCHER_STALE_S}",
        "1m",
        PAGE,
        "Hang detection is blind on rank {{ $labels.rank }} of {{ $labels.job }}",
        "The hang watcher of rank {{ $labels.rank }} on {{ $labels.host }} last looked "
        "{{ $value | humanizeDuration }} ago while the rank still answers scrapes: trainhealth's own thread "
        "stopped, so HungCollective and RankMissing cannot fire for this rank. This is trainhealth's failure, not "
        "the job's: see trainhealth_exporter_errors_total{source=~\"comm_.*\"} and the rank's log.",
        "telemetry",
        "A rank's /metrics still answers (its series are fresh) but its hang watcher, which looks once a second, "
        f"has not looked for {WATCHER_STALE_S} s: the state of its collectives is unknown until it is restarted.",
        panel=PanelRef(_COMMUNICATION, "Time inside the current collective"),
        limit=Limit(WATCHER_STALE_S, "above"),
    ),
)

_BY_NAME = {rule.name: rule for rule in ALERTS}


def by_name(name: str) -> AlertRule:
    return _BY_NAME[name]
