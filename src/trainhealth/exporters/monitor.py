"""The training-loop Monitor: model metrics per step, exported to Prometheus and OpenTelemetry.

Per step it records loss, total gradient norm, learning rate per parameter
group, step time, tokens/s, MFU and non-finite counts; every ``stats_every``
steps it adds gradient and parameter norms per layer group, the
update-to-parameter ratio and the cosine similarity of consecutive updates.
Device values are read without stalling the loop (see
:mod:`trainhealth.exporters.training.readout`), and the metric writes and detectors run
on a background thread (:meth:`Monitor.flush` waits for them). Errors are counted in
``trainhealth_exporter_errors_total`` and never reach the training loop.

>>> import torch
>>> model = torch.nn.Linear(4, 1)
>>> opt = torch.optim.SGD(model.parameters(), lr=0.1)
>>> with Monitor(model, opt, prometheus=False, otel=False, env={}) as mon:
...     for _ in range(3):
...         loss = model(torch.ones(2, 4)).pow(2).mean()
...         loss.backward()
...         opt.step()
...         opt.zero_grad()
...         mon.step(loss=loss, tokens=2)
>>> mon.latest.step, mon.latest.learning_rates
(2, (0.1,))
"""

from __future__ import annotations

import atexit
import dataclasses
import logging
import math
import time
import weakref
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from trainhealth import catalog
from trainhealth.exporters.collectives import install as comm_module
from trainhealth._torch import require_torch
from trainhealth.config import Settings
from trainhealth.detectors.runner import SignalDetectors
from trainhealth.detectors.spec import parse_setting
from trainhealth.events import EventLog
from trainhealth.exporters.gpu.telemetry import GpuTelemetry
from trainhealth.exporters.training.layer_groups import group_parameters
from trainhealth.exporters.training.model_health import ModelHealth
from trainhealth.exporters.training.model_signals import SignalValues
from trainhealth.exporters.training.param_stats import ParameterStats, UpdateStats
from trainhealth.exporters.training.readout import DeferredReadout
from trainhealth.sinks.service import Sinks
from trainhealth.exporters.training.worker import OrderedWorker
from trainhealth.identity import Identity
from trainhealth.store import MetricStore

