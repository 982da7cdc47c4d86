"""Bayesian online change-point detection: upward shifts caught within a few steps, a descent (with a fast
drop) never flagged upwards, the run-length posterior a distribution, the state bounded."""

from __future__ import annotations

import numpy as np
import pytest

from trainhealth._internal.detectors.bocpd import BOCPD
from trainhealth._internal.detectors.spec import parse_item
from trainhealth._internal.detectors.watch import Watch


def descending_loss(steps: int, seed: int) -> np.ndarray:
    """A noisy descending loss with a fast drop at step 300 (an LR decay) and noise that shrinks after it."""
    rng = np.random.default_rng(seed)
    t = np.arange(steps)
    loss = 2.0 + 2.5 * np.exp(-t / 150) - 0.4 * (t >= 300) * (1 - np.exp(-(t - 300) / 5))
    noise = np.where(t < 300, 0.04, 0.02) * rng.standard_t(5, steps)
    return loss * np.exp(noise)


def openings(item: str, values: np.ndarray) -> list[list[int]]:
    """Per series (a column of ``values``), the steps where an event opens."""
    spec = parse_item(item, "loss")
    watch = Watch("loss", spec.detector, decision=spec.decision())
    found: list[list[int]] = [[] for _ in range(values.shape[1])]
    for step, row in enumerate(values):
        for anomaly in watch.update(row, step=step).opened:
            found[int(anomaly.series)].append(step)
    return found


SEEDS = 4


def losses() -> np.ndarray:
    return np.column_stack([descending_loss(600, seed) for seed in range(SEEDS)])


def test_a_descent_with_a_fast_drop_raises_no_upward_change():
    assert openings("bocpd(direction=up,log=true)", losses()) == [[]] * SEEDS


@pytest.mark.parametrize("size", [0.1, 0.2])
def test_an_upward_shift_is_caught_within_a_few_steps(size):
    shifted = losses()
    shifted[450:] *= np.exp(size)  # +10% / +20%: 2.5 / 5 noise sigmas
    for found in openings("bocpd(direction=up,log=true)", shifted):
        assert found and 450 <= found[0] <= 458, found


def test_direction_down_sees_a_drop_and_both_sees_both_ways():
    up, down = descending_loss(600, 0), descending_loss(600, 0)
    up[450:] *= np.exp(0.2)
    down[450:] *= np.exp(-0.2)
    both = np.column_stack([up, down])
    caught = [[s for s in found if 450 <= s <= 460] for found in openings("bocpd(direction=down,log=true)", both)]
    assert not caught[0] and caught[1]
    caught = [[s for s in found if 450 <= s <= 460] for found in openings("bocpd(direction=up,log=true)", both)]
    assert caught[0] and not caught[1]
    assert all(any(450 <= s <= 460 for s in found) for found in openings("bocpd(log=true)", both))


def test_the_score_is_a_probability_and_the_posterior_sums_to_one():
    detector = BOCPD(max_run=50, warmup=10)
    rng = np.random.default_rng(2)
    for row in rng.normal(size=(200, 5)) + 10.0 * (np.arange(200)[:, None] >= 120):
        scores = detector.update(row)
        assert np.all(np.isnan(scores) | ((scores >= 0) & (scores <= 1)))
    np.testing.assert_allclose(detector._posterior.sum(axis=1), 1.0)
    assert detector._posterior.shape == (5, 50)
    np.testing.assert_allclose(detector.expected(), 10.0, atol=0.5)  # the level of the segment since the shift


def test_vectorised_equals_per_series_and_warm_up_is_nan():
    rng = np.random.default_rng(1)
    data = np.exp(rng.normal(0, 0.05, (120, 3)) + 0.3 * (np.arange(120)[:, None] >= 90))
    data[60, 1] = np.nan
    data[70, 2] = 0.0  # no logarithm: no verdict, not learnt
    vector = BOCPD(max_run=40, warmup=12, direction="up", log=True)
    scalars = [BOCPD(max_run=40, warmup=12, direction="up", log=True) for _ in range(3)]
    for step, row in enumerate(data):
        got = vector.update(row)
        expected = [scalars[i].update([row[i]])[0] for i in range(3)]
        np.testing.assert_allclose(got, expected, rtol=1e-9, atol=1e-12, equal_nan=True)
        assert np.isnan(got).all() == (step < 12)
    assert np.isnan(vector.score(data[70])[2]) and detector_params_round_trip(vector)


def detector_params_round_trip(detector: BOCPD) -> bool:
    clone = detector.clone()
    return clone.params() == detector.params() and clone.n_series is None


@pytest.mark.parametrize(
    "arguments, name",
    [
        ({"expected_run": 1.0}, "expected_run"),
        ({"recent": 0}, "recent"),
        ({"recent": 10, "max_run": 10}, "recent"),
        ({"warmup": 5, "recent": 5}, "warmup"),
        ({"min_scale": 0.0}, "min_scale"),
    ],
)
def test_bad_parameters_raise_naming_them(arguments, name):
    with pytest.raises(ValueError, match=name):
        BOCPD(**arguments)
