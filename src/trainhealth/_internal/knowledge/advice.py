"""The advice catalogue: what on-call should do about each kind of finding, and where that comes from.

One place for the mitigation text that localization results, alert
annotations, the runbooks (docs/runbooks, generated) and the demo show. Every
entry cites its sources by title and link: the papers, NVIDIA's and PyTorch's
documentation, the tools it names.

>>> advice_for("compute")[0]
'Cordon the node of the suspect GPU and restart the job without it (or on a hot spare); the job runs at the speed of its slowest GPU.'
>>> xid = xid_advice(79)
>>> xid.meaning, xid.action
('GPU has fallen off the bus', 'reboot the machine, then contact vendor support')
>>> str(xid.source)
'[NVIDIA, Analyzing Xid Errors with the Xid Catalog](https://docs.nvidia.com/deploy/xid-errors/analyzing-xid-catalog.html)'
"""

from __future__ import annotations

from dataclasses import dataclass

from trainhealth._internal.knowledge.xid import XidAction, describe_xid, known_xids

__all__ = ["ADVICE", "Advice", "Source", "XidAdvice", "advice_for", "known_xid_advice", "rewind_advice", "xid_advice"]


@dataclass(frozen=True)
class Source:
    """A document a piece of advice comes from: its title and where to read it; ``str`` is a Markdown link."""

    title: str
    url: str

    def __post_init__(self) -> None:
        if not self.title or not self.url.startswith("https://"):
            raise ValueError(f"a source needs a title and an https:// link: {self.title!r}, {self.url!r}")

    def __str__(self) -> str:
        return f"[{self.title}]({self.url})"


_NVIDIA_XID = Source(
    "NVIDIA, Analyzing Xid Errors with the Xid Catalog",
    "https://docs.nvidia.com/deploy/xid-errors/analyzing-xid-catalog.html",
)
_DCGM = Source(
    "NVIDIA DCGM User Guide, DCGM Diagnostics",
    "https://docs.nvidia.com/datacenter/dcgm/latest/user-guide/dcgm-diagnostics.html",
)
_MEMORY_ERRORS = Source(
    "NVIDIA, GPU Memory Error Management (row remapping)",
    "https://docs.nvidia.com/deploy/a100-gpu-mem-error-mgmt/index.html",
)
_NVML = Source(
    "NVIDIA, NVML API Reference Guide (clocks-event reasons, PCIe replay counter)",
    "https://docs.nvidia.com/deploy/nvml-api/index.html",
)
_HOLMES = Source(
    "Yao et al., Holmes: Localizing Irregularities in LLM Training with Mega-scale GPU Clusters (NSDI '25)",
    "https://www.usenix.org/conference/nsdi25/presentation/yao",
)
_PALM = Source(
    "Chowdhery et al., PaLM: Scaling Language Modeling with Pathways (arXiv 2204.02311), section 5.1",
    "https://arxiv.org/abs/2204.02311",
)
_OLMO2 = Source("OLMo Team, 2 OLMo 2 Furious (arXiv 2501.00656)", "https://arxiv.org/abs/2501.00656")
_WORTSMAN = Source(
    "Wortsman et al., Small-scale proxies for large-scale Transformer training instabilities (arXiv 2309.14322)",
    "https://arxiv.org/abs/2309.14322",
)
_MOLYBOG = Source(
    "Molybog et al., A Theory on Adam Instability in Large-Scale Machine Learning (arXiv 2304.09871)",
    "https://arxiv.org/abs/2304.09871",
)
_MA = Source(
    "Ma et al., Understanding Silent Data Corruption in LLM Training (arXiv 2502.12340)",
    "https://arxiv.org/abs/2502.12340",
)
_MEGATRON_HASHES = Source(
    "Megatron-LM, check_param_hashes_across_dp_replicas (megatron/core/utils.py)",
    "https://github.com/NVIDIA/Megatron-LM/blob/main/megatron/core/utils.py",
)
_MEGATRON_RERUN = Source(
    "Megatron-LM, the rerun state machine (megatron/core/rerun_state_machine.py)",
    "https://github.com/NVIDIA/Megatron-LM/blob/main/megatron/core/rerun_state_machine.py",
)
_FLIGHT_RECORDER = Source(
    "PyTorch tutorials, Flight Recorder for Debugging Stuck Jobs",
    "https://docs.pytorch.org/tutorials/prototype/flight_recorder_tutorial.html",
)
_LLAMA3 = Source(
    "Llama Team, The Llama 3 Herd of Models (arXiv 2407.21783), Reliability and Operational Challenges, Table 5",
    "https://arxiv.org/abs/2407.21783",
)
_PY_SPY = Source("py-spy, a sampling profiler for Python programs (py-spy dump)", "https://github.com/benfred/py-spy")
_DCP = Source(
    "PyTorch documentation, Distributed Checkpoint (torch.distributed.checkpoint)",
    "https://docs.pytorch.org/docs/stable/distributed.checkpoint.html",
)
_PROMETHEUS_ABSENT = Source(
    "Prometheus documentation, query functions: absent()",
    "https://prometheus.io/docs/prometheus/latest/querying/functions/#absent",
)


