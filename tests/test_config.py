"""Settings: precedence, parsing and validation with the setting named; one group per concern."""

from __future__ import annotations

import itertools

import pytest

from trainhealth.config import ConfigError, GpuSettings, Settings, TrainingSettings, setting_infos


def test_explicit_beats_environment_beats_default():
    env = {"TRAINHEALTH_STATS_EVERY": "7", "TRAINHEALTH_MAX_LAYER_GROUPS": "9"}
    settings = Settings.resolve(env=env, stats_every=3)
    assert settings.training.stats_every == 3  # explicit
    assert settings.training.max_layer_groups == 9  # environment
    assert settings.store.max_series_per_metric == 1000  # default
    assert Settings.resolve(env={"TRAINHEALTH_STATS_EVERY": ""}).training.stats_every == 20  # empty means unset


@pytest.mark.parametrize("raw, expected", [("1", True), ("true", True), ("YES", True), ("on", True),
                                           ("0", False), ("False", False), ("no", False), ("off", False)])
def test_booleans(raw, expected):
    assert Settings.resolve(env={"TRAINHEALTH_PROMETHEUS": raw}).prometheus.enabled is expected


@pytest.mark.parametrize("env, message", [
    ({"TRAINHEALTH_PROMETHEUS": "maybe"}, "prometheus (TRAINHEALTH_PROMETHEUS): expected true or false, got 'maybe'"),
    ({"TRAINHEALTH_PEAK_FLOPS": "fast"}, "peak_flops (TRAINHEALTH_PEAK_FLOPS): expected a number, got 'fast'"),
    ({"TRAINHEALTH_PROMETHEUS_PORT": "-1"}, "prometheus_port (TRAINHEALTH_PROMETHEUS_PORT): must be 0..65535, got -1"),
    ({"TRAINHEALTH_RANK": "4", "TRAINHEALTH_WORLD_SIZE": "4"}, "rank (TRAINHEALTH_RANK): 4 is not below world_size 4"),
    ({"TRAINHEALTH_TLS_CERTFILE": "/etc/hostname"}, "tls_keyfile (TRAINHEALTH_TLS_KEYFILE): tls_certfile and tls_keyfile are set together"),
    ({"TRAINHEALTH_BASIC_AUTH_USERNAME": "prom"}, "basic_auth_password (TRAINHEALTH_BASIC_AUTH_PASSWORD): basic auth needs both"),
    ({"TRAINHEALTH_BASIC_AUTH_PASSWORD": "x"}, "basic_auth_username (TRAINHEALTH_BASIC_AUTH_USERNAME): basic auth needs both"),
    ({"TRAINHEALTH_BASIC_AUTH_USERNAME": "u", "TRAINHEALTH_BASIC_AUTH_PASSWORD_FILE": "/no/such/file"},
     "basic_auth_password_file (TRAINHEALTH_BASIC_AUTH_PASSWORD_FILE): no such file: /no/such/file"),
])
def test_invalid_environment_values_name_the_setting(env, message):
    with pytest.raises(ConfigError) as error:
        Settings.resolve(env=env)
    assert str(error.value).startswith(message)


@pytest.mark.parametrize("kwargs, setting", [
    ({"stats_every": "5"}, "stats_every"),
    ({"prometheus": "yes"}, "prometheus"),
    ({"rank": True}, "rank"),
    ({"flops_per_token": 0}, "flops_per_token"),
    ({"tls_client_cafile": "/etc/hostname"}, "tls_client_cafile"),
    ({"no_such_setting": 1}, "no_such_setting"),
])
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
    settings = Settings.resolve(env={"TRAINHEALTH_BASIC_AUTH_PASSWORD_FILE": str(password_file)}, basic_auth_username="u")
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
    assert Settings.resolve(env={}).comm.trace_write_interval == 30.0
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
    assert str(error.value) == "gpu_sample_interval (TRAINHEALTH_GPU_SAMPLE_INTERVAL): must be a positive number, got 0.0"
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
