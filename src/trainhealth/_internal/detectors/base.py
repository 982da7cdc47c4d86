"""The detector API: score first, learn after, one value per series per update.

A detector holds bounded per-series state. :meth:`Detector.score` judges new
values against what was learnt before them (a point is never part of its own
baseline) and returns NaN where there is no verdict yet (warm-up);
:meth:`Detector.learn` then takes them in, for the series in ``mask`` only —
the decision step (:class:`~trainhealth._internal.detectors.decision.Decision`) leaves
flagged points out so an anomaly does not become the baseline. Values are a
vector, one per series (rank, GPU), so one call covers a whole cluster; a scalar
is a vector of one.

Scores are "higher is more anomalous" on a detector-specific scale (z units,
IQR units, a ratio); each detector names its default threshold.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import fields, is_dataclass
from typing import Any, ClassVar, Literal

import numpy as np

__all__ = ["Detector", "Direction", "directional"]

Direction = Literal["both", "up", "down"]


def directional(deviation: np.ndarray, direction: Direction) -> np.ndarray:
    """Signed deviations as scores: both ways, or only upwards / downwards (the rest score 0)."""
    if direction == "up":
        return np.where(np.isnan(deviation), np.nan, np.maximum(deviation, 0.0))
    if direction == "down":
        return np.where(np.isnan(deviation), np.nan, np.maximum(-deviation, 0.0))
    return np.abs(deviation)


class Detector(ABC):
    """Base class: vectors in, scores out, bounded state.

    A concrete detector is a ``@dataclass(eq=False, repr=False)``: its constructor
    arguments are its fields, checked in ``__post_init__``, which calls this one
    first (to check ``warmup`` and start with no series); :meth:`params`, ``repr``
    and :meth:`clone` follow from the fields. The streaming state is no field:
    :meth:`_allocate` creates it once the number of series is known. ``eq=False``
    keeps equality and hashing by identity, as for any stateful object.
    """

    name: ClassVar[str]
    default_threshold: ClassVar[float]
    default_critical: ClassVar[float | None] = None

    warmup: int  # values learnt before a series gets a verdict (a field, or set in __post_init__)
    n_series: int | None  # the number of series, fixed by the first update

    def __post_init__(self) -> None:
        if self.warmup < 1:
            raise ValueError("warmup must be >= 1")
        self.n_series = None

    def _vector(self, values: Any) -> np.ndarray:
        array = np.asarray(values, dtype=np.float64).reshape(-1)
        if self.n_series is None:
            self.n_series = len(array)
            self._allocate(len(array))
        elif len(array) != self.n_series:
            raise ValueError(f"{self.name}: expected {self.n_series} values (one per series), got {len(array)}")
        return array

    @abstractmethod
    def _allocate(self, n_series: int) -> None:
        """Create the per-series state once the number of series is known."""

    @abstractmethod
    def score(self, values: Any) -> np.ndarray:
        """Scores of ``values`` against the state before them; NaN where there is no verdict."""

    @abstractmethod
    def learn(self, values: Any, mask: np.ndarray | None = None) -> None:
        """Take ``values`` into the state, for the series in ``mask`` (default all)."""

    def expected(self) -> np.ndarray:
        """What each series was expected to be, for anomaly records (NaN where unknown)."""
        return np.full(self.n_series or 0, np.nan)

    def update(self, values: Any, mask: np.ndarray | None = None) -> np.ndarray:
        """Score, then learn everything in ``mask``: the plain streaming loop."""
        scores = self.score(values)
        self.learn(values, mask)
        return scores

    def __repr__(self) -> str:
        fields = ", ".join(f"{k}={v!r}" for k, v in self.params().items())
        return f"{type(self).__name__}({fields})"

    def params(self) -> dict[str, Any]:
        """The constructor arguments (the dataclass fields that ``__init__`` takes), for repr and cloning."""
        if not is_dataclass(self):
            return {}
        return {field.name: getattr(self, field.name) for field in fields(self) if field.init}

    def clone(self) -> Detector:
        """A fresh detector with the same parameters and no state."""
        return type(self)(**self.params())
