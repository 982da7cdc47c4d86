"""Settings: precedence, parsing and validation with the setting named; one group per concern."""

from __future__ import annotations

import dataclasses
import itertools
import math

import pytest
from hypothesis import given
from hypothesis import settings as hypothesis_settings
from hypothesis import strategies as st

from trainhealth._internal.config import (
    MAX_INTERVAL,
    MAX_WORLD_SIZE,
    MIN_INTERVAL,
    ConfigError,
    GpuSettings,
    Range,
    Settings,
    TrainingSettings,
    setting_infos,
)
from trainhealth._internal.config.fields import bounds_of
from trainhealth._internal.config.settings import _GROUPS


def test_explicit_beats_environment_beats_default():
    env = {"TRAINHEALTH_STATS_EVERY": "7", "TRAINHEALTH_MAX_LAYER_GROUPS": "9"}
    settings = Settings.resolve(env=env, stats_every=3)
    assert settings.training.stats_every == 3  # explicit
    assert settings.training.max_layer_groups == 9  # environment
    assert settings.store.max_series_per_metric == 1000  # default
    assert Settings.resolve(env={"TRAINHEALTH_STATS_EVERY": ""}).training.stats_every == 20  # empty means unset


@pytest.mark.parametrize(
    "raw, expected",
    [
        ("1", True),
        ("true", True),
        ("YES", True),
        ("on", True),
        ("0", False),
        ("False", False),
        ("no", False),
        ("off", False),
    ],
)
def test_booleans(raw, expected):
    assert Settings.resolve(env={"TRAINHEALTH_PROMETHEUS": raw}).prometheus.enabled is expected


@pytest.mark.parametrize(
    "env, message",
    [
        (
            {"TRAINHEALTH_PROMETHEUS": "maybe"},
            "prometheus (TRAINHEALTH_PROMETHEUS): expected true or false, got 'maybe'",
        ),
        ({"TRAINHEALTH_PEAK_FLOPS": "fast"}, "peak_flops (TRAINHEALTH_PEAK_FLOPS): expected a number, got 'fast'"),
        (
            {"TRAINHEALTH_PROMETHEUS_PORT": "-1"},
            "prometheus_port (TRAINHEALTH_PROMETHEUS_PORT): must be from 0 to 65535, got -1",
        ),
        (
            {"TRAINHEALTH_RANK": "4", "TRAINHEALTH_WORLD_SIZE": "4"},
            "rank (TRAINHEALTH_RANK): 4 is not below world_size 4",
        ),
        (
            {"TRAINHEALTH_TLS_CERTFILE": "/etc/hostname"},
            "tls_keyfile (TRAINHEALTH_TLS_KEYFILE): tls_certfile and tls_keyfile are set together",
        ),
        (
            {"TRAINHEALTH_BASIC_AUTH_USERNAME": "prom"},
            "basic_auth_password (TRAINHEALTH_BASIC_AUTH_PASSWORD): basic auth needs both",
        ),
        (
            {"TRAINHEALTH_BASIC_AUTH_PASSWORD": "x"},
            "basic_auth_username (TRAINHEALTH_BASIC_AUTH_USERNAME): basic auth needs both",
        ),
        (
            {"TRAINHEALTH_BASIC_AUTH_USERNAME": "u", "TRAINHEALTH_BASIC_AUTH_PASSWORD_FILE": "/no/such/file"},
            "basic_auth_password_file (TRAINHEALTH_BASIC_AUTH_PASSWORD_FILE): no such file: /no/such/file",
        ),
    ],
)
def test_invalid_environment_values_name_the_setting(env, message):
    with pytest.raises(ConfigError) as error:
        Settings.resolve(env=env)
    assert str(error.value).startswith(message)


@pytest.mark.parametrize(
    "kwargs, setting",
    [
        ({"stats_every": "5"}, "stats_every"),
        ({"prometheus": "yes"}, "prometheus"),
        ({"rank": True}, "rank"),
        ({"flops_per_token": 0}, "flops_per_token"),
        ({"tls_client_cafile": "/etc/hostname"}, "tls_client_cafile"),
        ({"no_such_setting": 1}, "no_such_setting"),
    ],
)
def test_invalid_explicit_values_name_the_setting(kwargs, setting):
    with pytest.raises(ConfigError) as error:
        Settings.resolve(env={}, **kwargs)
    assert error.value.setting == setting


def test_integers_are_accepted_for_float_settings():
    settings = Settings.resolve(env={}, peak_flops=989_000_000_000_000)
    assert isinstance(settings.training.peak_flops, float)


def test_password_is_hidden_and_read_from_file(tmp_path):
    settings = Settings.resolve(env={}, basic_auth_username="u", basic_auth_password="hunter2")
    assert "hunter2" not in repr(settings)
    password_file = tmp_path / "pw"
    password_file.write_text("from-file\n")
    settings = Settings.resolve(
        env={"TRAINHEALTH_BASIC_AUTH_PASSWORD_FILE": str(password_file)}, basic_auth_username="u"
    )
    assert settings.prometheus.read_basic_auth_password() == "from-file"


