"""Typed settings: explicit argument > ``TRAINHEALTH_*`` environment variable > default.

Every setting has one environment variable, ``TRAINHEALTH_`` + its name in
capitals; docs/configuration.md is generated from the declarations below. A bad
value raises :class:`ConfigError` at construction, naming the setting.

>>> s = Settings.resolve(env={"TRAINHEALTH_STATS_EVERY": "5"}, prometheus=False)
>>> s.stats_every, s.prometheus
(5, False)
>>> Settings.resolve(env={"TRAINHEALTH_PROMETHEUS_PORT": "http"})
Traceback (most recent call last):
...
trainhealth.config.ConfigError: prometheus_port (TRAINHEALTH_PROMETHEUS_PORT): expected an integer, got 'http'
"""

from __future__ import annotations

import dataclasses
import math
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

__all__ = ["ConfigError", "Settings", "SettingInfo", "ENV_PREFIX", "setting_infos"]

ENV_PREFIX = "TRAINHEALTH_"
#: The default ``detectors`` setting (syntax in trainhealth.detectors.spec).
DEFAULT_DETECTORS = (
    "loss=zscore(direction=up),spike,nonfinite;"
    "grad_norm=zscore(direction=up),spike,nonfinite;"
    "step_time=delta,level_shift(direction=up);"
    "throughput=level_shift(direction=down);"
    "comm_duration=level_shift(direction=up)"
)
DEFAULT_PROMETHEUS_PORT_BASE = 9450
#: The shortest ``trace_write_interval`` (seconds) other than 0: rewriting a trace more often only burns the flush thread.
MIN_TRACE_WRITE_INTERVAL = 0.05


class ConfigError(ValueError):
    """A setting has an invalid value. The message starts with the setting's name."""

    def __init__(self, setting: str, problem: str) -> None:
        self.setting = setting
        super().__init__(f"{setting} ({env_name(setting)}): {problem}")


def env_name(setting: str) -> str:
    return ENV_PREFIX + setting.upper()


def _parse_bool(text: str) -> bool:
    lowered = text.strip().lower()
    if lowered in {"1", "true", "yes", "on"}:
        return True
    if lowered in {"0", "false", "no", "off"}:
        return False
    raise ValueError(f"expected true or false, got {text!r}")


def _parse_int(text: str) -> int:
    try:
        return int(text.strip())
    except ValueError:
        raise ValueError(f"expected an integer, got {text!r}") from None


def _parse_float(text: str) -> float:
    try:
        return float(text.strip())
    except ValueError:
        raise ValueError(f"expected a number, got {text!r}") from None


def _parse_str(text: str) -> str:
    return text


_TYPE_NAMES = {_parse_bool: "bool", _parse_int: "int", _parse_float: "float", _parse_str: "str"}


def _setting(default: Any, parse: Callable[[str], Any], help: str, *, secret: bool = False) -> Any:
    return field(default=default, repr=not secret, metadata={"parse": parse, "help": help, "secret": secret})


