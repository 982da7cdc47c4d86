"""The catalogue's naming rules hold for every metric, and bad declarations fail at once."""

from __future__ import annotations

import re

import pytest

from trainhealth._internal import catalog
from trainhealth._internal.catalog import (
    ANALYSIS_RANK_COMPUTE,
    ANALYSIS_RANK_WAIT,
    CATALOG,
    IDENTITY_LABELS,
    SELFTEST_ERROR,
    SELFTEST_PASSED,
    SELFTEST_TIMESTAMP,
    SUSPECT_SCORE,
    SUSPECT_SINCE_STEP,
    SUSPECT_SLOWDOWN,
    MetricKind,
    MetricSpec,
    OtelAttribute,
    OtelInstrument,
    Semconv,
    Unit,
    translated_prometheus_name,
)

PROMETHEUS_NAME = re.compile(r"^trainhealth_[a-z][a-z0-9_]*$")
NON_BASE_UNITS = (
    "_milliseconds",
    "_ms",
    "_percent",
    "_megabytes",
    "_mb",
    "_kilobytes",
    "_fahrenheit",
    "_mhz",
    "_mw",
    "_mj",
)


@pytest.mark.parametrize("spec", CATALOG, ids=lambda spec: spec.prometheus_name)
def test_prometheus_naming_rules(spec: MetricSpec):
    name = spec.prometheus_name
    assert PROMETHEUS_NAME.match(name)
    assert name.endswith("_total") == (spec.kind is MetricKind.COUNTER)
    assert name.endswith("_info") == (spec.kind is MetricKind.INFO)
    if spec.unit.prometheus_suffix:
        assert name.removesuffix("_total").endswith("_" + spec.unit.prometheus_suffix)
    assert not any(part in name for part in NON_BASE_UNITS)
    assert not set(spec.labels) & set(spec.identity)
    assert spec.all_labels[: len(spec.identity)] == spec.identity
    # the suspects' rank and host name the suspect, the analyzer's per-rank figures the rank analysed; a self-test
    # belongs to a host, not a rank
    assert spec.identity in (IDENTITY_LABELS, ()) or spec in (
        SUSPECT_SCORE,
        SUSPECT_SLOWDOWN,
        SUSPECT_SINCE_STEP,
        ANALYSIS_RANK_COMPUTE,
        ANALYSIS_RANK_WAIT,
        SELFTEST_PASSED,
        SELFTEST_ERROR,
        SELFTEST_TIMESTAMP,
    )
    # the analyzer's verdicts about a job carry that job's label, not the analyzer's own: job is their first label
    assert "job" in spec.identity or spec.labels[:1] == ("job",)
    if not spec.identity:
        assert spec.prometheus_name.startswith(("trainhealth_suspect_", "trainhealth_analysis_"))


@pytest.mark.parametrize("spec", [s for s in CATALOG if s.semconv is None], ids=lambda spec: spec.prometheus_name)
def test_own_opentelemetry_names_survive_the_translation(spec: MetricSpec):
    assert spec.otel_name.startswith("trainhealth.")
    assert spec.otel_unit == spec.unit.ucum
    assert spec.otel_instrument is spec.kind.otel_instrument
    assert spec.otel_attributes(tuple(f"v{i}" for i in range(len(spec.labels)))) == {
        label: f"v{i}" for i, label in enumerate(spec.labels)
    }
    if spec.unit.ucum != "{token}/s":  # an annotation is no unit: the translation says only per_second
        assert spec.translated_name == spec.prometheus_name


