"""The settings, one frozen dataclass per concern; :class:`~trainhealth._internal.config.Settings` composes them.

A field is named for what it is within its group (``GpuSettings.backend``); the setting
name users write (``gpu_backend``) is declared beside it, and so is the range of a numeric
setting: intervals lie between :data:`MIN_INTERVAL` (or a larger minimum of their own) and
:data:`MAX_INTERVAL`, sizes and counts have upper bounds that keep memory bounded. Each group
checks its own fields.

>>> GpuSettings.resolve({"TRAINHEALTH_GPU_BACKEND": "simulated"}, {"simulated_gpus": 2})
GpuSettings(backend='simulated', gpus='', sample_interval=5.0, simulated_gpus=2, dcgm=None, dcgm_host='localhost', dcgm_bindings=None)
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass

from trainhealth._internal.config.fields import (
    ConfigError,
    Range,
    SettingGroup,
    parse_bool,
    parse_float,
    parse_int,
    parse_str,
    setting,
)

__all__ = [
    "DEFAULT_DETECTORS",
    "DEFAULT_PROMETHEUS_PORT_BASE",
    "GPU_BACKENDS",
    "HANG_FLOOR_S",
    "MAX_INTERVAL",
    "MAX_WORLD_SIZE",
    "MIN_INTERVAL",
    "MIN_TRACE_WRITE_INTERVAL",
    "CommSettings",
    "DetectorSettings",
    "GpuSettings",
    "IdentitySettings",
    "ModelSettings",
    "OtelSettings",
    "PrometheusSettings",
    "StoreSettings",
    "TrainingSettings",
]

#: The default ``detectors`` setting (syntax in trainhealth._internal.detectors.spec). The loss and gradient-norm
#: thresholds were chosen on the calibration seeds of the real-run corpus (benchmarks/training_corpus.py).
DEFAULT_DETECTORS = (
    "loss=divergence,zscore(direction=up,threshold=8),spike,nonfinite;"
    "grad_norm=zscore(direction=up,threshold=12),spike,nonfinite;"
    "step_time=delta(min_consecutive=2),level_shift(direction=up,min_relative=0.25,threshold=16);"
    "throughput=level_shift(direction=down,min_relative=0.25,threshold=16);"
    "comm_duration=level_shift(direction=up,min_relative=1)"
)
DEFAULT_PROMETHEUS_PORT_BASE = 9450
#: The shortest hang threshold (seconds), ``comm_hang_floor``'s default: pauses of a few seconds (a GC, a slow
#: batch) are never stuck. The alert rules' floor too (trainhealth._internal.knowledge.limits reads it from here:
#: the settings sit in the lowest layer, which imports nothing above it); whole, so PromQL reads ``10``.
HANG_FLOOR_S = 10
#: The shortest ``trace_write_interval`` (seconds) other than 0: appending to a trace more often only burns the flush thread.
MIN_TRACE_WRITE_INTERVAL = 0.05
#: The shortest interval (seconds) of a background thread: shorter ones busy-loop and slow training down.
MIN_INTERVAL = 0.01
#: The longest interval (seconds), one day: longer ones (``inf`` above all) stop a thread from ever running again.
MAX_INTERVAL = 86400.0
#: The most ranks a job may have (2**20); ranks run from 0 to one less.
MAX_WORLD_SIZE = 1 << 20
#: A count of steps between two checks: at most a million (0 turns the check off where that is allowed).
_STEPS = 1_000_000
#: FLOPs, per token or per second: positive and at most 1e18.
_FLOPS = Range(0, 1e18, above_low=True)
GPU_BACKENDS = ("nvml", "simulated", "off")


@dataclass(frozen=True)
class IdentitySettings(SettingGroup):
    """Overrides of the job's identity (see trainhealth._internal.identity for what is read when unset)."""

    TITLE = "Identity"

    job: str | None = setting(
        "job",
        None,
        parse_str,
        "The job's logical name, the same for every run of it (the job_name label of trainhealth_rank_info, "
        "never the job label); default the JobSet, PyTorchJob or Slurm job name.",
    )
    run_id: str | None = setting(
        "run_id",
        None,
        parse_str,
        "This run's own id, the job label of every series: the same on every rank of the run, different for "
        "every other run; default TORCHELASTIC_RUN_ID (unless 'none'), the JobSet or PyTorchJob and its "
        "restart, SLURM_JOB_ID and SLURM_RESTART_COUNT, else an id the ranks agree on through "
        "torch.distributed's store.",
    )
    host: str | None = setting(
        "host", None, parse_str, "Host label; default NODE_NAME (Kubernetes downward API) or the host name."
    )
    rank: int | None = setting(
        "rank",
        None,
        parse_int,
        "Global rank; default RANK or SLURM_PROCID, else torch.distributed's rank once it is initialised, else 0.",
        bounds=Range(0, MAX_WORLD_SIZE - 1),
    )
    local_rank: int | None = setting(
        "local_rank",
        None,
        parse_int,
        "Rank on this host; default LOCAL_RANK or SLURM_LOCALID, else 0.",
        bounds=Range(0, 4095),
    )
    world_size: int | None = setting(
        "world_size",
        None,
        parse_int,
        "Number of ranks; default WORLD_SIZE or SLURM_NTASKS, else torch.distributed's world size once it is initialised, else 1.",
        bounds=Range(1, MAX_WORLD_SIZE),
    )
    gpu_uuid: str | None = setting(
        "gpu_uuid",
        None,
        parse_str,
        "UUID of this rank's GPU (GPU-...); default read from CUDA when the model is on a GPU.",
    )

    def validate(self) -> None:
        if self.rank is not None and self.world_size is not None and self.rank >= self.world_size:
            raise self.error("rank", f"{self.rank} is not below world_size {self.world_size}")
        for name in ("job", "run_id"):
            value = getattr(self, name)
            if value is not None and not value.strip():
                raise self.error(name, f"must not be blank, got {value!r}")


