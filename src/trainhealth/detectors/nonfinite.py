"""Non-finite values: NaN or infinity where a number should be (loss, gradient norm).

>>> NonFinite().score([1.0, float("nan"), float("inf")]).tolist()
[0.0, 1.0, 1.0]
"""

from __future__ import annotations

from typing import Any

import numpy as np

from trainhealth.detectors.base import Detector

__all__ = ["NonFinite"]


class NonFinite(Detector):
    name = "nonfinite"
    default_threshold = 0.5
    default_critical = 0.5

    def __init__(self) -> None:
        super().__init__(warmup=1)

    def _allocate(self, n_series: int) -> None:
        pass

    def score(self, values: Any) -> np.ndarray:
        return (~np.isfinite(self._vector(values))).astype(np.float64)

    def learn(self, values: Any, mask: np.ndarray | None = None) -> None:
        self._vector(values)
