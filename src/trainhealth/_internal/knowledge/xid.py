"""The XID catalogue: what an XID means and what to do about it.

From NVIDIA's XID catalogue ("Analyzing Xid Errors with the Xid Catalog",
https://docs.nvidia.com/deploy/xid-errors/analyzing-xid-catalog.html): each
XID's immediate action there. Unknown XIDs get a generic entry that sends the
reader to the catalogue rather than guessing.

>>> info = describe_xid(79)
>>> info.meaning, info.action.value, info.severity.value
('GPU has fallen off the bus', 'reboot the machine, then contact vendor support', 'critical')
>>> describe_xid(4242).action is XidAction.INVESTIGATE
True
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

from trainhealth._internal.events import Severity

__all__ = ["XidAction", "XidInfo", "describe_xid", "known_xids", "recovery_action_advice"]


class XidAction(str, Enum):
    """The immediate action NVIDIA's catalogue recommends."""

    IGNORE = "none: informational, the GPU is healthy"
    RESTART_APP = "restart the application (usually an application bug)"
    RESTART_APP_RESET_LATER = "restart the application; reset the GPU when convenient"
    FOLLOW_OTHER = "follow the XID reported with it"
    RESET_GPU = "reset the GPU"
    RESET_GPU_OR_REBOOT = "reset the GPU or reboot; RMA if the error threshold is exceeded"
    RESET_GPU_THEN_VENDOR = "reset the GPU, then contact vendor support"
    RESET_GPU_POWER_CYCLE = "reset the GPU; power-cycle the node if it persists"
    RESET_OR_REBOOT_CHECK_PEER = "reset the GPU or reboot; the fault may be at the remote end of the link"
    REBOOT_MACHINE = "reboot the machine, then contact vendor support"
    CONTACT_SUPPORT = "contact vendor support"
    READ_RECOVERY_ACTION = "apply the recovery action the driver reports (trainhealth_gpu_recovery_action)"
    INVESTIGATE = "look the XID up in NVIDIA's XID catalogue"


@dataclass(frozen=True)
class XidInfo:
    xid: int
    meaning: str
    action: XidAction
    severity: Severity


_C, _W, _I = Severity.CRITICAL, Severity.WARNING, Severity.INFO
_CATALOGUE: dict[int, tuple[str, XidAction, Severity]] = {
    13: ("graphics engine exception", XidAction.RESTART_APP, _W),
    31: ("GPU memory page fault (MMU)", XidAction.RESTART_APP, _W),
    43: ("GPU stopped processing: user application fault", XidAction.IGNORE, _I),
    45: ("preemptive cleanup after a previous error", XidAction.FOLLOW_OTHER, _I),
    48: ("double-bit ECC error", XidAction.RESET_GPU_OR_REBOOT, _C),
    62: ("internal micro-controller halt", XidAction.RESET_GPU_POWER_CYCLE, _C),
    63: ("row remapping recorded", XidAction.IGNORE, _I),
    64: ("row remapping failure", XidAction.RESET_GPU, _C),
    68: ("video decoder (NVDEC) exception", XidAction.RESTART_APP, _W),
    69: ("graphics engine class error", XidAction.RESTART_APP, _W),
    74: ("NVLink error", XidAction.RESET_OR_REBOOT_CHECK_PEER, _C),
    79: ("GPU has fallen off the bus", XidAction.REBOOT_MACHINE, _C),
    92: ("high single-bit ECC error rate", XidAction.CONTACT_SUPPORT, _W),
    94: ("contained ECC error", XidAction.RESTART_APP_RESET_LATER, _W),
    95: ("uncontained ECC error", XidAction.RESET_GPU, _C),
    109: ("context switch timeout", XidAction.RESET_GPU_POWER_CYCLE, _C),
    119: ("GSP RPC timeout", XidAction.RESET_GPU_POWER_CYCLE, _C),
    120: ("GSP error", XidAction.RESET_GPU_POWER_CYCLE, _C),
    140: ("unrecovered ECC error", XidAction.RESET_GPU_THEN_VENDOR, _C),
    154: ("GPU recovery action changed", XidAction.READ_RECOVERY_ACTION, _C),
}


def known_xids() -> tuple[XidInfo, ...]:
    """Every XID in the catalogue, by number."""
    return tuple(describe_xid(xid) for xid in sorted(_CATALOGUE))


def describe_xid(xid: int) -> XidInfo:
    """The catalogue entry for ``xid``; a generic 'investigate' entry when it is not listed."""
    meaning, action, severity = _CATALOGUE.get(xid, ("XID not in trainhealth's catalogue", XidAction.INVESTIGATE, _W))
    return XidInfo(xid, meaning, action, severity)


_RECOVERY_ACTIONS = {
    0: "none",
    1: "reset the GPU",
    2: "reboot the node",
    3: "drain peer-to-peer traffic",
    4: "drain the GPU and reset it",
    5: "recover the IMEX domain",
    6: "reset the PCIe bus",
    7: "reboot the system",
}


def recovery_action_advice(code: int) -> str:
    """What NVML's recovery-action code asks for (see ``trainhealth_gpu_recovery_action``)."""
    return _RECOVERY_ACTIONS.get(code, f"unknown recovery action {code}")
