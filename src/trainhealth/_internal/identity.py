"""Who a process is: job, host, rank, local rank, world size, GPU, pod.

Read from the variables torchrun, Slurm and Kubernetes set, with explicit
overrides from :class:`~trainhealth._internal.config.Settings` taking precedence; when
neither gives the rank (a process started by ``torch.multiprocessing.spawn``),
an initialised torch.distributed does. Every value is bounded (one per job,
node or rank), so all of them may be labels.

>>> env = {"RANK": "3", "LOCAL_RANK": "1", "WORLD_SIZE": "8", "TORCHELASTIC_RUN_ID": "llm-7b", "NODE_NAME": "gpu-node-2"}
>>> ident = Identity.from_env(env)
>>> ident.job, ident.host, ident.rank, ident.local_rank, ident.world_size
('llm-7b', 'gpu-node-2', 3, 1, 8)
>>> ident.labels
{'job': 'llm-7b', 'host': 'gpu-node-2', 'rank': '3'}
"""

from __future__ import annotations

import dataclasses
import os
import socket
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from typing import cast

from trainhealth._internal.catalog import IDENTITY_LABELS
from trainhealth._internal.config import ConfigError, Settings

__all__ = ["Identity", "configured_rank"]

DEFAULT_JOB = "trainhealth"


@dataclass(frozen=True)
class Identity:
    """The identity of one training process (or one node exporter, with rank 0)."""

    job: str
    host: str
    rank: int | None
    local_rank: int
    world_size: int
    gpu_uuid: str = ""
    pod: str = ""
    namespace: str = ""

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None, settings: Settings | None = None) -> Identity:
        """Identity from ``settings`` overrides, then torchrun / Slurm / Kubernetes variables."""
        env = os.environ if env is None else env
        settings = settings if settings is not None else Settings.resolve(env=env)
        in_kubernetes = "KUBERNETES_SERVICE_HOST" in env
        pod = env.get("POD_NAME") or (env.get("HOSTNAME", "") if in_kubernetes else "")
        rank = configured_rank(env, settings)
        overrides = settings.identity
        world_size = _pick_int(overrides.world_size, env, "world_size", ("WORLD_SIZE", "SLURM_NTASKS"), None)
        if rank is None or world_size is None:
            distributed = _torch_distributed()
            if distributed is not None:
                rank = distributed[0] if rank is None else rank
                world_size = distributed[1] if world_size is None else world_size
        identity = cls(
            job=overrides.job or _first(env, "TORCHELASTIC_RUN_ID", "SLURM_JOB_ID", skip=("none",)) or DEFAULT_JOB,
            host=overrides.host or _first(env, "NODE_NAME", "SLURMD_NODENAME") or socket.gethostname(),
            rank=0 if rank is None else rank,
            # an int default: never None
            local_rank=cast(
                int, _pick_int(overrides.local_rank, env, "local_rank", ("LOCAL_RANK", "SLURM_LOCALID"), 0)
            ),
            world_size=1 if world_size is None else world_size,
            gpu_uuid=overrides.gpu_uuid or "",
            pod=pod,
            namespace=env.get("POD_NAMESPACE", ""),
        )
        if identity.rank is not None and identity.rank >= identity.world_size:
            raise ConfigError("rank", f"rank {identity.rank} is not below world size {identity.world_size}")
        return identity

    @classmethod
    def node(cls, env: Mapping[str, str] | None = None, settings: Settings | None = None) -> Identity:
        """The identity of a per-node exporter: job and host, no rank (its ``rank`` label is empty)."""
        env = os.environ if env is None else env
        settings = settings if settings is not None else Settings.resolve(env=env)
        per_rank = cls.from_env({k: v for k, v in env.items() if k not in _RANK_VARIABLES}, settings)
        return dataclasses.replace(per_rank, rank=None, local_rank=0, world_size=1, gpu_uuid="")

    def with_gpu_uuid(self, gpu_uuid: str) -> Identity:
        return dataclasses.replace(self, gpu_uuid=gpu_uuid)

    @property
    def labels(self) -> dict[str, str]:
        """The identity labels every exported series carries."""
        values = {"job": self.job, "host": self.host, "rank": "" if self.rank is None else str(self.rank)}
        return {name: values[name] for name in IDENTITY_LABELS}

    @property
    def info_labels(self) -> dict[str, str]:
        """The extra labels of ``trainhealth_rank_info`` (the dcgm-exporter join keys)."""
        return {
            "local_rank": str(self.local_rank),
            "world_size": str(self.world_size),
            "gpu_uuid": self.gpu_uuid,
            "pod": self.pod,
            "namespace": self.namespace,
        }

    @property
    def resource_attributes(self) -> dict[str, str | int]:
        """OpenTelemetry resource attributes for this process."""
        attributes: dict[str, str | int] = {"host.name": self.host, "trainhealth.job": self.job}
        if self.rank is not None:
            attributes.update(
                {
                    "trainhealth.rank": self.rank,
                    "trainhealth.local_rank": self.local_rank,
                    "trainhealth.world_size": self.world_size,
                }
            )
        if self.gpu_uuid:
            attributes["hw.id"] = self.gpu_uuid
        if self.pod:
            attributes["k8s.pod.name"] = self.pod
        if self.namespace:
            attributes["k8s.namespace.name"] = self.namespace
        return attributes


def configured_rank(env: Mapping[str, str] | None = None, settings: Settings | None = None) -> int | None:
    """The rank the settings or the launcher's variables give (RANK, SLURM_PROCID); ``None`` when none does."""
    env = os.environ if env is None else env
    settings = settings if settings is not None else Settings.resolve(env=env)
    return _pick_int(settings.identity.rank, env, "rank", ("RANK", "SLURM_PROCID"), None)


def _torch_distributed() -> tuple[int, int] | None:
    """(rank, world size) of an initialised torch.distributed; ``None`` unless the process already imported it."""
    dist = sys.modules.get("torch.distributed")  # never imported here: ``import trainhealth`` stays torch-free
    if dist is None:
        return None
    try:
        if dist.is_available() and dist.is_initialized():
            return int(dist.get_rank()), int(dist.get_world_size())
    except Exception:  # a torch without distributed support, or a group being torn down
        return None
    return None


_RANK_VARIABLES = frozenset({"RANK", "LOCAL_RANK", "WORLD_SIZE", "SLURM_PROCID", "SLURM_LOCALID", "SLURM_NTASKS"})


def _first(env: Mapping[str, str], *names: str, skip: tuple[str, ...] = ()) -> str:
    for name in names:
        value = env.get(name, "").strip()
        if value and value not in skip:
            return value
    return ""


def _pick_int(
    override: int | None, env: Mapping[str, str], setting: str, names: tuple[str, ...], default: int | None
) -> int | None:
    if override is not None:
        return override
    for name in names:
        raw = env.get(name, "").strip()
        if raw:
            try:
                return int(raw)
            except ValueError:
                raise ConfigError(setting, f"{name}={raw!r} in the environment is not an integer") from None
    return default
