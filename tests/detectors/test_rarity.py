"""The rarity detector: a calibrated -log10 probability, high for new values, low for repeated ones."""

from __future__ import annotations

import numpy as np
import pytest

from trainhealth._internal.detectors.rarity import Rarity


def learnt(detector: Rarity, values: np.ndarray) -> Rarity:
    for row in values:
        detector.learn(row)
    return detector


def test_the_score_is_a_calibrated_probability():
    # on fresh draws from the history's own distribution, p <= 1% happens about 1% of the time
    rng = np.random.default_rng(4)
    detector = learnt(Rarity(history=2000, warmup=100), rng.normal(size=(2000, 1)))
    scores = np.array([detector.score([x])[0] for x in rng.normal(size=4000)])
    assert 0.005 < np.mean(scores >= 2.0) < 0.02
    assert 0.03 < np.mean(scores >= 1.0) < 0.2  # p <= 10%


HEAVY_AND_QUANTISED = {
    "student_t2": lambda rng, size: rng.standard_t(2, size),
    "lognormal": lambda rng, size: rng.lognormal(0.0, 1.0, size),
    "pareto": lambda rng, size: rng.pareto(1.5, size) + 1.0,  # tail index 1.5: no variance
    "poisson_mean_2": lambda rng, size: rng.poisson(2.0, size).astype(np.float64),
}


@pytest.mark.parametrize("name", sorted(HEAVY_AND_QUANTISED))
def test_calibrated_on_heavy_tailed_and_quantised_series(name):
    # 40 series, each with its own 4,096-value history, then 2,500 fresh draws each (100,000 scores): p <= 1 / 1,000
    # happens about once in a thousand draws; a count can only be as rare as its values allow
    draw = HEAVY_AND_QUANTISED[name]
    rng = np.random.default_rng(11)
    detector = learnt(Rarity(), draw(rng, (4096, 40)))
    scores = np.concatenate([detector.score(draw(rng, 40)) for _ in range(2500)])
    rate = np.mean(scores >= detector.default_threshold)
    assert rate <= 0.002
    if not name.startswith("poisson"):
        assert rate >= 0.0005
    assert np.mean(scores >= detector.default_critical) <= 0.0002


def test_values_inside_the_range_score_by_their_rank():
    # a value the history holds is judged by its rank alone: at most log10((n + 1) / 4) (the largest or smallest,
    # p = 2 x 2 / (n + 1)), 2.10 with 500 values; the second largest stays below the threshold with 4,096
    rng = np.random.default_rng(3)
    history = rng.standard_t(2, (500, 20))
    detector = learnt(Rarity(history=500), history)
    scores = np.array([detector.score(row) for row in history])
    assert scores.max() == pytest.approx(np.log10(501 / 4))
    history = rng.standard_t(2, (4096, 20))
    detector = learnt(Rarity(), history)
    ordered = np.sort(history, axis=0)
    assert detector.score(ordered[-1]) == pytest.approx(np.full(20, np.log10(4097 / 4)))
    assert np.all(detector.score(ordered[-2]) < detector.default_threshold)


def test_a_new_value_is_rare_and_a_repeated_one_becomes_common():
    detector = learnt(Rarity(history=500, warmup=50), np.array([[float(i % 10)] for i in range(500)]))
    assert detector.score([5.0])[0] < 0.5
    first = detector.score([40.0])[0]
    assert first > detector.default_threshold
    for _ in range(100):  # the new value keeps coming back: it becomes part of the history
        detector.learn([40.0])
    assert detector.score([40.0])[0] < 1.0 < first


def test_quantised_counts_are_judged_by_their_own_resolution():
    # mostly idle, now and then 1 or 2: a 3 is new but one step away, a 9 is far beyond anything seen
    rng = np.random.default_rng(0)
    counts = rng.choice([0.0, 1.0, 2.0], p=[0.9, 0.08, 0.02], size=(2000, 1))
    detector = learnt(Rarity(history=2000, warmup=100), counts)
    zero, one, two, three, five, nine = (detector.score([x])[0] for x in (0.0, 1.0, 2.0, 3.0, 5.0, 9.0))
    assert zero == 0.0 < one < two < 2.0 < three <= five < nine
    assert three >= detector.default_threshold  # beyond every one of 2,000 values: p < 1 / 1,000


def test_one_direction_only():
    detector = learnt(Rarity(history=500, warmup=50, direction="up"), np.sin(np.arange(500))[:, None])
    assert detector.score([-5.0])[0] == 0.0
    assert detector.score([5.0])[0] > detector.default_threshold


@pytest.mark.parametrize(
    "arguments", [{"history": 50, "warmup": 100}, {"tail": 0.5}, {"tail": 0.0}, {"refit_every": 0}]
)
def test_bad_parameters_raise(arguments):
    with pytest.raises(ValueError):
        Rarity(**arguments)