@dataclass(frozen=True)
class Advice:
    """What to do, in order, and the sources it comes from."""

    title: str
    steps: tuple[str, ...]
    sources: tuple[Source, ...]


ADVICE: dict[str, Advice] = {
    "compute": Advice(
        "A slow GPU (straggler)",
        (
            "Cordon the node of the suspect GPU and restart the job without it (or on a hot spare); "
            "the job runs at the speed of its slowest GPU.",
            "Check the GPU's clocks-event (throttle) reasons, temperature, power and XIDs on the GPU health "
            "dashboard; run DCGM diagnostics (dcgmi diag -r 3) before returning it to service.",
        ),
        (_HOLMES, _DCGM),
    ),
    "communication": Advice(
        "A slow link, NIC, host or switch",
        (
            "Check the suspect link: NIC and switch-port error counters, link speed and width, PCIe replays "
            "and NVLink errors of the GPUs on either side.",
            "If one NIC or cable is slow, drain its node; if a switch is slow, move the job off the hosts behind "
            "it and open a network ticket.",
        ),
        (_HOLMES,),
    ),
    "imbalance": Advice(
        "Uneven work, no faulty device",
        (
            "No device is to blame: the work itself is uneven. Rebalance the pipeline stages (layers per stage) "
            "or pack sequences to even out micro-batch lengths.",
        ),
        (_HOLMES,),
    ),
    "hang": Advice(
        "A hung job or collective",
        (
            "The lagging ranks never entered the collective: inspect their stacks (py-spy dump), then restart "
            "from the last checkpoint; if a GPU on them reports XIDs, cordon its node first.",
        ),
        (_FLIGHT_RECORDER, _PY_SPY, _LLAMA3),
    ),
    "pause_overrun": Advice(
        "A pause that does not end",
        (
            "Read the rank's stacks file (stacks/ beside its trace, headed 'in a pause (<reason>) since ...') or "
            "take py-spy dump of the rank: a save blocked on storage (check the filesystem's health, quota and free "
            "space) or an evaluation loop that never returns.",
            "If the pause cannot finish, restart from the last complete checkpoint; raise comm_pause_limit only when "
            "pauses this long are expected.",
        ),
        (_PY_SPY, _DCP),
    ),
    "healthy": Advice("Healthy", (), ()),
    "insufficient_data": Advice(
        "Not enough evidence for a verdict",
        (
            "The window cannot tell a slow device from noise (see the reason): record step markers "
            "(trainhealth.Monitor with comm=True, or mon.step() each iteration) and localize a longer window.",
        ),
        (_HOLMES,),
    ),
    "sdc": Advice(
        "Silent data corruption",
        (
            "Rerun the step on the suspect rank's GPU and on another GPU with the same inputs; a GPU whose result "
            "differs is faulty (silent data corruption: wrong numbers, no error).",
            "Cordon the node, run DCGM diagnostics at level 3 (dcgmi diag -r 3) and trainhealth selftest on it before "
            "returning it to service.",
            "Restart from the last checkpoint saved before the first mismatch (the replicas agreed then); parameters "
            "that differ between replicas have already diverged.",
        ),
        (_MA, _MEGATRON_HASHES, _MEGATRON_RERUN, _DCGM),
    ),
    "loss_spike": Advice(
        "A loss spike",
        (
            "If the loss does not recover: restore the last checkpoint before the spike (about 100 steps back), "
            "skip the next 200-500 batches of data and resume.",
            "If spikes recur: lower the learning rate or lengthen warm-up, clip gradients, add QK-norm or z-loss, "
            "lower Adam epsilon (1e-8 or less).",
        ),
        (_PALM, _OLMO2, _WORTSMAN, _MOLYBOG),
    ),
    "nonfinite": Advice(
        "NaN or infinite values",
        (
            "Find the rank that produced it (trainhealth_train_nonfinite_origin_first_step with where=local) and the "
            "block (trainhealth_train_nonfinite_origin there, or the nonfinite_origin event; block=head_or_loss: after "
            "the last block, in the output head or the loss); if it is always the same rank, suspect its GPU (run trainhealth selftest there); if it moves, the numerics: lower "
            "the learning rate, check loss scaling and bf16/fp16 ranges, add z-loss.",
            "Restore the last checkpoint with finite weights before resuming.",
        ),
        (_MA, _WORTSMAN),
    ),
    "xid_critical": Advice(
        "A critical XID",
        (
            "Follow NVIDIA's action for the XID (in the description); drain the node's jobs first.",
            "Then run DCGM diagnostics (dcgmi diag -r 3); repeated XIDs on one GPU: take it out of service and RMA.",
        ),
        (_NVIDIA_XID, _DCGM),
    ),
    "xid_warning": Advice(
        "An XID that is usually not the hardware's fault",
        (
            "Follow NVIDIA's action for the XID (in the description), usually restarting the application.",
            "If the same GPU keeps reporting it under different jobs, treat it as a hardware fault: DCGM diagnostics "
            "level 3.",
        ),
        (_NVIDIA_XID,),
    ),
    "ecc_uncorrectable": Advice(
        "An uncorrectable ECC error",
        (
            "Restart the job from its last checkpoint on other GPUs; reset this GPU to trigger row remapping.",
            "If row remapping fails or errors recur, take the GPU out of service (RMA).",
        ),
        (_NVIDIA_XID, _MEMORY_ERRORS),
    ),
    "row_remap_failure": Advice(
        "A failed row remap",
        ("Take the GPU out of service: it has no spare rows left for its failing memory; RMA it.",),
        (_MEMORY_ERRORS,),
    ),
    "row_remap_pending": Advice(
        "A pending row remap",
        ("Reset the GPU when no job runs on it (drain, nvidia-smi -r) so the remap takes effect.",),
        (_MEMORY_ERRORS,),
    ),
    "gpu_lost": Advice(
        "A lost GPU",
        (
            "Cordon the node, restart the job elsewhere from the last checkpoint, then reboot the node; if the GPU "
            "does not come back or falls off the bus again, RMA it (XID 79).",
        ),
        (_NVIDIA_XID,),
    ),
    "thermal": Advice(
        "Thermal throttling",
        (
            "Check the node's cooling (fans, airflow, inlet temperature) and the GPU's temperature against its "
            "peers; a single hot GPU slows the whole synchronous job: move the job off it if it persists.",
        ),
        (_NVML, _HOLMES),
    ),
    "power": Advice(
        "Power capping",
        (
            "Compare the GPU's power limit with its peers' (nvidia-smi -q -d POWER); a lower limit or a power brake "
            "on one GPU makes it a straggler: restore the limit or check the node's power supply.",
        ),
        (_NVML,),
    ),
    "pcie": Advice(
        "PCIe replays",
        (
            "Reseat or replace the riser or cable at the next maintenance; check the link width and speed "
            "(nvidia-smi -q -d PCIE) against the GPU's peers.",
        ),
        (_NVML,),
    ),
    "nvlink": Advice(
        "NVLink errors",
        (
            "Run DCGM diagnostics on the node; if CRC or recovery errors keep growing on one link, drain the node "
            "and have the NVLink/NVSwitch fabric checked (XID 74 often follows).",
        ),
        (_NVIDIA_XID, _DCGM),
    ),
    "telemetry": Advice(
        "Missing telemetry",
        (
            "Check that the target runs and listens on the scraped port (curl its /metrics); a training rank that "
            "crashed also stops answering, so look at the job's state first.",
        ),
        (_PROMETHEUS_ABSENT,),
    ),
}

