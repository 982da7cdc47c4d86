"""Host-timed rows the Monitor adds to the collective trace while the collective logger is active.

A ``step`` marker spans from the previous :meth:`~trainhealth.Monitor.step` call to this one
(the first step begins at the model's first forward pass, else at the Monitor's creation); the
root module's ``forward`` passes and ``optimizer.step()`` (as ``optimizer``) get a row each. From
them the logger exports how long each step computed and how long it waited in collectives
(``trainhealth_train_step_{compute,wait}_seconds_total``). The hooks record their errors and never raise.
"""

from __future__ import annotations

import threading
import time
from typing import Any

from trainhealth._internal.exporters.collectives.logger import CollectiveLogger
from trainhealth._internal.store import MetricStore

__all__ = ["StepMarkers"]


class StepMarkers:
    """The markers of one Monitor, on the clock of the collective records (``time.perf_counter``)."""

    def __init__(self, comm: CollectiveLogger, store: MetricStore) -> None:
        self._comm = comm
        self._store = store
        self._created = time.perf_counter()
        self._last_step: float | None = None
        self._first_step_began: float | None = None  # the first forward pass, when it precedes the first step
        self._forward_began: float | None = None
        self._optimizer_began: float | None = None

    def step(self, step: int, now: float) -> None:
        """Close training step ``step`` at ``now``; the collectives that follow belong to the next step."""
        previous, self._last_step = self._last_step, now
        if previous is None:
            previous = self._created if self._first_step_began is None else self._first_step_began
        self._comm.add_marker("step", step, previous, now - previous)
        self._comm.step = step + 1
        self._comm.training_thread = threading.get_ident()  # the loop's thread: whose stack says where a hang is

    # --- hooks: forward (pre and post) on the model, step (pre and post) on the optimizer ---
    def forward_begins(self, module: Any, args: Any) -> None:
        try:
            now = time.perf_counter()
            self._forward_began = now
            if self._first_step_began is None and self._last_step is None:
                self._first_step_began = now
        except Exception as exc:
            self._store.record_error("monitor", exc)

    def forward_ends(self, module: Any, args: Any, output: Any) -> None:
        try:
            began, self._forward_began = self._forward_began, None
            if began is not None:
                self._comm.add_marker("forward", self._comm.step, began, time.perf_counter() - began)
        except Exception as exc:
            self._store.record_error("monitor", exc)

    def optimizer_step_begins(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        self._optimizer_began = time.perf_counter()

    def optimizer_step_ends(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        try:
            began, self._optimizer_began = self._optimizer_began, None
            if began is not None:
                self._comm.add_marker("optimizer", self._comm.step, began, time.perf_counter() - began)
        except Exception as exc:
            self._store.record_error("monitor", exc)
