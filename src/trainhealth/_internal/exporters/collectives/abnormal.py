"""Local abnormal-operator summary: keep only the collectives far above their recent baseline.

Holmes ships only abnormal operators off a node (96.6% less data). Per rank and
per (op, group, message-size class) the filter keeps a window of recent
durations; a record is abnormal when it exceeds both ``ratio`` times the
window's median and the median plus ``mad_factor`` robust standard deviations
(1.4826 * MAD). Nothing is judged before ``min_baseline`` samples. Flagged
records stay out of the window, so a run of slow collectives does not raise
its own bar — unless most recent records are flagged: then the slower level is
the new normal (a different phase of training) and is learnt.

>>> import numpy as np
>>> f = AbnormalFilter(window=64, min_baseline=8)
>>> f.flag(("all_reduce", "dp", 20), np.full(32, 0.010) + np.linspace(0, 1e-4, 32))
array([], dtype=int64)
>>> f.flag(("all_reduce", "dp", 20), np.array([0.0101, 0.050, 0.0099]))
array([1])
"""

from __future__ import annotations

from collections import deque
from collections.abc import Hashable

import numpy as np

__all__ = ["AbnormalFilter"]


class AbnormalFilter:
    """Flags durations far above the recent baseline of their key; bounded per key."""

    def __init__(
        self,
        window: int = 256,
        min_baseline: int = 32,
        ratio: float = 2.0,
        mad_factor: float = 4.0,
        max_keys: int = 1024,
        drift_share: float = 0.5,
    ) -> None:
        if window < min_baseline or min_baseline < 2:
            raise ValueError("need window >= min_baseline >= 2")
        self._window = window
        self._min_baseline = min_baseline
        self._ratio = ratio
        self._mad_factor = mad_factor
        self._max_keys = max_keys
        self._drift_share = drift_share
        self._baselines: dict[Hashable, deque[float]] = {}
        self._recent_flags: dict[Hashable, deque[bool]] = {}

    def flag(self, key: Hashable, durations: np.ndarray) -> np.ndarray:
        """Indices of ``durations`` (in arrival order) that are abnormal; then learn them all."""
        baseline = self._baselines.get(key)
        if baseline is None:
            if len(self._baselines) >= self._max_keys:
                return np.array([], dtype=np.int64)
            baseline = self._baselines[key] = deque(maxlen=self._window)
            self._recent_flags[key] = deque(maxlen=self._min_baseline)
        if len(baseline) < self._min_baseline:
            baseline.extend(durations[-self._window :].tolist())  # what the window keeps of them
            return np.array([], dtype=np.int64)
        history = np.fromiter(baseline, dtype=np.float64, count=len(baseline))
        median = float(np.median(history))
        spread = 1.4826 * float(np.median(np.abs(history - median)))
        threshold = max(self._ratio * median, median + self._mad_factor * spread)
        is_flagged = durations > threshold
        recent = self._recent_flags[key]
        recent.extend(is_flagged[-self._min_baseline :].tolist())  # what the deques keep, not the whole batch
        drifting = sum(recent) > self._drift_share * len(recent)
        baseline.extend((durations if drifting else durations[~is_flagged])[-self._window :].tolist())
        return np.flatnonzero(is_flagged)
