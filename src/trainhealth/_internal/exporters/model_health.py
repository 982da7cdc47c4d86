"""The Monitor's model health, as observers of each step (:class:`~trainhealth._internal.exporters.step_observer.StepObserver`).

* :class:`SignalWatch`: the model signals (attention max logit and entropy, output log Z,
  activation RMS) and the block where a non-finite or overflowing value first appeared, and
  whether this rank produced it or received it through the all-reduce;
* :class:`ReplicaCheckWatch`: the cross-replica checks (collectives, at the point every rank
  reaches together; see :mod:`trainhealth._internal.sdc.checks`);
* :class:`RecoveryWatch`: goodput, restarts, checkpoints, and whether a loss spike recovered (if
  not, the advice names the checkpoint to rewind to). It learns of a spike from the event log,
  where the loss detectors report it.

:class:`ModelHealth` builds the three for a Monitor with a model.
"""

from __future__ import annotations

import math
import os
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, cast

from trainhealth._internal import catalog
from trainhealth._internal.config import Settings
from trainhealth._internal.events import Event, EventLog, Severity
from trainhealth._internal.exporters.step_observer import StepObserver
from trainhealth._internal.exporters.step_records import StepStats
from trainhealth._internal.exporters.training.goodput import Checkpoint, Goodput
from trainhealth._internal.exporters.training.loss_recovery import LossSpikeRecovery, SpikeOutcome
from trainhealth._internal.exporters.training.model_signals import ModelSignals, SignalValues
from trainhealth._internal.exporters.training.provenance import BlockOrder, Stage, Where
from trainhealth._internal.knowledge.advice import rewind_advice
from trainhealth._internal.sdc.checks import ReplicaChecks
from trainhealth._internal.store import MetricStore

__all__ = ["ModelHealth", "RecoveryWatch", "ReplicaCheckWatch", "SignalWatch", "transformer_blocks"]


def transformer_blocks(torch: Any, model: Any) -> list[str]:
    """Names of the model's repeated blocks: the children of its longest ModuleList (else its children)."""
    longest: tuple[str, Any] | None = None
    for name, module in model.named_modules():
        if isinstance(module, torch.nn.ModuleList) and (longest is None or len(module) > len(longest[1])):
            longest = (name, module)
    if longest is not None and len(longest[1]) > 0:
        return [f"{longest[0]}.{i}" if longest[0] else str(i) for i in range(len(longest[1]))]
    return [name for name, _ in model.named_children()]


@dataclass(frozen=True)
class ModelHealth:
    """The model-health observers of one Monitor (``checks``: the cross-replica checks, when on)."""

    observers: tuple[StepObserver, ...]
    recovery: RecoveryWatch
    checks: ReplicaChecks | None

    @classmethod
    def build(
        cls,
        torch: Any,
        model: Any,
        settings: Settings,
        store: MetricStore,
        events: EventLog,
        *,
        start_time: float,
        sdc_group: Any = None,
        env: Mapping[str, str] | None = None,
    ) -> ModelHealth:
        """The observers ``settings`` turn on, for ``model``."""
        health = settings.model
        recovery = RecoveryWatch(store, events, start_time=start_time, restarts=health.restarts, env=env)
        observers: list[StepObserver] = [recovery]
        if health.signals or health.provenance:
            observers.append(SignalWatch(torch, model, settings, store, events))
        checks = None
        if health.sdc_group != "off" and (health.sdc_interval or health.grad_check_every):
            checks = ReplicaChecks(
                torch,
                model,
                store,
                events,
                sdc_interval=health.sdc_interval,
                grad_check_every=health.grad_check_every,
                group=sdc_group,
                timeout_s=health.sdc_timeout,
            )
            observers.append(ReplicaCheckWatch(checks))
        return cls(tuple(observers), recovery, checks)