@dataclass(frozen=True)
class PrometheusSettings(SettingGroup):
    """The /metrics endpoint: address, port, TLS and basic auth."""

    TITLE = "Prometheus endpoint"

    enabled: bool = setting("prometheus", True, parse_bool, "Serve /metrics over HTTP.")
    addr: str = setting("prometheus_addr", "0.0.0.0", parse_str, "Address the /metrics server binds to.")
    port: int | None = setting(
        "prometheus_port",
        None,
        parse_int,
        f"Port of the /metrics server; default {DEFAULT_PROMETHEUS_PORT_BASE} + local_rank; 0 picks a free port.",
        bounds=Range(0, 65535),
    )
    tls_certfile: str | None = setting("tls_certfile", None, parse_str, "PEM certificate: serve /metrics over HTTPS.")
    tls_keyfile: str | None = setting("tls_keyfile", None, parse_str, "PEM private key of tls_certfile.")
    tls_client_cafile: str | None = setting(
        "tls_client_cafile", None, parse_str, "CA bundle: require client certificates signed by it (mTLS)."
    )
    basic_auth_username: str | None = setting(
        "basic_auth_username", None, parse_str, "Require HTTP basic auth with this user name."
    )
    basic_auth_password: str | None = setting(
        "basic_auth_password", None, parse_str, "Password for basic auth.", secret=True
    )
    basic_auth_password_file: str | None = setting(
        "basic_auth_password_file",
        None,
        parse_str,
        "File holding the basic-auth password (instead of basic_auth_password).",
    )

    def validate(self) -> None:
        if (self.tls_certfile is None) != (self.tls_keyfile is None):
            missing = "tls_keyfile" if self.tls_keyfile is None else "tls_certfile"
            raise self.error(missing, "tls_certfile and tls_keyfile are set together")
        if self.tls_client_cafile is not None and self.tls_certfile is None:
            raise self.error("tls_client_cafile", "client certificates need TLS: set tls_certfile and tls_keyfile")
        for attribute in ("tls_certfile", "tls_keyfile", "tls_client_cafile", "basic_auth_password_file"):
            path = getattr(self, attribute)
            if path is not None and not os.path.isfile(path):
                raise self.error(attribute, f"no such file: {path}")
        if self.basic_auth_password is not None and self.basic_auth_password_file is not None:
            raise self.error(
                "basic_auth_password_file", "set basic_auth_password or basic_auth_password_file, not both"
            )
        has_password = self.basic_auth_password is not None or self.basic_auth_password_file is not None
        if (self.basic_auth_username is None) == has_password:
            missing = "basic_auth_password" if self.basic_auth_username is not None else "basic_auth_username"
            raise self.error(missing, "basic auth needs both a user name and a password")
        if self.basic_auth_password == "":
            raise self.error("basic_auth_password", "must not be empty")

    def metrics_port(self, local_rank: int) -> int:
        """The /metrics port of the process with ``local_rank``: 9450 + local rank unless set."""
        if self.port is not None:
            return self.port
        return DEFAULT_PROMETHEUS_PORT_BASE + local_rank

    def read_basic_auth_password(self) -> str | None:
        """The basic-auth password, read from its file when configured that way."""
        if self.basic_auth_password_file is None:
            return self.basic_auth_password
        with open(self.basic_auth_password_file, encoding="utf-8") as handle:
            password = handle.read().rstrip("\r\n")
        if not password:
            raise ConfigError("basic_auth_password_file", f"{self.basic_auth_password_file} is empty")
        return password


