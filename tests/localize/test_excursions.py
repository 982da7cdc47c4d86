"""Recurrence judged against the run's own episodes: the rule's power and its false-blame bound."""

from __future__ import annotations

import numpy as np

from trainhealth._internal.localize.excursions import binomial_tail, recurrent_members

ROWS, STEPS = 64, 1000


def _with_episodes(
    rng: np.random.Generator,
    count: int,
    lengths: tuple[int, int],
    strength: tuple[float, float],
    rows: int = ROWS,
    steps: int = STEPS,
) -> np.ndarray:
    """Quiet rows with ``count`` episodes on random rows at random steps."""
    values = rng.normal(0.0, 0.01, (rows, steps))
    for _ in range(count):
        row, start = rng.integers(rows), rng.integers(0, steps - 10)
        values[row, start : start + rng.integers(lengths[0], lengths[1] + 1)] = rng.uniform(*strength)
    return values


def test_three_long_episodes_stand_out_of_many_short_ones():
    """A device slow for 5 steps three times, in a run whose 40 other episodes last 2 steps (GC pauses): counted
    against all 43 episodes the three are ordinary (P = 5e-4 per row, above 1% / 64); against the episodes as
    long as they are, they are not."""
    rng = np.random.default_rng(7)
    values = _with_episodes(rng, 40, (2, 2), (0.5, 1.5))
    values[17] = rng.normal(0.0, 0.01, STEPS)
    for start in (100, 480, 830):
        values[17, start : start + 5] = 0.4  # weaker than most of the short ones: only its length stands out
    assert binomial_tail(3, 43, 1 / ROWS) > 0.01 / ROWS
    assert sorted(recurrent_members(values, level=0.1)) == [17]


def test_three_strong_episodes_stand_out_of_many_shallow_ones():
    """Three 3-step episodes at 2.5x (log 0.9) on one NIC among 60 congestion episodes of 3-6 steps at 5-12%."""
    rng = np.random.default_rng(8)
    values = _with_episodes(rng, 60, (3, 6), (0.10, 0.12))
    values[5] = rng.normal(0.0, 0.01, STEPS)
    for start in (50, 400, 700):
        values[5, start : start + 3] = 0.9
    assert sorted(recurrent_members(values, level=0.1)) == [5]


def test_episodes_falling_at_random_blame_nobody_in_99_percent_of_runs():
    """The bound the rule promises, measured: 300 runs of 64 rows whose 20-80 episodes of every length and
    strength fall on random rows (none recurrent by construction) name a row in at most 1% of them; 9 or more
    of 300 would happen with probability 0.4% if the rate were 1%."""
    rng = np.random.default_rng(2026)
    blamed = 0
    for _ in range(300):
        values = _with_episodes(rng, int(rng.integers(20, 81)), (2, 6), (0.12, 1.5), steps=400)
        blamed += bool(recurrent_members(values, level=0.1))
    assert blamed <= 8, blamed
