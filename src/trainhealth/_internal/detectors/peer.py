"""Peer comparison: at each step, a series that is a robust outlier among its peers.

Across the series of one update (the ranks of a job, the GPUs of a node), each
value is compared with the median of all of them in units of
``max(1.4826 * MAD, min_relative * |median|)``. The relative floor keeps
healthy spread from being flagged: GEMM speed varies by up to 14% between the
GPUs of one fleet (PRISM), so by default a rank must differ by more than
``threshold * min_relative`` = 15% of the median. A persistent outlier is a
straggler (slow compute) or, for values that should agree across replicas, an
SDC suspect. The detector has no memory; ask the decision step for
``min_consecutive`` points to require persistence.

>>> PeerOutlier().score([1.00, 1.01, 0.99, 1.40, 1.00]).round(1).tolist()
[0.0, 0.3, 0.3, 13.3, 0.0]
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from trainhealth._internal.detectors.base import Detector, Direction, directional

__all__ = ["PeerOutlier"]


@dataclass(eq=False, repr=False)
class PeerOutlier(Detector):
    """A series unlike its peers at the same step: a slow rank, a GPU that disagrees with its replicas.

    The score is the distance from the median of the step's values in units of
    ``max(1.4826 * MAD, min_relative * |median|)`` (default threshold 5, critical 10).
    There is no memory and no warm-up: each update is judged alone.

    Parameters
    ----------
    direction
        ``"both"``, or ``"up"`` / ``"down"`` to score deviations one way only (the other way scores 0).
    min_relative
        Floor on the scale relative to the median, so healthy spread is not flagged.
    min_peers
        How many finite values (>= 3) a step needs for a verdict (NaN otherwise).

    >>> detector = PeerOutlier()
    >>> step_times = [1.00, 1.01, 0.99, 1.40, 1.00]  # one value per rank
    >>> [rank for rank, s in enumerate(detector.update(step_times)) if s > detector.default_threshold]
    [3]
    """

    name = "peer"
    default_threshold = 5.0
    default_critical = 10.0

    direction: Direction = "both"
    min_relative: float = 0.03
    min_peers: int = 3

    def __post_init__(self) -> None:
        self.warmup = 1
        super().__post_init__()
        if self.min_peers < 3:
            raise ValueError("min_peers must be >= 3: an outlier needs a majority to differ from")
        self._median = np.zeros(0)

    def _allocate(self, n_series: int) -> None:
        pass

    def score(self, values: Any) -> np.ndarray:
        x = self._vector(values)
        finite = x[np.isfinite(x)]
        if len(finite) < self.min_peers:
            return np.full(len(x), np.nan)
        median = float(np.median(finite))
        scale = max(1.4826 * float(np.median(np.abs(finite - median))), self.min_relative * abs(median), 1e-12)
        self._median = np.full(len(x), median)
        return directional((x - median) / scale, self.direction)

    def learn(self, values: Any, mask: np.ndarray | None = None) -> None:
        self._vector(values)

    def expected(self) -> np.ndarray:
        return self._median if len(self._median) == (self.n_series or 0) else np.full(self.n_series or 0, np.nan)
