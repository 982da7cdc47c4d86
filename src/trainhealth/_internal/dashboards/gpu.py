"""GPU health: up, utilization, temperature, power, clocks, throttle reasons, ECC, remapped rows, PCIe replays,
NVLink errors, XIDs with their meaning and action, telemetry; and a GPU-efficiency row with DCGM's profiling
fields (SM, tensor-pipe and DRAM activity, NVLink and PCIe bandwidth) next to MFU.

Where dcgm-exporter has the same field, the panel also queries its metric (legend "dcgm"), so the dashboard
works with trainhealth's exporter, dcgm-exporter, or both. dcgm-exporter's series are filtered on the labels
it emits (``Hostname``, ``gpu``: see :data:`trainhealth._internal.dashboards.layout.DCGM_FILTER`)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from trainhealth._internal import catalog as c
from trainhealth._internal.dashboards.layout import DCGM_FILTER as D
from trainhealth._internal.dashboards.layout import GPU_FILTER as F
from trainhealth._internal.dashboards.layout import (
    RANK_FILTER,
    RANKED_NOTE,
    AlertLike,
    arrange,
    dashboard,
    ranked,
    target,
)
from trainhealth._internal.dashboards.model import Dashboard, Row, Table, Target, Text, TimeSeries, unit_of
from trainhealth._internal.knowledge.promql import counted
from trainhealth._internal.knowledge.recording import NVLINK_ERRORS_10M, PCIE_REPLAYS_RATE
from trainhealth._internal.knowledge.xid import known_xids

__all__ = ["DCGM_METRICS", "UID", "gpu_dashboard", "gpu_panels"]

UID = "trainhealth-gpu"

#: dcgm-exporter metrics the dashboards may query: its default counters (etc/default-counters.csv) and the
#: profiling fields of etc/dcp-metrics-included.csv (SM_ACTIVE and the NVLINK bytes are commented out there).
DCGM_METRICS = (
    "DCGM_FI_DEV_GPU_UTIL",
    "DCGM_FI_DEV_GPU_TEMP",
    "DCGM_FI_DEV_POWER_USAGE",
    "DCGM_FI_DEV_SM_CLOCK",
    "DCGM_FI_DEV_XID_ERRORS",
    "DCGM_FI_DEV_PCIE_REPLAY_COUNTER",
    "DCGM_FI_DEV_ROW_REMAP_FAILURE",
    "DCGM_FI_PROF_SM_ACTIVE",
    "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE",
    "DCGM_FI_PROF_DRAM_ACTIVE",
    "DCGM_FI_PROF_NVLINK_TX_BYTES",
    "DCGM_FI_PROF_NVLINK_RX_BYTES",
    "DCGM_FI_PROF_PCIE_TX_BYTES",
    "DCGM_FI_PROF_PCIE_RX_BYTES",
)
_DCGM_LEGEND = "{{Hostname}} GPU {{gpu}} (dcgm)"


def _panel(
    title: str,
    ours: str,
    dcgm: str | None = None,
    unit: str = "short",
    description: str = "",
    legend: str = "{{host}} GPU {{gpu}}",
    extra: Sequence[Target] = (),
    worst: str = "above",
) -> TimeSeries:
    """One series per GPU (trainhealth's, and dcgm-exporter's where it has the field), cut to the GPUs worst at
    each instant at All: ``worst`` is the side of a GPU's value that is bad; ``extra`` targets come cut."""
    targets = [target(ranked(ours, worst), legend)]
    if dcgm is not None:
        targets.append(target(ranked(dcgm, worst), _DCGM_LEGEND, ref="B"))
    targets += extra
    return TimeSeries(
        title=title,
        description=f"{description} {RANKED_NOTE}".strip(),
        targets=targets,
        unit=unit,
        tooltipMode="multi",
        tooltipSort="desc",
    )


def _bandwidth(title: str, ours: c.MetricSpec, dcgm: str, description: str, *extra: Target) -> TimeSeries:
    """trainhealth's tx/rx series and dcgm-exporter's two fields (already rates: bytes per second), the slowest
    GPUs at All."""
    return TimeSeries(
        title=title,
        description=f"{description} {RANKED_NOTE}",
        unit=unit_of(ours),
        tooltipMode="multi",
        tooltipSort="desc",
        targets=[
            target(ranked(f"{ours.prometheus_name}{{{F}}}", "below"), "{{host}} GPU {{gpu}} {{direction}}"),
            target(
                ranked(f"DCGM_FI_PROF_{dcgm}_TX_BYTES{{{D}}}", "below"), "{{Hostname}} GPU {{gpu}} tx (dcgm)", ref="B"
            ),
            target(
                ranked(f"DCGM_FI_PROF_{dcgm}_RX_BYTES{{{D}}}", "below"), "{{Hostname}} GPU {{gpu}} rx (dcgm)", ref="C"
            ),
            *extra,
        ],
    )


