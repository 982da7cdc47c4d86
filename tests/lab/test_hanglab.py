"""The hang lab for real: 4 gloo ranks with the Monitor, Prometheus with trainhealth's rules, Alertmanager with its
routing tree. A rank stalled in host code is named by the analyzer, the rule and the page, with the stalling
function; a checkpoint save inside ``Monitor.pause`` is named by nobody. (All cases: benchmarks/hangs.py.)"""

from __future__ import annotations

import shutil

import pytest

from tests.prometheus_server import require_binary
from trainhealth_lab.hangs.harness import HangCase, run_hang_case


def test_a_rank_stalled_in_host_code_is_named_within_a_minute_with_its_function(tmp_path):
    require_binary("prometheus")
    require_binary("prometheus-alertmanager" if shutil.which("prometheus-alertmanager") else "alertmanager")
    outcome = run_hang_case(HangCase("host_stall", target=3, onset_step=40, steps=120), tmp_path / "case")
    assert outcome.onset is not None, outcome.notes
    assert outcome.analyzer_named == 3 and outcome.analyzer_first_s is not None and outcome.analyzer_first_s <= 60
    assert (outcome.cli_verdict, outcome.cli_named) == ("hang", 3)  # trainhealth analyze --prometheus --once --json
    assert outcome.rule_named == 3 and outcome.rule_name == "HungCollective"
    assert outcome.page_first_s is not None and outcome.page_first_s <= 60
    assert "load_batch" in outcome.where and "load_batch" in outcome.analyzer_evidence + outcome.where
    assert outcome.stacks_files >= 1


@pytest.mark.slow
def test_a_checkpoint_save_inside_monitor_pause_pages_nobody(tmp_path):
    require_binary("prometheus")
    require_binary("prometheus-alertmanager" if shutil.which("prometheus-alertmanager") else "alertmanager")
    outcome = run_hang_case(HangCase("checkpoint", target=0, onset_step=40, steps=100, pause_s=15.0), tmp_path / "case")
    assert outcome.onset is not None, outcome.notes
    assert "hang" not in outcome.analyzer_verdicts and outcome.analyzer_verdicts  # judged, and never a hang
    assert outcome.rule_first_s is None and outcome.page_first_s is None
    assert not outcome.notes  # the job finished: the peers waited 15 s and went on
