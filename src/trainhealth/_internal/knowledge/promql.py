r"""PromQL idioms the alert rules, the dashboards and the analyzer share, so a panel shows what its alert counts.

>>> counted("xids", "1h")
'(increase(xids[1h]) > 0 or (xids > 0 unless xids offset 1h))'
>>> print("up{job=" + string_literal('llm "70b"') + "}")
up{job="llm \"70b\""}
"""

from __future__ import annotations

__all__ = ["counted", "string_literal"]

_ESCAPES = {"\\": "\\\\", '"': '\\"', "\n": "\\n", "\r": "\\r", "\t": "\\t"}


def counted(selector: str, window: str) -> str:
    """Events counted in ``window``: the increase, or the whole count of a series that did not exist before.

    An exporter creates an event counter's series at the first event (an XID, an anomaly), at 1: ``increase``
    alone never sees that first step.
    """
    return f"(increase({selector}[{window}]) > 0 or ({selector} > 0 unless {selector} offset {window}))"


def string_literal(value: str) -> str:
    r"""``value`` as a double-quoted PromQL string literal, for a label value the user gave (``--job``).

    PromQL strings follow Go's escaping: a backslash and a double quote are escaped, and a newline may not
    appear raw (``\n``, ``\r``, ``\t``); other control characters are written as ``\xNN``. Everything else
    (UTF-8 included) is kept, so the literal matches exactly ``value``, never more.

    >>> print(string_literal("llm-70b"))
    "llm-70b"
    >>> print(string_literal('a"} or up{job="b'))
    "a\"} or up{job=\"b"
    >>> print(string_literal("back\\slash, new\nline, bell\a, naïve"))
    "back\\slash, new\nline, bell\x07, naïve"
    """
    return (
        '"'
        + "".join(_ESCAPES.get(c) or (f"\\x{ord(c):02x}" if ord(c) < 0x20 or ord(c) == 0x7F else c) for c in value)
        + '"'
    )