@dataclass(frozen=True)
class Settings:
    """All trainhealth settings. Build with :meth:`resolve` to read the environment."""

    # identity overrides (see trainhealth.identity for what is read when unset)
    job: str | None = _setting(None, _parse_str, "Training job name; default TORCHELASTIC_RUN_ID, SLURM_JOB_ID or 'trainhealth'.")
    host: str | None = _setting(None, _parse_str, "Host label; default NODE_NAME (Kubernetes downward API) or the host name.")
    rank: int | None = _setting(None, _parse_int, "Global rank; default RANK or SLURM_PROCID, else torch.distributed's rank once it is initialised, else 0.")
    local_rank: int | None = _setting(None, _parse_int, "Rank on this host; default LOCAL_RANK or SLURM_LOCALID, else 0.")
    world_size: int | None = _setting(None, _parse_int, "Number of ranks; default WORLD_SIZE or SLURM_NTASKS, else torch.distributed's world size once it is initialised, else 1.")
    gpu_uuid: str | None = _setting(None, _parse_str, "UUID of this rank's GPU (GPU-...); default read from CUDA when the model is on a GPU.")
    # Prometheus endpoint
    prometheus: bool = _setting(True, _parse_bool, "Serve /metrics over HTTP.")
    prometheus_addr: str = _setting("0.0.0.0", _parse_str, "Address the /metrics server binds to.")
    prometheus_port: int | None = _setting(None, _parse_int, f"Port of the /metrics server; default {DEFAULT_PROMETHEUS_PORT_BASE} + local_rank; 0 picks a free port.")
    tls_certfile: str | None = _setting(None, _parse_str, "PEM certificate: serve /metrics over HTTPS.")
    tls_keyfile: str | None = _setting(None, _parse_str, "PEM private key of tls_certfile.")
    tls_client_cafile: str | None = _setting(None, _parse_str, "CA bundle: require client certificates signed by it (mTLS).")
    basic_auth_username: str | None = _setting(None, _parse_str, "Require HTTP basic auth with this user name.")
    basic_auth_password: str | None = _setting(None, _parse_str, "Password for basic auth.", secret=True)
    basic_auth_password_file: str | None = _setting(None, _parse_str, "File holding the basic-auth password (instead of basic_auth_password).")
    # OpenTelemetry
    otel: bool | None = _setting(None, _parse_bool, "Push metrics over OTLP/HTTP; default on when OTEL_EXPORTER_OTLP_ENDPOINT or OTEL_EXPORTER_OTLP_METRICS_ENDPOINT is set. Endpoint, interval, resource and service name come from the standard OTEL_* variables.")
    # training-loop statistics
    stats_every: int = _setting(20, _parse_int, "Steps between the heavier statistics: per-layer norms, update ratio, update cosine.")
    max_layer_groups: int = _setting(64, _parse_int, "Most layer groups reported; numbered blocks are merged into ranges beyond it.")
    flops_per_token: float | None = _setting(None, _parse_float, "Training FLOPs per token (forward and backward, e.g. 6 x parameters); enables MFU.")
    peak_flops: float | None = _setting(None, _parse_float, "Peak FLOP/s of this rank's device for the training dtype; enables MFU.")
    max_series_per_metric: int = _setting(1000, _parse_int, "Most label sets kept per metric; more are dropped and counted as errors.")
    # collective operations
    comm: bool = _setting(False, _parse_bool, "Record torch.distributed collectives in the Monitor (trainhealth.comm.install).")
    trace_dir: str | None = _setting(None, _parse_str, "Directory for per-rank collective traces (rank-<rank>.parquet, trace format v1), written at uninstall and exit.")
    trace_write_interval: float = _setting(30.0, _parse_float, "Seconds between rewrites of the trace in trace_dir while the job runs (each replaces the file whole, for a live analyzer); 0 writes it only at uninstall and exit.")
    comm_ring_size: int = _setting(65536, _parse_int, "Collective records kept in memory per rank; older ones are dropped (and counted).")
    comm_flush_interval: float = _setting(1.0, _parse_float, "Seconds between updates of the collective metrics, the in-flight view and the abnormal filter.")
    # detectors
    detectors: str = _setting(DEFAULT_DETECTORS, _parse_str, "Detectors per signal (loss, grad_norm, step_time, throughput, comm_duration): signal=detector[(key=value,...)],...;... or off. See docs/detectors.md.")
    # silent data corruption, instability signals, faults
    sdc_interval: int = _setting(100, _parse_int, "Steps between cross-replica parameter fingerprints (needs torch.distributed); 0 turns them off.")
    grad_check_every: int = _setting(10, _parse_int, "Steps between comparisons of the ranks' local gradient norms before the all-reduce (needs torch.distributed); 0 turns them off.")
    sdc_group: str = _setting("world", _parse_str, "Ranks that hold identical replicas, for the fingerprints: world (pure data parallelism) or off; other layouts pass sdc_group= a process group to Monitor.")
    model_signals: bool = _setting(True, _parse_bool, "Hook the model for attention max logit and entropy, output log Z, block activation RMS and the origin of non-finite activations.")
    signal_tokens: int = _setting(64, _parse_int, "Tokens of the first sequence that the attention signals are recomputed on.")
    restarts: int | None = _setting(None, _parse_int, "Times this job was restarted; default TORCHELASTIC_RESTART_COUNT, else 0.")
    # GPU hardware telemetry
    gpu_backend: str = _setting("nvml", _parse_str, "Where GPU metrics come from: nvml, simulated (explicitly chosen, every series labelled backend=\"simulated\") or off.")
    gpus: str = _setting("", _parse_str, "GPUs to sample: own (the rank's GPU), all, or NVML indices like 0,2; default own in a training process, all in trainhealth export.")
    gpu_sample_interval: float = _setting(5.0, _parse_float, "Seconds between GPU sampling passes; a scrape never calls NVML.")
    simulated_gpus: int = _setting(8, _parse_int, "Number of GPUs the simulated backend has.")
    dcgm: bool | None = _setting(None, _parse_bool, "Read DCGM profiling fields (SM, tensor, DRAM activity); default on in trainhealth export, off in a training process.")
    dcgm_host: str = _setting("localhost", _parse_str, "Address of nv-hostengine for the DCGM profiling fields.")
    dcgm_bindings: str | None = _setting(None, _parse_str, "Directory holding DCGM's Python bindings (pydcgm); default the datacenter-gpu-manager install paths.")

    def __post_init__(self) -> None:
        for spec in dataclasses.fields(self):
            _check_type(self, spec)
        _check_range(self, "rank", 0)
        _check_range(self, "local_rank", 0)
        _check_range(self, "world_size", 1)
        _check_range(self, "prometheus_port", 0, 65535)
        _check_range(self, "stats_every", 1)
        _check_range(self, "max_layer_groups", 1)
        _check_range(self, "max_series_per_metric", 1)
        _check_range(self, "simulated_gpus", 1)
        _check_range(self, "comm_ring_size", 1)
        _check_range(self, "sdc_interval", 0)
        _check_range(self, "grad_check_every", 0)
        _check_range(self, "signal_tokens", 1)
        _check_range(self, "restarts", 0)
        if self.sdc_group not in ("world", "off"):
            raise ConfigError("sdc_group", f"must be world or off, got {self.sdc_group!r}")
        if self.gpu_backend not in GPU_BACKENDS:
            raise ConfigError("gpu_backend", f"must be one of {', '.join(GPU_BACKENDS)}, got {self.gpu_backend!r}")
        if not _valid_gpus(self.gpus):
            raise ConfigError("gpus", f"must be own, all or comma-separated GPU indices, got {self.gpus!r}")
        for name in ("flops_per_token", "peak_flops", "gpu_sample_interval", "comm_flush_interval"):
            value = getattr(self, name)
            if value is not None and not value > 0:
                raise ConfigError(name, f"must be a positive number, got {value!r}")
        if not math.isfinite(self.trace_write_interval):
            raise ConfigError("trace_write_interval", f"must be a finite number of seconds, got {self.trace_write_interval!r}")
        if self.trace_write_interval != 0 and not self.trace_write_interval > MIN_TRACE_WRITE_INTERVAL:
            raise ConfigError("trace_write_interval", f"must be 0 (write only at exit) or more than "
                                                      f"{MIN_TRACE_WRITE_INTERVAL} s, got {self.trace_write_interval!r}")
        if self.rank is not None and self.world_size is not None and self.rank >= self.world_size:
            raise ConfigError("rank", f"{self.rank} is not below world_size {self.world_size}")
        if (self.tls_certfile is None) != (self.tls_keyfile is None):
            missing = "tls_keyfile" if self.tls_keyfile is None else "tls_certfile"
            raise ConfigError(missing, "tls_certfile and tls_keyfile are set together")
        if self.tls_client_cafile is not None and self.tls_certfile is None:
            raise ConfigError("tls_client_cafile", "client certificates need TLS: set tls_certfile and tls_keyfile")
        for name in ("tls_certfile", "tls_keyfile", "tls_client_cafile", "basic_auth_password_file"):
            path = getattr(self, name)
            if path is not None and not os.path.isfile(path):
                raise ConfigError(name, f"no such file: {path}")
        if self.basic_auth_password is not None and self.basic_auth_password_file is not None:
            raise ConfigError("basic_auth_password_file", "set basic_auth_password or basic_auth_password_file, not both")
        has_password = self.basic_auth_password is not None or self.basic_auth_password_file is not None
        if (self.basic_auth_username is None) == has_password:
            missing = "basic_auth_password" if self.basic_auth_username is not None else "basic_auth_username"
            raise ConfigError(missing, "basic auth needs both a user name and a password")
        if self.basic_auth_password == "":
            raise ConfigError("basic_auth_password", "must not be empty")

    @classmethod
    def resolve(cls, env: Mapping[str, str] | None = None, **explicit: Any) -> Settings:
        """Settings from explicit values (``None`` means unset), then ``env``, then defaults.

        ``env`` defaults to ``os.environ``. Unknown names raise :class:`ConfigError`.
        """
        env = os.environ if env is None else env
        _check_names(explicit)
        known = {f.name: f for f in dataclasses.fields(cls)}
        values: dict[str, Any] = {}
        for name, spec in known.items():
            if explicit.get(name) is not None:
                values[name] = explicit[name]
                continue
            raw = env.get(env_name(name))
            if raw is None or raw == "":
                continue
            try:
                values[name] = spec.metadata["parse"](raw)
            except ValueError as exc:
                raise ConfigError(name, str(exc)) from None
        return cls(**values)

    def replace(self, **changes: Any) -> Settings:
        """A copy with ``changes`` applied and validated; unknown names raise :class:`ConfigError`."""
        _check_names(changes)
        return dataclasses.replace(self, **changes)

    def metrics_port(self, local_rank: int) -> int:
        """The /metrics port of the process with ``local_rank``: 9450 + local rank unless set."""
        if self.prometheus_port is not None:
            return self.prometheus_port
        return DEFAULT_PROMETHEUS_PORT_BASE + local_rank

    def otel_enabled(self, env: Mapping[str, str] | None = None) -> bool:
        if self.otel is not None:
            return self.otel
        env = os.environ if env is None else env
        return bool(env.get("OTEL_EXPORTER_OTLP_ENDPOINT") or env.get("OTEL_EXPORTER_OTLP_METRICS_ENDPOINT"))

    def read_basic_auth_password(self) -> str | None:
        """The basic-auth password, read from its file when configured that way."""
        if self.basic_auth_password_file is None:
            return self.basic_auth_password
        with open(self.basic_auth_password_file, encoding="utf-8") as handle:
            password = handle.read().rstrip("\r\n")
        if not password:
            raise ConfigError("basic_auth_password_file", f"{self.basic_auth_password_file} is empty")
        return password