def _xid_table() -> Table:
    return Table(
        title="XID errors (last 24 h)",
        unit="short",
        description="Count per GPU and XID; the panel beside it gives each XID's meaning and action.",
        targets=[
            target(
                f"sum by (job, host, gpu, xid) {counted(f'{c.GPU_XID_ERRORS.prometheus_name}{{{F}}}', '24h')}",
                instant=True,
                table=True,
            )
        ],
        transformations=[
            {
                "id": "organize",
                "options": {"excludeByName": {"Time": True}, "renameByName": {"Value": "count", "xid": "XID"}},
            }
        ],
    )


def _xid_meanings() -> Text:
    lines = [
        "From NVIDIA's XID catalogue (the same as the XID alerts and their runbooks).",
        "",
        "| XID | meaning | immediate action |",
        "|---|---|---|",
    ]
    lines += [f"| {x.xid} | {x.meaning} | {x.action.value} |" for x in known_xids()]
    return Text(title="What each XID means and what to do", mode="markdown", content="\n".join(lines))


def gpu_dashboard(alerts: Iterable[AlertLike]) -> Dashboard:
    """The GPU dashboard: :func:`gpu_panels`, placed, with the ``alerts``' limits drawn on the panels they name."""
    return dashboard(
        UID,
        "trainhealth / GPU health",
        "Per-GPU health from NVML (trainhealth) or dcgm-exporter: what is failing and what to do.",
        arrange(gpu_panels()),
        alerts,
        gpu=True,
    )