@dataclass(frozen=True)
class OtelSettings(SettingGroup):
    """The OTLP push; its endpoint, interval and resource come from the standard OTEL_* variables."""

    TITLE = "OpenTelemetry"

    enabled: bool | None = setting(
        "otel",
        None,
        parse_bool,
        "Push metrics over OTLP/HTTP; default on when OTEL_EXPORTER_OTLP_ENDPOINT or OTEL_EXPORTER_OTLP_METRICS_ENDPOINT is set. Endpoint, interval, resource and service name come from the standard OTEL_* variables.",
    )
    close_timeout: float = setting(
        "otel_close_timeout",
        1.5,
        parse_float,
        'Seconds that closing (Monitor.close(), the end of trainhealth export) waits for the last OTLP push of metrics and events; an endpoint that does not answer in time loses that push, counted in trainhealth_exporter_errors_total{source="otel"}.',
        bounds=Range(0.1, 600, unit="seconds"),
    )

    def active(self, env: Mapping[str, str] | None = None) -> bool:
        """Whether to push: the ``otel`` setting, else whether ``env`` names an OTLP endpoint."""
        if self.enabled is not None:
            return self.enabled
        env = os.environ if env is None else env
        return bool(env.get("OTEL_EXPORTER_OTLP_ENDPOINT") or env.get("OTEL_EXPORTER_OTLP_METRICS_ENDPOINT"))


@dataclass(frozen=True)
class TrainingSettings(SettingGroup):
    """What the Monitor computes from the training loop."""

    TITLE = "Training-loop statistics"

    stats_every: int = setting(
        "stats_every",
        20,
        parse_int,
        "Steps between the heavier statistics: per-layer norms, update ratio, update cosine.",
        bounds=Range(1, _STEPS),
    )
    max_layer_groups: int = setting(
        "max_layer_groups",
        64,
        parse_int,
        "Most layer groups reported; numbered blocks are merged into ranges beyond it.",
        bounds=Range(1, 1024),
    )
    flops_per_token: float | None = setting(
        "flops_per_token",
        None,
        parse_float,
        "Training FLOPs per token (forward and backward, e.g. 6 x parameters); enables MFU.",
        bounds=_FLOPS,
    )
    peak_flops: float | None = setting(
        "peak_flops",
        None,
        parse_float,
        "Peak FLOP/s of this rank's device for the training dtype; enables MFU.",
        bounds=_FLOPS,
    )


@dataclass(frozen=True)
class StoreSettings(SettingGroup):
    """The in-process metric store every exporter writes to."""

    TITLE = "Metric store"

    max_series_per_metric: int = setting(
        "max_series_per_metric",
        1000,
        parse_int,
        "Most label sets kept per metric; more are dropped and counted as errors.",
        bounds=Range(1, 100_000),
    )


