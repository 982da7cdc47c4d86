"""The local deployment (docker-compose.yml, Dockerfile, deploy/) is valid and hangs together.

Prometheus and Alertmanager configs go through promtool and amtool; docker-compose.yml is validated
against the Compose Specification's JSON schema, checked structurally here and, where Docker Compose
is installed, by ``docker compose config``.
"""

from __future__ import annotations

import copy
import json
import os
import re
import shutil
import subprocess
import urllib.parse
from pathlib import Path

import pytest
import yaml

from tests.prometheus_server import require_binary

ROOT = Path(__file__).resolve().parent.parent
COMPOSE_FILE = ROOT / "docker-compose.yml"
PROMETHEUS_CONFIG = ROOT / "deploy/prometheus/prometheus.yml"
ALERTMANAGER_CONFIG = ROOT / "deploy/alertmanager/alertmanager.yml"
ALERTMANAGER_COMPOSE_CONFIG = ROOT / "deploy/alertmanager/alertmanager.compose.yml"
GRAFANA_DATASOURCES = ROOT / "deploy/grafana/provisioning/datasources/prometheus.yml"
GRAFANA_DASHBOARD_PROVIDERS = ROOT / "deploy/grafana/provisioning/dashboards/trainhealth.yml"
OTEL_COLLECTOR_CONFIG = ROOT / "deploy/otel/collector.yml"
DOCKERFILE = ROOT / "Dockerfile"
#: The Compose Specification's JSON schema, with its source in the README beside it.
COMPOSE_SCHEMA = ROOT / "tests/fixtures/compose-spec/compose-spec.json"

# Services that run on a plain `docker compose up`; the rest belong to profiles.
DEFAULT_SERVICES = {"trainer", "prometheus", "alertmanager", "grafana"}
PROFILES = {
    "gpu": {"gpu-exporter", "dcgm-exporter"},
    "otel": {"otel-collector"},
    "scale": {"victoriametrics", "shard-0", "shard-1", "vmalert"},
    "scale-vmagent": {"victoriametrics", "vmagent-0", "vmagent-1", "vmalert"},
}
SHARDS = (ROOT / "deploy/scale/shard-0.yml", ROOT / "deploy/scale/shard-1.yml")
VMAGENT_SHARDS = (ROOT / "deploy/scale/vmagent-0.yml", ROOT / "deploy/scale/vmagent-1.yml")
RULES = ROOT / "deploy/prometheus/trainhealth.rules.yml"


def load(path: Path):
    return yaml.safe_load(path.read_text(encoding="utf-8"))


@pytest.fixture(scope="module")
def compose() -> dict:
    return load(COMPOSE_FILE)


@pytest.fixture(scope="module")
def services(compose) -> dict:
    return compose["services"]


@pytest.fixture(scope="module")
def prometheus_config() -> dict:
    return load(PROMETHEUS_CONFIG)


def mounts(service: dict) -> list[tuple[str, str]]:
    """(source, target) of a service's volumes, short or long syntax."""
    found = []
    for volume in service.get("volumes", []):
        if isinstance(volume, dict):
            found.append((volume["source"], volume["target"]))
        else:
            source, target = volume.split(":")[:2]
            found.append((source, target))
    return found


def host_path(source: str) -> Path | None:
    """The repository path of a bind mount's source; None for a named volume."""
    return ROOT / source if source.startswith(("./", "../", "/")) else None


def container_ports(service: dict) -> set[int]:
    """Ports a service listens on inside the network: its `expose` and the container side of `ports`."""
    ports: set[int] = set()
    entries = [str(entry) for entry in service.get("expose", [])]
    for entry in service.get("ports", []):
        entries.append(str(entry["target"]) if isinstance(entry, dict) else str(entry).rsplit(":", 1)[-1])
    for entry in entries:
        entry = entry.split("/")[0]
        low, _, high = entry.partition("-")
        ports.update(range(int(low), int(high or low) + 1))
    return ports