def test_replace_validates():
    settings = Settings.resolve(env={})
    assert settings.replace(stats_every=2).training.stats_every == 2
    with pytest.raises(ConfigError):
        settings.replace(stats_every=0)
    with pytest.raises(ConfigError):
        settings.replace(unknown=1)


def test_default_port_follows_local_rank():
    settings = Settings.resolve(env={})
    assert [settings.prometheus.metrics_port(local_rank) for local_rank in range(3)] == [9450, 9451, 9452]
    assert Settings.resolve(env={"TRAINHEALTH_PROMETHEUS_PORT": "9000"}).prometheus.metrics_port(5) == 9000


def test_otel_is_on_when_an_endpoint_is_configured():
    settings = Settings.resolve(env={})
    assert not settings.otel.active({})
    assert settings.otel.active({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318"})
    assert settings.otel.active({"OTEL_EXPORTER_OTLP_METRICS_ENDPOINT": "http://collector:4318/v1/metrics"})
    assert not settings.replace(otel=False).otel.active({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318"})


def test_every_setting_is_documented():
    for info in setting_infos():
        assert info.env == "TRAINHEALTH_" + info.name.upper()
        assert info.help.endswith(".") and len(info.help) > 15


def test_trace_write_interval():
    assert Settings.resolve(env={}).comm.trace_write_interval == 1.0  # what a SIGKILL can lose
    assert Settings.resolve(env={"TRAINHEALTH_TRACE_WRITE_INTERVAL": "0"}).comm.trace_write_interval == 0.0  # at exit
    assert Settings.resolve(env={"TRAINHEALTH_TRACE_WRITE_INTERVAL": "2.5"}).comm.trace_write_interval == 2.5


@pytest.mark.parametrize("raw", ["inf", "nan", "-inf", "0.05", "0.01", "-1"])
def test_trace_write_interval_rejects_what_no_writer_can_follow(raw):
    with pytest.raises(ConfigError) as error:
        Settings.resolve(env={"TRAINHEALTH_TRACE_WRITE_INTERVAL": raw})
    assert error.value.setting == "trace_write_interval"
    assert str(error.value).startswith("trace_write_interval (TRAINHEALTH_TRACE_WRITE_INTERVAL): ")
    with pytest.raises(ConfigError):
        Settings.resolve(env={}, trace_write_interval=float(raw))


def test_a_setting_is_read_from_its_group_and_named_as_before():
    settings = Settings.resolve(env={"TRAINHEALTH_GPU_BACKEND": "off"}, comm_ring_size=1024, detectors="off")
    assert (settings.gpu.backend, settings.comm.ring_size, settings.detectors.spec) == ("off", 1024, "off")
    assert settings.value("gpu_backend") == "off" and settings.value("comm_ring_size") == 1024
    for info in setting_infos():
        group, attribute = info.attribute.split(".")
        assert settings.value(info.name) == getattr(getattr(settings, group), attribute)
    with pytest.raises(ConfigError) as error:
        settings.value("backend")  # an attribute, not a setting name
    assert error.value.setting == "backend"


def test_replace_changes_only_the_groups_it_names():
    settings = Settings.resolve(env={})
    changed = settings.replace(gpu_backend="simulated", stats_every=5)
    assert changed.gpu.backend == "simulated" and changed.training.stats_every == 5
    assert changed.prometheus is settings.prometheus and changed.comm is settings.comm


def test_a_group_validates_itself_and_names_the_setting():
    assert GpuSettings(backend="simulated", sample_interval=2).sample_interval == 2.0
    with pytest.raises(ConfigError) as error:
        GpuSettings(sample_interval=0.0)
    assert (
        str(error.value)
        == "gpu_sample_interval (TRAINHEALTH_GPU_SAMPLE_INTERVAL): must be from 0.01 to 86400 seconds, got 0.0"
    )
    with pytest.raises(ConfigError) as error:
        TrainingSettings.resolve({"TRAINHEALTH_STATS_EVERY": "often"}, {})
    assert error.value.setting == "stats_every"
    with pytest.raises(TypeError):
        Settings(gpu=TrainingSettings())  # type: ignore[arg-type]


def test_settings_are_documented_group_by_group():
    infos = setting_infos()
    assert len({info.name for info in infos}) == len(infos)
    groups = [info.group for info in infos]
    assert groups[0] == "Identity" and len(set(groups)) == len(Settings.__dataclass_fields__)
    assert [group for group, _ in itertools.groupby(groups)] == list(dict.fromkeys(groups))  # one run per group
    assert {info.name: info.attribute for info in infos}["gpu_backend"] == "gpu.backend"


def _ranged():
    """(setting name, Range, type) of every numeric setting."""
    return [
        (name, bounds_of(spec), spec.metadata["parse"].__name__.removeprefix("parse_"))
        for group in _GROUPS.values()
        for name, spec in group.declared()
        if bounds_of(spec) is not None
    ]


def test_every_numeric_setting_has_a_documented_range():
    infos = {info.name: info for info in setting_infos()}
    numeric = {info.name for info in infos.values() if info.type in ("int", "float")}
    assert numeric == {name for name, _, _ in _ranged()}
    for name, bounds, _ in _ranged():
        assert infos[name].range == str(bounds)
        assert infos[name].help.endswith(f" Range: {bounds}.")
        assert math.isfinite(bounds.high)


INTERVALS = ["gpu_sample_interval", "comm_flush_interval"]


@pytest.mark.parametrize("name", INTERVALS + ["trace_write_interval"])
@pytest.mark.parametrize("raw", ["inf", "1e-300", "nan", "-1", "1e9", "-inf", "86401"])
def test_intervals_refuse_what_kills_or_busy_loops_a_thread(name, raw):
    with pytest.raises(ConfigError) as error:
        Settings.resolve(env={"TRAINHEALTH_" + name.upper(): raw})
    assert error.value.setting == name
    assert str(error.value).startswith(f"{name} (TRAINHEALTH_{name.upper()}): must be ")
    with pytest.raises(ConfigError):
        Settings.resolve(env={}, **{name: float(raw)})


@pytest.mark.parametrize("name", INTERVALS)
def test_intervals_accept_their_bounds(name):
    for value in (MIN_INTERVAL, 0.5, MAX_INTERVAL):
        assert Settings.resolve(env={}, **{name: value}).value(name) == value


@pytest.mark.parametrize("name, bounds, kind", _ranged(), ids=[name for name, _, _ in _ranged()])
def test_each_range_is_enforced_at_its_edges(name, bounds, kind):
    context = {"world_size": MAX_WORLD_SIZE} if name == "rank" else {}  # a rank is below world_size too

    def build(value):
        return Settings.resolve(env={}, **context, **{name: value})

    inside = [bounds.high] + ([] if bounds.above_low else [bounds.low])
    outside = [bounds.high * 2 + 1, bounds.low - 1] + ([bounds.low] if bounds.above_low else [])
    if kind == "int":
        inside, outside = [int(v) for v in inside], [int(v) for v in outside] + [10**30]
    else:
        outside += [float("inf"), float("-inf"), float("nan")]
    for value in inside:
        assert build(value).value(name) == value
    for value in outside:
        if bounds.off is not None and value == bounds.off:
            continue
        with pytest.raises(ConfigError) as error:
            build(value)
        assert error.value.setting == name


@hypothesis_settings(max_examples=200, deadline=None)
@given(value=st.floats(allow_nan=True, allow_infinity=True))
def test_any_float_is_either_in_range_or_refused_naming_the_setting(value):
    try:
        settings = Settings.resolve(env={}, gpu_sample_interval=value)
    except ConfigError as error:
        assert error.setting == "gpu_sample_interval"
        assert not (MIN_INTERVAL <= value <= MAX_INTERVAL)
    else:
        assert MIN_INTERVAL <= settings.gpu.sample_interval <= MAX_INTERVAL


def test_a_range_reads_as_its_help_says():
    assert str(Range(1, 1000)) == "from 1 to 1000"
    assert str(Range(0.01, 86400, unit="seconds")) == "from 0.01 to 86400 seconds"
    assert str(Range(0, 1e18, above_low=True)) == "above 0 up to 1e+18"
    assert 2.5 not in Range(1, 8, integer=True) and 2.0 in Range(1, 8, integer=True)
    assert 0 in Range(0.05, 1, off=0, above_low=True) and 0.05 not in Range(0.05, 1, off=0, above_low=True)
    assert True not in Range(0, 1) and "1" not in Range(0, 10)  # type: ignore[operator]
    with pytest.raises(ValueError):
        Range(1, float("inf"))
    with pytest.raises(ValueError):
        Range(2, 1)


def test_sizes_and_counts_have_upper_bounds():
    for name, value in (
        ("comm_ring_size", 1 << 21),
        ("max_series_per_metric", 10**6),
        ("max_layer_groups", 10**5),
        ("signal_tokens", 10**5),
        ("simulated_gpus", 10**4),
        ("world_size", 10**30),
        ("stats_every", 10**30),
        ("sdc_interval", 10**7),
        ("peak_flops", float("inf")),
    ):
        with pytest.raises(ConfigError) as error:
            Settings.resolve(env={}, **{name: value})
        assert error.value.setting == name


def test_every_group_default_is_within_its_range():
    settings = Settings.resolve(env={})
    for name, bounds, _ in _ranged():
        value = settings.value(name)
        assert value is None or value in bounds, name
    assert dataclasses.replace(settings.gpu, sample_interval=1.0).sample_interval == 1.0