def gpu_panels() -> list[Any]:
    """The GPU dashboard's panels, in their order on it (not yet placed)."""
    profiling = (
        "DCGM profiling field {field} (dcgm-exporter) next to trainhealth's series from its DCGM backend. {note}"
    )
    panels = [
        _panel(
            "GPU up",
            f"{c.GPU_UP.prometheus_name}{{{F}}}",
            unit="none",
            description="1 while the GPU answers NVML; 0: lost, off the bus or needing a reset.",
            worst="below",
        ),
        _panel(
            "Utilization",
            f"{c.GPU_UTILIZATION.prometheus_name}{{{F}}}",
            f"DCGM_FI_DEV_GPU_UTIL{{{D}}} / 100",
            unit=unit_of(c.GPU_UTILIZATION),
            worst="below",
        ),
        _panel(
            "Temperature",
            f"{c.GPU_TEMPERATURE.prometheus_name}{{{F}}}",
            f"DCGM_FI_DEV_GPU_TEMP{{{D}}}",
            unit=unit_of(c.GPU_TEMPERATURE),
        ),
        _panel(
            "HBM temperature",
            f"{c.GPU_MEMORY_TEMPERATURE.prometheus_name}{{{F}}}",
            unit=unit_of(c.GPU_MEMORY_TEMPERATURE),
        ),
        _panel(
            "Power",
            f"{c.GPU_POWER.prometheus_name}{{{F}}}",
            f"DCGM_FI_DEV_POWER_USAGE{{{D}}}",
            unit=unit_of(c.GPU_POWER),
        ),
        _panel(
            "SM clock",
            f'{c.GPU_CLOCK.prometheus_name}{{{F},clock="sm"}}',
            f"DCGM_FI_DEV_SM_CLOCK{{{D}}} * 1e6",
            unit=unit_of(c.GPU_CLOCK),
            worst="below",
        ),
        _panel(
            "Throttle (clocks-event) reasons active",
            f'{c.GPU_CLOCKS_EVENT_ACTIVE.prometheus_name}{{{F},reason!="gpu_idle"}} == 1',
            unit="none",
            legend="{{host}} GPU {{gpu}} {{reason}}",
        ),
        _panel(
            "Uncorrectable ECC errors (volatile)",
            f'{c.GPU_ECC_ERRORS.prometheus_name}{{{F},error_type="uncorrected",counter_type="volatile"}}',
        ),
        _panel(
            "Remapped rows",
            f"{c.GPU_REMAPPED_ROWS.prometheus_name}{{{F}}}",
            legend="{{host}} GPU {{gpu}} {{error_type}}",
        ),
        _panel(
            "Row remap pending / failed",
            f"{c.GPU_ROW_REMAP_PENDING.prometheus_name}{{{F}}} + 2 * {c.GPU_ROW_REMAP_FAILURE.prometheus_name}{{{F}}}",
            f"2 * DCGM_FI_DEV_ROW_REMAP_FAILURE{{{D}}}",
            unit="none",
            description="1 pending, 2 failed, 3 both.",
        ),
        _panel(
            "PCIe replays per minute",
            f"{PCIE_REPLAYS_RATE}{{{F}}} * 60",
            f"rate(DCGM_FI_DEV_PCIE_REPLAY_COUNTER{{{D}}}[10m]) * 60",
            unit="cpm",
            description="Averaged over 10 minutes (trainhealth's: a recording rule, once a minute).",
        ),
        _panel(
            "NVLink errors per minute",
            f"{NVLINK_ERRORS_10M}{{{F}}} / 10",
            unit="cpm",
            legend="{{host}} GPU {{gpu}} link {{link}}",
            description="Averaged over 10 minutes, the links that had errors only (a recording rule over every "
            "link's counters, once a minute: what GpuNvlinkErrors reads).",
        ),
        _panel(
            "XIDs in the last hour",
            counted(f"{c.GPU_XID_ERRORS.prometheus_name}{{{F}}}", "1h"),
            f"DCGM_FI_DEV_XID_ERRORS{{{D}}} > 0",
            legend="{{host}} GPU {{gpu}} XID {{xid}}",
            description="dcgm-exporter exports only the last XID's number (repeats are lost).",
        ),
        _panel("Memory used", f"{c.GPU_MEMORY_USED.prometheus_name}{{{F}}}", unit=unit_of(c.GPU_MEMORY_USED)),
        _panel(
            "GPU telemetry up",
            f'{c.EXPORTER_GPU_BACKEND_UP.prometheus_name}{{job=~"$job",host=~"$host"}}',
            unit="none",
            legend="{{host}} {{backend}}",
            description="1 while the exporter's NVML, DCGM or simulated backend samples; 0: GPU alerts are blind.",
            worst="below",
        ),
        _xid_table(),
        _xid_meanings(),
        Row(title="GPU efficiency (DCGM profiling)"),
        _panel(
            "SM activity",
            f"{c.GPU_SM_ACTIVE.prometheus_name}{{{F}}}",
            f"DCGM_FI_PROF_SM_ACTIVE{{{D}}}",
            unit=unit_of(c.GPU_SM_ACTIVE),
            extra=[
                target(
                    ranked(f"{c.GPU_UTILIZATION.prometheus_name}{{{F}}}", "below"),
                    "{{host}} GPU {{gpu}} (NVML utilization)",
                    ref="C",
                )
            ],
            worst="below",
            description=profiling.format(
                field="DCGM_FI_PROF_SM_ACTIVE",
                note=(
                    "Fraction of cycles an SM had a warp resident. Not in dcgm-exporter's default counters: add it "
                    "to its CSV (docs/dcgm.md). Without DCGM, NVML's utilization (a kernel ran at all) stands in: "
                    "an upper bound of SM activity."
                ),
            ),
        ),
        _panel(
            "Tensor-pipe activity",
            f"{c.GPU_TENSOR_ACTIVE.prometheus_name}{{{F}}}",
            f"DCGM_FI_PROF_PIPE_TENSOR_ACTIVE{{{D}}}",
            unit=unit_of(c.GPU_TENSOR_ACTIVE),
            description=profiling.format(
                field="DCGM_FI_PROF_PIPE_TENSOR_ACTIVE",
                note="Low while MFU is low: the GPU waits instead of multiplying.",
            ),
            worst="below",
        ),
        _panel(
            "DRAM activity",
            f"{c.GPU_DRAM_ACTIVE.prometheus_name}{{{F}}}",
            f"DCGM_FI_PROF_DRAM_ACTIVE{{{D}}}",
            unit=unit_of(c.GPU_DRAM_ACTIVE),
            description=profiling.format(
                field="DCGM_FI_PROF_DRAM_ACTIVE", note="High with low tensor activity: memory-bound kernels."
            ),
            worst="below",
        ),
        _panel(
            "MFU",
            f"{c.TRAIN_MFU.prometheus_name}{{{RANK_FILTER}}}",
            unit=unit_of(c.TRAIN_MFU),
            legend="rank {{rank}}",
            description="Model FLOPs utilization the training loop reports: the useful share of the GPU's peak.",
            worst="below",
        ),
        _bandwidth(
            "NVLink bandwidth",
            c.GPU_NVLINK_THROUGHPUT,
            "NVLINK",
            profiling.format(
                field="DCGM_FI_PROF_NVLINK_TX_BYTES / RX_BYTES",
                note=(
                    "Not in dcgm-exporter's default counters: add them to its CSV. Without DCGM, the bytes the "
                    "ranks' collectives move (trainhealth's collective logger) stand in."
                ),
            ),
            target(
                ranked(
                    f"sum by (job, host, rank) (rate({c.COMM_BYTES.prometheus_name}{{{RANK_FILTER}}}[5m]))", "below"
                ),
                "{{job}} {{host}} rank {{rank}} collective bytes",
                ref="D",
            ),
        ),
        _bandwidth(
            "PCIe bandwidth",
            c.GPU_PCIE_THROUGHPUT,
            "PCIE",
            profiling.format(
                field="DCGM_FI_PROF_PCIE_TX_BYTES / RX_BYTES",
                note="trainhealth reads NVML's PCIe counters without DCGM.",
            ),
        ),
    ]
    return panels
