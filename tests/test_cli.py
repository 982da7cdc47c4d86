"""The installed ``trainhealth`` command, run as a user would."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import trainhealth
from trainhealth.catalog import CATALOG

COMMAND = str(Path(sys.executable).parent / "trainhealth")


def run(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    environment = {k: v for k, v in os.environ.items() if not k.startswith(("TRAINHEALTH_", "RANK", "WORLD_SIZE"))}
    environment.update(env or {})
    return subprocess.run([COMMAND, *args], capture_output=True, text=True, env=environment, timeout=60)


def test_version_and_help():
    assert run("--version").stdout.strip() == f"trainhealth {trainhealth.__version__}"
    result = run("--help")
    assert result.returncode == 0
    assert "metrics" in result.stdout and "config" in result.stdout


def test_metrics_json_lists_the_catalogue():
    result = run("metrics", "--json")
    assert result.returncode == 0
    listed = json.loads(result.stdout)
    assert [m["name"] for m in listed] == [spec.prometheus_name for spec in CATALOG]
    step = next(m for m in listed if m["name"] == "trainhealth_train_step_duration_seconds")
    assert step["type"] == "histogram" and step["otel_unit"] == "s" and step["labels"] == ["job", "host", "rank"]


def test_metrics_table_has_one_line_per_metric():
    lines = run("metrics").stdout.splitlines()
    assert [line.split()[0] for line in lines] == [spec.prometheus_name for spec in CATALOG]


def test_unknown_option_is_one_line_and_status_2():
    result = run("metrics", "--yaml")
    assert result.returncode == 2
    assert result.stderr.count("\n") == 1 and "--yaml" in result.stderr
    assert "Traceback" not in result.stderr


def test_no_command_is_a_usage_error():
    assert run().returncode == 2


def test_config_reports_a_bad_variable_in_one_line():
    result = run("config", env={"TRAINHEALTH_MAX_LAYER_GROUPS": "many"})
    assert result.returncode == 2
    assert result.stderr == "trainhealth: error: max_layer_groups (TRAINHEALTH_MAX_LAYER_GROUPS): expected an integer, got 'many'\n"


def test_config_json_shows_values_sources_and_identity_without_secrets():
    result = run("config", "--json", env={
        "TRAINHEALTH_STATS_EVERY": "50", "RANK": "1", "WORLD_SIZE": "2",
        "TRAINHEALTH_BASIC_AUTH_USERNAME": "prom", "TRAINHEALTH_BASIC_AUTH_PASSWORD": "hunter2",
    })
    assert result.returncode == 0, result.stderr
    assert "hunter2" not in result.stdout
    report = json.loads(result.stdout)
    rows = {row["setting"]: row for row in report["settings"]}
    assert rows["stats_every"]["value"] == 50 and rows["stats_every"]["source"] == "environment"
    assert rows["max_layer_groups"]["source"] == "default"
    assert rows["basic_auth_password"]["value"] == "<hidden>"
    assert report["identity"]["rank"] == 1 and report["identity"]["world_size"] == 2
