"""Root-cause localization: which GPU, link or host makes the steps irregular, or why no one can be named.

:func:`localize` judges trace records (trace format v1); :class:`Analyzer` does it continuously over a
:class:`TraceDirectory` or a :class:`PrometheusSource` (the ``trainhealth analyze`` service). A window
that cannot support an answer gets the verdict ``insufficient_data``, never ``healthy``.

Four ranks in data parallel, rank 2 computing twice as long from step 15:

>>> import numpy as np, pandas as pd
>>> from trainhealth.localize import localize
>>> rng, rows = np.random.default_rng(0), []
>>> for step in range(30):
...     compute = [0.1 * (1 + 0.02 * rng.standard_normal()) * (2 if rank == 2 and step >= 15 else 1)
...                for rank in range(4)]
...     for rank, seconds in enumerate(compute):
...         rows += [dict(rank=rank, step=step, op="forward", start=step, duration=seconds / 3),
...                  dict(rank=rank, step=step, op="backward", start=step + seconds / 3, duration=2 * seconds / 3),
...                  dict(rank=rank, step=step, op="all_reduce", group="dp", seq=step, start=step + seconds,
...                       duration=max(compute) - seconds + 0.01)]
>>> result = localize(pd.DataFrame(rows))
>>> result.verdict, [suspect.component for suspect in result.suspects], result.irregular_steps[0]
('compute', ['gpu:rank-2'], 15)
>>> localize(pd.DataFrame(rows[:0])).verdict
'insufficient_data'
"""

from typing import TYPE_CHECKING as _TYPE_CHECKING

from trainhealth._internal._extras import lazy_attributes as _lazy_attributes

if _TYPE_CHECKING:
    from trainhealth._internal.localize.analyzer import Analyzer
    from trainhealth._internal.localize.candidates import Thresholds
    from trainhealth._internal.localize.localizer import localize
    from trainhealth._internal.localize.result import VERDICTS, JobResults, LocalizationResult, Suspect
    from trainhealth._internal.localize.sources import PrometheusSource, TraceDirectory

__all__ = [
    "VERDICTS",
    "Analyzer",
    "JobResults",
    "LocalizationResult",
    "PrometheusSource",
    "Suspect",
    "Thresholds",
    "TraceDirectory",
    "localize",
]

#: Each name's home; they load on first use, so a missing 'analysis' extra is one line naming the pip install.
_HOME = {
    "Analyzer": "localize.analyzer",
    "Thresholds": "localize.candidates",
    "localize": "localize.localizer",
    "VERDICTS": "localize.result",
    "JobResults": "localize.result",
    "LocalizationResult": "localize.result",
    "Suspect": "localize.result",
    "PrometheusSource": "localize.sources",
    "TraceDirectory": "localize.sources",
}

__getattr__ = _lazy_attributes(
    __name__, {name: f"trainhealth._internal.{home}" for name, home in _HOME.items()}, "analysis"
)