@dataclass(frozen=True)
class CommSettings(SettingGroup):
    """The collective logger (``trainhealth.comm``) and its per-rank trace."""

    TITLE = "Collective operations"

    enabled: bool = setting(
        "comm",
        False,
        parse_bool,
        "Record torch.distributed collectives in the Monitor (trainhealth.comm.install). Off by default; turned on, each collective costs about 1 us of host time (0.95-1.04 us per gloo all-reduce with the flush thread on the same CPU core, benchmarks/comm_overhead.py) and each step a marker (6 us).",
    )
    trace_dir: str | None = setting(
        "trace_dir",
        None,
        parse_str,
        "Directory for per-rank collective traces (rank-<rank>.<n>.jsonl.gz, trace format v1), appended to while the job runs, at uninstall and at exit.",
    )
    trace_write_interval: float = setting(
        "trace_write_interval",
        1.0,
        parse_float,
        "Seconds between appends to the trace in trace_dir while the job runs (sooner when half of comm_ring_size records wait): what a SIGKILL can lose; SIGTERM, SIGINT and exit append the rest. 0 writes only at uninstall, exit and those signals.",
        bounds=Range(MIN_TRACE_WRITE_INTERVAL, MAX_INTERVAL, unit="seconds", off=0, above_low=True),
    )
    ring_size: int = setting(
        "comm_ring_size",
        65536,
        parse_int,
        "Collective records kept in memory per rank, and most records waiting for the next trace append; records that never reach the trace are counted.",
        bounds=Range(1, 1 << 20),
    )
    flush_interval: float = setting(
        "comm_flush_interval",
        1.0,
        parse_float,
        "Seconds between updates of the collective metrics, the in-flight view and the abnormal filter.",
        bounds=Range(MIN_INTERVAL, MAX_INTERVAL, unit="seconds"),
    )
    hang_floor: float = setting(
        "comm_hang_floor",
        float(HANG_FLOOR_S),
        parse_float,
        "The shortest wait in a collective (or stop outside them) that makes a rank stuck; its hang threshold is 3x its longest recent step, collective or checkpoint save, never under this (trainhealth_comm_hang_threshold_seconds, HungCollective, trainhealth analyze). "
        f"HungCollective never fires under the default, {HANG_FLOOR_S} s, whatever this is.",
        bounds=Range(MIN_INTERVAL, MAX_INTERVAL, unit="seconds"),
    )
    pause_limit: float = setting(
        "comm_pause_limit",
        1800.0,
        parse_float,
        "How long an announced pause (Monitor.pause: a checkpoint save, an evaluation) may last before any pause of its reason ended; later, 3x the longest earlier pause of that reason. Past its bound the rank is stuck in the pause (PauseOverrun) and the pause no longer holds the hang rules.",
        bounds=Range(MIN_INTERVAL, MAX_INTERVAL, unit="seconds"),
    )


@dataclass(frozen=True)
class DetectorSettings(SettingGroup):
    """The streaming detectors per signal; the grammar is parsed by trainhealth._internal.detectors.spec."""

    TITLE = "Detectors"

    spec: str = setting(
        "detectors",
        DEFAULT_DETECTORS,
        parse_str,
        "Detectors per signal (loss, grad_norm, step_time, throughput, comm_duration): signal=detector[(key=value,...)],...;... or off. See docs/detectors.md.",
    )
    warmup_steps: int = setting(
        "detector_warmup",
        20,
        parse_int,
        "Values of each signal (steps; collective flushes) that no detector sees at the start of a run: compilation, allocator and data-loader warm-up, connection set-up. The metrics are exported from the first step.",
        bounds=Range(0, _STEPS),
    )


