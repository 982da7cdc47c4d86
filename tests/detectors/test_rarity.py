"""The rarity detector: a calibrated -log10 probability, high for new values, low for repeated ones."""

from __future__ import annotations

import numpy as np
import pytest

from trainhealth.detectors.rarity import Rarity


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


@pytest.mark.parametrize("arguments", [{"history": 50, "warmup": 100}, {"tail": 0.5}, {"tail": 0.0},
                                       {"refit_every": 0}])
def test_bad_parameters_raise(arguments):
    with pytest.raises(ValueError):
        Rarity(**arguments)