GPU_BACKENDS = ("nvml", "simulated", "off")


def _valid_gpus(text: str) -> bool:
    text = text.strip()
    if text in ("", "own", "all"):
        return True
    parts = [part.strip() for part in text.split(",")]
    return all(part.isdigit() for part in parts)


def _check_names(values: Mapping[str, Any]) -> None:
    known = {f.name for f in dataclasses.fields(Settings)}
    for name in values:
        if name not in known:
            raise ConfigError(name, f"unknown setting; known settings: {', '.join(sorted(known))}")


def _check_type(settings: Settings, spec: dataclasses.Field) -> None:
    value = getattr(settings, spec.name)
    if value is None:
        return
    kind = _TYPE_NAMES[spec.metadata["parse"]]
    if kind == "float" and isinstance(value, int) and not isinstance(value, bool):
        object.__setattr__(settings, spec.name, float(value))
        return
    expected = {"bool": bool, "int": int, "float": float, "str": str}[kind]
    if not isinstance(value, expected) or (kind == "int" and isinstance(value, bool)):
        raise ConfigError(spec.name, f"expected {_ARTICLES[kind]}, got {value!r}")


_ARTICLES = {"bool": "true or false", "int": "an integer", "float": "a number", "str": "a string"}


def _check_range(settings: Settings, name: str, low: int, high: int | None = None) -> None:
    value = getattr(settings, name)
    if value is None:
        return
    if value < low or (high is not None and value > high):
        bound = f"{low}..{high}" if high is not None else f">= {low}"
        raise ConfigError(name, f"must be {bound}, got {value}")


@dataclass(frozen=True)
class SettingInfo:
    """Documentation of one setting, for docs/configuration.md and ``trainhealth config``."""

    name: str
    env: str
    type: str
    default: Any
    help: str
    secret: bool


def setting_infos() -> tuple[SettingInfo, ...]:
    return tuple(
        SettingInfo(
            name=f.name,
            env=env_name(f.name),
            type=_TYPE_NAMES[f.metadata["parse"]],
            default=f.default,
            help=f.metadata["help"],
            secret=f.metadata["secret"],
        )
        for f in dataclasses.fields(Settings)
    )
