"""The installed ``trainhealth`` command, run as a user would."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import trainhealth
from trainhealth._internal.catalog import CATALOG

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
    assert (
        result.stderr
        == "trainhealth: error: max_layer_groups (TRAINHEALTH_MAX_LAYER_GROUPS): expected an integer, got 'many'\n"
    )


def test_config_json_shows_values_sources_and_identity_without_secrets():
    result = run(
        "config",
        "--json",
        env={
            "TRAINHEALTH_STATS_EVERY": "50",
            "RANK": "1",
            "WORLD_SIZE": "2",
            "TRAINHEALTH_BASIC_AUTH_USERNAME": "prom",
            "TRAINHEALTH_BASIC_AUTH_PASSWORD": "hunter2",
        },
    )
    assert result.returncode == 0, result.stderr
    assert "hunter2" not in result.stdout
    report = json.loads(result.stdout)
    rows = {row["setting"]: row for row in report["settings"]}
    assert rows["stats_every"]["value"] == 50 and rows["stats_every"]["source"] == "environment"
    assert rows["max_layer_groups"]["source"] == "default"
    assert rows["basic_auth_password"]["value"] == "<hidden>"
    assert report["identity"]["rank"] == 1 and report["identity"]["world_size"] == 2


def _config_sections(stdout: str) -> dict[str, list[str]]:
    """The plain ``trainhealth config`` output as heading -> its indented lines, in order."""
    sections: dict[str, list[str]] = {}
    for line in stdout.splitlines():
        if line and not line.startswith(" "):
            assert line not in sections, f"heading {line!r} twice"
            sections[line] = []
        elif line:
            assert sections, f"{line!r} before any heading"
            list(sections.values())[-1].append(line)
    return sections


def test_config_text_groups_settings_with_value_and_source():
    from trainhealth._internal.config import setting_infos

    result = run(
        "config",
        env={
            "TRAINHEALTH_STATS_EVERY": "50",
            "TRAINHEALTH_JOB": "llm-7b",
            "RANK": "1",
            "WORLD_SIZE": "2",
            "TRAINHEALTH_BASIC_AUTH_USERNAME": "prom",
            "TRAINHEALTH_BASIC_AUTH_PASSWORD": "hunter2",
        },
    )
    assert result.returncode == 0, result.stderr
    assert "hunter2" not in result.stdout and "None" not in result.stdout
    sections = _config_sections(result.stdout)
    infos = setting_infos()
    titles = list(dict.fromkeys(info.group for info in infos))
    assert list(sections) == [*titles, "Resolved identity"]

    settings: dict[str, tuple[str, list[str]]] = {}  # name -> (heading, its line and continuation lines)
    name = ""  # the setting a continuation line belongs to
    for title in titles:
        for line in sections[title]:
            if line.startswith("   "):
                assert name in settings, line
                settings[name][1].append(line)
            else:
                name = line.split()[0]
                assert name not in settings
                settings[name] = (title, [line])
    assert {name: title for name, (title, _) in settings.items()} == {info.name: info.group for info in infos}

    def fields(name: str) -> list[str]:
        return settings[name][1][0].split()

    assert fields("stats_every") == ["stats_every", "50", "env", "TRAINHEALTH_STATS_EVERY"]
    assert fields("job") == ["job", "llm-7b", "env", "TRAINHEALTH_JOB"]
    assert fields("max_layer_groups") == ["max_layer_groups", "64", "default"]
    assert fields("peak_flops") == ["peak_flops", "unset", "default"]
    assert fields("basic_auth_password") == [
        "basic_auth_password",
        "<hidden>",
        "env",
        "TRAINHEALTH_BASIC_AUTH_PASSWORD",
    ]

    # the source column starts at the same place on every setting's line, a long value wrapping beneath its own
    first_lines = [lines[0] for _, lines in settings.values()]
    columns = {
        line.index("  default") if line.endswith("  default") else line.index("  env TRAINHEALTH_")
        for line in first_lines
    }
    (column,) = columns
    detectors = settings["detectors"][1]
    assert len(detectors) > 1 and all(len(line) <= column for line in detectors[1:])
    shown = "".join([detectors[0].split()[1], *(line.strip() for line in detectors[1:])])
    reported = {row["setting"]: row["value"] for row in json.loads(run("config", "--json").stdout)["settings"]}
    assert shown == reported["detectors"]

    identity = dict(line.split(maxsplit=1) for line in sections["Resolved identity"])
    assert identity["job_name"] == "llm-7b" and identity["rank"] == "1" and identity["world_size"] == "2"
    assert identity["job"] == "(agreed by the ranks at start)"  # TRAINHEALTH_JOB is the logical name, not the label
    assert identity["pod"] == "unset"
