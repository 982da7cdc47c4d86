"""The training-loop Monitor: model metrics per step, exported to Prometheus and OpenTelemetry.

Per step it records loss, total gradient norm, learning rate per parameter
group, step time, tokens/s, MFU and non-finite counts; every ``stats_every``
steps it adds gradient and parameter norms per layer group, the
update-to-parameter ratio and the cosine similarity of consecutive updates.
Device values are read without stalling the loop (see
:mod:`trainhealth._internal.exporters.training.readout`), and the metric writes and detectors run
on a background thread (:meth:`Monitor.flush` waits for them). Errors are counted in
``trainhealth_exporter_errors_total`` and never reach the training loop; a signal that
cannot be computed (a learning rate of ``None``, an optimizer it cannot hook, a missing
gradient) is left out and counted, and the step's other signals are still recorded.
:meth:`Monitor.close` returns within about ``otel_close_timeout`` (1.5 s) plus the time to
read the last steps, whatever the OTLP endpoint does.

The per-step path is :mod:`trainhealth._internal.exporters.steps`, the collective-trace markers
:mod:`trainhealth._internal.exporters.markers`, the assembly helpers :mod:`trainhealth._internal.exporters.wiring`;
this module ties them, the three wings and the sinks together.

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
import time
from collections.abc import Mapping
from contextlib import AbstractContextManager, nullcontext
from typing import Any

from trainhealth._internal import catalog
from trainhealth._internal._torch import require_torch
from trainhealth._internal.config import Settings
from trainhealth._internal.detectors.runner import SignalDetectors
from trainhealth._internal.detectors.spec import parse_setting
from trainhealth._internal.events import EventLog
from trainhealth._internal.exporters.collectives import install as comm_module
from trainhealth._internal.exporters.gpu.telemetry import GpuTelemetry
from trainhealth._internal.exporters.markers import StepMarkers
from trainhealth._internal.exporters.model_health import ModelHealth
from trainhealth._internal.exporters.steps import LayerGroupStats, StepRecorder, StepStats
from trainhealth._internal.exporters.wiring import (
    base_optimizer,
    close_at_exit,
    cuda_uuid,
    hookable_optimizer,
    parameter_stats,
)
from trainhealth._internal.identity import Identity, RunIdentity
from trainhealth._internal.sinks.service import Sinks
from trainhealth._internal.store import MetricStore

__all__ = ["LayerGroupStats", "Monitor", "StepStats"]


class Monitor:
    """Record training-loop metrics and serve them.

    Use as a context manager or call :meth:`close`. Call :meth:`step` once per
    training iteration, after ``optimizer.step()``. The ``detectors`` setting
    chooses the streaming detectors run on loss, gradient norm, step time and
    throughput (their anomalies are metrics and ``events``). Unless ``gpu_backend`` is
    ``off``, the rank's own GPU is sampled too (see :mod:`trainhealth._internal.exporters.gpu.telemetry`);
    ``events`` holds what happened to it (XIDs, a lost GPU). Every keyword argument is a
    setting (docs/configuration.md) and overrides its ``TRAINHEALTH_*`` variable; pass
    ``settings=`` for a prepared :class:`~trainhealth._internal.config.Settings` and ``env=`` to read a
    mapping other than ``os.environ``. The resolved values are in ``settings``, grouped by
    concern (``monitor.settings.training.stats_every``).

    The gradient norm is taken from ``step(grad_norm=...)`` when the loop
    passes it (use the value ``clip_grad_norm_`` returns: the norm before
    clipping); otherwise it is computed in an optimizer pre-step hook, which sees
    the gradients the optimizer uses — after clipping, if the loop clips.

    With a model, the Monitor also hooks it for the model signals (attention
    max logit and entropy, output log Z, block activation RMS, the origin of
    non-finite activations) and, under torch.distributed, runs the cross-replica
    SDC checks (see :mod:`trainhealth._internal.exporters.model_health`); ``sdc_group`` is
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
        explicit = dict(overrides, flops_per_token=flops_per_token, peak_flops=peak_flops)
        if settings is None:
            settings = Settings.resolve(env=env, **explicit)
        else:
            settings = settings.replace(**{name: value for name, value in explicit.items() if value is not None})
        self.settings = settings
        watched = parse_setting(settings.detectors.spec)  # a bad detectors setting fails here, before any thread starts
        identity = Identity.from_env(env, settings)
        if not identity.gpu_uuid:
            identity = identity.with_gpu_uuid(cuda_uuid(torch, model))
        self.store = MetricStore(settings.store.max_series_per_metric)
        # the job label: the launcher's run id, else agreed through torch.distributed's store once it is up
        self._run = RunIdentity(identity, self._identity_fixed, lambda exc: self.store.record_error("identity", exc))
        self.store.set_info(catalog.RANK_INFO, tuple(identity.info_labels.values()))
        identity = self._run.current() or identity

        lr_source = base_optimizer(optimizer)
        optimizer = hookable_optimizer(lr_source, self.store)  # None for one the Monitor cannot hook
        self._model = model
        stats, group_labels = parameter_stats(torch, model, optimizer, settings.training.max_layer_groups)
        self._closed = False
        self._hook_handles: list[Any] = []

        self.events = EventLog()
        self.detectors = SignalDetectors(
            watched, store=self.store, events=self.events, warmup=settings.detectors.warmup_steps
        )
        for signal in ("loss", "grad_norm"):  # from 0, so the first non-finite step is an increase
            self.store.inc(catalog.TRAIN_NONFINITE_STEPS, 0.0, (signal,))
        self._sinks = Sinks.start(self.store, identity, settings, env, events=self.events, current=self._run.current)
        if not self._run.identity.pending:
            self._sinks.identity_fixed(self._run.identity)  # fixed while the sinks started
        self.health: ModelHealth | None = None
        if model is not None:
            self.health = ModelHealth.build(
                torch, model, settings, self.store, self.events, start_time=time.time(), sdc_group=sdc_group, env=env
            )
        try:
            self.gpu = GpuTelemetry.start(self.store, self.events, settings, identity, role="rank", env=env)
        except Exception:
            self._sinks.close()
            raise
        if self.gpu is not None and not identity.gpu_uuid and len(self.gpu.gpu_uuids) == 1:
            identity = self._run.replace(gpu_uuid=self.gpu.gpu_uuids[0])
            self.store.set_info(catalog.RANK_INFO, tuple(identity.info_labels.values()))
        self.comm = None
        self._owns_comm = False
        if settings.comm.enabled or comm_module.installed() is not None:
            self._owns_comm = comm_module.installed() is None
            self.comm = comm_module.install(store=self.store, settings=settings, detectors=self.detectors)
        markers = StepMarkers(self.comm, self.store) if self.comm is not None else None
        self._recorder = StepRecorder(
            torch,
            self.store,
            settings.training,
            stats,
            group_labels,
            optimizer,
            self.detectors,
            () if self.health is None else self.health.observers,
            markers,
            lr_source=lr_source,
        )
        self._hook(model, optimizer, markers)
        self._atexit = close_at_exit(self)

    def _hook(self, model: Any, optimizer: Any, markers: StepMarkers | None) -> None:
        recorder = self._recorder
        if optimizer is not None:
            # the timing hooks run inside the statistics hooks, so the optimizer row times the update alone
            self._hook_handles.append(optimizer.register_step_pre_hook(recorder.before_optimizer_step))
            if markers is not None:
                self._hook_handles += [
                    optimizer.register_step_pre_hook(markers.optimizer_step_begins),
                    optimizer.register_step_post_hook(markers.optimizer_step_ends),
                ]
            self._hook_handles.append(optimizer.register_step_post_hook(recorder.after_optimizer_step))
        if markers is not None and model is not None and hasattr(model, "register_forward_pre_hook"):
            self._hook_handles += [
                model.register_forward_pre_hook(markers.forward_begins),
                model.register_forward_hook(markers.forward_ends),
            ]

    def _identity_fixed(self, identity: Identity) -> None:
        """The job label was fixed (see :class:`RunIdentity`): the info metric and the OTLP push follow it."""
        self.store.set_info(catalog.RANK_INFO, tuple(identity.info_labels.values()))
        sinks: Sinks | None = getattr(self, "_sinks", None)  # None: fixed before they started, and they know
        if sinks is not None:
            sinks.identity_fixed(identity)

    # --- public ---------------------------------------------------------------------
    @property
    def identity(self) -> Identity:
        """Who this process is; its job label is empty until fixed (torch.distributed not initialised yet)."""
        return self._run.identity

    @property
    def metrics_url(self) -> str | None:
        """Where /metrics is served, or ``None`` when the Prometheus endpoint is off."""
        return self._sinks.metrics_url

    @property
    def latest(self) -> StepStats | None:
        """The most recent step whose device values have been read."""
        return self._recorder.latest

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
        if self._run.identity.pending:  # the loop steps: torch.distributed is up by now, or this run goes without
            self._run.current(final=True)
        self._recorder.record(loss, tokens, grad_norm, step)

    def gradients_ready(self) -> None:
        """Say that this optimizer step's gradients are final, before any clipping. Never raises.

        For trainers that call ``optimizer.step(closure)`` (Lightning): the optimizer's
        pre-hook runs before the closure computes the gradients, so the Monitor takes the
        step's gradient statistics here instead (Lightning's ``on_before_optimizer_step``).
        Loops that call ``backward()`` before ``optimizer.step()`` need not call it.
        """
        if not self._closed:
            self._recorder.gradients_ready()

    def flush(self, timeout_s: float = 10.0) -> bool:
        """Make every step recorded so far visible in the metrics (waits for the device and the export thread)."""
        return self._recorder.flush(timeout_s)

    def checkpoint_saved(self, step: int, duration_s: float | None = None) -> None:
        """Report a checkpoint of training step ``step`` (``duration_s``: how long saving took). Never raises.

        The step whose time includes the save (the next one recorded) is not judged by the
        step-time and throughput detectors: a save is not a straggler; and the hang threshold
        allows 1.5x the longest save reported (wrap saves in :meth:`pause` to allow any length).
        """
        if self._closed:
            return
        self._recorder.checkpoint_saved()
        try:
            if self.comm is not None and duration_s is not None:
                self.comm.watch.checkpoint_saved(float(duration_s))  # a save this long is no hang
            if self.health is None:
                return
            self.health.recovery.checkpoint_saved(int(step), None if duration_s is None else float(duration_s))
        except Exception as exc:
            self.store.record_error("monitor", exc)

    def pause(self, reason: str = "pause") -> AbstractContextManager[None]:
        """A context manager around a pause of the loop that is no hang: a checkpoint save, an evaluation.

        While it lasts, neither this rank nor its peers waiting in a collective for it count as hung
        (``trainhealth_comm_paused{reason}`` is 1, and the hang rules and the analyzer hold their verdict),
        and its length stays out of the hang threshold. Without the collective logger there is no hang
        watcher and it does nothing. Never raises.

        >>> import torch
        >>> with Monitor(torch.nn.Linear(2, 1), prometheus=False, otel=False, env={}) as mon:
        ...     with mon.pause("checkpoint"):
        ...         pass  # torch.save(...)
        """
        if self._closed or self.comm is None:
            return nullcontext()
        return self.comm.pause(reason)

    def selftest(self, size: int = 256) -> list[Any]:
        """Run ``trainhealth selftest``'s checks on this rank's device now (between steps) and publish them.

        Returns the :class:`~trainhealth._internal.sdc.selftest.SelftestResult` list; a failure is also a
        ``selftest_failed`` event. Never raises.
        """
        from trainhealth._internal.sdc.selftest import publish_results, run_selftest

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
        """Read the last device values, remove the hooks, export a last time and stop serving.

        The last OTLP push waits at most ``otel_close_timeout`` (1.5 s), whatever the endpoint does.
        """
        if self._closed:
            return
        self._closed = True
        atexit.unregister(self._atexit)
        for handle in self._hook_handles:
            handle.remove()
        self._hook_handles = []
        self._recorder.stats.release()
        for observer in () if self.health is None else self.health.observers:
            try:
                observer.close()
            except Exception as exc:  # one observer's failure leaves the others to close
                self.store.record_error(observer.source, exc)
        if self.gpu is not None:
            self.gpu.close()
        if self._owns_comm:
            comm_module.uninstall()
        self._recorder.close()
        self._sinks.close()

    def __enter__(self) -> Monitor:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()
