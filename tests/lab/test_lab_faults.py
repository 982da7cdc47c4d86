"""The lab's fault kinds are one typed vocabulary (:class:`LabFault`), each a kind of trainhealth's one ``Fault``:
every kind has a case and a ground truth, and a kind the lab does not inject is refused naming it, never scored as
another kind's."""

from __future__ import annotations

import pytest

import trainhealth._internal.simulator.scenario  # noqa: F401 - declares the simulator's kinds (gpu, nic, ...)
from trainhealth._internal.faults import KINDS, Fault
from trainhealth_lab.realrun.cases import make_case
from trainhealth_lab.realrun.spec import CaseSpec, LabFault, Parallelism, Pattern, Truth, lab_fault, truth

#: what a right answer to each kind is: the expected verdict, and whether a component is to be named
VERDICTS = {
    LabFault.COMPUTE: "compute",
    LabFault.LINK_RATE: "communication",
    LabFault.LINK_DELAY: "communication",
    LabFault.CPU_CONTENTION: "compute",
    LabFault.DATALOADER: "compute",
    LabFault.CLEAN: "healthy",
    LabFault.SEQ_IMBALANCE: "imbalance",
    LabFault.STAGE_IMBALANCE: "imbalance",
}


def test_the_lab_kinds_are_the_fault_kinds_the_lab_declares():
    assert {kind.value for kind in LabFault} == {name for name, kind in KINDS.items() if kind.injector == "lab"}
    assert {kind for kind in LabFault if kind.control} == {
        LabFault.CLEAN,
        LabFault.SEQ_IMBALANCE,
        LabFault.STAGE_IMBALANCE,
    }
    assert {kind for kind in LabFault if kind.link} == {LabFault.LINK_RATE, LabFault.LINK_DELAY}
    assert LabFault("link_rate") is LabFault.LINK_RATE and str(LabFault.LINK_RATE) == "link_rate"


@pytest.mark.parametrize("kind", list(LabFault))
def test_every_kind_has_a_case_and_a_ground_truth(kind):
    layout = Parallelism.DP_PP if kind is LabFault.STAGE_IMBALANCE else Parallelism.DDP
    spec = make_case(kind.value, Pattern.PERSISTENT, layout, 4, seed=0)
    assert spec.kind is kind and spec.fault.kind == kind.value
    answer = truth(spec)
    assert answer.kind is kind and answer.expected_verdict == VERDICTS[kind]
    assert bool(answer.components) == (not kind.control)
    assert answer.expected().link == kind.link
    assert Truth.from_dict(answer.to_dict()) == answer and answer.to_dict()["kind"] == kind.value


@pytest.mark.parametrize("kind", ["gpu", "nic", "host"])
def test_a_kind_the_lab_does_not_inject_is_refused_naming_it(kind):
    # a simulator's kind is a valid Fault: before, the lab took it and scored it as a slow GPU ("compute")
    fault = Fault(kind, (1,), severity=2.0)
    with pytest.raises(ValueError, match=f"the lab injects no fault '{kind}'"):
        CaseSpec("foreign", Parallelism.DDP, 4, 30, 0, fault)
    with pytest.raises(ValueError, match=f"'{kind}'"):
        make_case(kind, Pattern.PERSISTENT, Parallelism.DDP, 4, seed=0)
    with pytest.raises(ValueError, match=f"'{kind}'"):
        lab_fault(kind, target=1, severity=2.0)
    written = truth(CaseSpec("c", Parallelism.DDP, 4, 30, 0, lab_fault("compute", target=1, severity=2.0))).to_dict()
    with pytest.raises(ValueError, match=f"'{kind}'"):
        Truth.from_dict({**written, "kind": kind})
