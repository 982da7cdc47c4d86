"""GPU health: utilization, temperature, power, clocks, throttle reasons, ECC, remapped rows, XIDs with their
meaning and action, PCIe replays, NVLink errors and GPU up. Where dcgm-exporter has the same field, the panel
also queries its metric (legend "dcgm"), so the dashboard works with either exporter."""

from __future__ import annotations

from grafanalib import core as g

from trainhealth import catalog as c
from trainhealth.dashboards.layout import DCGM_FILTER as D
from trainhealth.dashboards.layout import GPU_FILTER as F
from trainhealth.dashboards.layout import arrange, dashboard, target
from trainhealth.knowledge.promql import counted
from trainhealth.knowledge.xid import known_xids

__all__ = ["DCGM_METRICS", "gpu_dashboard"]

#: dcgm-exporter metrics the dashboards may query (its default counters).
DCGM_METRICS = ("DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_DEV_GPU_TEMP", "DCGM_FI_DEV_POWER_USAGE", "DCGM_FI_DEV_SM_CLOCK",
                "DCGM_FI_DEV_XID_ERRORS", "DCGM_FI_DEV_PCIE_REPLAY_COUNTER", "DCGM_FI_DEV_ROW_REMAP_FAILURE")


def _panel(title: str, ours: str, dcgm: str | None = None, unit: str = "short", description: str = "",
           legend: str = "{{host}} GPU {{gpu}}") -> g.TimeSeries:
    targets = [target(ours, legend)]
    if dcgm is not None:
        targets.append(target(dcgm, "{{Hostname}} GPU {{gpu}} (dcgm)", ref="B"))
    return g.TimeSeries(title=title, description=description, targets=targets, unit=unit, dataSource="${datasource}")


def _xid_table() -> g.Table:
    """XIDs in the window, with the catalogue's meaning and action as value mappings."""
    meaning = {str(x.xid): {"text": f"XID {x.xid}: {x.meaning}; action: {x.action.value}"} for x in known_xids()}
    return g.Table(
        title="XID errors (last 24 h) with meaning and action",
        description="From NVIDIA's XID catalogue: each XID is shown with its meaning and immediate action.",
        dataSource="${datasource}",
        targets=[target(f"sum by (host, gpu, xid) {counted(f'{c.GPU_XID_ERRORS.prometheus_name}{{{F}}}', '24h')}",
                        instant=True, table=True)],
        transformations=[{"id": "organize", "options": {"excludeByName": {"Time": True},
                                                        "renameByName": {"Value": "count", "xid": "XID"}}}],
        overrides=[{"matcher": {"id": "byName", "options": "XID"},
                    "properties": [{"id": "mappings", "value": [{"type": "value", "options": meaning}]}]}],
    )


def gpu_dashboard() -> g.Dashboard:
    panels = [
        _panel("GPU up", f"{c.GPU_UP.prometheus_name}{{{F}}}",
               description="1 while the GPU answers NVML; 0: lost, off the bus or needing a reset."),
        _panel("Utilization", f"{c.GPU_UTILIZATION.prometheus_name}{{{F}}}",
               f"DCGM_FI_DEV_GPU_UTIL{{{D}}} / 100", unit="percentunit"),
        _panel("Temperature", f"{c.GPU_TEMPERATURE.prometheus_name}{{{F}}}", f"DCGM_FI_DEV_GPU_TEMP{{{D}}}",
               unit="celsius"),
        _panel("HBM temperature", f"{c.GPU_MEMORY_TEMPERATURE.prometheus_name}{{{F}}}", unit="celsius"),
        _panel("Power", f"{c.GPU_POWER.prometheus_name}{{{F}}}", f"DCGM_FI_DEV_POWER_USAGE{{{D}}}", unit="watt"),
        _panel("SM clock", f'{c.GPU_CLOCK.prometheus_name}{{{F},clock="sm"}}', f"DCGM_FI_DEV_SM_CLOCK{{{D}}} * 1e6",
               unit="hertz"),
        _panel("Throttle (clocks-event) reasons active",
               f'{c.GPU_CLOCKS_EVENT_ACTIVE.prometheus_name}{{{F},reason!="gpu_idle"}} == 1',
               legend="{{host}} GPU {{gpu}} {{reason}}"),
        _panel("Uncorrectable ECC errors (volatile)",
               f'{c.GPU_ECC_ERRORS.prometheus_name}{{{F},error_type="uncorrected",counter_type="volatile"}}'),
        _panel("Remapped rows", f"{c.GPU_REMAPPED_ROWS.prometheus_name}{{{F}}}",
               legend="{{host}} GPU {{gpu}} {{error_type}}"),
        _panel("Row remap pending / failed",
               f"{c.GPU_ROW_REMAP_PENDING.prometheus_name}{{{F}}} + 2 * {c.GPU_ROW_REMAP_FAILURE.prometheus_name}{{{F}}}",
               f"2 * DCGM_FI_DEV_ROW_REMAP_FAILURE{{{D}}}", description="1 pending, 2 failed, 3 both."),
        _panel("PCIe replays per minute", f"rate({c.GPU_PCIE_REPLAYS.prometheus_name}{{{F}}}[5m]) * 60",
               f"rate(DCGM_FI_DEV_PCIE_REPLAY_COUNTER{{{D}}}[5m]) * 60"),
        _panel("NVLink errors per minute", f"sum by (host, gpu, link) (rate({c.GPU_NVLINK_ERRORS.prometheus_name}"
               f"{{{F}}}[5m])) * 60", legend="{{host}} GPU {{gpu}} link {{link}}"),
        _panel("XIDs in the last hour", counted(f"{c.GPU_XID_ERRORS.prometheus_name}{{{F}}}", "1h"),
               f"DCGM_FI_DEV_XID_ERRORS{{{D}}} > 0", legend="{{host}} GPU {{gpu}} XID {{xid}}",
               description="dcgm-exporter exports only the last XID's number (repeats are lost)."),
        _panel("Memory used", f"{c.GPU_MEMORY_USED.prometheus_name}{{{F}}}", unit="bytes"),
        _xid_table(),
    ]
    return dashboard("trainhealth-gpu", "trainhealth / GPU health",
                     "Per-GPU health from NVML (trainhealth) or dcgm-exporter: what is failing and what to do.",
                     arrange(panels, wide=[False] * 14 + [True]), gpu=True)