def option(command: list[str], name: str) -> str:
    """The value of ``--name=value`` in a command list."""
    for argument in command:
        if argument.startswith(f"{name}="):
            return argument.split("=", 1)[1]
    raise AssertionError(f"{name}= not in {command}")


def resolve_in_container(service: dict, container_path: str) -> Path:
    """The repository file that ``container_path`` is inside ``service`` (through a bind mount)."""
    for source, target in mounts(service):
        path = host_path(source)
        if path is None:
            continue
        if container_path == target:
            return path
        if container_path.startswith(target.rstrip("/") + "/"):
            return path / container_path[len(target.rstrip("/")) + 1 :]
    raise AssertionError(f"{container_path} is not bind-mounted into the service ({mounts(service)})")


# --- Prometheus -----------------------------------------------------------------------------------


def test_prometheus_config_passes_promtool():
    result = subprocess.run(
        [require_binary("promtool"), "check", "config", str(PROMETHEUS_CONFIG)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    output = result.stdout + result.stderr
    assert result.returncode == 0, output
    assert "SUCCESS" in output and "rules found" in output, output  # the rule file was found and loaded


def test_prometheus_scrape_settings(prometheus_config):
    assert prometheus_config["global"]["scrape_interval"] == "5s"
    assert prometheus_config["global"]["evaluation_interval"] == "5s"
    assert prometheus_config["rule_files"] == ["trainhealth.rules.yml"]
    jobs = {job["job_name"]: job for job in prometheus_config["scrape_configs"]}
    assert {"trainhealth-ranks", "trainhealth-analyzer", "trainhealth-node", "dcgm-exporter"} <= set(jobs)
    for name, job in jobs.items():
        if name.startswith("trainhealth"):  # the exporters set job/host/rank themselves
            assert job.get("honor_labels") is True, name
    ranks = jobs["trainhealth-ranks"]["static_configs"][0]["targets"]
    assert ranks == [f"trainer:{9450 + rank}" for rank in range(4)]
    assert jobs["trainhealth-analyzer"]["static_configs"][0]["targets"] == ["trainer:9448"]


def test_prometheus_targets_are_compose_services(prometheus_config, services):
    """Static targets run without a profile (else TrainhealthTargetDown fires for good);
    the profiles' services are found by DNS."""
    static, discovered = [], []
    for job in prometheus_config["scrape_configs"]:
        for group in job.get("static_configs", []):
            static += [(job["job_name"], target) for target in group["targets"]]
        for dns in job.get("dns_sd_configs", []):
            assert dns["type"] == "A"
            discovered += [(job["job_name"], f"{name}:{dns['port']}") for name in dns["names"]]
    for alertmanagers in prometheus_config["alerting"]["alertmanagers"]:
        for group in alertmanagers["static_configs"]:
            static += [("alerting", target) for target in group["targets"]]
    assert static and discovered
    for job, target in static:
        host, port = target.rsplit(":", 1)
        if host == "localhost":
            assert job == "prometheus"
            continue
        assert host in DEFAULT_SERVICES, f"{job}: {target} is not a service of a plain `docker compose up`"
        assert int(port) in container_ports(services[host]), f"{job}: {host} does not listen on {port}"
    for job, target in discovered:
        host, port = target.rsplit(":", 1)
        assert host in PROFILES["gpu"], f"{job}: {target} is not a gpu-profile service"
        assert int(port) in container_ports(services[host]), f"{job}: {host} does not listen on {port}"
    assert {target for _, target in discovered} == {"gpu-exporter:9449", "dcgm-exporter:9400"}


# --- Alertmanager ---------------------------------------------------------------------------------


# --- the scale profile -----------------------------------------------------------------------------


def test_scale_shards_are_prometheus_yml_split_by_hashmod(prometheus_config, services):
    """deploy/scale/shard-N.yml is what shard_config makes of prometheus.yml: edit one, regenerate the other."""
    from trainhealth._internal.stack.topology import shard_config

    for number, path in enumerate(SHARDS):
        expected = shard_config(prometheus_config, number, len(SHARDS), "http://victoriametrics:8428/api/v1/write")
        assert load(path) == expected, f"{path.name} drifted from prometheus.yml"
        service = services[f"shard-{number}"]
        assert "--agent" in service["command"]
        assert resolve_in_container(service, option(service["command"], "--config.file")) == path
        write = urllib.parse.urlsplit(expected["remote_write"][0]["url"])
        assert write.hostname == "victoriametrics" and write.port in container_ports(services["victoriametrics"])


def test_scale_shards_pass_promtool_in_agent_mode():
    for path in SHARDS:
        result = subprocess.run(
            [require_binary("promtool"), "check", "config", "--agent", str(path)],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert result.returncode == 0 and "SUCCESS" in result.stdout + result.stderr, result.stdout + result.stderr


def test_scale_vmagent_shards_are_prometheus_yml_split_by_hashmod(prometheus_config, services):
    """deploy/scale/vmagent-N.yml is what shard_config makes of prometheus.yml for a vmagent; what vmagent refuses
    in its config (remote_write, the discoveries' refresh_interval) is a flag of the service instead."""
    from trainhealth._internal.stack.topology import shard_config, vmagent_sd_flags

    for number, path in enumerate(VMAGENT_SHARDS):
        assert load(path) == shard_config(prometheus_config, number, len(VMAGENT_SHARDS), None), (
            f"{path.name} drifted from prometheus.yml"
        )
        service = services[f"vmagent-{number}"]
        command = service["command"]
        assert resolve_in_container(service, option(command, "-promscrape.config")) == path
        assert set(vmagent_sd_flags(prometheus_config)) <= set(command)
        assert vmagent_sd_flags(prometheus_config)  # prometheus.yml discovers the gpu profile's exporters by DNS
        write = urllib.parse.urlsplit(option(command, "-remoteWrite.url"))
        assert write.hostname == "victoriametrics" and write.port in container_ports(services["victoriametrics"])
        assert write.path == "/api/v1/write"
        # it listens where a Prometheus agent does, so prometheus.yml's job `prometheus` scrapes the shard itself
        listen = int(option(command, "-httpListenAddr").rsplit(":", 1)[1])
        assert listen in container_ports(service) and listen in container_ports(services[f"shard-{number}"])
        scrapes_itself = [
            target
            for job in prometheus_config["scrape_configs"]
            if job["job_name"] == "prometheus"
            for static in job["static_configs"]
            for target in static["targets"]
        ]
        assert scrapes_itself == [f"localhost:{listen}"]
        assert "ports" not in service  # reached inside the network only, as the Prometheus agents


def test_scale_vmagent_shards_pass_vmagent_and_run_as_the_stack_runs_them(prometheus_config, services, tmp_path):
    """vmagent's own check accepts deploy/scale/vmagent-N.yml (and refuses the Prometheus agents' shard-N.yml),
    and each vmagent service takes the flags ``trainhealth stack up --agent vmagent`` gives its shards."""
    from tests.e2e.stack_checks import require_binaries
    from trainhealth._internal.stack.topology import StackOptions, commands, vmagent_sd_flags

    vmagent = require_binary("vmagent")
    for path, accepted in ((VMAGENT_SHARDS[0], True), (VMAGENT_SHARDS[1], True), (SHARDS[0], False)):
        done = subprocess.run(
            [vmagent, f"-promscrape.config={path}", "-promscrape.config.dryRun", "-loggerLevel=ERROR"],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert (done.returncode == 0) == accepted, (path.name, done.stdout + done.stderr)
    options = StackOptions(directory=tmp_path, store="victoriametrics", agent="vmagent", demo=False)
    require_binaries(options)
    stack = dict(commands(options, tmp_path / "demo"))

    def flags(command: list[str]) -> set[str]:
        return {argument.split("=", 1)[0] for argument in command if argument.startswith("-")}

    discovery = flags(vmagent_sd_flags(prometheus_config))  # the stack's targets are static: none there
    for number in range(len(VMAGENT_SHARDS)):
        assert flags(services[f"vmagent-{number}"]["command"]) == flags(stack[f"shard-{number}"]) | discovery


def test_vmalert_reads_the_deployed_rules_and_the_store(services):
    vmalert = services["vmalert"]
    assert resolve_in_container(vmalert, option(vmalert["command"], "-rule")) == RULES
    for flag in ("-datasource.url", "-remoteWrite.url", "-remoteRead.url"):
        url = urllib.parse.urlsplit(option(vmalert["command"], flag))
        assert url.hostname == "victoriametrics" and url.port in container_ports(services["victoriametrics"]), flag
    notifier = urllib.parse.urlsplit(option(vmalert["command"], "-notifier.url"))
    assert notifier.hostname == "alertmanager" and notifier.port in container_ports(services["alertmanager"])
    assert "-disableAlertgroupLabel" in vmalert["command"]  # the labels Prometheus gives the same alerts


def _vmalert_dry_run(rules: Path) -> tuple[int, str]:
    """vmalert's own check of a rule file: its exit status and what it printed."""
    done = subprocess.run(
        [require_binary("vmalert"), f"-rule={rules}", "-dryRun", "-loggerLevel=WARN"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    return done.returncode, done.stdout + done.stderr


def test_the_deployed_rules_pass_vmalert(tmp_path):
    """vmalert parses every rule (MetricsQL's parser) and template of the deployed rule file; a rule it refuses
    fails here, not in a store's ruler."""
    status, output = _vmalert_dry_run(RULES)
    assert status == 0, output
    broken = RULES.read_text(encoding="utf-8").replace(
        "expr: trainhealth_gpu_up == 0", "expr: trainhealth_gpu_up ==", 1
    )
    assert broken != RULES.read_text(encoding="utf-8")
    (tmp_path / "broken.yml").write_text(broken, encoding="utf-8")
    # and it refuses what it cannot evaluate
    status, output = _vmalert_dry_run(tmp_path / "broken.yml")
    assert status != 0 and "GpuLost" in output, output


def test_compose_alertmanager_config_passes_amtool():
    result = subprocess.run(
        [require_binary("amtool"), "check-config", str(ALERTMANAGER_COMPOSE_CONFIG)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    output = result.stdout + result.stderr
    assert result.returncode == 0, output
    assert "SUCCESS" in output, output


def pop_webhook_urls(node) -> list[str]:
    """Remove and return every webhook URL under ``node``, in document order."""
    urls = []
    if isinstance(node, dict):
        for key, value in node.items():
            if key == "webhook_configs":
                urls += [webhook.pop("url") for webhook in value]
            else:
                urls += pop_webhook_urls(value)
    elif isinstance(node, list):
        for item in node:
            urls += pop_webhook_urls(item)
    return urls


def test_compose_alertmanager_config_differs_only_in_webhook_urls(services):
    default, composed = copy.deepcopy(load(ALERTMANAGER_CONFIG)), copy.deepcopy(load(ALERTMANAGER_COMPOSE_CONFIG))
    default_urls, compose_urls = pop_webhook_urls(default), pop_webhook_urls(composed)
    assert composed == default, "alertmanager.compose.yml drifted from alertmanager.yml: copy the change over"
    assert len(compose_urls) == len(default_urls) >= 2
    for original, local in zip(default_urls, compose_urls):
        original, local = urllib.parse.urlsplit(original), urllib.parse.urlsplit(local)
        assert (local.scheme, local.port, local.path) == (original.scheme, original.port, original.path)
        assert local.hostname == "trainer"
        assert local.port in container_ports(services["trainer"])
    assert {urllib.parse.urlsplit(url).path for url in compose_urls} == {"/alerts/page", "/alerts/ticket"}


# --- docker-compose.yml ---------------------------------------------------------------------------


def test_every_image_is_pinned(services):
    images = {name: service["image"] for name, service in services.items() if "image" in service}
    assert set(images) >= DEFAULT_SERVICES - {"trainer"}
    for name, image in images.items():
        last = image.rsplit("/", 1)[-1]
        assert ":" in last, f"{name}: {image} has no tag"
        assert last.split(":", 1)[1] not in ("", "latest"), f"{name}: {image} is not pinned"
    for name, service in services.items():
        assert "image" in service or "build" in service, name


def test_pinned_images_are_the_ones_docs_stack_records(services):
    table = (ROOT / "docs/stack.md").read_text(encoding="utf-8").split("**Pinned images**", 1)[1].split("\n\n")[1]
    recorded = {
        row.split("|")[1].strip().split(" ")[0]: row.split("|")[2].strip().strip("`") for row in table.splitlines()[2:]
    }
    pinned = {name: service["image"] for name, service in services.items() if "build" not in service}
    assert {name: recorded.get(name) for name in pinned} == pinned


def test_compose_file_matches_the_compose_specification_schema(compose):
    from jsonschema import Draft7Validator

    schema = json.loads(COMPOSE_SCHEMA.read_text(encoding="utf-8"))
    Draft7Validator.check_schema(schema)
    validator = Draft7Validator(schema)
    problems = [
        f"{'/'.join(map(str, error.absolute_path))}: {error.message}" for error in validator.iter_errors(compose)
    ]
    assert problems == []
    # and it catches what compose would refuse
    for service, key, value in (
        ("prometheus", "depends_on", {"alertmanager": {"condition": "when_ready"}}),
        ("grafana", "healthcheck", {"test": ["CMD", "true"], "retry": 3}),
        ("trainer", "restart_policy", "always"),
    ):
        broken = copy.deepcopy(compose)
        broken["services"][service][key] = value
        assert list(validator.iter_errors(broken)), (service, key)


def test_every_service_has_a_healthcheck_and_dependencies_wait_for_health(services):
    for name, service in services.items():
        check = service.get("healthcheck")
        assert check and not check.get("disable"), f"{name} has no healthcheck"
        test = check["test"]
        assert isinstance(test, list) and test[0] == "CMD" and len(test) > 1, f"{name}: {test}"
        for key in ("interval", "timeout"):
            assert re.fullmatch(r"\d+(ms|s|m)", str(check[key])), f"{name}: {key} {check.get(key)}"
    waited = 0
    for name, service in services.items():
        depends = service.get("depends_on", {})
        assert isinstance(depends, dict), f"{name}: depends_on must name a condition, not a list"
        for dependency, how in depends.items():
            assert dependency in services, f"{name} depends on unknown {dependency}"
            assert how["condition"] == "service_healthy", f"{name} -> {dependency}: {how}"
            waited += 1
    assert services["grafana"]["depends_on"].keys() == {"prometheus"}
    assert waited >= 3
    # the checks ask the port each service listens on
    for name, port in (
        ("prometheus", 9090),
        ("alertmanager", 9093),
        ("grafana", 3000),
        ("trainer", 9450),
        ("gpu-exporter", 9449),
        ("dcgm-exporter", 9400),
        ("victoriametrics", 8428),
        ("shard-0", 9090),
        ("shard-1", 9090),
        ("vmagent-0", 9090),
        ("vmagent-1", 9090),
        ("vmalert", 8880),
    ):
        assert f"127.0.0.1:{port}/" in " ".join(
            services[name]["healthcheck"]["test"]
        ) or f"127.0.0.1/{port}" in " ".join(services[name]["healthcheck"]["test"]), name
        assert port in container_ports(services[name]), name


def test_every_published_port_is_bound_to_localhost(services):
    published = 0
    for name, service in services.items():
        for port in service.get("ports", []):
            published += 1
            if isinstance(port, dict):
                assert port.get("host_ip") == "127.0.0.1", f"{name}: {port}"
            else:
                assert re.fullmatch(r"127\.0\.0\.1:\d+(-\d+)?:\d+(-\d+)?(/(tcp|udp))?", str(port)), f"{name}: {port}"
    assert published >= 3  # at least Prometheus, Alertmanager and Grafana


def test_grafana_has_no_default_admin_password(services):
    environment = services["grafana"]["environment"]
    # ${VAR:?message}: compose refuses to start without the variable, so there is no admin/admin.
    assert re.fullmatch(r"\$\{[A-Z_][A-Z0-9_]*:\?[^}]+\}", str(environment["GF_SECURITY_ADMIN_PASSWORD"]))
    assert re.fullmatch(r"\$\{[A-Z_][A-Z0-9_]*:-false\}", str(environment["GF_AUTH_ANONYMOUS_ENABLED"]))
    assert environment["GF_AUTH_ANONYMOUS_ORG_ROLE"] == "Viewer"


def test_profiles(services):
    by_profile: dict[str, set[str]] = {}
    for name, service in services.items():
        for profile in service.get("profiles", []) or ["default"]:
            by_profile.setdefault(profile, set()).add(name)
    assert by_profile == {"default": DEFAULT_SERVICES, **PROFILES}
    for name in ("gpu-exporter", "dcgm-exporter"):
        devices = services[name]["deploy"]["resources"]["reservations"]["devices"]
        assert any(device["driver"] == "nvidia" and "gpu" in device["capabilities"] for device in devices), name
    assert "SYS_ADMIN" in services["dcgm-exporter"]["cap_add"]
    exporter = services["gpu-exporter"]["command"]
    assert exporter[:3] == ["export", "--backend", "nvml"] and "0.0.0.0" in exporter and "9449" in exporter
    # The otel profile's collector gets the trainer's metrics when the endpoint is passed through.
    assert "OTEL_EXPORTER_OTLP_ENDPOINT" in services["trainer"]["environment"]


def test_trainer_runs_the_demo(services):
    trainer = services["trainer"]
    command = trainer["command"]
    assert command[0] == "demo"  # the image's entrypoint is `trainhealth`
    assert command[command.index("--addr") + 1] == "0.0.0.0"
    assert command[command.index("--out") + 1] == "/reports"
    assert ("./reports", "/reports") in mounts(trainer)
    assert {9448, 9450, 9451, 9452, 9453, 9096} <= container_ports(trainer)
    assert "ports" not in trainer  # reached by Prometheus and Alertmanager inside the network only


def test_mounted_deploy_files_exist(services):
    checked = 0
    for name, service in services.items():
        for source, target in mounts(service):
            if source.startswith("./deploy"):
                checked += 1
                assert (ROOT / source).exists(), f"{name} mounts {source}, which does not exist"
    assert checked >= 5


def test_service_commands_read_the_mounted_configs(services):
    prometheus_service = services["prometheus"]
    prometheus = resolve_in_container(prometheus_service, option(prometheus_service["command"], "--config.file"))
    assert prometheus == PROMETHEUS_CONFIG
    assert (prometheus.parent / "trainhealth.rules.yml").is_file()  # rule_files resolve next to it
    alertmanager = services["alertmanager"]
    alertmanager_config = resolve_in_container(alertmanager, option(alertmanager["command"], "--config.file"))
    assert alertmanager_config == ALERTMANAGER_COMPOSE_CONFIG
    collector = services["otel-collector"]
    assert resolve_in_container(collector, option(collector["command"], "--config")) == OTEL_COLLECTOR_CONFIG


def test_grafana_provisioning(services):
    grafana = services["grafana"]
    provisioning = resolve_in_container(grafana, "/etc/grafana/provisioning")
    assert provisioning.resolve() == (ROOT / "deploy/grafana/provisioning").resolve()
    datasource, store = load(GRAFANA_DATASOURCES)["datasources"]
    assert (datasource["type"], datasource["uid"], datasource["isDefault"]) == ("prometheus", "prometheus", True)
    url = urllib.parse.urlsplit(datasource["url"])
    assert url.hostname == "prometheus" and url.port in container_ports(services["prometheus"])
    # the scale profile's store, read through its Prometheus API by the same dashboards
    assert (store["type"], store["uid"], store.get("isDefault", False)) == ("prometheus", "victoriametrics", False)
    url = urllib.parse.urlsplit(store["url"])
    assert url.hostname == "victoriametrics" and url.port in container_ports(services["victoriametrics"])

    (provider,) = load(GRAFANA_DASHBOARD_PROVIDERS)["providers"]
    assert provider["type"] == "file"
    dashboards = resolve_in_container(grafana, provider["options"]["path"])
    assert dashboards.resolve() == (ROOT / "deploy/grafana/dashboards").resolve()
    files = sorted(dashboards.glob("*.json"))
    assert files, f"no dashboards in {dashboards}"
    for path in files:
        variables = {v["name"]: v for v in json.loads(path.read_text(encoding="utf-8"))["templating"]["list"]}
        assert variables["datasource"]["type"] == "datasource", path.name
        assert variables["datasource"]["query"] == "prometheus", path.name


def test_otel_collector_config(services):
    config = load(OTEL_COLLECTOR_CONFIG)
    assert config["receivers"]["otlp"]["protocols"]["http"]["endpoint"] == "0.0.0.0:4318"
    assert config["exporters"]["prometheus"]["endpoint"] == "0.0.0.0:8889"
    pipeline = config["service"]["pipelines"]["metrics"]
    assert pipeline["receivers"] == ["otlp"] and {"prometheus", "debug"} <= set(pipeline["exporters"])
    for kind in ("receivers", "processors", "exporters"):
        for component in pipeline.get(kind, []):
            assert component in config[kind], f"{component} is used but not defined under {kind}"
    assert {4318, 8889} <= container_ports(services["otel-collector"])


def test_dockerfile(services):
    text = DOCKERFILE.read_text(encoding="utf-8")
    instructions = [line for line in text.splitlines() if line and not line.startswith("#")]
    (base,) = [line.split()[1] for line in instructions if line.startswith("FROM ")]
    assert base.startswith("python:3.11-slim")
    assert "torch==" in text and "download.pytorch.org/whl/cpu" in text
    users = [line.split()[1] for line in instructions if line.startswith("USER ")]
    assert users and users[-1] not in ("root", "0")
    assert 'ENTRYPOINT ["trainhealth"]' in instructions
    exposed = container_ports(
        {"expose": [p for line in instructions if line.startswith("EXPOSE ") for p in line.split()[1:]]}
    )
    assert container_ports(services["trainer"]) <= exposed
    ignored = (ROOT / ".dockerignore").read_text(encoding="utf-8").split()
    assert {".venv", ".git", "reports"} <= set(ignored)


# --- Docker Compose itself, where installed -------------------------------------------------------


def docker_compose() -> list[str]:
    docker = shutil.which("docker")
    if docker is None:
        pytest.skip("docker is not installed")
    result = subprocess.run([docker, "compose", "version"], capture_output=True, text=True, timeout=30, check=False)
    if result.returncode != 0:
        pytest.skip("docker compose is not installed")
    return [
        docker,
        "compose",
        "--project-directory",
        str(ROOT),
        "-f",
        str(COMPOSE_FILE),
        "--profile",
        "gpu",
        "--profile",
        "otel",
    ]


def test_docker_compose_config(tmp_path):
    command = docker_compose()
    empty_env_file = tmp_path / "empty.env"  # ignore a developer's .env
    empty_env_file.write_text("")
    environment = {key: value for key, value in os.environ.items() if key != "GRAFANA_ADMIN_PASSWORD"}

    refused = subprocess.run(
        [*command, "--env-file", str(empty_env_file), "config", "-q"],
        env=environment,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert refused.returncode != 0 and "GRAFANA_ADMIN_PASSWORD" in refused.stderr, refused.stderr

    result = subprocess.run(
        [*command, "--env-file", str(empty_env_file), "config", "--format", "json"],
        env={**environment, "GRAFANA_ADMIN_PASSWORD": "test-only"},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    rendered = json.loads(result.stdout)["services"]
    assert set(rendered) == DEFAULT_SERVICES.union(*PROFILES.values())
    for name, service in rendered.items():
        for port in service.get("ports", []):
            assert port.get("host_ip") == "127.0.0.1", f"{name}: {port}"
