"""The step path's one extension point: every observer is called at the same points, in order, on the documented
threads, gets the tensors it asked to be read, and one that raises is counted without costing the step or the
other observers. Real parts throughout: a torch model and optimizer, the recorder, its readout and export thread."""

from __future__ import annotations

import threading
from collections.abc import Mapping
from typing import Any

import pytest
import torch

from trainhealth._internal import catalog
from trainhealth._internal.config import Settings
from trainhealth._internal.detectors.runner import SignalDetectors
from trainhealth._internal.exporters.step_observer import StepObserver
from trainhealth._internal.exporters.step_records import StepStats
from trainhealth._internal.exporters.steps import StepRecorder
from trainhealth._internal.exporters.wiring import parameter_stats
from trainhealth._internal.store import MetricStore


class Journal(StepObserver):
    """Writes down each call: (point, index, thread), and the value read for the tensor it asked for."""

    source = "journal"

    def __init__(self) -> None:
        self.calls: list[tuple[str, int, str]] = []
        self.read: dict[int, float] = {}
        self.steps: dict[int, int] = {}

    def _note(self, point: str, index: int) -> None:
        self.calls.append((point, index, threading.current_thread().name))

    def device_values(self, index: int) -> list[tuple[str, Any, int]]:
        self._note("device_values", index)
        return [("journal_value", torch.tensor(float(10 * index + 1)), 1)]

    def lockstep(self, index: int, step: int) -> None:
        self._note("lockstep", index)
        self.steps[index] = step

    def recorded(self, index: int) -> None:
        self._note("recorded", index)

    def finished(self, index: int, stats: StepStats, read: Mapping[str, Any]) -> None:
        self._note("finished", index)
        self.read[index] = read["journal_value"]


class Failing(StepObserver):
    """Raises at every point."""

    source = "failing"

    def device_values(self, index: int) -> list[tuple[str, Any, int]]:
        raise RuntimeError("device_values")

    def lockstep(self, index: int, step: int) -> None:
        raise RuntimeError("lockstep")

    def recorded(self, index: int) -> None:
        raise RuntimeError("recorded")

    def finished(self, index: int, stats: StepStats, read: Mapping[str, Any]) -> None:
        raise RuntimeError("finished")


def _recorder(observers: list[StepObserver], hooked: bool) -> tuple[StepRecorder, Any, Any, MetricStore]:
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    settings = Settings.resolve(env={}, prometheus=False, otel=False)
    store = MetricStore(settings.store.max_series_per_metric)
    stats, labels = parameter_stats(torch, model, optimizer if hooked else None, settings.training.max_layer_groups)
    recorder = StepRecorder(
        torch,
        store,
        settings.training,
        stats,
        labels,
        optimizer if hooked else None,
        SignalDetectors([], store=store),
        observers,
        None,
    )
    if hooked:
        optimizer.register_step_pre_hook(recorder.before_optimizer_step)
        optimizer.register_step_post_hook(recorder.after_optimizer_step)
    return recorder, model, optimizer, store


def _train(recorder: StepRecorder, model: Any, optimizer: Any, steps: int) -> None:
    for step in range(steps):
        loss = model(torch.ones(2, 4)).pow(2).mean()
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        recorder.record(loss.detach(), None, None, 100 + step)
    assert recorder.flush(30.0)


@pytest.mark.parametrize("hooked", [True, False], ids=["optimizer hooked", "no optimizer hooked"])
def test_each_point_is_called_in_order_on_its_thread_and_the_asked_tensor_comes_back(hooked):
    journal = Journal()
    recorder, model, optimizer, store = _recorder([journal], hooked)
    _train(recorder, model, optimizer, 3)
    recorder.close()
    main = threading.current_thread().name
    for index in range(3):
        calls = [(point, thread) for point, i, thread in journal.calls if i == index]
        # hooked: the lockstep point is the optimizer step, before the Monitor's step; else inside it
        order = ["lockstep", "device_values", "recorded"] if hooked else ["device_values", "lockstep", "recorded"]
        assert [point for point, _ in calls] == [*order, "finished"]
        assert [thread for _, thread in calls[:3]] == [main] * 3
        assert calls[3][1] != main  # the export thread
        assert journal.read[index] == pytest.approx(10 * index + 1)
    assert journal.steps == ({0: 0, 1: 101, 2: 102} if hooked else {0: 100, 1: 101, 2: 102})
    assert store.value(catalog.TRAIN_STEPS) == 3


def test_an_observer_that_raises_is_counted_and_costs_nothing_else():
    journal = Journal()
    recorder, model, optimizer, store = _recorder([Failing(), journal], hooked=True)
    _train(recorder, model, optimizer, 2)
    recorder.close()
    assert store.value(catalog.TRAIN_STEPS) == 2  # both steps exported, their loss too
    assert store.value(catalog.TRAIN_LOSS) is not None
    assert store.value(catalog.EXPORTER_ERRORS, ("failing",)) == 2 * 4  # four points per step
    assert store.value(catalog.EXPORTER_ERRORS, ("journal",)) in (None, 0.0)
    assert journal.read == {0: pytest.approx(1.0), 1: pytest.approx(11.0)}  # the other observer saw every step
