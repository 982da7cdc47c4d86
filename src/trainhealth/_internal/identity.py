"""Who a process is: job, host, rank, local rank, world size, GPU, pod.

Read from the variables torchrun, Slurm and Kubernetes set, with explicit
overrides from :class:`~trainhealth._internal.config.Settings` taking precedence; when
neither gives the rank (a process started by ``torch.multiprocessing.spawn``),
an initialised torch.distributed does. Every value is bounded (one per job,
node or rank), so all of them may be labels.

**The job label is the run's own id**: the same on every rank of one run, different for every other run,
so one Prometheus can hold many jobs and every rule, panel and analyzer comparison stays inside one of them.
It is the first of (:func:`run_id`):

1. the ``run_id`` setting (``TRAINHEALTH_RUN_ID``), for launchers trainhealth does not know;
2. torchrun's ``TORCHELASTIC_RUN_ID`` (its ``--rdzv-id``), unless it is torchrun's default ``none``, which
   every torchrun without ``--rdzv-id`` shares (``--standalone`` draws a fresh one);
3. Kubernetes, from variables the pod maps from its own labels and annotations with the downward API
   (neither operator sets them as variables itself):

   * a JobSet (and a Kubeflow Trainer ``TrainJob``, which runs as a JobSet of its name):
     ``JOBSET_NAME`` from the pod label ``jobset.sigs.k8s.io/jobset-name`` and ``JOBSET_RESTART_ATTEMPT``
     from the annotation ``jobset.sigs.k8s.io/restart-attempt`` (JobSet puts both on every pod it
     creates: https://github.com/kubernetes-sigs/jobset, ``api/jobset/v1alpha2/jobset_types.go`` and
     ``pkg/constants/constants.go``; the convention of those variable names is Flyte's and Metaflow's);
   * a Kubeflow ``PyTorchJob`` (training-operator v1): ``PYTORCHJOB_NAME`` from the pod label
     ``training.kubeflow.org/job-name`` (https://www.kubeflow.org/docs/components/trainer/legacy-v1/
     user-guides/pytorch/; the operator's own variables are ``MASTER_ADDR``, ``MASTER_PORT``, ``WORLD_SIZE``,
     ``RANK`` and, with an elastic policy, the ``PET_*`` torchrun options, ``PET_RDZV_ID`` among them, which
     torchrun turns into ``TORCHELASTIC_RUN_ID``: item 2);

   each as ``<namespace>/<name>/<restart>`` (``POD_NAMESPACE``; the restart where there is one). A JobSet
   or PyTorchJob deleted and created again under the same name gets the same label: set ``run_id`` there;
4. Slurm: ``SLURM_JOB_ID``, with ``/<SLURM_RESTART_COUNT>`` once the job was requeued;
5. none of these: an id the ranks agree on through torch.distributed's rendezvous store once the process
   group exists (:func:`agree_on_run_id`; the Monitor does it before its first export), or, in a process
   that is not one of several ranks, a fresh id of its own.

The logical name, which users give every run of a job alike (the ``job`` setting, ``TRAINHEALTH_JOB``;
default the JobSet, PyTorchJob or Slurm job name), is ``job_name``: a label of ``trainhealth_rank_info``
only, never the job label, so two runs of ``llm-7b`` never share a job label.

>>> env = {"RANK": "3", "LOCAL_RANK": "1", "WORLD_SIZE": "8", "TORCHELASTIC_RUN_ID": "llm-7b-0412", "NODE_NAME": "gpu-node-2"}
>>> ident = Identity.from_env(env)
>>> ident.job, ident.host, ident.rank, ident.local_rank, ident.world_size
('llm-7b-0412', 'gpu-node-2', 3, 1, 8)
>>> ident.labels
{'job': 'llm-7b-0412', 'host': 'gpu-node-2', 'rank': '3'}
>>> Identity.from_env({"SLURM_JOB_ID": "41234", "SLURM_RESTART_COUNT": "2", "SLURM_JOB_NAME": "llm-7b"}).job
'41234/2'
>>> Identity.from_env({"TORCHELASTIC_RUN_ID": "none", "WORLD_SIZE": "2", "TRAINHEALTH_JOB": "llm-7b"}).pending
True
"""

from __future__ import annotations

import dataclasses
import logging
import os
import socket
import sys
import threading
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, cast

from trainhealth._internal.catalog import IDENTITY_LABELS
from trainhealth._internal.config import ConfigError, Settings

