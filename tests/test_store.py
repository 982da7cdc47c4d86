"""The in-memory store: kinds, labels, bounds and snapshots."""

from __future__ import annotations

import threading

import pytest

from trainhealth._internal import catalog
from trainhealth._internal.store import HistogramValue, MetricStore


def test_kinds_are_enforced():
    store = MetricStore()
    with pytest.raises(TypeError):
        store.inc(catalog.TRAIN_LOSS)
    with pytest.raises(TypeError):
        store.set(catalog.TRAIN_STEPS, 1)
    with pytest.raises(ValueError, match="counters only go up"):
        store.inc(catalog.TRAIN_STEPS, -1)
    with pytest.raises(ValueError, match="takes labels"):
        store.set(catalog.TRAIN_LEARNING_RATE, 0.1)


def test_histogram_buckets_and_nonfinite_values():
    store = MetricStore()
    for value in (0.005, 0.01, 0.3, 1000.0, float("nan")):
        store.observe(catalog.TRAIN_STEP_DURATION, value)
    histogram = store.value(catalog.TRAIN_STEP_DURATION)
    assert isinstance(histogram, HistogramValue)
    assert histogram.count == 4 and histogram.sum == pytest.approx(1000.315)
    buckets = catalog.TRAIN_STEP_DURATION.buckets
    cumulative = dict(zip(buckets + (float("inf"),), histogram.cumulative()))
    assert cumulative[0.01] == 2  # le is inclusive
    assert cumulative[0.5] == 3
    assert cumulative[300.0] == 3 and cumulative[float("inf")] == 4


def test_series_limit_drops_new_label_sets_and_counts_them():
    store = MetricStore(max_series=2)
    for group in ("a", "b", "c", "d"):
        store.set(catalog.TRAIN_LAYER_GRAD_NORM, 1.0, (group,))
    store.set(catalog.TRAIN_LAYER_GRAD_NORM, 5.0, ("a",))  # existing series still update
    assert [labels for labels, _ in store.series(catalog.TRAIN_LAYER_GRAD_NORM)] == [("a",), ("b",)]
    assert store.value(catalog.TRAIN_LAYER_GRAD_NORM, ("a",)) == 5.0
    assert store.value(catalog.EXPORTER_ERRORS, ("series_limit",)) == 2


def test_snapshot_is_a_copy():
    store = MetricStore()
    store.set(catalog.TRAIN_LOSS, 1.0)
    snapshot = store.snapshot()
    store.set(catalog.TRAIN_LOSS, 2.0)
    (family,) = snapshot
    assert family.samples == (((), 1.0),)


def test_a_failing_observer_is_counted():
    store = MetricStore()

    def broken(spec, value, labels):
        raise RuntimeError("sink down")

    store.add_observer(broken)
    store.observe(catalog.TRAIN_STEP_DURATION, 0.2)
    assert store.value(catalog.EXPORTER_ERRORS, ("observer",)) == 1
    assert store.value(catalog.TRAIN_STEP_DURATION).count == 1


def test_concurrent_writers_lose_no_increments():
    store = MetricStore()

    def work():
        for _ in range(2000):
            store.inc(catalog.TRAIN_STEPS)
            store.snapshot()

    threads = [threading.Thread(target=work) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert store.value(catalog.TRAIN_STEPS) == 8000