class SignalWatch(StepObserver):
    """Model signals, sampled every ``stats_every`` steps, and NaN provenance on every step."""

    def __init__(self, torch: Any, model: Any, settings: Settings, store: MetricStore, events: EventLog) -> None:
        health = settings.model
        # local gradients are measured where an all-reduce could bring another rank's bad value (several ranks):
        # on one process they cost a read of every gradient per step (docs/benchmarks.md, "What each default
        # costs") and a bad one can only be local
        self.signals = ModelSignals(
            torch,
            model,
            transformer_blocks(torch, model),
            sample_tokens=health.signal_tokens,
            store=store,
            signals=health.signals,
            provenance=health.provenance,
            gradients=bool(ReplicaChecks.available(torch)),
        )
        self._store = store
        self._events = events
        self._stats_every = settings.training.stats_every
        self._order: dict[int, BlockOrder] = {}  # written on the training thread, taken on the export thread
        self._first_nonfinite: int | None = None
        self.signals.sampling = True  # step 0 takes the heavy statistics

    def device_values(self, index: int) -> list[tuple[str, Any, int]]:
        tensors, order = self.signals.take()
        if order.forward or order.gradients:
            self._order[index] = order
        return tensors

    def recorded(self, index: int) -> None:
        self.signals.sampling = (index + 1) % self._stats_every == 0

    def finished(self, index: int, stats: StepStats, read: Mapping[str, Any]) -> None:
        # a step without measured peaks (NaN provenance off, no forward) cannot say what was received
        values = ModelSignals.interpret(dict(read), self._order.pop(index, BlockOrder(complete=False)))
        self._publish_signals(stats.step, values)

    def close(self) -> None:
        self.signals.close()

    def _publish_signals(self, step: int, values: SignalValues) -> None:
        store = self._store
        for layer, value in values.attention_max_logit.items():
            if math.isfinite(value):
                store.set(catalog.MODEL_ATTENTION_MAX_LOGIT, value, (layer,))
        for layer, value in values.attention_entropy.items():
            if math.isfinite(value):
                store.set(catalog.MODEL_ATTENTION_ENTROPY, value, (layer,))
        for block, value in values.activation_rms.items():
            if math.isfinite(value):
                store.set(catalog.MODEL_ACTIVATION_RMS, value, (block,))
        if values.log_z is not None and math.isfinite(values.log_z):
            store.set(catalog.MODEL_OUTPUT_LOG_Z, values.log_z)
        origin = values.nonfinite_origin
        if origin is None:
            return
        store.inc(catalog.TRAIN_NONFINITE_ORIGIN, labels=(origin.block,))
        if self._first_nonfinite is not None:
            return
        self._first_nonfinite = step
        store.set(catalog.TRAIN_NONFINITE_FIRST_STEP, float(step), (origin.where.value,))
        if origin.stage is Stage.AFTER_BLOCKS:
            text = (
                f"first non-finite value at step {step} after the last block: the output head or the loss "
                "(every block output was finite), on this rank before the gradient all-reduce"
            )
        elif origin.where is Where.LOCAL:
            text = (
                f"first non-finite or overflowing value at step {step}, in the {origin.stage.value} of block "
                f"{origin.block}, on this rank before the gradient all-reduce"
            )
        else:
            text = (
                f"first non-finite or overflowing value at step {step}, received through the gradient "
                "all-reduce: another rank produced it"
            )
        self._events.emit(
            Event(
                "nonfinite_origin",
                Severity.CRITICAL,
                text,
                {"block": origin.block, "step": step, "where": origin.where.value, "stage": origin.stage.value},
            )
        )


class ReplicaCheckWatch(StepObserver):
    """The cross-replica checks due at each step, where every rank is at the same point."""

    source = "sdc"

    def __init__(self, checks: ReplicaChecks) -> None:
        self.checks = checks
        checks.arm(0)

    def lockstep(self, index: int, step: int) -> None:
        self.checks.after_step(index, step)

    def close(self) -> None:
        self.checks.close()