_XID_FOLLOW_UP = {
    XidAction.IGNORE: "None needed unless it repeats.",
    XidAction.RESTART_APP: "If it repeats on this GPU under different jobs, run DCGM diagnostics level 3.",
    XidAction.RESTART_APP_RESET_LATER: "Reset the GPU at the next drain; watch for XID 95 or 140.",
    XidAction.FOLLOW_OTHER: "Look at the XID reported just before it.",
    XidAction.RESET_GPU: "Run DCGM diagnostics level 3 after the reset; RMA if it recurs.",
    XidAction.RESET_GPU_OR_REBOOT: "Check remapped rows after the reset; RMA when the error threshold is exceeded.",
    XidAction.RESET_GPU_THEN_VENDOR: "Open a vendor case with nvidia-bug-report.sh output.",
    XidAction.RESET_GPU_POWER_CYCLE: "Power-cycle the node if it recurs; then DCGM diagnostics level 3.",
    XidAction.RESET_OR_REBOOT_CHECK_PEER: "Check the GPU at the other end of the link too.",
    XidAction.REBOOT_MACHINE: "If the GPU falls off the bus again, RMA it.",
    XidAction.CONTACT_SUPPORT: "Open a vendor case with nvidia-bug-report.sh output.",
    XidAction.READ_RECOVERY_ACTION: "Read trainhealth_gpu_recovery_action and apply it.",
    XidAction.INVESTIGATE: "Look the XID up in NVIDIA's catalogue.",
}


