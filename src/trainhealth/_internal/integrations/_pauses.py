"""The pauses an integration announces for its trainer: checkpoint saves and evaluations (``Monitor.pause``).

While a pause lasts, neither this rank nor its peers waiting for it in a collective count as hung
(``trainhealth_comm_paused{reason}`` is 1). A trainer tells when a save or an evaluation begins and
ends either through two of its events (:meth:`Pauses.open` at the first, :meth:`Pauses.close` at the
second) or through one method of its own, which :meth:`Pauses.around` wraps on the instance. The
integration closes what is still open at the next step and when training ends (:meth:`Pauses.end`),
so its bookkeeping never leaves a pause open for the rest of the run. Nothing here raises into the
trainer: a failure is counted in ``trainhealth_exporter_errors_total{source="monitor"}`` and dropped.

>>> import torch
>>> from trainhealth._internal.exporters.monitor import Monitor
>>> monitor = Monitor(torch.nn.Linear(2, 1), comm=True, prometheus=False, otel=False, gpu_backend="off", env={})
>>> pauses = Pauses(monitor)
>>> pauses.open("evaluation")
>>> monitor.comm.watch.paused, pauses.is_open("evaluation")
(True, True)
>>> pauses.close("evaluation")
>>> monitor.comm.watch.paused
False
>>> pauses.end()
>>> monitor.close()
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from typing import Any

from trainhealth._internal.exporters.monitor import Monitor

__all__ = ["CHECKPOINT", "EVALUATION", "Pauses", "patch_method"]

#: The ``reason`` label of a checkpoint save's pause.
CHECKPOINT = "checkpoint"
#: The ``reason`` label of an evaluation's pause.
EVALUATION = "evaluation"


class Pauses:
    """The pauses one integration announces on ``monitor``: at most one open per reason between two events,
    any number nested around wrapped methods (the Monitor counts them)."""

    def __init__(self, monitor: Monitor) -> None:
        self._monitor = monitor
        self._open: dict[str, ExitStack] = {}
        self._restores: list[Callable[[], None]] = []

    def is_open(self, reason: str) -> bool:
        return reason in self._open

    def open(self, reason: str) -> None:
        """Open the pause ``reason`` until :meth:`close`; nothing when it is open already."""
        if reason not in self._open:
            self._open[reason] = self._enter(reason)

    def close(self, *reasons: str) -> None:
        """Close the pauses ``reasons`` (every open one without arguments); a pause that is not open is skipped."""
        for reason in reasons or tuple(self._open):
            stack = self._open.pop(reason, None)
            if stack is not None:
                self._exit(stack)

    @contextmanager
    def during(self, reason: str) -> Iterator[None]:
        """The pause ``reason`` around a block; what the block raises passes through unchanged."""
        stack = self._enter(reason)
        try:
            yield
        finally:
            self._exit(stack)

    def around(self, owner: Any, name: str, reason: str, after: Callable[[], None] | None = None) -> bool:
        """Run each call of ``owner.<name>`` (one instance's method) inside the pause ``reason``, then ``after()``
        when it returned. The call passes through unchanged; :meth:`end` puts the method back. False (and
        counted) when the method cannot be wrapped."""
        pauses = self

        def paused(original: Callable[..., Any]) -> Callable[..., Any]:
            def call(*args: Any, **kwargs: Any) -> Any:
                with pauses.during(reason):
                    result = original(*args, **kwargs)
                if after is not None:
                    try:
                        after()
                    except Exception as exc:  # noqa: BLE001 - never into the training loop
                        pauses._monitor.store.record_error("monitor", exc)
                return result

            return call

        try:
            self._restores.append(patch_method(owner, name, paused))
        except Exception as exc:  # noqa: BLE001
            self._monitor.store.record_error("monitor", exc)
            return False
        return True

    def end(self) -> None:
        """Close every open pause and put the wrapped methods back (training ended)."""
        self.close()
        restores, self._restores = self._restores, []
        for restore in reversed(restores):
            try:
                restore()
            except Exception as exc:  # noqa: BLE001
                self._monitor.store.record_error("monitor", exc)

    def _enter(self, reason: str) -> ExitStack:
        stack = ExitStack()
        try:
            stack.enter_context(self._monitor.pause(reason))
        except Exception as exc:  # noqa: BLE001 - never into the training loop
            self._monitor.store.record_error("monitor", exc)
        return stack

    def _exit(self, stack: ExitStack) -> None:
        try:
            stack.close()
        except Exception as exc:  # noqa: BLE001
            self._monitor.store.record_error("monitor", exc)


def patch_method(owner: Any, name: str, wrap: Callable[[Callable[..., Any]], Callable[..., Any]]) -> Callable[[], None]:
    """Replace ``owner.<name>`` (one instance's attribute) with ``wrap(original)``; returns what puts it back.

    Once put back, a wrapper that something else kept (wrapped again after us) is a plain pass-through.
    """
    original = getattr(owner, name)
    had_own = name in vars(owner)
    inner = wrap(original)
    active = True

    def wrapper(*args: Any, **kwargs: Any) -> Any:
        return inner(*args, **kwargs) if active else original(*args, **kwargs)

    def restore() -> None:
        nonlocal active
        active = False
        if vars(owner).get(name) is wrapper:
            if had_own:
                setattr(owner, name, original)
            else:
                delattr(owner, name)

    setattr(owner, name, wrapper)
    return restore
