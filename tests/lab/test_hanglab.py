"""The hang lab for real: 4 ranks with the Monitor, Prometheus with trainhealth's rules, Alertmanager with its
routing tree. A rank stalled in host code is named by the analyzer, the rule and the page, with the stalling
function, on gloo and on a backend with NCCL's semantics (calls return at once; the peers block in
``synchronize()``, outside every collective call); three set-up barriers and a rank 30 s late to its first
all-reduce page nobody. A few other shapes of issue 48 run in the slow tier; the rest (a Trainer's save, a stalled
disk, groups made every step, a slow loader) in benchmarks/hangs.py, to keep CI's time: the stalled disk and the
groups are also unit-tested in tests/exporters/collectives/test_watch.py."""

from __future__ import annotations

import shutil

import pytest

from tests.prometheus_server import require_binary
from trainhealth_lab.hangs.harness import HangCase, HangOutcome, run_hang_case


def _require_stack() -> None:
    require_binary("prometheus")
    require_binary("prometheus-alertmanager" if shutil.which("prometheus-alertmanager") else "alertmanager")


def _assert_quiet(outcome: HangOutcome) -> None:
    """A control: judged while it ran, never a hang verdict, rule or page, and the job finished."""
    assert outcome.onset is not None, outcome.notes
    assert outcome.analyzer_verdicts and "hang" not in outcome.analyzer_verdicts, outcome.analyzer_verdicts
    assert outcome.rule_first_s is None and outcome.page_first_s is None, (outcome.rule_alerts, outcome.page_alerts)
    assert not outcome.notes  # every rank finished: the peers waited and went on


def _assert_named(outcome: HangOutcome, target: int, within_s: float = 60.0) -> None:
    assert outcome.onset is not None, outcome.notes
    assert outcome.analyzer_named == target, (outcome.analyzer_verdicts[-3:], outcome.analyzer_evidence)
    assert outcome.analyzer_first_s is not None and outcome.analyzer_first_s <= within_s
    assert outcome.rule_named == target, outcome.rule_alerts
    assert outcome.page_first_s is not None and outcome.page_first_s <= within_s, outcome.page_alerts


def test_a_rank_stalled_in_host_code_is_named_within_a_minute_with_its_function(tmp_path):
    _require_stack()
    outcome = run_hang_case(HangCase("host_stall", target=3, onset_step=40, steps=120), tmp_path / "case")
    _assert_named(outcome, 3)
    assert (outcome.cli_verdict, outcome.cli_named) == ("hang", 3)  # trainhealth analyze --prometheus --once --json
    assert outcome.rule_name == "HungCollective"
    assert "load_batch" in outcome.where and "load_batch" in outcome.analyzer_evidence + outcome.where
    assert outcome.stacks_files >= 1


def test_with_ncclsemantics_a_stalled_rank_is_named_while_its_peers_block_outside_collectives(tmp_path):
    _require_stack()
    case = HangCase("host_stall", target=1, onset_step=40, steps=120, watch_s=70.0, backend="ncclsim")
    outcome = run_hang_case(case, tmp_path / "case")
    _assert_named(outcome, 1)
    assert outcome.rule_name == "HungCollective"
    assert "load_batch" in outcome.where


def test_set_up_barriers_and_a_rank_late_to_its_first_all_reduce_page_nobody(tmp_path):
    _require_stack()
    case = HangCase("setup_barriers", target=2, steps=100, pause_s=30.0, watch_s=100.0)
    _assert_quiet(run_hang_case(case, tmp_path / "case"))


@pytest.mark.slow
def test_a_checkpoint_save_inside_monitor_pause_pages_nobody(tmp_path):
    _require_stack()
    outcome = run_hang_case(HangCase("checkpoint", target=0, onset_step=40, steps=100, pause_s=15.0), tmp_path / "case")
    _assert_quiet(outcome)


@pytest.mark.slow
def test_a_25_s_all_gather_every_rank_entered_is_a_slow_collective_and_pages_nobody(tmp_path):
    _require_stack()
    _assert_quiet(
        run_hang_case(HangCase("long_collective", target=2, onset_step=40, steps=100, pause_s=25.0), tmp_path)
    )


@pytest.mark.slow
def test_of_two_runs_of_one_job_name_the_hung_one_is_named_and_the_healthy_one_never(tmp_path):
    _require_stack()
    outcome = run_hang_case(HangCase("two_jobs", target=2, onset_step=40, steps=160), tmp_path / "case")
    _assert_named(outcome, 2)
    assert outcome.labels_disjoint, outcome.job_labels
    assert outcome.healthy_judged > 0  # the analyzer judged the healthy job while the other hung
    assert not outcome.healthy_named, (outcome.healthy_verdict_s, outcome.healthy_rule_s, outcome.healthy_page_s)


@pytest.mark.slow
def test_a_pause_that_never_ends_pages_with_its_reason(tmp_path):
    _require_stack()
    case = HangCase("endless_pause", target=0, onset_step=40, pause_s=3.0, watch_s=120.0)
    outcome = run_hang_case(case, tmp_path / "case")
    _assert_named(outcome, 0, within_s=90.0)
    assert outcome.page_names_reason, outcome.page_text
