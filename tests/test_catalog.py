"""The catalogue's naming rules hold for every metric, and bad declarations fail at once."""

from __future__ import annotations

import re

import pytest

from trainhealth import catalog
from trainhealth.catalog import (
    CATALOG,
    IDENTITY_LABELS,
    SELFTEST_ERROR,
    SELFTEST_PASSED,
    SELFTEST_TIMESTAMP,
    ANALYSIS_RANK_COMPUTE,
    ANALYSIS_RANK_WAIT,
    SUSPECT_SCORE,
    SUSPECT_SINCE_STEP,
    SUSPECT_SLOWDOWN,
    MetricKind,
    MetricSpec,
    Unit,
)

PROMETHEUS_NAME = re.compile(r"^trainhealth_[a-z][a-z0-9_]*$")
NON_BASE_UNITS = ("_milliseconds", "_ms", "_percent", "_megabytes", "_mb", "_kilobytes", "_fahrenheit", "_mhz", "_mw", "_mj")


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
    assert spec.identity == IDENTITY_LABELS or spec in (SUSPECT_SCORE, SUSPECT_SLOWDOWN, SUSPECT_SINCE_STEP,
                                                        ANALYSIS_RANK_COMPUTE, ANALYSIS_RANK_WAIT, SELFTEST_PASSED,
                                                        SELFTEST_ERROR, SELFTEST_TIMESTAMP)


@pytest.mark.parametrize("spec", CATALOG, ids=lambda spec: spec.prometheus_name)
def test_opentelemetry_name_translates_to_the_prometheus_name(spec: MetricSpec):
    assert spec.otel_name.startswith("trainhealth.")
    translated = spec.otel_name.replace(".", "_")
    assert spec.prometheus_name.startswith(translated)
    assert spec.otel_unit == spec.unit.ucum


def test_names_are_unique_and_every_constant_is_in_the_catalogue():
    assert len({s.prometheus_name for s in CATALOG}) == len(CATALOG)
    assert len({s.otel_name for s in CATALOG}) == len(CATALOG)
    constants = [v for v in vars(catalog).values() if isinstance(v, MetricSpec)]
    assert set(constants) == set(CATALOG)
    assert set(catalog.__all__) >= {n for n, v in vars(catalog).items() if isinstance(v, MetricSpec)}


@pytest.mark.parametrize("kwargs, problem", [
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
])
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
