"""What a metric declaration is: the kinds, the unit table, and the naming rules every :class:`MetricSpec` obeys."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from enum import Enum

from trainhealth._internal.catalog.otel import OtelInstrument, Semconv, translated_prometheus_name

__all__ = ["IDENTITY_LABELS", "MetricKind", "MetricSpec", "PREFIX", "Unit"]

PREFIX = "trainhealth"

#: Labels every trainhealth series carries, added by the exporters from the
#: process identity (see :mod:`trainhealth._internal.identity`). All three are bounded:
#: one value per job, per node, per rank.
IDENTITY_LABELS: tuple[str, ...] = ("job", "host", "rank")

#: Label names that would make cardinality unbounded or collide with
#: Prometheus' own; a declaration using one fails at import.
_FORBIDDEN_LABELS = frozenset(
    {"step", "iteration", "tensor", "param", "parameter", "message", "text", "le", "quantile", "instance"}
)
_NAME_RE = re.compile(r"^[a-z][a-z0-9_]*(\.[a-z][a-z0-9_]*)*$")
_LABEL_RE = re.compile(r"^[a-z][a-z0-9_]*$")


class MetricKind(Enum):
    """How a metric aggregates; decides the Prometheus type and the OpenTelemetry instrument."""

    GAUGE = "gauge"
    COUNTER = "counter"
    HISTOGRAM = "histogram"
    INFO = "info"

    @property
    def otel_instrument(self) -> OtelInstrument:
        """The instrument of a metric without a semantic convention."""
        return _OTEL_INSTRUMENTS[self]


_OTEL_INSTRUMENTS = {
    MetricKind.GAUGE: OtelInstrument.GAUGE,
    MetricKind.COUNTER: OtelInstrument.COUNTER,
    MetricKind.HISTOGRAM: OtelInstrument.HISTOGRAM,
    MetricKind.INFO: OtelInstrument.GAUGE,
}
#: The instruments a semantic convention may put in place of each kind's own.
_SEMCONV_INSTRUMENTS = {
    MetricKind.GAUGE: (OtelInstrument.GAUGE, OtelInstrument.UP_DOWN_COUNTER),
    MetricKind.COUNTER: (OtelInstrument.COUNTER,),
    MetricKind.HISTOGRAM: (OtelInstrument.HISTOGRAM,),
    MetricKind.INFO: (),
}


class Unit(Enum):
    """The one OpenTelemetry (UCUM) <-> Prometheus unit table.

    Values are ``(ucum, prometheus_suffix)``; an empty suffix adds nothing to
    the Prometheus name (curly-brace annotations are not units). ``RATIO`` is
    UCUM ``1`` (a fraction: the OTLP translators add ``_ratio`` to such gauges);
    ``DIMENSIONLESS`` values that are not fractions (a loss, a norm, a step number,
    a 0/1 flag) have no unit over OTLP, so no translation calls them ratios.
    """

    SECONDS = ("s", "seconds")
    BYTES = ("By", "bytes")
    CELSIUS = ("Cel", "celsius")
    WATTS = ("W", "watts")
    JOULES = ("J", "joules")
    HERTZ = ("Hz", "hertz")
    RATIO = ("1", "ratio")
    BYTES_PER_SECOND = ("By/s", "bytes_per_second")
    TOKENS_PER_SECOND = ("{token}/s", "tokens_per_second")
    DIMENSIONLESS = ("", "")
    STEPS = ("{step}", "")
    TOKENS = ("{token}", "")
    ERRORS = ("{error}", "")
    EVENTS = ("{event}", "")
    OPERATIONS = ("{operation}", "")
    RECORDS = ("{record}", "")

    @property
    def ucum(self) -> str:
        return self.value[0]

    @property
    def prometheus_suffix(self) -> str:
        return self.value[1]


@dataclass(frozen=True, eq=False)
class MetricSpec:
    """One exported metric. Invalid declarations raise ``ValueError`` at import.

    Each metric is declared once, so specs compare and hash by identity, which
    keeps the store's per-sample lookups cheap.
    """

    name: str
    kind: MetricKind
    unit: Unit
    help: str
    labels: tuple[str, ...] = ()
    buckets: tuple[float, ...] = ()
    #: When the metric may be missing from an endpoint, and why.
    availability: str = ""
    #: The identity labels of the exporting process it carries: all of them, except for metrics whose
    #: own ``rank`` and ``host`` labels name someone else (the analyzer's suspects), and none for metrics whose
    #: own ``job`` label names the job they judge (the analyzer's verdicts, one per job it reads).
    identity: tuple[str, ...] = IDENTITY_LABELS
    #: The OpenTelemetry semantic convention it is exported as over OTLP, where one covers it.
    semconv: Semconv | None = None
    _prometheus_name: str = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not _NAME_RE.match(self.name):
            raise ValueError(f"metric {self.name!r}: name must be lowercase dotted words")
        if self.kind is MetricKind.COUNTER and self.name.endswith("total"):
            raise ValueError(f"metric {self.name!r}: counters get '_total' from the catalogue")
        if self.kind is MetricKind.INFO and self.unit is not Unit.DIMENSIONLESS:
            raise ValueError(f"metric {self.name!r}: info metrics have no unit")
        if not self.help or not (self.help[0].isupper() or self.help[0].isdigit()) or self.help.endswith("."):
            raise ValueError(f"metric {self.name!r}: help is a capitalised phrase without a final period")
        if not set(self.identity) <= set(IDENTITY_LABELS) or "job" not in self.identity + self.labels[:1]:
            raise ValueError(
                f"metric {self.name!r}: identity labels must come from {IDENTITY_LABELS} and include job, "
                "unless job is the metric's own first label"
            )
        for label in self.labels:
            if not _LABEL_RE.match(label) or label in _FORBIDDEN_LABELS or label in self.identity:
                raise ValueError(f"metric {self.name!r}: label {label!r} is not allowed")
        if len(set(self.labels)) != len(self.labels):
            raise ValueError(f"metric {self.name!r}: duplicate label")
        if (self.kind is MetricKind.HISTOGRAM) != bool(self.buckets):
            raise ValueError(f"metric {self.name!r}: histograms, and only histograms, have buckets")
        if list(self.buckets) != sorted(set(self.buckets)):
            raise ValueError(f"metric {self.name!r}: buckets must increase strictly")
        if self.semconv is not None:
            _check_semconv(self, self.semconv)
        object.__setattr__(self, "_prometheus_name", _prometheus_name(self))

    @property
    def prometheus_name(self) -> str:
        return self._prometheus_name

    @property
    def prometheus_type(self) -> str:
        return self.kind.value

    @property
    def otel_name(self) -> str:
        """The OTLP name: the semantic convention's, else ``trainhealth.<name>`` (``.info`` for info metrics)."""
        if self.semconv is not None:
            return self.semconv.name
        return f"{PREFIX}.{self.name}" + (".info" if self.kind is MetricKind.INFO else "")

    @property
    def otel_unit(self) -> str:
        return self.semconv.unit if self.semconv is not None else self.unit.ucum

    @property
    def otel_instrument(self) -> OtelInstrument:
        return self.semconv.instrument if self.semconv is not None else self.kind.otel_instrument

    @property
    def otel_description(self) -> str:
        return self.semconv.description if self.semconv is not None else self.help

    @property
    def translated_name(self) -> str:
        """The Prometheus name of the OTLP metric after the Collector's (or Prometheus's) default translation."""
        return translated_prometheus_name(self.otel_name, self.otel_unit, self.otel_instrument)

    def otel_attributes(self, values: tuple[str, ...]) -> dict[str, str]:
        """The OTLP point attributes of the series with label ``values`` (identity labels excluded)."""
        if self.semconv is None:
            return dict(zip(self.labels, values))
        labels = dict(zip(self.labels, values))
        attributes = dict(self.semconv.constants)
        attributes.update((a.key, a.value(labels[a.label])) for a in self.semconv.attributes)
        used = {a.label for a in self.semconv.attributes}
        attributes.update((f"{PREFIX}.{label}", value) for label, value in labels.items() if label not in used)
        return attributes

    @property
    def all_labels(self) -> tuple[str, ...]:
        """Identity labels followed by the metric's own labels, as exported to Prometheus."""
        return self.identity + self.labels

    def to_dict(self) -> dict[str, object]:
        return {
            "name": self.prometheus_name,
            "type": self.prometheus_type,
            "unit": self.unit.prometheus_suffix,
            "help": self.help,
            "labels": list(self.all_labels),
            "otel_name": self.otel_name,
            "otel_unit": self.otel_unit,
            "otel_instrument": self.otel_instrument.value,
            "otlp_translated_name": self.translated_name,
            "buckets": list(self.buckets),
            "availability": self.availability,
        }


