"""How a metric is shaped over OTLP, and the name Prometheus gives it after translation.

A catalogue metric goes out over OTLP as ``trainhealth.<name>`` unless an
OpenTelemetry semantic convention covers it: then a :class:`Semconv` on its
:class:`~trainhealth._internal.catalog.spec.MetricSpec` names the convention's metric
(``hw.gpu.utilization``), its instrument, unit and attributes.

:func:`translated_prometheus_name` is the name a metric gets when the
OpenTelemetry Collector's Prometheus exporters or Prometheus's own OTLP receiver
translate it with their default strategy (``UnderscoreEscapingWithSuffixes``
of github.com/prometheus/otlptranslator): dots become underscores, then the unit
word, ``_total`` for monotonic sums and ``_ratio`` for gauges with unit ``1``.

>>> translated_prometheus_name("hw.gpu.memory.usage", "By", OtelInstrument.UP_DOWN_COUNTER)
'hw_gpu_memory_usage_bytes'
>>> translated_prometheus_name("trainhealth.train.steps", "{step}", OtelInstrument.COUNTER)
'trainhealth_train_steps_total'
>>> translated_prometheus_name("trainhealth.train.loss", "1", OtelInstrument.GAUGE)
'trainhealth_train_loss_ratio'
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from enum import Enum

__all__ = ["OtelAttribute", "OtelInstrument", "Semconv", "translated_prometheus_name"]


class OtelInstrument(Enum):
    """The OpenTelemetry instrument a metric is recorded with."""

    GAUGE = "ObservableGauge"
    COUNTER = "ObservableCounter"
    UP_DOWN_COUNTER = "ObservableUpDownCounter"
    HISTOGRAM = "Histogram"


@dataclass(frozen=True)
class OtelAttribute:
    """A point attribute made from one of the metric's labels.

    ``values`` renames label values (a state the convention calls otherwise), then
    ``template`` formats the result (``"gpu{}"`` makes ``hw.id="gpu0"`` of ``gpu="0"``).
    Where several label values become one attribute value (``lost`` and
    ``reset_required`` are both ``failed``), the points fall together and keep the
    largest value: the state holds when any of its states does.

    >>> OtelAttribute("gpu", "hw.id", "gpu{}").value("3")
    'gpu3'
    """

    label: str
    key: str
    template: str = "{}"
    values: tuple[tuple[str, str], ...] = ()

    def value(self, label_value: str) -> str:
        return self.template.format(dict(self.values).get(label_value, label_value))


@dataclass(frozen=True)
class Semconv:
    """The OpenTelemetry semantic-convention metric a catalogue metric is exported as over OTLP.

    ``attributes`` make the convention's attributes from labels, ``constants`` add
    fixed ones (``hw.type="gpu"``); every other label becomes ``trainhealth.<label>``.
    Metrics sharing a convention name (the die and memory temperatures are both
    ``hw.temperature``) share one instrument and differ in their attributes.
    """

    name: str
    instrument: OtelInstrument
    unit: str
    description: str
    attributes: tuple[OtelAttribute, ...] = ()
    constants: tuple[tuple[str, str], ...] = ()


# The translators' unit words (OpenTelemetry's Prometheus compatibility specification), which are
# not trainhealth's own table (spec.Unit): unit "1" has no word here, gauges get "_ratio" instead.
_UNIT_WORDS = {
    "d": "days",
    "h": "hours",
    "min": "minutes",
    "s": "seconds",
    "ms": "milliseconds",
    "us": "microseconds",
    "ns": "nanoseconds",
    "By": "bytes",
    "KiBy": "kibibytes",
    "MiBy": "mebibytes",
    "GiBy": "gibibytes",
    "TiBy": "tibibytes",
    "KBy": "kilobytes",
    "MBy": "megabytes",
    "GBy": "gigabytes",
    "TBy": "terabytes",
    "m": "meters",
    "V": "volts",
    "A": "amperes",
    "J": "joules",
    "W": "watts",
    "g": "grams",
    "Cel": "celsius",
    "Hz": "hertz",
    "1": "",
    "%": "percent",
}
_PER_UNIT_WORDS = {"s": "second", "m": "minute", "h": "hour", "d": "day", "w": "week", "mo": "month", "y": "year"}
_NOT_NAME_CHARS = re.compile(r"[^a-zA-Z0-9:]+")


def _unit_word(unit: str, words: dict[str, str]) -> str:
    unit = unit.strip()
    if not unit or "{" in unit or "}" in unit:  # an annotation such as {token} is not a unit
        return ""
    return words.get(unit, unit)


def _clean(word: str) -> str:
    return re.sub(r"_+", "_", _NOT_NAME_CHARS.sub("_", word)).lstrip("_")


def translated_prometheus_name(name: str, unit: str, instrument: OtelInstrument, *, ratio: bool = True) -> str:
    """The Prometheus name of an OTLP metric after the default OTLP-to-Prometheus translation.

    This is the Go translation of the Collector and of Prometheus 3.x. The Python
    ``opentelemetry-exporter-prometheus`` differs in one rule: it adds no ``_ratio``
    (``ratio=False`` gives its name).

    >>> translated_prometheus_name("hw.gpu.utilization", "1", OtelInstrument.GAUGE, ratio=False)
    'hw_gpu_utilization'
    """
    tokens = [token for token in _NOT_NAME_CHARS.split(name) if token]
    main, _, per = unit.partition("/")
    main_word = _clean(_unit_word(main, _UNIT_WORDS))
    per_word = _unit_word(per, _PER_UNIT_WORDS)
    per_word = _clean(f"per_{per_word}") if per_word else ""
    per_word = "" if per_word == "per_" else per_word.removesuffix("_")
    if main_word and main_word not in tokens:
        tokens.append(main_word.rstrip("_") if per_word else main_word)
    if per_word and per_word not in tokens:
        tokens.append(per_word)
    if instrument is OtelInstrument.COUNTER:
        tokens = [token for token in tokens if token != "total"] + ["total"]
    if ratio and unit == "1" and instrument is OtelInstrument.GAUGE:
        tokens = [token for token in tokens if token != "ratio"] + ["ratio"]
    translated = "_".join(tokens)
    return f"_{translated}" if translated[:1].isdigit() else translated
