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

from typing import Any

import numpy as np

from trainhealth.detectors.base import Detector, Direction, directional

__all__ = ["PeerOutlier"]


class PeerOutlier(Detector):
    name = "peer"
    default_threshold = 5.0
    default_critical = 10.0

    def __init__(self, direction: Direction = "both", min_relative: float = 0.03, min_peers: int = 3) -> None:
        super().__init__(warmup=1)
        if min_peers < 3:
            raise ValueError("min_peers must be >= 3: an outlier needs a majority to differ from")
        self.direction, self.min_relative, self.min_peers = direction, min_relative, min_peers
        self._median = np.zeros(0)

    def params(self) -> dict[str, Any]:
        return {"direction": self.direction, "min_relative": self.min_relative, "min_peers": self.min_peers}

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
