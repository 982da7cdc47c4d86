"""The Monitor's per-step path: from ``optimizer.step()`` and :meth:`~trainhealth.Monitor.step` to the metrics.

The optimizer hooks take the gradient norms (and, every ``stats_every`` steps, the
per-layer norms and the update); :meth:`StepRecorder.record` queues the step's device
values for a non-blocking read (:mod:`trainhealth._internal.exporters.training.readout`); once read,
the step becomes a :class:`StepStats` and is exported, and the detectors run, on the
export thread (:mod:`trainhealth._internal.exporters.training.worker`). Nothing here raises into
the training loop, and a signal that cannot be computed (a learning rate of ``None``, an
optimizer without torch's ``param_groups``, a gradient norm that fails, a bad ``loss``) is
left out of its step and counted in ``trainhealth_exporter_errors_total{source}``; the
step and its other signals are still recorded.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from trainhealth._internal import catalog
from trainhealth._internal._gil import yield_gil
from trainhealth._internal.config import TrainingSettings
from trainhealth._internal.detectors.runner import SignalDetectors
from trainhealth._internal.exporters.markers import StepMarkers
from trainhealth._internal.exporters.step_observer import StepObserver
from trainhealth._internal.exporters.step_records import HookResults, LayerGroupStats, PendingStep, StepStats
from trainhealth._internal.exporters.training.param_stats import ParameterStats
from trainhealth._internal.exporters.training.readout import ON_DEVICE, DeferredReadout, StepValues, learning_rates
from trainhealth._internal.exporters.training.worker import OrderedWorker
from trainhealth._internal.store import MetricStore

__all__ = ["LayerGroupStats", "StepRecorder", "StepStats"]

_T = TypeVar("_T")


class StepRecorder:
    """Records the steps of one Monitor; built by it with the parts it assembled.

    ``optimizer`` is the optimizer whose step hooks take the gradient statistics (``None``:
    they are taken in :meth:`record` from ``stats``' parameters); ``lr_source`` the object whose
    ``param_groups`` give the learning rates (default ``optimizer``); ``observers`` watch each step
    (:class:`~trainhealth._internal.exporters.step_observer.StepObserver`).
    """

    def __init__(
        self,
        torch: Any,
        store: MetricStore,
        training: TrainingSettings,
        stats: ParameterStats,
        group_labels: tuple[str, ...],
        optimizer: Any,
        detectors: SignalDetectors,
        observers: Sequence[StepObserver],
        markers: StepMarkers | None,
        *,
        lr_source: Any = None,
    ) -> None:
        self._torch = torch
        self._store = store
        self._training = training
        self.stats = stats
        self._group_labels = group_labels
        self._optimizer = optimizer
        self._lr_source = optimizer if lr_source is None else lr_source
        self._detectors = detectors
        self._observers = tuple(observers)
        self._markers = markers
        self._readout = DeferredReadout(torch)
        self._worker = OrderedWorker(store)  # metric writes and detectors run off the training thread
        self._hook_results = HookResults()
        self._optimizer_steps = 0
        self._reported_steps = 0
        self._caller_supplies_grad_norm = False
        self._last_step_time: float | None = None
        self._last_step_label: int | None = None
        self._early_results: tuple[int, HookResults] | None = None
        self._waiting_for_closure: int | None = None
        self._checkpoint_since_last_step = False
        #: The most recent step whose device values have been read.
        self.latest: StepStats | None = None

    def checkpoint_saved(self) -> None:
        """A checkpoint was saved since the last recorded step: the next step's time includes it."""
        self._checkpoint_since_last_step = True

    def is_heavy(self, index: int) -> bool:
        """Whether step ``index`` (counted from 0) takes the per-layer statistics."""
        return index % self._training.stats_every == 0

    # --- optimizer hooks ------------------------------------------------------------
    def gradients_ready(self) -> None:
        """Take this optimizer step's gradient statistics now (see :meth:`Monitor.gradients_ready`)."""
        try:
            index = self._optimizer_steps
            if self._waiting_for_closure == index:  # inside step(closure): the pre-hook has run, the update has not
                self._waiting_for_closure = None
                results = self._gradient_results(index)
                self._hook_results.grad_norm, self._hook_results.group_grad_norms = (
                    results.grad_norm,
                    results.group_grad_norms,
                )
            else:  # before step(): the pre-hook will use these
                self._early_results = (index, self._gradient_statistics(index))
        except Exception as exc:
            self.stats.release()
            self._store.record_error("optimizer_hook", exc)

    def _gradient_statistics(self, index: int) -> HookResults:
        results = self._gradient_results(index)
        if self.is_heavy(index) or self.is_heavy(index + 1):
            self.stats.snapshot_before_update()
        return results

    def before_optimizer_step(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        try:
            index = self._optimizer_steps
            early, self._early_results = self._early_results, None
            if early is not None and early[0] == index:  # taken at gradients_ready()
                results = early[1]
            elif _closure(args, kwargs) is not None:
                # step(closure): the closure computes the gradients inside step(), after this hook; they
                # come with gradients_ready() (Lightning), else the caller's grad_norm
                results = HookResults()
                self._waiting_for_closure = index
                if self.is_heavy(index) or self.is_heavy(index + 1):
                    self.stats.snapshot_before_update()  # the closure leaves the parameters as they are
            else:  # the gradients are final once step() is called
                results = self._gradient_statistics(index)
            results.lr_values = StepValues(self._torch, self._store)
            results.learning_rates = learning_rates(optimizer, results.lr_values)
            self._hook_results = results
        except Exception as exc:
            self.stats.release()
            self._store.record_error("optimizer_hook", exc)

    def after_optimizer_step(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        try:
            index = self._optimizer_steps
            self._optimizer_steps += 1
            heavy = self.is_heavy(index)
            update = self.stats.measure_update(keep_for_next=self.is_heavy(index + 1), measure=heavy)
            if heavy:
                self._hook_results.update = update
        except Exception as exc:
            self.stats.release()
            self._store.record_error("optimizer_hook", exc)
        # every rank steps its optimizer in lockstep: the observers' collectives go here
        self._lockstep(index, index if self._last_step_label is None else self._last_step_label + 1)

    # --- the training thread --------------------------------------------------------
    def record(self, loss: Any, tokens: int | None, grad_norm: Any, step: int | None) -> None:
        """Queue one step and publish the steps whose device values are ready. Never raises."""
        try:
            self._record(loss, tokens, grad_norm, step)
        except Exception as exc:
            self._hook_results = HookResults()
            self._store.record_error("monitor", exc)
        try:
            for pending, vector in self._readout.ready():
                self._publish(pending, vector)
        except Exception as exc:
            self._store.record_error("monitor", exc)

    def drain(self) -> None:
        """Wait for every queued step's device values and hand the steps to the export thread."""
        try:
            for pending, values in self._readout.drain():
                self._publish(pending, values)
        except Exception as exc:
            self._store.record_error("monitor", exc)

    def flush(self, timeout_s: float) -> bool:
        """Drain, then wait for the export thread; False on timeout."""
        self.drain()
        return self._worker.flush(timeout_s)

    def close(self) -> None:
        """Drain and stop the export thread."""
        self.drain()
        self._worker.close()

    def _record(self, loss: Any, tokens: int | None, grad_norm: Any, step: int | None) -> None:
        """Queue step ``step``; a signal that cannot be computed is counted and left out, the others go on."""
        now = time.perf_counter()
        previous = self._last_step_time
        duration = None if previous is None else now - previous
        self._last_step_time = now
        index = self._reported_steps
        self._reported_steps += 1
        unjudged = _TIMING_SIGNALS if self._checkpoint_since_last_step else ()
        self._checkpoint_since_last_step = False
        step_index = index if step is None else self._guard("monitor", lambda: int(step), index)
        self._last_step_label = step_index
        if tokens is not None and (
            isinstance(tokens, bool) or not isinstance(tokens, (int, float)) or not 0 <= tokens < float("inf")
        ):
            self._store.record_error("monitor", ValueError(f"tokens must be a non-negative number, got {tokens!r}"))
            tokens = None
        markers = self._markers
        if markers is not None:
            self._guard("monitor", lambda: markers.step(step_index, now))
        results, self._hook_results = self._hook_results, HookResults()
        if self._optimizer is None and self.stats.params:
            results = self._guard("grad_norm", lambda: self._gradient_results(index), HookResults())

        reading = StepValues(self._torch, self._store)
        reading.add("loss", loss, source="monitor")
        if grad_norm is not None:
            self._caller_supplies_grad_norm = True
            reading.add("grad_norm", grad_norm, source="monitor")
        else:
            reading.add("grad_norm", results.grad_norm)
        for observer in self._observers:
            for name, tensor, length in self._guard(observer.source, lambda: observer.device_values(index), []):
                reading.add(name, tensor, length, source=observer.source)
        n_groups = len(self._group_labels)
        reading.add("group_grad_norms", results.group_grad_norms, n_groups)
        if results.update is not None:
            reading.add("group_update_norms", results.update.update_norms, n_groups)
            reading.add("group_param_norms", results.update.param_norms, n_groups)
            reading.add("update_norm", results.update.total_update)
            reading.add("param_norm", results.update.total_param)
            reading.add("update_cosine", results.update.cosine)
        elif self._optimizer is None and self.stats.params and self.is_heavy(index):
            total, by_group = self._guard("param_norm", self.stats.param_norms_by_group, (None, None))
            reading.add("param_norm", total)
            reading.add("group_param_norms", by_group, n_groups)
        if results.learning_rates is not None and results.lr_values is not None:  # read at the optimizer step
            rates = results.learning_rates
            reading.merge(results.lr_values)
        else:
            rates = learning_rates(self._lr_source, reading) if self._lr_source is not None else []
        pending = PendingStep(
            step=step_index,
            index=index,
            wall_time=time.time(),
            duration_s=duration,
            tokens=None if tokens is None else int(tokens),
            values=reading.values,
            learning_rates=rates,
            fields=reading.fields,
            unjudged=unjudged,
        )
        try:
            self._readout.submit(reading.tensors, pending)
        except Exception as exc:  # a tensor the readout cannot copy: keep the step and its host values
            self._store.record_error("monitor", exc)
            pending.fields = []
            pending.learning_rates = [None if lr is ON_DEVICE else lr for lr in rates]
            self._readout.submit([], pending)
        if self._optimizer is None:  # without a hooked optimizer, the lockstep point is here (every rank calls step)
            self._lockstep(index, step_index)
        for observer in self._observers:
            self._guard(observer.source, lambda: observer.recorded(index))

    def _lockstep(self, index: int, step: int) -> None:
        for observer in self._observers:
            self._guard(observer.source, lambda: observer.lockstep(index, step))

    def _guard(self, source: str, compute: Callable[[], _T], fallback: Any = None) -> Any:
        """``compute()``, or ``fallback`` with the error counted under ``source``."""
        try:
            return compute()
        except Exception as exc:
            self._store.record_error(source, exc)
            return fallback

    def _gradient_results(self, index: int) -> HookResults:
        """Step ``index``'s gradient norms (device tensors); none, counted, when no parameter has a gradient."""
        results = HookResults()
        heavy = self.is_heavy(index)
        if not heavy and self._caller_supplies_grad_norm:
            return results
        if self.stats.params and not self.stats.has_gradients():  # a zero norm would read as vanishing gradients
            self._store.record_error(
                "grad_norm",
                LookupError(
                    "no watched parameter has a gradient (optimizer or Monitor step before backward, or after "
                    "zero_grad): this step's gradient norms are left out"
                ),
            )
            return results
        if heavy:
            results.grad_norm, results.group_grad_norms = self.stats.grad_norms_by_group()
        else:
            results.grad_norm = self.stats.grad_norm()
        return results

    def _publish(self, pending: PendingStep, vector: list[float]) -> None:
        read: dict[str, Any] = dict(pending.values)
        offset = 0
        for name, length in pending.fields:
            chunk = vector[offset : offset + length]
            # per-group values stay a list, whatever the number of groups (a one-group model has one)
            read[name] = chunk if length != 1 or name.startswith("group_") else chunk[0]
            offset += length
        learning_rates = tuple(
            read.get(f"lr{i}") if lr is ON_DEVICE else lr for i, lr in enumerate(pending.learning_rates)
        )
        stats = self._step_stats(pending, read, learning_rates)  # type: ignore[arg-type]  # no ON_DEVICE left
        self.latest = stats
        self._worker.submit(self._export, pending.index, stats, read)

    def _step_stats(
        self, pending: PendingStep, read: dict[str, Any], learning_rates: tuple[float | None, ...]
    ) -> StepStats:
        duration = pending.duration_s
        throughput = None
        if pending.tokens is not None and duration is not None and duration > 0:
            throughput = pending.tokens / duration
        mfu = None
        training = self._training
        if throughput is not None and training.flops_per_token and training.peak_flops:
            mfu = throughput * training.flops_per_token / training.peak_flops
        update_ratio = _ratio(read.get("update_norm"), read.get("param_norm")) if "update_norm" in read else None
        layers: tuple[LayerGroupStats, ...] = ()
        if any(key in read for key in ("group_grad_norms", "group_param_norms")):
            grads = read.get("group_grad_norms")
            params = read.get("group_param_norms")
            updates = read.get("group_update_norms")
            layers = tuple(
                LayerGroupStats(
                    name=label,
                    grad_norm=None if grads is None else grads[i],
                    param_norm=None if params is None else params[i],
                    update_ratio=None if updates is None or params is None else _ratio(updates[i], params[i]),
                )
                for i, label in enumerate(self._group_labels)
            )
        return StepStats(
            step=pending.step,
            loss=read.get("loss"),
            grad_norm=read.get("grad_norm"),
            duration_s=duration,
            tokens=pending.tokens,
            tokens_per_second=throughput,
            mfu=mfu,
            learning_rates=learning_rates,
            param_norm=read.get("param_norm"),
            update_ratio=update_ratio,
            update_cosine=read.get("update_cosine"),
            layers=layers,
            unjudged=pending.unjudged,
            wall_time=pending.wall_time,
        )

    # --- the export thread ----------------------------------------------------------
    def _export(self, index: int, stats: StepStats, read: dict[str, Any]) -> None:
        store = self._store
        store.inc(catalog.TRAIN_STEPS)
        store.set(catalog.TRAIN_STEP, stats.step)
        store.set(catalog.TRAIN_LAST_STEP_TIMESTAMP, time.time())
        for signal, value in (("loss", stats.loss), ("grad_norm", stats.grad_norm)):
            if value is not None and not math.isfinite(value):
                store.inc(catalog.TRAIN_NONFINITE_STEPS, labels=(signal,))
        _set_if(store, catalog.TRAIN_LOSS, stats.loss)
        _set_if(store, catalog.TRAIN_GRAD_NORM, stats.grad_norm)
        if stats.duration_s is not None:
            store.observe(catalog.TRAIN_STEP_DURATION, stats.duration_s)
            store.set(catalog.TRAIN_LAST_STEP_DURATION, stats.duration_s)
        if stats.tokens is not None:
            store.inc(catalog.TRAIN_TOKENS, stats.tokens)
        _set_if(store, catalog.TRAIN_THROUGHPUT, stats.tokens_per_second)
        _set_if(store, catalog.TRAIN_MFU, stats.mfu)
        for position, lr in enumerate(stats.learning_rates):
            _set_if(store, catalog.TRAIN_LEARNING_RATE, lr, (str(position),))
        _set_if(store, catalog.TRAIN_PARAM_NORM, stats.param_norm)
        _set_if(store, catalog.TRAIN_UPDATE_RATIO, stats.update_ratio)
        _set_if(store, catalog.TRAIN_UPDATE_COSINE, stats.update_cosine)
        for layer in stats.layers:
            labels = (layer.name,)
            _set_if(store, catalog.TRAIN_LAYER_GRAD_NORM, layer.grad_norm, labels)
            _set_if(store, catalog.TRAIN_LAYER_PARAM_NORM, layer.param_norm, labels)
            _set_if(store, catalog.TRAIN_LAYER_UPDATE_RATIO, layer.update_ratio, labels)
        yield_gil()  # the detectors below yield between their watches, the observers after them
        for signal, value in (
            ("loss", stats.loss),
            ("grad_norm", stats.grad_norm),
            ("step_time", stats.duration_s),
            ("throughput", stats.tokens_per_second),
        ):
            if value is None or signal in stats.unjudged:
                continue
            try:  # a loss spike reaches the observers as an event (RecoveryWatch listens to the event log)
                self._detectors.observe(signal, value, step=stats.step)
            except Exception as exc:  # a failing detector leaves the metrics and the other signals
                self._store.record_error("detectors", exc)
        for observer in self._observers:
            self._guard(observer.source, lambda: observer.finished(index, stats, read))
            yield_gil()


#: The signals a checkpoint save inflates.
_TIMING_SIGNALS = ("step_time", "throughput")


def _closure(args: Any, kwargs: Any) -> Any:
    """The closure an ``optimizer.step`` call was given (torch hands its hooks ``(self, *args)`` and ``kwargs``)."""
    if kwargs and kwargs.get("closure") is not None:
        return kwargs["closure"]
    return args[1] if args is not None and len(args) > 1 else None


def _set_if(store: MetricStore, spec: catalog.MetricSpec, value: float | None, labels: tuple[str, ...] = ()) -> None:
    if value is not None:
        store.set(spec, value, labels)


def _ratio(numerator: float | None, denominator: float | None) -> float | None:
    if numerator is None or denominator is None or denominator == 0:
        return None
    return numerator / denominator