__all__ = [
    "AGREE_TIMEOUT_S",
    "NODE_JOB",
    "RUN_ID_KEY",
    "Identity",
    "RunIdentity",
    "agree_on_run_id",
    "configured_rank",
    "job_name",
    "new_run_id",
    "run_id",
]

log = logging.getLogger(__name__)

#: The job label of a per-node exporter or an analyzer outside any run (a service, not a run): its series are
#: keyed by host, and the analyzer's verdicts carry the label of the job they judge.
NODE_JOB = "trainhealth"
#: The key of the agreed run id in torch.distributed's default store (a per-attempt prefix under torchrun).
RUN_ID_KEY = "trainhealth/run_id"
#: The longest a rank waits for rank 0's id, where the store cannot compare-and-set.
AGREE_TIMEOUT_S = 30.0


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
    #: the job's logical name, the same for every run of it: ``trainhealth_rank_info``'s ``job_name`` label
    job_name: str = ""

    @property
    def pending(self) -> bool:
        """Whether the job label waits for torch.distributed (:class:`RunIdentity` fixes it)."""
        return not self.job

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None, settings: Settings | None = None) -> Identity:
        """Identity from ``settings`` overrides, then torchrun / Slurm / Kubernetes variables; its job label is
        empty (:attr:`pending`) where none gives the run's id. Reads no store and draws no id."""
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
            job=run_id(env, settings),
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
            job_name=job_name(env, settings),
        )
        if identity.rank is not None and identity.rank >= identity.world_size:
            raise ConfigError("rank", f"rank {identity.rank} is not below world size {identity.world_size}")
        return identity

    @classmethod
    def node(cls, env: Mapping[str, str] | None = None, settings: Settings | None = None) -> Identity:
        """The identity of a per-node exporter (or the analyzer): job and host, no rank (its ``rank`` label is
        empty). Its job label is the run's id where the environment gives one (a node exporter inside a Slurm
        allocation), else :data:`NODE_JOB`: a service, not a run."""
        env = os.environ if env is None else env
        settings = settings if settings is not None else Settings.resolve(env=env)
        per_rank = cls.from_env({k: v for k, v in env.items() if k not in _RANK_VARIABLES}, settings)
        return dataclasses.replace(
            per_rank, job=per_rank.job or NODE_JOB, rank=None, local_rank=0, world_size=1, gpu_uuid=""
        )

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
            "job_name": self.job_name,
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
        if self.job_name:
            attributes["trainhealth.job_name"] = self.job_name
        return attributes


def configured_rank(env: Mapping[str, str] | None = None, settings: Settings | None = None) -> int | None:
    """The rank the settings or the launcher's variables give (RANK, SLURM_PROCID); ``None`` when none does."""
    env = os.environ if env is None else env
    settings = settings if settings is not None else Settings.resolve(env=env)
    return _pick_int(settings.identity.rank, env, "rank", ("RANK", "SLURM_PROCID"), None)


def run_id(env: Mapping[str, str] | None = None, settings: Settings | None = None) -> str:
    """The run's own id from the settings and the launcher's variables (the module's order); "" when none
    gives one (the ranks then agree on one: :func:`agree_on_run_id`)."""
    env = os.environ if env is None else env
    settings = settings if settings is not None else Settings.resolve(env=env)
    if settings.identity.run_id:
        return settings.identity.run_id
    torchrun = _first(env, "TORCHELASTIC_RUN_ID", skip=("none",))
    if torchrun:
        return torchrun
    kubernetes = _first(env, "JOBSET_NAME", "PYTORCHJOB_NAME")
    if kubernetes:
        restart = env.get("JOBSET_RESTART_ATTEMPT", "").strip() if env.get("JOBSET_NAME", "").strip() else ""
        return "/".join(part for part in (env.get("POD_NAMESPACE", "").strip(), kubernetes, restart) if part)
    slurm = _first(env, "SLURM_JOB_ID")
    if slurm:
        restart = env.get("SLURM_RESTART_COUNT", "").strip()
        return f"{slurm}/{restart}" if restart else slurm
    return ""


def job_name(env: Mapping[str, str] | None = None, settings: Settings | None = None) -> str:
    """The job's logical name: the ``job`` setting, else the JobSet, PyTorchJob or Slurm job name, else ""."""
    env = os.environ if env is None else env
    settings = settings if settings is not None else Settings.resolve(env=env)
    return settings.identity.job or _first(env, "JOBSET_NAME", "PYTORCHJOB_NAME", "SLURM_JOB_NAME")


def new_run_id() -> str:
    """A fresh run id: 12 hex digits (48 random bits)."""
    return uuid.uuid4().hex[:12]


