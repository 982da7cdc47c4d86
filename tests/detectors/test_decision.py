"""The decision step: one event per anomaly, hysteresis, cooldown, persistence, protection."""

from __future__ import annotations

import numpy as np

from trainhealth._internal.detectors.decision import Decision
from trainhealth._internal.detectors.watch import Watch
from trainhealth._internal.detectors.zscore import ZScore


def run(decision: Decision, scores: list[float]) -> tuple[list[int], list[int]]:
    opened, closed = [], []
    for t, score in enumerate(scores):
        step = decision.step(np.array([score]))
        opened += [t] * len(step.opened)
        closed += [t] * len(step.closed)
    return opened, closed


def test_a_burst_above_threshold_is_one_event():
    opened, closed = run(Decision(3.0), [0, 4, 5, 4, 6, 0, 0, 0, 0])
    assert opened == [1] and closed == [5]


def test_hysteresis_keeps_an_event_open_above_release():
    opened, closed = run(Decision(3.0, release=1.5), [0, 4, 2, 2, 2, 1, 0])
    assert opened == [1] and closed == [5]


def test_cooldown_merges_events_separated_by_a_short_gap():
    assert run(Decision(3.0, cooldown=2), [4, 0, 0, 4, 0, 0, 0, 0]) == ([0], [6])
    assert run(Decision(3.0, cooldown=0), [4, 0, 0, 4, 0]) == ([0, 3], [1, 4])


def test_min_consecutive_requires_persistence():
    assert run(Decision(3.0, min_consecutive=3), [4, 4, 0, 4, 4, 4, 0])[0] == [5]


def test_no_verdict_is_never_an_event():
    assert run(Decision(3.0), [np.nan, np.nan, 4.0]) == ([2], [])


def test_protection_keeps_a_level_change_from_becoming_the_baseline():
    """A run of anomalous values stays anomalous when protected, and becomes normal when not."""
    rng = np.random.default_rng(0)
    values = np.r_[rng.normal(0, 1, 200), rng.normal(8, 1, 60)]

    def last_scores(protect: bool, max_protected: int = 1000) -> float:
        decision = Decision(4.0, protect=protect, max_protected=max_protected, max_protected_share=1.0)
        watch = Watch("x", ZScore(window=50, warmup=20), decision=decision)
        scores = [watch.update([v], step=t).scores[0] for t, v in enumerate(values)]
        return float(np.mean(scores[-10:]))

    assert last_scores(protect=True) > 6
    assert last_scores(protect=False) < 2
    # protection gives way after max_protected points: a lasting change becomes the new normal
    assert last_scores(protect=True, max_protected=20) < 2


def test_watch_reports_open_and_closed_anomalies_with_their_peak():
    watch = Watch("loss", ZScore(window=30, warmup=10), series=("r0",))
    rng = np.random.default_rng(1)
    for t in range(30):
        watch.update([2.0 + rng.normal(0, 0.01)], step=t, time=float(t))
    opened = watch.update([2.5], step=30, time=30.0).opened
    watch.update([3.0], step=31, time=31.0)
    closed = []
    for t in range(32, 40):
        closed += watch.update([2.0], step=t, time=float(t)).closed
    (first,) = opened
    (done,) = closed
    assert (first.start_step, first.series, first.value) == (30, "r0", 2.5) and first.end_step is None
    assert (
        done.start_step == 30 and done.value == 3.0 and done.step == 31 and done.end_step == 35
    )  # 4 quiet steps > cooldown 3
    assert done.expected == pytest_approx(2.0)


def pytest_approx(value: float):
    import pytest

    return pytest.approx(value, abs=0.01)
