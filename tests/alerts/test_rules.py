"""The generated alert rules under ``promtool``: valid, and each alert fires on its case and stays quiet on a
near miss, with the labels and annotations on-call reads."""

from __future__ import annotations

import subprocess

import pytest
import yaml

from tests.alerts.cases import CASES
from tests.prometheus_server import require_binary
from trainhealth._internal.alerts.render import rule_file_yaml
from trainhealth._internal.alerts.rules import ALERTS, RUNBOOK_BASE
from trainhealth._internal.knowledge.advice import ADVICE
from trainhealth._internal.knowledge.recording import RECORDING_RULES


def _promtool() -> str:
    return require_binary("promtool")


def test_every_alert_has_a_case_and_a_complete_declaration():
    assert sorted(CASES) == sorted(rule.name for rule in ALERTS)
    for rule in ALERTS:
        assert rule.severity in ("page", "ticket", "info")
        assert rule.advice in ADVICE and ADVICE[rule.advice].steps and ADVICE[rule.advice].sources
        assert "{{ $labels." in rule.summary + rule.description


def test_promtool_accepts_the_rule_file(tmp_path):
    path = tmp_path / "trainhealth.rules.yml"
    path.write_text(rule_file_yaml())
    done = subprocess.run([_promtool(), "check", "rules", str(path)], capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"SUCCESS: {len(ALERTS) + len(RECORDING_RULES)} rules found" in done.stdout


def _test_file(name: str) -> dict:
    rule = next(r for r in ALERTS if r.name == name)
    case = CASES[name]
    annotations = {
        "runbook_url": f"{RUNBOOK_BASE}/{name}.md",
        "mitigation": rule.mitigation,
        "dashboard_url": rule.panel.url(),
    }
    tests = []
    for firing in case.firing:
        tests.append(
            {
                "interval": "1m",
                "input_series": [{"series": s, "values": v} for s, v in firing.series.items()],
                "alert_rule_test": [
                    {
                        "eval_time": firing.eval_time,
                        "alertname": name,
                        "exp_alerts": [
                            {
                                "exp_labels": {**firing.labels, "severity": rule.severity},
                                "exp_annotations": {
                                    "summary": firing.summary,
                                    "description": firing.description,
                                    **annotations,
                                },
                            }
                        ],
                    }
                ],
            }
        )
    for quiet in (case.quiet, *case.also_quiet):
        tests.append(
            {
                "interval": "1m",
                "input_series": [{"series": s, "values": v} for s, v in quiet.items()],
                "alert_rule_test": [{"eval_time": case.quiet_eval_time, "alertname": name, "exp_alerts": []}],
            }
        )
    return {"rule_files": ["rules.yml"], "evaluation_interval": "1m", "tests": tests}


@pytest.fixture(scope="module")
def rules_dir(tmp_path_factory):
    directory = tmp_path_factory.mktemp("rules")
    (directory / "rules.yml").write_text(rule_file_yaml())
    return directory


@pytest.mark.parametrize("name", sorted(CASES))
def test_alert_fires_on_its_case_and_not_on_the_near_miss(name, rules_dir):
    path = rules_dir / f"{name}.test.yml"
    path.write_text(yaml.safe_dump(_test_file(name), sort_keys=False, allow_unicode=True))
    done = subprocess.run(
        [_promtool(), "test", "rules", path.name],
        cwd=rules_dir,
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )
    assert done.returncode == 0, done.stdout + done.stderr


def test_recording_rules_aggregate_per_job(rules_dir):
    series = [
        ('trainhealth_train_throughput_tokens_per_second{job="train",host="a",rank="0"}', "1000x10"),
        ('trainhealth_train_throughput_tokens_per_second{job="train",host="b",rank="1"}', "500x10"),
        ('trainhealth_gpu_up{job="train",host="b",rank="1",gpu="1",backend="nvml"}', "1 1 0x8"),
        ('trainhealth_gpu_up{job="train",host="a",rank="0",gpu="0",backend="nvml"}', "1x10"),
    ]
    test = {
        "rule_files": ["rules.yml"],
        "evaluation_interval": "1m",
        "tests": [
            {
                "interval": "1m",
                "input_series": [{"series": s, "values": v} for s, v in series],
                "promql_expr_test": [
                    {
                        "expr": "job:trainhealth_train_throughput_tokens_per_second:sum",
                        "eval_time": "5m",
                        "exp_samples": [
                            {
                                "labels": 'job:trainhealth_train_throughput_tokens_per_second:sum{job="train"}',
                                "value": 1500,
                            }
                        ],
                    },
                    {
                        "expr": "job:trainhealth_gpu_up:min",
                        "eval_time": "5m",
                        "exp_samples": [{"labels": 'job:trainhealth_gpu_up:min{job="train"}', "value": 0}],
                    },
                ],
            }
        ],
    }
    path = rules_dir / "recording.test.yml"
    path.write_text(yaml.safe_dump(test, sort_keys=False))
    done = subprocess.run(
        [_promtool(), "test", "rules", path.name],
        cwd=rules_dir,
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )
    assert done.returncode == 0, done.stdout + done.stderr
