"""Every rule compares ranks within one job: one Prometheus holds many jobs that share ranks, hosts and group
names (two runs started by torchrun without ``--rdzv-id``), and each run has a job label of its own."""

from __future__ import annotations

import re
import subprocess

import pytest
import yaml

from tests.prometheus_server import require_binary
from trainhealth._internal.alerts.render import rule_file_yaml
from trainhealth._internal.alerts.rules import ALERTS
from trainhealth._internal.knowledge.recording import RECORDING_RULES

#: rules about scrape targets, not ranks: they match by instance
TARGET_RULES = {"TrainhealthMetricsAbsent"}
_GROUPING = re.compile(r"\b(by|on|ignoring|without)\s*\(([^)]*)\)")
GROUP = 'group="default_pg:0"'


def test_every_aggregation_and_match_keeps_the_job():
    expressions = [(rule.name, rule.expr) for rule in ALERTS if rule.name not in TARGET_RULES]
    expressions += [(rule.record, rule.expr) for rule in RECORDING_RULES]
    for name, expr in expressions:
        for clause in _GROUPING.finditer(expr):
            labels = {label.strip() for label in clause.group(2).split(",")}
            if clause.group(1) in ("by", "on"):
                assert "job" in labels, f"{name}: {clause.group(0)} compares ranks of different jobs"
            else:
                assert "job" not in labels, f"{name}: {clause.group(0)} drops the job"


def _positions(job: str, seqs: tuple[int, ...], waited: str, host: str = "node-1") -> dict[str, str]:
    """Ranks 0.. of default_pg:0 of ``job`` at sequence numbers ``seqs``; those at the highest wait ``waited``."""
    top = max(seqs)
    series = {}
    for rank, seq in enumerate(seqs):
        labels = f'job="{job}",host="{host}",rank="{rank}"'
        series[f"trainhealth_comm_started_seq{{{labels},{GROUP}}}"] = f"{seq}x10"
        series[f'trainhealth_comm_inflight_duration_seconds{{{labels},op="all_reduce",{GROUP}}}'] = (
            waited if seq == top else "0x10"
        )
        series[f"trainhealth_comm_hang_threshold_seconds{{{labels}}}"] = "2x10"  # the 10 s floor applies
    return series


def _promtool(tmp_path, series: dict[str, str], firing: list[dict[str, str]]) -> None:
    """The hang alerts firing at 5 m are exactly ``firing`` (labels, alertname included)."""
    (tmp_path / "rules.yml").write_text(rule_file_yaml())
    alerts = 'ALERTS{alertname=~"HungCollective|RankMissing",alertstate="firing"}'
    test = {
        "rule_files": ["rules.yml"],
        "evaluation_interval": "1m",
        "tests": [
            {
                "interval": "1m",
                "input_series": [{"series": s, "values": v} for s, v in series.items()],
                "promql_expr_test": [
                    {
                        "expr": alerts,
                        "eval_time": "5m",
                        "exp_samples": [
                            {
                                "labels": "ALERTS" + _braces({**labels, "alertstate": "firing", "severity": "page"}),
                                "value": 1,
                            }
                            for labels in firing
                        ],
                    }
                ],
            }
        ],
    }
    (tmp_path / "jobs.test.yml").write_text(yaml.safe_dump(test, sort_keys=False))
    done = subprocess.run(
        [require_binary("promtool"), "test", "rules", "jobs.test.yml"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )
    assert done.returncode == 0, done.stdout + done.stderr


def _braces(labels: dict[str, str]) -> str:
    return "{" + ",".join(f'{k}="{v}"' for k, v in sorted(labels.items())) + "}"


def test_the_hung_job_pages_and_the_jobs_beside_it_never(tmp_path):
    series = {
        **_positions("run-a", (41, 41, 41, 40), "30x10"),  # rank 3 never entered #41: hung
        **_positions("run-b", (41, 41, 41, 41), "0x10"),  # same ranks, hosts and group: healthy
        **_positions("run-c", (1, 1, 1, 1), "25x10"),  # a 25 s first all-gather every rank entered: slow
    }
    hung = {"alertname": "HungCollective", "job": "run-a", "host": "node-1", "rank": "3", "group": "default_pg:0"}
    _promtool(tmp_path, series, [hung])


@pytest.mark.parametrize("same_label", [True, False])
def test_a_runs_long_first_collective_beside_another_run_is_no_hang(tmp_path, same_label):
    """Two 2-rank runs started by torchrun without a run id on other hosts: one trains (at #500), the other sits
    in its 25 s first all-gather, every rank in it. Under one shared job label (the old default) its ranks look
    500 collectives behind the other run's and HungCollective pages for them; with a job label per run, nothing
    pages."""
    first, second = ("trainhealth", "trainhealth") if same_label else ("3f9a0c12b7de", "81c4e2d09a5f")
    series = {
        **_positions(first, (500, 500), "0x10", host="node-1"),
        **_positions(second, (1, 1), "25x10", host="node-2"),
    }
    wrong = [
        {"alertname": "HungCollective", "job": second, "host": "node-2", "rank": str(rank), "group": "default_pg:0"}
        for rank in (0, 1)
    ]
    _promtool(tmp_path, series, wrong if same_label else [])
