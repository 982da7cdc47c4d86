"""Does the loss come back after a spike? A spike that does not recover calls for a rewind.

Most loss spikes recover within tens of steps; one that does not leaves the
model somewhere worse, and the remedy is to restore the last checkpoint saved
before the spike began and skip the batches around it (PaLM: Scaling Language
Modeling with Pathways, section 5.1, https://arxiv.org/abs/2204.02311). A spike
starts when a loss detector opens an anomaly; ``patience`` steps later the
spike has recovered if the median of the last ten losses fell back below
``baseline + recovery_share * (peak - baseline)``.

>>> watch = LossSpikeRecovery(patience=5)
>>> for step in range(20):
...     _ = watch.observe(step, 2.0)
>>> watch.spike_began(20, 2.0)
>>> outcomes = [watch.observe(step, 6.0) for step in range(20, 26)]
>>> outcome = next(o for o in outcomes if o is not None)
>>> outcome.onset_step, outcome.recovered, outcome.baseline
(20, False, 2.0)
"""

from __future__ import annotations

import math
import statistics
from collections import deque
from dataclasses import dataclass

__all__ = ["LossSpikeRecovery", "SpikeOutcome"]


@dataclass(frozen=True)
class SpikeOutcome:
    """How a loss spike that began at ``onset_step`` looked ``patience`` steps later."""

    onset_step: int
    baseline: float
    peak: float
    level: float
    recovered: bool


class LossSpikeRecovery:
    """Follows one spike at a time; feed every step's loss to :meth:`observe`."""

    def __init__(self, patience: int = 50, window: int = 100, recovery_share: float = 0.25) -> None:
        self.patience = patience
        self.recovery_share = recovery_share
        self._history: deque[float] = deque(maxlen=window)
        self._recent: deque[float] = deque(maxlen=10)
        self._onset: int | None = None
        self._baseline = 0.0
        self._peak = 0.0

    def spike_began(self, step: int, loss: float) -> None:
        """A detector opened a loss anomaly at ``step`` (ignored while a spike is being followed)."""
        if self._onset is not None or not self._history:
            return
        self._onset = step
        self._baseline = statistics.median(self._history)
        self._peak = loss

    def observe(self, step: int, loss: float) -> SpikeOutcome | None:
        """Record ``loss``; returns the outcome once ``patience`` steps have passed since the onset."""
        if math.isnan(loss):  # the non-finite alerts own it
            return None
        self._recent.append(loss)
        if self._onset is None:
            self._history.append(loss)
            return None
        self._peak = max(self._peak, loss)
        if step - self._onset < self.patience:
            return None
        level = statistics.median(self._recent)
        threshold = self._baseline + self.recovery_share * (self._peak - self._baseline)
        outcome = SpikeOutcome(self._onset, self._baseline, self._peak, level, recovered=level <= threshold)
        self._onset = None
        self._history.clear()
        self._history.extend(self._recent)
        return outcome
