"""The Monitor's cross-replica checks: parameter fingerprints and local gradient norms, on a schedule.

Both are collectives on a host (gloo) group, run on the training thread inside
``Monitor.step`` at the same step on every rank — every rank must call
``Monitor.step`` the same number of times, as a data-parallel loop does. A
fingerprint check every ``sdc_interval`` steps costs one small all-gather and
one pass over the parameters; a gradient-norm check every ``grad_check_every``
steps, one all-gather of a float. Findings become ``trainhealth_sdc_suspect``
and ``sdc_suspect`` events naming the rank and the tensors.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from typing import Any

from trainhealth import catalog
from trainhealth.events import Event, EventLog, Severity
from trainhealth.sdc.fingerprint import FingerprintCheck
from trainhealth.sdc.gradient_norms import LocalGradientNorm, compare
from trainhealth.sdc.groups import host_group
from trainhealth.store import MetricStore

__all__ = ["ReplicaCheckResult", "ReplicaChecks"]

log = logging.getLogger(__name__)

FINGERPRINT, GRAD_NORM = "fingerprint", "grad_norm"


@dataclass(frozen=True)
class ReplicaCheckResult:
    """One check at one step: the ranks in the minority, and for a fingerprint the tensors this rank differs in."""

    check: str
    step: int
    suspects: tuple[int, ...]
    tensors: tuple[str, ...] = ()
    local_grad_norm: float | None = None
    peer_ratio: float | None = None


class ReplicaChecks:
    """Schedules and runs the checks for one rank; ``group`` is the set of ranks holding identical replicas."""

    def __init__(self, torch: Any, model: Any, store: MetricStore, events: EventLog, *,
                 sdc_interval: int, grad_check_every: int, group: Any = None) -> None:
        self._torch = torch
        self._model = model
        self._store = store
        self._events = events
        self._fingerprint_every = sdc_interval
        self._grad_every = grad_check_every
        self._group = group
        self._fingerprints: FingerprintCheck | None = None
        parameters = [p for p in model.parameters() if p.requires_grad]
        self._grad_norm = LocalGradientNorm(torch, parameters) if grad_check_every else None
        self.results: list[ReplicaCheckResult] = []  # the last findings, newest last (bounded)
        self.arm(0)

    @staticmethod
    def available(torch: Any) -> bool:
        dist = torch.distributed
        return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1

    def arm(self, index: int) -> None:
        """Prepare for step ``index`` (the gradient hooks measure only on check steps)."""
        if self._grad_norm is not None:
            self._grad_norm.armed = index % self._grad_every == 0

    def after_step(self, index: int, step: int) -> list[ReplicaCheckResult]:
        """Run the checks due at step ``index`` (the Monitor's count) and publish them; arm the next step."""
        results: list[ReplicaCheckResult] = []
        if not self.available(self._torch):
            self.arm(index + 1)
            return results
        if self._group is None:
            self._group = host_group()
        if self._grad_norm is not None and index % self._grad_every == 0:
            results.append(self._check_grad_norm(step))
        if self._fingerprint_every and index % self._fingerprint_every == 0:
            results.append(self._check_fingerprints(step))
        self.arm(index + 1)
        for result in results:
            self._publish(result)
        self.results = (self.results + results)[-64:]
        return results

    def close(self) -> None:
        if self._grad_norm is not None:
            self._grad_norm.close()

    # --- checks -------------------------------------------------------------------
    def _members(self) -> list[int]:
        dist = self._torch.distributed
        return dist.get_process_group_ranks(self._group) if self._group is not None else list(
            range(dist.get_world_size()))

    def _check_grad_norm(self, step: int) -> ReplicaCheckResult:
        assert self._grad_norm is not None
        mine = float(self._grad_norm.take())
        norms = self._grad_norm.gather(mine, self._group)
        members = self._members()
        outliers = compare(norms)
        me = members.index(self._torch.distributed.get_rank())
        others = sorted(n for i, n in enumerate(norms) if i != me and math.isfinite(n))
        median = others[len(others) // 2] if others else math.nan
        ratio = mine / median if others and median > 0 else None
        return ReplicaCheckResult(GRAD_NORM, step, tuple(members[i] for i in outliers),
                           local_grad_norm=mine, peer_ratio=ratio)

    def _check_fingerprints(self, step: int) -> ReplicaCheckResult:
        if self._fingerprints is None:
            self._fingerprints = FingerprintCheck(self._model, self._group)
        mismatches = self._fingerprints.check()
        rank = self._torch.distributed.get_rank()
        mine = next((m.tensors for m in mismatches if m.rank == rank), ())
        return ReplicaCheckResult(FINGERPRINT, step, tuple(m.rank for m in mismatches), tensors=mine)

    # --- publishing ----------------------------------------------------------------
    def _publish(self, result: ReplicaCheckResult) -> None:
        store, labels = self._store, (result.check,)
        rank = self._torch.distributed.get_rank()
        suspect = rank in result.suspects
        store.inc(catalog.SDC_CHECKS, labels=labels)
        store.set(catalog.SDC_SUSPECT, 1.0 if suspect else 0.0, labels)
        if result.check == FINGERPRINT:
            store.set(catalog.SDC_MISMATCHED_TENSORS, float(len(result.tensors)))
        else:
            if result.local_grad_norm is not None and math.isfinite(result.local_grad_norm):
                store.set(catalog.TRAIN_LOCAL_GRAD_NORM, result.local_grad_norm)
            if result.peer_ratio is not None and math.isfinite(result.peer_ratio):
                store.set(catalog.TRAIN_LOCAL_GRAD_NORM_PEER_RATIO, result.peer_ratio)
        if not suspect:
            return
        store.inc(catalog.SDC_MISMATCHES, labels=labels)
        if result.check == FINGERPRINT:
            shown = ", ".join(result.tensors[:5]) + (f" and {len(result.tensors) - 5} more"
                                                     if len(result.tensors) > 5 else "")
            summary = (f"rank {rank}: parameters differ from the other replicas at step {result.step} ({shown}); "
                       f"silent data corruption suspected")
        elif result.local_grad_norm is None or not math.isfinite(result.local_grad_norm):
            summary = (f"rank {rank}: local gradient norm is not finite at step {result.step} (before the "
                       f"all-reduce); silent data corruption or a numerical fault on this rank")
        else:
            summary = (f"rank {rank}: local gradient norm {result.local_grad_norm:.4g} is "
                       f"{result.peer_ratio or math.nan:.3g}x the other ranks' median at step {result.step}; "
                       f"silent data corruption suspected")
        self._events.emit(Event("sdc_suspect", Severity.CRITICAL, summary,
                                {"check": result.check, "rank": str(rank), "step": result.step,
                                 "tensors": ",".join(result.tensors)}))
