"""Numeric command-line options with a documented range.

Every number an operational command takes is declared with :class:`Bounded` as its argparse
``type``: the parser refuses NaN, infinities, non-numbers and anything outside the range in
one line naming the option, before the command does anything, and ``--help`` shows the range.

>>> seconds = Bounded(float, 20, 86400, unit="seconds")
>>> seconds("150")
150.0
>>> seconds("nan")
Traceback (most recent call last):
...
argparse.ArgumentTypeError: expected a number of seconds from 20 to 86400, got 'nan'
>>> Bounded(int, 1, 65535)("70000")
Traceback (most recent call last):
...
argparse.ArgumentTypeError: expected an integer from 1 to 65535, got '70000'
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass

from trainhealth._internal.config.fields import Range

__all__ = ["PORT", "PORT_OR_ZERO", "Bounded"]


@dataclass(frozen=True)
class Bounded:
    """An argparse ``type``: an ``int`` or finite ``float`` from ``low`` to ``high`` (``low_open``: above ``low``),
    checked by the one :class:`~trainhealth._internal.config.fields.Range`."""

    kind: type[int] | type[float]
    low: float
    high: float
    unit: str = ""
    low_open: bool = False

    def __post_init__(self) -> None:
        if self.kind not in (int, float):
            raise TypeError(f"Bounded numbers are int or float, not {self.kind!r}")
        Range(self.low, self.high, above_low=self.low_open)  # refuses bounds that are not finite, low <= high

    @property
    def range(self) -> Range:
        return Range(self.low, self.high, unit=self.unit, above_low=self.low_open, integer=self.kind is int)

    @property
    def range_text(self) -> str:
        """``from 20 to 86400`` or ``above 0 up to 3600``."""
        return self.range.span

    def describe(self) -> str:
        if self.kind is int:
            what = f"a whole number of {self.unit}" if self.unit else "an integer"
        else:
            what = f"a number of {self.unit}" if self.unit else "a number"
        return f"{what} {self.range_text}"

    def accepts(self, value: float) -> bool:
        """Whether ``value`` is in the range (finite, and an integer for ``int``)."""
        return value in self.range

    def __call__(self, text: str) -> int | float:
        try:
            value = self.kind(text.strip())
        except (ValueError, OverflowError):
            value = None
        if value is None or not self.accepts(value):
            raise argparse.ArgumentTypeError(f"expected {self.describe()}, got {text!r}")
        return value


#: A TCP port to bind.
PORT = Bounded(int, 1, 65535)
#: A TCP port, or 0 (for a free port, or off: the option's help says which).
PORT_OR_ZERO = Bounded(int, 0, 65535)