def test_the_translation_follows_the_go_rules():
    # the rules of github.com/prometheus/otlptranslator (UnderscoreEscapingWithSuffixes), one case each
    assert translated_prometheus_name("a.b", "1", OtelInstrument.GAUGE) == "a_b_ratio"
    assert translated_prometheus_name("a.ratio.b", "1", OtelInstrument.GAUGE) == "a_b_ratio"  # moved to the end
    assert translated_prometheus_name("a.b", "1", OtelInstrument.UP_DOWN_COUNTER) == "a_b"
    assert translated_prometheus_name("a.total.b", "{x}", OtelInstrument.COUNTER) == "a_b_total"
    assert translated_prometheus_name("a.bytes.b", "By", OtelInstrument.GAUGE) == "a_bytes_b"  # unit word present
    assert translated_prometheus_name("a..b__c", "By/s", OtelInstrument.GAUGE) == "a_b_c_bytes_per_second"
    assert translated_prometheus_name("a", "{x}/s", OtelInstrument.GAUGE) == "a_per_second"
    assert translated_prometheus_name("a", "m/min", OtelInstrument.GAUGE) == "a_meters_per_min"
    assert translated_prometheus_name("a", "furlong", OtelInstrument.GAUGE) == "a_furlong"
    assert translated_prometheus_name("9a", "s", OtelInstrument.HISTOGRAM) == "_9a_seconds"


def test_names_are_unique_and_every_constant_is_in_the_catalogue():
    assert len({s.prometheus_name for s in CATALOG}) == len(CATALOG)
    # an OTLP name is shared only by semantic-convention entries that differ in a constant attribute
    for name in {s.otel_name for s in CATALOG}:
        sharing = catalog.by_otel_name(name)
        assert len(sharing) == 1 or all(s.semconv is not None for s in sharing)
        assert len({tuple(sorted(s.otel_attributes(("0",) * len(s.labels)).items())) for s in sharing}) == len(sharing)
    constants = [v for v in vars(catalog).values() if isinstance(v, MetricSpec)]
    assert set(constants) == set(CATALOG)
    assert set(catalog.__all__) >= {n for n, v in vars(catalog).items() if isinstance(v, MetricSpec)}


@pytest.mark.parametrize(
    "kwargs, problem",
    [
        ({"name": "train.steps_total", "kind": MetricKind.COUNTER}, "_total"),
        ({"name": "Train.Loss"}, "lowercase"),
        ({"labels": ("step",)}, "label 'step'"),
        ({"labels": ("tensor",)}, "label 'tensor'"),
        ({"labels": ("rank",)}, "label 'rank'"),
        ({"labels": ("gpu", "gpu")}, "duplicate"),
        ({"kind": MetricKind.HISTOGRAM}, "buckets"),
        ({"buckets": (1.0, 0.5)}, "buckets"),
        ({"help": "lowercase help."}, "help"),
        ({"kind": MetricKind.INFO, "unit": Unit.SECONDS}, "no unit"),
        ({"semconv": Semconv("hw.power", OtelInstrument.COUNTER, "W", "Power")}, "cannot be exported"),
        ({"semconv": Semconv("trainhealth.x", OtelInstrument.GAUGE, "W", "X")}, "dotted name"),
        (
            {
                "semconv": Semconv(
                    "hw.power", OtelInstrument.GAUGE, "W", "Power", attributes=(OtelAttribute("gpu", "hw.id"),)
                )
            },
            "unknown label 'gpu'",
        ),
        (
            {
                "labels": ("gpu",),
                "semconv": Semconv(
                    "hw.power",
                    OtelInstrument.GAUGE,
                    "W",
                    "Power",
                    attributes=(OtelAttribute("gpu", "hw.id"),),
                    constants=(("hw.id", "x"),),
                ),
            },
            "repeat",
        ),
        (
            {
                "kind": MetricKind.COUNTER,
                "labels": ("state",),
                "semconv": Semconv(
                    "hw.errors",
                    OtelInstrument.COUNTER,
                    "{error}",
                    "Errors",
                    attributes=(OtelAttribute("state", "error.type", values=(("a", "x"), ("b", "x"))),),
                ),
            },
            "state sets",
        ),
    ],
)
def test_bad_declarations_raise(kwargs, problem):
    base = {"name": "test.metric", "kind": MetricKind.GAUGE, "unit": Unit.SECONDS, "help": "A test metric"}
    base.update(kwargs)
    if base["kind"] is MetricKind.HISTOGRAM and "buckets" not in kwargs:
        base.pop("buckets", None)
    with pytest.raises(ValueError, match=re.escape(problem)):
        MetricSpec(**base)