def _check_semconv(spec: MetricSpec, semconv: Semconv) -> None:
    if not _NAME_RE.match(semconv.name) or semconv.name.startswith(f"{PREFIX}."):
        raise ValueError(f"metric {spec.name!r}: semconv name {semconv.name!r} is not a convention's dotted name")
    if semconv.instrument not in _SEMCONV_INSTRUMENTS[spec.kind]:
        raise ValueError(f"metric {spec.name!r}: a {spec.kind.value} cannot be exported as {semconv.instrument.value}")
    keys = [key for key, _ in semconv.constants] + [a.key for a in semconv.attributes]
    if len(set(keys)) != len(keys):
        raise ValueError(f"metric {spec.name!r}: semconv attribute keys repeat")
    for attribute in semconv.attributes:
        if attribute.label not in spec.labels:
            raise ValueError(f"metric {spec.name!r}: semconv attribute from unknown label {attribute.label!r}")
        renamed = [new for _, new in attribute.values]
        if len(set(renamed)) != len(renamed) and semconv.instrument not in (
            OtelInstrument.GAUGE,
            OtelInstrument.UP_DOWN_COUNTER,
        ):
            raise ValueError(f"metric {spec.name!r}: only gauge points (state sets) may fall together")


def _prometheus_name(spec: MetricSpec) -> str:
    name = f"{PREFIX}_{spec.name.replace('.', '_')}"
    suffix = spec.unit.prometheus_suffix
    if suffix and not name.endswith(f"_{suffix}"):
        name = f"{name}_{suffix}"
    if spec.kind is MetricKind.COUNTER:
        name += "_total"
    elif spec.kind is MetricKind.INFO:
        name += "_info"
    return name


# Short names for the kinds, for the declaration tables of the sibling modules.
_G, _C, _H, _I = MetricKind.GAUGE, MetricKind.COUNTER, MetricKind.HISTOGRAM, MetricKind.INFO
