"""Non-finite values: NaN or infinity where a number should be (loss, gradient norm).

>>> NonFinite().score([1.0, float("nan"), float("inf")]).tolist()
[0.0, 1.0, 1.0]
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from trainhealth._internal.detectors.base import Detector

__all__ = ["NonFinite"]


@dataclass(eq=False, repr=False)
class NonFinite(Detector):
    """NaN or infinity where a number should be; the score is 1 for those, 0 otherwise (threshold 0.5).

    No parameters, no memory, no warm-up.

    >>> detector = NonFinite()
    >>> series = [2.1, 2.0, float("nan"), 1.9, float("inf")]
    >>> [i for i, x in enumerate(series) if detector.update([x])[0] > detector.default_threshold]
    [2, 4]
    """

    name = "nonfinite"
    default_threshold = 0.5
    default_critical = 0.5

    def __post_init__(self) -> None:
        self.warmup = 1
        super().__post_init__()

    def _allocate(self, n_series: int) -> None:
        pass

    def score(self, values: Any) -> np.ndarray:
        return (~np.isfinite(self._vector(values))).astype(np.float64)

    def learn(self, values: Any, mask: np.ndarray | None = None) -> None:
        self._vector(values)
