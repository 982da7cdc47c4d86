"""PromQL idioms the alert rules and the dashboards share, so a panel shows what its alert counts.

>>> counted("xids", "1h")
'(increase(xids[1h]) > 0 or (xids > 0 unless xids offset 1h))'
"""

from __future__ import annotations

__all__ = ["counted"]


def counted(selector: str, window: str) -> str:
    """Events counted in ``window``: the increase, or the whole count of a series that did not exist before.

    An exporter creates an event counter's series at the first event (an XID, an anomaly), at 1: ``increase``
    alone never sees that first step.
    """
    return f"(increase({selector}[{window}]) > 0 or ({selector} > 0 unless {selector} offset {window}))"