@dataclass(frozen=True)
class ModelSettings(SettingGroup):
    """Model health: silent data corruption checks, instability signals, restarts."""

    TITLE = "Model health"

    sdc_interval: int = setting(
        "sdc_interval",
        100,
        parse_int,
        "Steps between cross-replica parameter fingerprints (needs torch.distributed); 0 turns them off.",
        bounds=Range(0, _STEPS),
    )
    grad_check_every: int = setting(
        "grad_check_every",
        10,
        parse_int,
        "Steps between comparisons of the ranks' local gradient norms before the all-reduce (needs torch.distributed); 0 turns them off.",
        bounds=Range(0, _STEPS),
    )
    sdc_timeout: float = setting(
        "sdc_timeout",
        60.0,
        parse_float,
        'Seconds a cross-replica check may wait for the other ranks; past it the checks are turned off on this rank and the failure counted in trainhealth_exporter_errors_total{source="sdc"}, never a hung job.',
        bounds=Range(1.0, 3600.0, unit="seconds"),
    )
    sdc_group: str = setting(
        "sdc_group",
        "world",
        parse_str,
        "Ranks that hold identical replicas, for the fingerprints: world (pure data parallelism) or off; other layouts pass sdc_group= a process group to Monitor.",
    )
    signals: bool = setting(
        "model_signals",
        True,
        parse_bool,
        "Hook the model for attention max logit and entropy, output log Z and block activation RMS (sampled every stats_every steps).",
    )
    provenance: bool = setting(
        "nan_provenance",
        True,
        parse_bool,
        "Hook the model for the origin of a non-finite or overflowing value that reached the loss or the gradients: every step one float32 sum of each block's output (the output head is judged by elimination, never read) and, when the process is one of several torch.distributed ranks, of each parameter's local gradient (whether this rank made the value or received it through the all-reduce). Cost: docs/benchmarks.md, 'What each default costs'.",
    )
    signal_tokens: int = setting(
        "signal_tokens",
        64,
        parse_int,
        "Tokens of the first sequence that the attention signals are recomputed on (their logits take tokens squared per head).",
        bounds=Range(1, 1024),
    )
    restarts: int | None = setting(
        "restarts",
        None,
        parse_int,
        "Times this job was restarted; default TORCHELASTIC_RESTART_COUNT, else 0.",
        bounds=Range(0, _STEPS),
    )

    def validate(self) -> None:
        if self.sdc_group not in ("world", "off"):
            raise self.error("sdc_group", f"must be world or off, got {self.sdc_group!r}")


@dataclass(frozen=True)
class GpuSettings(SettingGroup):
    """GPU hardware telemetry: backend, which GPUs, sampling, DCGM."""

    TITLE = "GPU telemetry"

    backend: str = setting(
        "gpu_backend",
        "nvml",
        parse_str,
        'Where GPU metrics come from: nvml, simulated (explicitly chosen, every series labelled backend="simulated") or off.',
    )
    gpus: str = setting(
        "gpus",
        "",
        parse_str,
        "GPUs to sample: own (the rank's GPU), all, or NVML indices like 0,2; default own in a training process, all in trainhealth export.",
    )
    sample_interval: float = setting(
        "gpu_sample_interval",
        5.0,
        parse_float,
        "Seconds between GPU sampling passes; a scrape never calls NVML.",
        bounds=Range(MIN_INTERVAL, MAX_INTERVAL, unit="seconds"),
    )
    simulated_gpus: int = setting(
        "simulated_gpus", 8, parse_int, "Number of GPUs the simulated backend has.", bounds=Range(1, 256)
    )
    dcgm: bool | None = setting(
        "dcgm",
        None,
        parse_bool,
        "Read DCGM profiling fields (SM, tensor, DRAM activity); default on in trainhealth export, off in a training process.",
    )
    dcgm_host: str = setting(
        "dcgm_host", "localhost", parse_str, "Address of nv-hostengine for the DCGM profiling fields."
    )
    dcgm_bindings: str | None = setting(
        "dcgm_bindings",
        None,
        parse_str,
        "Directory holding DCGM's Python bindings (pydcgm); default the datacenter-gpu-manager install paths.",
    )

    def validate(self) -> None:
        if self.backend not in GPU_BACKENDS:
            raise self.error("backend", f"must be one of {', '.join(GPU_BACKENDS)}, got {self.backend!r}")
        if not _valid_gpus(self.gpus):
            raise self.error("gpus", f"must be own, all or comma-separated GPU indices, got {self.gpus!r}")


def _valid_gpus(text: str) -> bool:
    text = text.strip()
    if text in ("", "own", "all"):
        return True
    parts = [part.strip() for part in text.split(",")]
    return all(part.isdigit() for part in parts)
