"""Streaming detectors by name: the ``detectors`` setting's grammar, and one API for every detector.

A :class:`Detector` scores a vector of values (one per series) against the state before them and then
learns them; :func:`build_detector` makes one by name with its parameters checked, :func:`parse_spec`
reads a whole ``signal=detector(...)`` setting.

>>> from trainhealth.detectors import DETECTORS, build_detector, parse_spec
>>> sorted(DETECTORS)[:4]
['bocpd', 'delta', 'divergence', 'iqr']
>>> watch = build_detector("robust_z", {"window": 50, "warmup": 10, "threshold": 6}, signal="loss")
>>> for value in [2.0, 2.1, 1.9, 2.05, 1.95] * 4:
...     watch.detector.learn([value])
>>> float(watch.detector.score([2.02])[0]) < watch.threshold < float(watch.detector.score([9.0])[0])
True
>>> [(spec.signal, spec.detector.name) for spec in parse_spec("loss=spike,nonfinite;step_time=delta")]
[('loss', 'spike'), ('loss', 'nonfinite'), ('step_time', 'delta')]
"""

from trainhealth._internal.detectors.base import Detector
from trainhealth._internal.detectors.spec import DETECTORS, WatchSpec, build_detector, parse_spec

__all__ = ["DETECTORS", "Detector", "WatchSpec", "build_detector", "parse_spec"]
