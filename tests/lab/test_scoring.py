"""The one localization scorer: each rule, on the answers the localizer gives, for every lab's kind of truth."""

from __future__ import annotations

import pytest

from trainhealth._internal.localize.result import LocalizationResult, Suspect
from trainhealth_lab.realrun.spec import CaseSpec, Parallelism, Pattern, lab_fault, truth
from trainhealth_lab.scoring import BLAME_SCORE, Expected, score, score_result

GPU3 = Expected("compute", ("compute",), components=("gpu:rank-3",), ranks=(3,))


def test_top1_needs_the_accepted_verdict_and_the_faulty_component_first():
    assert score(GPU3, "compute", [("gpu:rank-3", (3,), 0.9)]).top1
    assert not score(GPU3, "communication", [("gpu:rank-3", (3,), 0.9)]).top1  # the right device, wrong class
    assert not score(GPU3, "compute", [("gpu:rank-2", (2,), 0.9), ("gpu:rank-3", (3,), 0.8)]).top1
    assert not score(GPU3, "healthy", []).top1


def test_top3_is_a_ranking_measure_without_the_verdict():
    suspects = [("gpu:rank-1", (1,), 0.9), ("gpu:rank-2", (2,), 0.4), ("gpu:rank-3", (3,), 0.3)]
    assert score(GPU3, "compute", suspects).top3 and not score(GPU3, "compute", suspects).top1
    assert not score(GPU3, "compute", [("gpu:rank-0", (0,), 0.9)] + suspects).top3


def test_only_a_blaming_verdict_blames_and_only_the_top_or_strong_suspects():
    weak = BLAME_SCORE - 0.01
    s = score(GPU3, "compute", [("gpu:rank-3", (3,), 0.2), ("gpu:rank-5", (5,), weak)])
    assert s.blamed == ("gpu:rank-3",) and not s.false_blame  # the top is blamed whatever its score
    s = score(GPU3, "compute", [("gpu:rank-3", (3,), 0.9), ("gpu:rank-5", (5,), BLAME_SCORE)])
    assert s.blamed == ("gpu:rank-3", "gpu:rank-5") and s.false_blame
    assert score(GPU3, "imbalance", [("gpu:rank-5", (5,), 0.9)]).blamed == ()


def test_a_control_has_nothing_to_name_and_any_blame_is_false():
    control = Expected("healthy", ("healthy", "imbalance"))
    s = score(control, "compute", [("gpu:rank-0", (0,), 0.7)])
    assert s.top1 is None and s.top3 is None and s.false_blame and not s.verdict_right
    assert not score(control, "imbalance", []).false_blame


def test_a_transient_fault_is_named_by_the_first_event_when_nobody_is_blamed():
    transient = Expected("compute", ("compute", "healthy"), ("gpu:rank-3",), (3,), transient=True)
    assert score(transient, "healthy", [], events=[("gpu:rank-3", (3,))]).top1
    assert not score(transient, "healthy", [], events=[("gpu:rank-1", (1,)), ("gpu:rank-3", (3,))]).top1
    assert score(transient, "healthy", [], events=[("gpu:rank-1", (1,)), ("gpu:rank-3", (3,))]).top3
    assert not score(transient, "imbalance", [], events=[("gpu:rank-3", (3,))]).top1  # not an accepted verdict
    assert not score(GPU3, "healthy", [], events=[("gpu:rank-3", (3,))]).top1  # a persistent fault needs blame


def test_a_link_fault_is_covered_by_any_suspect_of_its_rank_alone_but_its_gpu():
    link = Expected("communication", ("communication",), ("nic:rank-2",), (2,), link=True)
    assert score(link, "communication", [("link:rank-2", (2,), 0.8)]).top1
    assert score(link, "communication", [(None, (2,), 0.8)]).top1
    assert not score(link, "communication", [("gpu:rank-2", (2,), 0.8)]).top1
    assert not score(link, "communication", [("host:h0", (2, 3), 0.8)]).top1
    assert not score(GPU3, "compute", [(None, (3,), 0.8)]).top1  # only link faults accept an unnamed suspect


@pytest.mark.parametrize(
    ("fault", "verdict", "component", "right"),
    [
        (lab_fault("compute", target=1, onset=3, severity=2.0), "compute", "gpu:rank-1", True),
        (lab_fault("link_delay", target=2, onset=3, delay_ms=5.0), "communication", "nic:rank-2", True),
        (lab_fault("dataloader", target=0, onset=3, stall_s=0.1), "compute", "gpu:rank-0", True),
        (
            lab_fault("compute", Pattern.TRANSIENT, target=1, onset=3, severity=2.0, length=3),
            "compute",
            "gpu:rank-3",
            False,
        ),
    ],
)
def test_the_real_run_labs_truth_scores_a_localization_result(fault, verdict, component, right):
    spec = CaseSpec("c", Parallelism.DDP, 4, 20, 0, fault)
    rank = int(component.rsplit("-", 1)[1])
    result = LocalizationResult(verdict, (Suspect("gpu", (rank,), None, None, 0.9, "test", component),), (5,), [])
    s = score_result(truth(spec).expected(), result)
    assert s.top1 is right and s.false_blame is not right and s.top == component
