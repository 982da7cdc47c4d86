"""The localization benchmark's cases and scoring, on a small sample of held-out seeds."""

from __future__ import annotations

import pytest

from trainhealth._internal.localize.localizer import Thresholds
from trainhealth._internal.simulator.scenario import CLUSTER_FAULTS, Control
from trainhealth_lab.bench.localization import SCALES, cases, evaluate, summarize


def test_cases_cover_every_kind_severity_control_and_layout():
    generated = cases(64, seeds=[3])
    faults = [c for c in generated if c.fault]
    assert {c.fault.kind for c in faults} == set(CLUSTER_FAULTS)
    assert {c.fault.severity for c in faults} == {1.02, 1.05, 1.1, 1.2, 1.5, 2.0, 3.0}
    assert {c.pattern for c in faults} == {"persistent", "transient"}
    assert {c.control for c in generated if not c.fault} == set(Control)
    assert {c.layout for c in generated} == set(SCALES[64])
    assert cases(64, seeds=[3]) == generated  # seeded: the same cases every time


@pytest.mark.slow
def test_clear_faults_are_found_and_controls_blame_no_one():
    chosen = [c for c in cases(64, seeds=[7]) if c.fault is None or c.fault.severity >= 1.5]
    outcomes = [evaluate(case, Thresholds()) for case in chosen]
    faults = [o for o in outcomes if o.case.fault]
    assert all(o.top1 for o in faults), [(o.case, o.components[:2]) for o in faults if not o.top1]
    assert not any(o.blamed for o in outcomes if o.case.fault is None)
    table = summarize(outcomes, "kind")
    assert set(table.index) == {"gpu", "nic", "host", "switch"} and (table["top1"] == 1.0).all()
    controls = summarize(outcomes, "control")
    assert controls.loc["none", "false_blame"] == 0.0 and controls.loc["none", "verdict_ok"] == 1.0