class RecoveryWatch(StepObserver):
    """Goodput, restarts and checkpoints, and whether a loss spike recovered."""

    def __init__(
        self,
        store: MetricStore,
        events: EventLog,
        *,
        start_time: float,
        restarts: int | None = None,
        env: Mapping[str, str] | None = None,
    ) -> None:
        self._store = store
        self._events = events
        self.goodput = Goodput(start=start_time)
        self.spikes = LossSpikeRecovery()
        self._lock = threading.Lock()  # checkpoints arrive on the training thread, steps on the export thread
        self._lost_published: dict[str, float] = {}
        self._spike_step: int | None = None  # the step at which a loss detector last opened an anomaly
        events.add_listener(self._loss_anomaly)
        if restarts is None:
            raw = (os.environ if env is None else env).get("TORCHELASTIC_RESTART_COUNT", "0")
            restarts = int(raw) if raw.isdigit() else 0
        store.set(catalog.TRAIN_RESTARTS, float(restarts))

    def checkpoint_saved(self, step: int, duration_s: float | None) -> Checkpoint:
        """A checkpoint of step ``step`` was saved (training thread)."""
        now = time.time()
        with self._lock:
            checkpoint = self.goodput.checkpoint_saved(step, now, duration_s)
        store = self._store
        store.inc(catalog.CHECKPOINT_SAVES)
        store.set(catalog.CHECKPOINT_LAST_STEP, float(step))
        store.set(catalog.CHECKPOINT_LAST_TIMESTAMP, now)
        if duration_s is not None:
            store.set(catalog.CHECKPOINT_LAST_DURATION, float(duration_s))
        return checkpoint

    def _loss_anomaly(self, event: Event) -> None:
        """A detector on the loss opened an anomaly (a NaN is the non-finite origin's, not a spike): listened
        to on the event log, before :meth:`finished` sees the step."""
        attributes = event.attributes
        if (
            event.name == "anomaly"
            and attributes.get("signal") == "loss"
            and not attributes.get("series")
            and attributes.get("detector") != "nonfinite"
            and isinstance(attributes.get("step"), int)
        ):
            with self._lock:
                self._spike_step = cast(int, attributes["step"])

    def finished(self, index: int, stats: StepStats, read: Mapping[str, Any]) -> None:
        step, loss = stats.step, stats.loss
        wall_time = time.time() if stats.wall_time is None else stats.wall_time
        with self._lock:
            self.goodput.step(step, wall_time)
            ratio, lost = self.goodput.ratio(wall_time), dict(self.goodput.lost)
        self._store.set(catalog.TRAIN_GOODPUT, ratio)
        for reason, seconds in lost.items():  # the counter follows Goodput's running totals
            self._store.inc(
                catalog.TRAIN_LOST_TIME, max(0.0, seconds - self._lost_published.get(reason, 0.0)), (reason,)
            )
            self._lost_published[reason] = seconds
        with self._lock:
            spike_began = self._spike_step == step
        if loss is not None:
            if spike_began:
                self.spikes.spike_began(step, loss)
            outcome = self.spikes.observe(step, loss)
            if outcome is not None:
                self._publish_spike(outcome)

    def _publish_spike(self, outcome: SpikeOutcome) -> None:
        store = self._store
        store.set(catalog.TRAIN_LOSS_SPIKE_UNRECOVERED, 0.0 if outcome.recovered else 1.0)
        store.set(catalog.TRAIN_LOSS_SPIKE_ONSET_STEP, float(outcome.onset_step))
        if outcome.recovered:
            return
        with self._lock:
            checkpoint = self.goodput.last_checkpoint_before(outcome.onset_step)
        if checkpoint is not None:
            store.set(catalog.TRAIN_LOSS_SPIKE_REWIND_STEP, float(checkpoint.step))
        advice = rewind_advice(outcome.onset_step, None if checkpoint is None else checkpoint.step)
        self._events.emit(
            Event(
                "loss_spike_unrecovered",
                Severity.CRITICAL,
                f"the loss spike that began at step {outcome.onset_step} has not recovered (loss {outcome.level:.4g}, "
                f"{outcome.baseline:.4g} before it). {advice}",
                {"onset_step": outcome.onset_step, "checkpoint_step": -1 if checkpoint is None else checkpoint.step},
            )
        )
