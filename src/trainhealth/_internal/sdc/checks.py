"""The Monitor's cross-replica checks: parameter fingerprints and local gradient norms, on a schedule.

Both are collectives on their own gloo group (never the training's), run on the
training thread at a point every rank reaches in lockstep: the optimizer step
when the Monitor hooks the optimizer, else ``Monitor.step`` (then every rank must
call it the same number of times, as a data-parallel loop does). A check that
waits more than ``sdc_timeout`` seconds for the other ranks fails, turns the
checks off on this rank and is counted in
``trainhealth_exporter_errors_total{source="sdc"}``: the job never hangs on them. A
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

from trainhealth._internal import catalog
from trainhealth._internal.events import Event, EventLog, Severity
from trainhealth._internal.sdc.fingerprint import FingerprintCheck
from trainhealth._internal.sdc.gradient_norms import UNKNOWN, LocalGradientNorm, compare, gather_norms
from trainhealth._internal.sdc.groups import host_group, release
from trainhealth._internal.store import MetricStore

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

    def __init__(
        self,
        torch: Any,
        model: Any,
        store: MetricStore,
        events: EventLog,
        *,
        sdc_interval: int,
        grad_check_every: int,
        group: Any = None,
        timeout_s: float = 60.0,
    ) -> None:
        self._torch = torch
        self._model = model
        self._store = store
        self._events = events
        self._fingerprint_every = sdc_interval
        self._grad_every = grad_check_every
        self._group = group
        self._owns_group = False  # True once the checks made their own group (host_group), freed at close
        self._timeout_s = timeout_s
        #: Why the checks stopped on this rank (a check failed or timed out), or None while they run.
        self.disabled: str | None = None
        self._fingerprints: FingerprintCheck | None = None
        self._parameters = [p for p in model.parameters() if p.requires_grad]
        # hooked on the backward pass once the job has replicas to compare: a one-process job pays nothing
        self._grad_norm: LocalGradientNorm | None = None
        self.results: list[ReplicaCheckResult] = []  # the last findings, newest last (bounded)
        self.arm(0)

    @staticmethod
    def available(torch: Any) -> bool:
        dist = torch.distributed
        return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1

    def arm(self, index: int) -> None:
        """Prepare for step ``index`` (the gradient hooks measure only on check steps)."""
        if not self._grad_every or self.disabled is not None:
            return
        if self._grad_norm is None:
            if not self.available(self._torch):
                return
            self._grad_norm = LocalGradientNorm(self._torch, self._parameters, self._store)
        self._grad_norm.armed = index % self._grad_every == 0

    def after_step(self, index: int, step: int) -> list[ReplicaCheckResult]:
        """Run the checks due at step ``index`` (the Monitor's count) and publish them; arm the next step."""
        results: list[ReplicaCheckResult] = []
        if self.disabled is not None or not self.available(self._torch):
            self.arm(index + 1)
            return results
        try:
            due_grad = bool(self._grad_every) and index % self._grad_every == 0
            due_fingerprint = bool(self._fingerprint_every) and index % self._fingerprint_every == 0
            if (due_grad or due_fingerprint) and self._group is None:
                self._group = host_group(self._timeout_s)
                self._owns_group = True
            if due_grad:
                results.append(self._check_grad_norm(step))
            if due_fingerprint:
                results.append(self._check_fingerprints(step))
        except Exception as exc:  # a rank that never came, a group that broke: stop checking, never hang
            self._disable(step, exc)
            results = []
        self.arm(index + 1)
        for result in results:
            self._publish(result)
        self.results = (self.results + results)[-64:]
        return results

    def close(self) -> None:
        if self._grad_norm is not None:
            self._grad_norm.close()
        if self._owns_group:
            release(self._group)
            self._group, self._owns_group = None, False

    def _disable(self, step: int, exc: Exception) -> None:
        self.disabled = f"{type(exc).__name__}: {exc}"
        self._store.record_error("sdc", exc)
        if self._grad_norm is not None:
            self._grad_norm.armed = False
        log.warning(
            "trainhealth: the cross-replica check at step %d failed (%s); the checks are off on this rank from now on",
            step,
            self.disabled.splitlines()[0],
        )

    # --- checks -------------------------------------------------------------------
    def _members(self) -> list[int]:
        dist = self._torch.distributed
        return (
            dist.get_process_group_ranks(self._group) if self._group is not None else list(range(dist.get_world_size()))
        )

    def _check_grad_norm(self, step: int) -> ReplicaCheckResult:
        mine = UNKNOWN if self._grad_norm is None else float(self._grad_norm.take())  # not hooked yet: unknown
        norms = gather_norms(self._torch, mine, self._group)  # every rank takes part, measured or not
        members = self._members()
        outliers = compare(norms)
        me = members.index(self._torch.distributed.get_rank())
        others = sorted(n for i, n in enumerate(norms) if i != me and math.isfinite(n) and n >= 0)
        median = others[len(others) // 2] if others else math.nan
        known = mine >= 0  # UNKNOWN: our own measurement failed, which is no finding
        ratio = mine / median if known and others and median > 0 else None
        return ReplicaCheckResult(
            GRAD_NORM,
            step,
            tuple(members[i] for i in outliers),
            local_grad_norm=mine if known else None,
            peer_ratio=ratio,
        )

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
            shown = ", ".join(result.tensors[:5]) + (
                f" and {len(result.tensors) - 5} more" if len(result.tensors) > 5 else ""
            )
            summary = (
                f"rank {rank}: parameters differ from the other replicas at step {result.step} ({shown}); "
                f"silent data corruption suspected"
            )
        elif result.local_grad_norm is None or not math.isfinite(result.local_grad_norm):
            summary = (
                f"rank {rank}: local gradient norm is not finite at step {result.step} (before the "
                f"all-reduce); silent data corruption or a numerical fault on this rank"
            )
        else:
            summary = (
                f"rank {rank}: local gradient norm {result.local_grad_norm:.4g} is "
                f"{result.peer_ratio or math.nan:.3g}x the other ranks' median at step {result.step}; "
                f"silent data corruption suspected"
            )
        self._events.emit(
            Event(
                "sdc_suspect",
                Severity.CRITICAL,
                summary,
                {"check": result.check, "rank": str(rank), "step": result.step, "tensors": ",".join(result.tensors)},
            )
        )
