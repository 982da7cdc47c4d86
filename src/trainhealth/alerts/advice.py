"""The advice catalogue: what on-call should do about each kind of finding.

One place for the mitigation text that localization results, alert
annotations and runbooks show (from REFERENCE.md's mitigation catalogue and
NVIDIA's XID actions).

>>> advice_for("compute")[0]
'Cordon the node of the suspect GPU and restart the job without it (or on a hot spare); the job runs at the speed of its slowest GPU.'
"""

from __future__ import annotations

__all__ = ["ADVICE", "advice_for"]

ADVICE: dict[str, tuple[str, ...]] = {
    "compute": (
        "Cordon the node of the suspect GPU and restart the job without it (or on a hot spare); "
        "the job runs at the speed of its slowest GPU.",
        "Check the GPU's clocks-event (throttle) reasons, temperature, power and XIDs on the GPU health "
        "dashboard; run DCGM diagnostics (dcgmi diag -r 3) before returning it to service.",
    ),
    "communication": (
        "Check the suspect link: NIC and switch-port error counters, link speed and width, PCIe replays "
        "and NVLink errors of the GPUs on either side.",
        "If one NIC or cable is slow, drain its node; if a switch is slow, move the job off the hosts behind "
        "it and open a network ticket.",
    ),
    "imbalance": (
        "No device is to blame: the work itself is uneven. Rebalance the pipeline stages (layers per stage) "
        "or pack sequences to even out micro-batch lengths.",
    ),
    "hang": (
        "The lagging ranks never entered the collective: inspect their stacks (py-spy dump), then restart "
        "from the last checkpoint; if a GPU on them reports XIDs, cordon its node first.",
    ),
    "healthy": (),
}


def advice_for(verdict: str) -> list[str]:
    """The advice for a localization verdict (empty for healthy)."""
    return list(ADVICE.get(verdict, ()))