__all__ = ["LayerGroupStats", "Monitor", "StepStats"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class LayerGroupStats:
    """Statistics of one layer group on a heavy-statistics step."""

    name: str
    grad_norm: float | None
    param_norm: float | None
    update_ratio: float | None


@dataclass(frozen=True)
class StepStats:
    """What the Monitor recorded for one step, once its device values were read."""

    step: int
    loss: float | None
    grad_norm: float | None
    duration_s: float | None
    tokens: int | None
    tokens_per_second: float | None
    mfu: float | None
    learning_rates: tuple[float, ...]
    param_norm: float | None = None
    update_ratio: float | None = None
    update_cosine: float | None = None
    layers: tuple[LayerGroupStats, ...] = ()
    #: Model signals: every step's non-finite origin, the sampled values every ``stats_every`` steps.
    signals: SignalValues | None = None


@dataclass
class _PendingStep:
    """Host-side facts of a step, waiting for its device values; ``fields`` lays out the read vector."""

    step: int
    index: int
    wall_time: float
    duration_s: float | None
    tokens: int | None
    values: dict[str, float | None]
    learning_rates: list[float | None]
    fields: list[tuple[str, int]]


@dataclass
class _HookResults:
    """Device tensors produced by the optimizer hooks for the step in progress."""

    grad_norm: Any = None
    group_grad_norms: Any = None
    update: UpdateStats | None = None


class Monitor:
    """Record training-loop metrics and serve them.

    Use as a context manager or call :meth:`close`. Call :meth:`step` once per
    training iteration, after ``optimizer.step()``. The ``detectors`` setting
    chooses the streaming detectors run on loss, gradient norm, step time and
    throughput (their anomalies are metrics and ``events``). Unless ``gpu_backend`` is
    ``off``, the rank's own GPU is sampled too (see :mod:`trainhealth.exporters.gpu.telemetry`);
    ``events`` holds what happened to it (XIDs, a lost GPU). Every keyword argument is a
    :class:`~trainhealth.config.Settings` field and overrides its
    ``TRAINHEALTH_*`` variable; pass ``settings=`` for a prepared object and
    ``env=`` to read a mapping other than ``os.environ``.

    The gradient norm is taken from ``step(grad_norm=...)`` when the loop
    passes it (use the value ``clip_grad_norm_`` returns: the norm before
    clipping); otherwise it is computed in an optimizer pre-step hook, which sees
    the gradients the optimizer uses — after clipping, if the loop clips.

    With a model, the Monitor also hooks it for the model signals (attention
    max logit and entropy, output log Z, block activation RMS, the origin of
    non-finite activations) and, under torch.distributed, runs the cross-replica
    SDC checks (see :mod:`trainhealth.exporters.training.model_health`); ``sdc_group`` is
    the process group of the ranks holding identical replicas when that is not
    every rank. Report checkpoints with :meth:`checkpoint_saved`.

    With the collective logger active (``comm=True``, or :func:`trainhealth.comm.install`
    called first) each step also leaves rows in the collective trace, on the clock of its
    collective records: a ``step`` marker from the previous :meth:`step` call to this one
    (the first step begins at the model's first forward pass, else at the Monitor's
    creation), the root module's ``forward`` passes and ``optimizer.step()`` as
    ``optimizer``; from them the logger exports how long each step computed and how long
    it waited in collectives (``trainhealth_train_step_{compute,wait}_seconds_total``).
    """

    def __init__(
        self,
        model: Any = None,
        optimizer: Any = None,
        *,
        flops_per_token: float | None = None,
        peak_flops: float | None = None,
        settings: Settings | None = None,
        env: Mapping[str, str] | None = None,
        sdc_group: Any = None,
        **overrides: Any,
    ) -> None:
        torch = require_torch("trainhealth.Monitor")
        self._torch = torch
        explicit = dict(overrides, flops_per_token=flops_per_token, peak_flops=peak_flops)
        if settings is None:
            settings = Settings.resolve(env=env, **explicit)
        else:
            settings = settings.replace(**{name: value for name, value in explicit.items() if value is not None})
        self.settings = settings
        watched = parse_setting(settings.detectors)  # a bad detectors setting fails here, before any thread starts
        identity = Identity.from_env(env, settings)
        if not identity.gpu_uuid:
            identity = identity.with_gpu_uuid(_cuda_uuid(torch, model))
        self.identity = identity
        self.store = MetricStore(settings.max_series_per_metric)
        self.store.set_info(catalog.RANK_INFO, tuple(identity.info_labels.values()))

        optimizer = _base_optimizer(optimizer)
        self._model = model
        self._optimizer = optimizer
        self._stats, self._group_labels = _parameter_stats(torch, model, optimizer, settings.max_layer_groups)
        self._readout = DeferredReadout(torch)
        self._worker = OrderedWorker(self.store)  # metric writes and detectors run off the training thread
        self._hook_results = _HookResults()
        self._optimizer_steps = 0
        self._reported_steps = 0
        self._caller_supplies_grad_norm = False
        self._last_step_time: float | None = None
        self._latest: StepStats | None = None
        self._closed = False
        self._hook_handles: list[Any] = []
        self._first_step_began: float | None = None  # the first forward pass, when it precedes the first step
        self._forward_began: float | None = None
        self._optimizer_began: float | None = None

        self.events = EventLog()
        self.detectors = SignalDetectors(watched, store=self.store, events=self.events)
        for signal in ("loss", "grad_norm"):  # from 0, so the first non-finite step is an increase
            self.store.inc(catalog.TRAIN_NONFINITE_STEPS, 0.0, (signal,))
        self._sinks = Sinks.start(self.store, identity, settings, env, events=self.events)
        self.health: ModelHealth | None = None
        if model is not None:
            self.health = ModelHealth(torch, model, settings, self.store, self.events, start_time=time.time(),
                                      sdc_group=sdc_group, env=env)
        try:
            self.gpu = GpuTelemetry.start(self.store, self.events, settings, identity, role="rank", env=env)
        except Exception:
            self._sinks.close()
            raise
        if self.gpu is not None and not identity.gpu_uuid and len(self.gpu.gpu_uuids) == 1:
            self.identity = identity = identity.with_gpu_uuid(self.gpu.gpu_uuids[0])
            self.store.set_info(catalog.RANK_INFO, tuple(identity.info_labels.values()))
        self.comm = None
        self._owns_comm = False
        if settings.comm or comm_module.installed() is not None:
            self._owns_comm = comm_module.installed() is None
            self.comm = comm_module.install(store=self.store, settings=settings, detectors=self.detectors)
        if optimizer is not None:
            # the timing hooks run inside the statistics hooks, so the optimizer row times the update alone
            self._hook_handles.append(optimizer.register_step_pre_hook(self._before_optimizer_step))
            if self.comm is not None:
                self._hook_handles += [optimizer.register_step_pre_hook(self._optimizer_step_begins),
                                       optimizer.register_step_post_hook(self._optimizer_step_ends)]
            self._hook_handles.append(optimizer.register_step_post_hook(self._after_optimizer_step))
        if self.comm is not None and model is not None and hasattr(model, "register_forward_pre_hook"):
            self._hook_handles += [model.register_forward_pre_hook(self._forward_begins),
                                   model.register_forward_hook(self._forward_ends)]
        self._created = time.perf_counter()
        self._atexit = _close_at_exit(self)

    # --- public ---------------------------------------------------------------------
    @property
    def metrics_url(self) -> str | None:
        """Where /metrics is served, or ``None`` when the Prometheus endpoint is off."""
        return self._sinks.metrics_url

    @property
    def latest(self) -> StepStats | None:
        """The most recent step whose device values have been read."""
        return self._latest

    def step(
        self,
        loss: Any = None,
        tokens: int | None = None,
        *,
        grad_norm: Any = None,
        step: int | None = None,
    ) -> None:
        """Record one training step. Never raises; never waits for the device.

        ``loss`` and ``grad_norm`` may be tensors or numbers; ``tokens`` is the
        number of tokens this rank processed in the step; ``step`` is the
        training iteration (default: a counter starting at 0).
        """
        if self._closed:
            return
        try:
            self._record_step(loss, tokens, grad_norm, step)
        except Exception as exc:
            self._hook_results = _HookResults()
            self.store.record_error("monitor", exc)
        self._publish_ready()

    def flush(self, timeout_s: float = 10.0) -> bool:
        """Make every step recorded so far visible in the metrics (waits for the device and the export thread)."""
        try:
            for pending, values in self._readout.drain():
                self._publish(pending, values)
        except Exception as exc:
            self.store.record_error("monitor", exc)
        return self._worker.flush(timeout_s)

    def checkpoint_saved(self, step: int, duration_s: float | None = None) -> None:
        """Report a checkpoint of training step ``step`` (``duration_s``: how long saving took). Never raises."""
        if self._closed or self.health is None:
            return
        try:
            self.health.checkpoint_saved(int(step), None if duration_s is None else float(duration_s))
        except Exception as exc:
            self.store.record_error("monitor", exc)

    def selftest(self, size: int = 256) -> list[Any]:
        """Run ``trainhealth selftest``'s checks on this rank's device now (between steps) and publish them.

        Returns the :class:`~trainhealth.sdc.selftest.SelftestResult` list; a failure is also a
        ``selftest_failed`` event. Never raises.
        """
        from trainhealth.sdc.selftest import publish_results, run_selftest

        device = "cpu"
        first = next(iter(self._model.parameters()), None) if self._model is not None else None
        if first is not None and first.device.type == "cuda":
            device = f"cuda:{first.device.index or 0}"
        try:
            results = run_selftest([device], size=size)
            publish_results(self.store, self.events, results)
            return results
        except Exception as exc:
            self.store.record_error("selftest", exc)
            return []

    def close(self) -> None:
        """Read the last device values, remove the hooks, export a last time and stop serving."""
        if self._closed:
            return
        self._closed = True
        atexit.unregister(self._atexit)
        for handle in self._hook_handles:
            handle.remove()
        self._hook_handles = []
        self._stats.release()
        if self.health is not None:
            self.health.close()
        if self.gpu is not None:
            self.gpu.close()
        if self._owns_comm:
            comm_module.uninstall()
        try:
            for pending, values in self._readout.drain():
                self._publish(pending, values)
        except Exception as exc:
            self.store.record_error("monitor", exc)
        self._worker.close()
        self._sinks.close()

    def __enter__(self) -> Monitor:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # --- optimizer hooks ------------------------------------------------------------
    def _is_heavy(self, index: int) -> bool:
        return index % self.settings.stats_every == 0

    def _before_optimizer_step(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        try:
            index = self._optimizer_steps
            results = _HookResults()
            if self._is_heavy(index):
                results.grad_norm, results.group_grad_norms = self._stats.grad_norms_by_group()
            elif not self._caller_supplies_grad_norm:
                results.grad_norm = self._stats.grad_norm()
            if self._is_heavy(index) or self._is_heavy(index + 1):
                self._stats.snapshot_before_update()
            self._hook_results = results
        except Exception as exc:
            self._stats.release()
            self.store.record_error("optimizer_hook", exc)

    def _after_optimizer_step(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        try:
            index = self._optimizer_steps
            self._optimizer_steps += 1
            heavy = self._is_heavy(index)
            update = self._stats.measure_update(keep_for_next=self._is_heavy(index + 1), measure=heavy)
            if heavy:
                self._hook_results.update = update
        except Exception as exc:
            self._stats.release()
            self.store.record_error("optimizer_hook", exc)

    # --- host-timed rows for the collective trace (only while the logger is active) ---
    def _forward_begins(self, module: Any, args: Any) -> None:
        try:
            now = time.perf_counter()
            self._forward_began = now
            if self._first_step_began is None and self._last_step_time is None:
                self._first_step_began = now
        except Exception as exc:
            self.store.record_error("monitor", exc)

    def _forward_ends(self, module: Any, args: Any, output: Any) -> None:
        try:
            began, self._forward_began = self._forward_began, None
            if began is not None and self.comm is not None:
                self.comm.add_marker("forward", self.comm.step, began, time.perf_counter() - began)
        except Exception as exc:
            self.store.record_error("monitor", exc)

    def _optimizer_step_begins(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        self._optimizer_began = time.perf_counter()

    def _optimizer_step_ends(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        try:
            began, self._optimizer_began = self._optimizer_began, None
            if began is not None and self.comm is not None:
                self.comm.add_marker("optimizer", self.comm.step, began, time.perf_counter() - began)
        except Exception as exc:
            self.store.record_error("monitor", exc)

    # --- per step -------------------------------------------------------------------
    def _record_step(self, loss: Any, tokens: int | None, grad_norm: Any, step: int | None) -> None:
        if tokens is not None and (isinstance(tokens, bool) or not isinstance(tokens, (int, float)) or tokens < 0):
            raise ValueError(f"tokens must be a non-negative number, got {tokens!r}")
        now = time.perf_counter()
        previous = self._last_step_time
        duration = None if previous is None else now - previous
        self._last_step_time = now
        index = self._reported_steps
        self._reported_steps += 1
        step_index = index if step is None else int(step)
        if self.comm is not None:
            if previous is None:
                previous = self._created if self._first_step_began is None else self._first_step_began
            self.comm.add_marker("step", step_index, previous, now - previous)
            self.comm.step = step_index + 1  # the collectives that follow belong to the next step
        results, self._hook_results = self._hook_results, _HookResults()
        if self._optimizer is None and self._stats.params:
            results = self._gradient_results_without_optimizer(index)
        if grad_norm is not None:
            self._caller_supplies_grad_norm = True
            results.grad_norm = grad_norm

        tensors: list[Any] = []
        fields: list[tuple[str, int]] = []
        values: dict[str, float | None] = {}

        def add(name: str, value: Any, length: int = 1) -> None:
            if value is None:
                return
            if isinstance(value, self._torch.Tensor):
                if value.numel() != length:
                    raise ValueError(f"{name}: expected {length} value(s), got a tensor of shape {tuple(value.shape)}")
                tensors.append(value)
                fields.append((name, length))
            else:
                values[name] = float(value)

        add("loss", loss)
        add("grad_norm", results.grad_norm)
        if self.health is not None:
            for name, tensor, length in self.health.device_values(index):
                add(name, tensor, length)
        n_groups = len(self._group_labels)
        add("group_grad_norms", results.group_grad_norms, n_groups)
        if results.update is not None:
            add("group_update_norms", results.update.update_norms, n_groups)
            add("group_param_norms", results.update.param_norms, n_groups)
            add("update_norm", results.update.total_update)
            add("param_norm", results.update.total_param)
            add("update_cosine", results.update.cosine)
        elif self._optimizer is None and self._stats.params and self._is_heavy(index):
            total, by_group = self._stats.param_norms_by_group()
            add("param_norm", total)
            add("group_param_norms", by_group, n_groups)

        learning_rates: list[float | None] = []
        if self._optimizer is not None:
            for position, group in enumerate(self._optimizer.param_groups):
                lr = group.get("lr")
                if isinstance(lr, self._torch.Tensor):
                    add(f"lr{position}", lr)
                    learning_rates.append(None)
                else:
                    learning_rates.append(None if lr is None else float(lr))
        pending = _PendingStep(
            step=step_index,
            index=index,
            wall_time=time.time(),
            duration_s=duration,
            tokens=None if tokens is None else int(tokens),
            values=values,
            learning_rates=learning_rates,
            fields=fields,
        )
        self._readout.submit(tensors, pending)
        if self.health is not None:
            self.health.after_step(index, step_index)  # the cross-replica checks: collectives, same step everywhere

    def _gradient_results_without_optimizer(self, index: int) -> _HookResults:
        results = _HookResults()
        if self._is_heavy(index):
            results.grad_norm, results.group_grad_norms = self._stats.grad_norms_by_group()
        elif not self._caller_supplies_grad_norm:
            results.grad_norm = self._stats.grad_norm()
        return results

    def _publish_ready(self) -> None:
        try:
            for pending, vector in self._readout.ready():
                self._publish(pending, vector)
        except Exception as exc:
            self.store.record_error("monitor", exc)

    def _publish(self, pending: _PendingStep, vector: list[float]) -> None:
        read: dict[str, Any] = dict(pending.values)
        offset = 0
        for name, length in pending.fields:
            chunk = vector[offset: offset + length]
            read[name] = chunk[0] if length == 1 else chunk
            offset += length
        learning_rates = tuple(
            read[f"lr{i}"] if lr is None else lr for i, lr in enumerate(pending.learning_rates)
        )
        stats = self._step_stats(pending, read, learning_rates)
        if self.health is not None:
            stats = dataclasses.replace(stats, signals=self.health.signal_values(pending.index, read))
        self._latest = stats
        self._worker.submit(self._export, stats, pending.wall_time)

    def _step_stats(self, pending: _PendingStep, read: dict[str, Any], learning_rates: tuple[float, ...]) -> StepStats:
        duration = pending.duration_s
        throughput = None
        if pending.tokens is not None and duration is not None and duration > 0:
            throughput = pending.tokens / duration
        mfu = None
        if throughput is not None and self.settings.flops_per_token and self.settings.peak_flops:
            mfu = throughput * self.settings.flops_per_token / self.settings.peak_flops
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
        )

    def _export(self, stats: StepStats, wall_time: float) -> None:
        store = self.store
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
        loss_spike_began = False
        for signal, value in (("loss", stats.loss), ("grad_norm", stats.grad_norm),
                              ("step_time", stats.duration_s), ("throughput", stats.tokens_per_second)):
            if value is not None:
                opened = self.detectors.observe(signal, value, step=stats.step)
                if signal == "loss":
                    loss_spike_began = any(anomaly.detector != "nonfinite" for anomaly in opened)
        if self.health is not None:
            self.health.export(stats.step, wall_time, stats.loss, stats.signals, loss_spike_began)


def _base_optimizer(optimizer: Any) -> Any:
    """The torch optimizer inside wrappers such as Accelerate's AcceleratedOptimizer (they forward ``step``)."""
    while optimizer is not None and not hasattr(optimizer, "_optimizer_step_pre_hooks") and hasattr(
            optimizer, "optimizer"):
        optimizer = optimizer.optimizer
    return optimizer


def _set_if(store: MetricStore, spec: catalog.MetricSpec, value: float | None, labels: tuple[str, ...] = ()) -> None:
    if value is not None:
        store.set(spec, value, labels)


def _ratio(numerator: float | None, denominator: float | None) -> float | None:
    if numerator is None or denominator is None or denominator == 0:
        return None
    return numerator / denominator


def _parameter_stats(torch: Any, model: Any, optimizer: Any, max_groups: int) -> tuple[ParameterStats, tuple[str, ...]]:
    """The parameters to watch (the optimizer's, else the model's) and their layer groups."""
    names: dict[int, str] = {}
    if model is not None:
        names = {id(p): name for name, p in model.named_parameters()}
    if optimizer is not None:
        params, labels = [], []
        for position, group in enumerate(optimizer.param_groups):
            for p in group["params"]:
                params.append(p)
                labels.append(names.get(id(p), f"param_group_{position}"))
    elif model is not None:
        params = [p for p in model.parameters() if p.requires_grad]
        labels = [names[id(p)] for p in params]
    else:
        params, labels = [], []
    grouping = group_parameters(labels, max_groups)
    return ParameterStats(torch, params, grouping.index, len(grouping.labels)), grouping.labels


def _cuda_uuid(torch: Any, model: Any) -> str:
    """The UUID of the GPU holding the model's first parameter, as dcgm-exporter writes it."""
    try:
        if model is None or not torch.cuda.is_available():
            return ""
        device = next(model.parameters()).device
        if device.type != "cuda":
            return ""
        uuid = str(torch.cuda.get_device_properties(device).uuid)
        return uuid if uuid.startswith("GPU-") else f"GPU-{uuid}"
    except Exception:
        log.debug("trainhealth: could not read the GPU UUID", exc_info=True)
        return ""


def _close_at_exit(monitor: Monitor) -> Any:
    """Close ``monitor`` at interpreter exit unless it was closed; holds it weakly."""
    reference = weakref.ref(monitor)

    def close() -> None:
        alive = reference()
        if alive is not None:
            alive.close()

    atexit.register(close)
    return close