def test_lookup_by_prometheus_name():
    assert catalog.by_prometheus_name("trainhealth_train_mfu_ratio") is catalog.TRAIN_MFU
    with pytest.raises(KeyError):
        catalog.by_prometheus_name("trainhealth_not_a_metric")


# --- the OpenTelemetry semantic conventions, checked against the package the SDK installs -----------------

SEMCONV = [s for s in CATALOG if s.semconv is not None]
#: Required attributes of each convention (open-telemetry/semantic-conventions docs/hardware/common.md,
#: gpu.md, temperature.md, fan.md): hw.id everywhere, hw.type on the common metrics, hw.state on hw.status.
REQUIRED = {
    "hw.status": {"hw.id", "hw.type", "hw.state"},
    "hw.errors": {"hw.id", "hw.type"},
    "hw.power": {"hw.id", "hw.type"},
    "hw.energy": {"hw.id", "hw.type"},
}


def _semconv_instrument(name: str):
    """The instrument the semantic-conventions package's own ``create_*`` function makes for ``name``."""
    import inspect

    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.semconv._incubating.metrics import hw_metrics

    (constant,) = [key for key, value in vars(hw_metrics).items() if key.isupper() and value == name]
    create = getattr(hw_metrics, f"create_{constant.lower()}")
    meter = MeterProvider(shutdown_on_exit=False).get_meter("semconv-check")
    arguments = [meter] + ([[]] if len(inspect.signature(create).parameters) == 2 else [])
    return create(*arguments)


@pytest.mark.parametrize("spec", SEMCONV, ids=lambda spec: spec.prometheus_name)
def test_semantic_convention_names_units_and_instruments(spec: MetricSpec):
    from opentelemetry import metrics as api

    instrument = _semconv_instrument(spec.otel_name)
    kinds = {
        OtelInstrument.GAUGE: api.ObservableGauge,
        OtelInstrument.COUNTER: api.Counter,
        OtelInstrument.UP_DOWN_COUNTER: api.UpDownCounter,
    }
    assert isinstance(instrument, kinds[spec.otel_instrument])  # observable and synchronous counters alike
    assert (spec.otel_unit, spec.otel_description) == (instrument.unit, instrument.description)


@pytest.mark.parametrize("spec", SEMCONV, ids=lambda spec: spec.prometheus_name)
def test_semantic_convention_attributes(spec: MetricSpec):
    from opentelemetry.semconv._incubating.attributes import hw_attributes
    from opentelemetry.semconv.attributes import error_attributes

    known = {v for k, v in vars(hw_attributes).items() if k.isupper()} | {error_attributes.ERROR_TYPE}
    values = {
        hw_attributes.HW_TYPE: {v.value for v in hw_attributes.HwTypeValues},
        hw_attributes.HW_STATE: {v.value for v in hw_attributes.HwStateValues},
        hw_attributes.HW_GPU_TASK: {v.value for v in hw_attributes.HwGpuTaskValues},
    }
    label_values = {"gpu": "3", "backend": "nvml", "state": "ok", "error_type": "corrected", "counter_type": "volatile"}
    attributes = spec.otel_attributes(tuple(label_values[label] for label in spec.labels))
    assert REQUIRED.get(spec.otel_name, {"hw.id"}) <= set(attributes)
    for key, value in attributes.items():
        assert key in known or key.startswith("trainhealth."), key
        assert value in values.get(key, {value}), (key, value)
    assert attributes.get("hw.id", "").startswith("gpu3") and attributes["trainhealth.backend"] == "nvml"
    if spec.otel_name.startswith("hw.gpu.") or spec.otel_name in REQUIRED:
        assert attributes["hw.type"] == "gpu"  # gpu.md: hw.type MUST be "gpu" on GPU metrics


def test_every_gpu_state_is_a_semantic_convention_state():
    from opentelemetry.semconv._incubating.attributes.hw_attributes import HwStateValues

    from trainhealth._internal.exporters.gpu.sampler import GPU_STATES

    states = {catalog.GPU_STATE.otel_attributes(("0", "nvml", state))["hw.state"] for state in GPU_STATES}
    assert states <= {v.value for v in HwStateValues} and "ok" in states and "failed" in states