@dataclass(frozen=True)
class XidAdvice:
    xid: int
    meaning: str
    action: str
    follow_up: str
    severity: str
    source: Source = _NVIDIA_XID


def xid_advice(xid: int) -> XidAdvice:
    """Meaning, immediate action and follow-up for an XID (a generic entry for unlisted ones)."""
    info = describe_xid(xid)
    return XidAdvice(xid, info.meaning, info.action.value, _XID_FOLLOW_UP[info.action], info.severity.value)


def known_xid_advice() -> tuple[XidAdvice, ...]:
    """The advice for every XID in the catalogue."""
    return tuple(xid_advice(info.xid) for info in known_xids())


def rewind_advice(onset_step: int, checkpoint_step: int | None) -> str:
    """The first thing to do about a loss spike that began at ``onset_step`` and did not recover.

    >>> rewind_advice(1200, 1000)
    'Restore the checkpoint of step 1000 (the last one before the spike began at step 1200), skip the next 200-500 batches of data and resume.'
    """
    if checkpoint_step is None:
        return (
            f"No checkpoint before the spike (step {onset_step}) was reported: restore the latest one saved "
            f"before it, skip the next 200-500 batches of data and resume."
        )
    return (
        f"Restore the checkpoint of step {checkpoint_step} (the last one before the spike began at step "
        f"{onset_step}), skip the next 200-500 batches of data and resume."
    )


def advice_for(verdict: str) -> list[str]:
    """The steps for a localization verdict or any catalogue key (empty for healthy or unknown keys)."""
    entry = ADVICE.get(verdict)
    return list(entry.steps) if entry is not None else []