def agree_on_run_id(dist: Any, timeout_s: float = AGREE_TIMEOUT_S) -> str:
    """The run id every rank of torch.distributed's initialised default group agrees on, through the group's
    rendezvous store (no collective): the first rank to ask puts a fresh id under :data:`RUN_ID_KEY` with an
    atomic compare-and-set and every later one reads it, so no rank waits for another. A store without
    compare-and-set: rank 0 sets the id and the others wait for it up to ``timeout_s`` seconds. Under torchrun
    the store's keys are per restart attempt, so every attempt gets an id of its own.

    Raises what the store raises (a timeout, a closed store): the caller logs and counts it.
    """
    store = dist.distributed_c10d._get_default_store()
    fresh = new_run_id()
    try:
        value = store.compare_set(RUN_ID_KEY, "", fresh)
    except (NotImplementedError, AttributeError, RuntimeError):  # a store of another kind
        if dist.get_rank() == 0:
            store.set(RUN_ID_KEY, fresh)
            value = fresh
        else:
            store.wait([RUN_ID_KEY], timedelta(seconds=timeout_s))
            value = store.get(RUN_ID_KEY)
    return value.decode() if isinstance(value, bytes) else str(value)


class RunIdentity:
    """A process's identity whose job label may wait for torch.distributed.

    :meth:`current` returns the identity to export with, or ``None`` while the label is pending; each call
    while pending tries to fix it: through the default group's store once torch.distributed is initialised
    (:func:`agree_on_run_id`), or, with ``final`` (the training loop has stepped without torch.distributed)
    or in a process that is not one of several ranks, as a run of its own (:func:`new_run_id`). The label is
    fixed once, logged once, and ``on_fixed`` is called with the identity. Never raises: a store that fails
    is logged, counted through ``on_error`` and the process takes an id of its own.

    >>> run = RunIdentity(Identity("", "node-a", 1, 1, 2))
    >>> run.current() is None  # one of two ranks, torch.distributed not initialised yet
    True
    >>> len(run.current(final=True).job)  # the loop stepped without it: a run of its own
    12
    """

    def __init__(
        self,
        identity: Identity,
        on_fixed: Callable[[Identity], None] | None = None,
        on_error: Callable[[BaseException], None] | None = None,
    ) -> None:
        self._identity = identity
        self._on_fixed = on_fixed
        self._on_error = on_error
        self._lock = threading.Lock()

    @property
    def identity(self) -> Identity:
        """The identity as it stands (its job label empty while pending)."""
        return self._identity

    def replace(self, **changes: Any) -> Identity:
        """Change fields other than the job label (a GPU UUID found later); returns the identity."""
        with self._lock:
            self._identity = dataclasses.replace(self._identity, **changes)
            return self._identity

    def current(self, final: bool = False) -> Identity | None:
        """The identity to export with, its job label fixed now if it can be; ``None`` while it cannot."""
        identity = self._identity
        if not identity.pending:
            return identity
        with self._lock:
            if not self._identity.pending:
                return self._identity
            job, how, announce = self._agree(final)
            if not job:
                return None
            self._identity = dataclasses.replace(self._identity, job=job)
            identity = self._identity
        if announce:
            log.info("trainhealth: job label %s (%s; TRAINHEALTH_RUN_ID sets it)", job, how)
        if self._on_fixed is not None:
            try:
                self._on_fixed(identity)
            except Exception as exc:  # on the training or the scrape path: logged, counted, dropped
                log.warning("trainhealth: after fixing the job label: %s", exc)
                if self._on_error is not None:
                    self._on_error(exc)
        return identity

    def _agree(self, final: bool) -> tuple[str, str, bool]:
        """(job label or "" while pending, how it was found, whether this process logs it: rank 0 for a run)."""
        dist = sys.modules.get("torch.distributed")
        try:
            initialised = dist is not None and dist.is_available() and dist.is_initialized()
        except Exception:
            initialised = False
        if dist is not None and initialised:
            try:
                return agree_on_run_id(dist), "agreed through torch.distributed's store", dist.get_rank() == 0
            except Exception as exc:
                log.warning(
                    "trainhealth: the ranks could not agree on a run id through torch.distributed's store (%s); "
                    "this rank takes one of its own: set TRAINHEALTH_RUN_ID to one id for every rank",
                    exc,
                )
                if self._on_error is not None:
                    self._on_error(exc)
                return new_run_id(), "this rank's own: the store failed", True
        if final or self._identity.world_size <= 1:
            return new_run_id(), "a run of one process", True
        return "", "", False


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
