"""The one fault vocabulary, as a contract every declared kind keeps (as tests/detectors/test_contract.py does
for the detectors): made from a dictionary, it round-trips, reads as one line, acts where and when it says,
and a bad field is refused naming the field."""

from __future__ import annotations

import json

import pytest

from trainhealth._internal.config.fields import Range
from trainhealth._internal.faults import KINDS, Fault, FaultError, FaultKind, register
from trainhealth._internal.injectors.schedule_file import FAULT_KINDS, load_schedule
from trainhealth._internal.simulator.scenario import CLUSTER_FAULTS
from trainhealth_lab.realrun.spec import LAB_FAULTS

#: who declares which kinds: the simulator, the injectors and the real-run lab
DECLARED = {"simulator": CLUSTER_FAULTS, "injectors": FAULT_KINDS, "lab": LAB_FAULTS}
ALL = sorted(kind for kinds in DECLARED.values() for kind in kinds)


def _inside(bounds: Range) -> float:
    """A severity inside ``bounds``, away from its edges."""
    return round(bounds.low + (bounds.high - bounds.low) / 3, 3)


def _example(kind: str) -> dict:
    spec = KINDS[kind]
    entry: dict = {"kind": kind, "step": 12, "until": 20}
    if spec.needs_ranks or not spec.control:
        entry["ranks"] = [1]
    if spec.severity is not None:
        entry["severity"] = _inside(spec.severity)
    if kind in ("link_rate",):
        entry["rate_mbit"] = 50.0
    if kind in ("link_delay",):
        entry["delay_ms"] = 4.0
    return entry


def test_every_injector_declares_its_kinds_and_no_name_is_shared():
    for injector, kinds in DECLARED.items():
        assert {KINDS[kind].injector for kind in kinds} == {injector}
    assert len(ALL) == len(set(ALL))
    with pytest.raises(ValueError, match="already declared by simulator"):
        register(FaultKind("gpu", "elsewhere", "another gpu"))


@pytest.mark.parametrize("kind", ALL)
def test_a_fault_round_trips_through_its_dictionary_and_json(kind):
    fault = Fault.from_dict(_example(kind))
    again = Fault.from_dict(json.loads(json.dumps(fault.to_dict())))
    assert again == fault and again.to_dict() == fault.to_dict()
    assert (fault.kind, fault.step, fault.until) == (kind, 12, 20)


@pytest.mark.parametrize("kind", ALL)
def test_a_fault_reads_as_one_line_naming_when_and_where(kind):
    fault = Fault.from_dict(_example(kind))
    line = fault.describe()
    assert "\n" not in line and line.startswith("steps 12-20: ")
    if not KINDS[kind].control:
        assert line.endswith(" on rank 1")
    if KINDS[kind].severity is not None:
        assert f"{fault.severity:g}"[:3] in line or f"{fault.severity:.2f}" in line


@pytest.mark.parametrize("kind", ALL)
def test_a_fault_acts_only_in_its_steps_and_on_its_ranks(kind):
    fault = Fault.from_dict(_example(kind))
    assert [fault.active(step, rank=1) for step in (11, 12, 20, 21)] == [False, True, True, False]
    if fault.ranks:
        assert not fault.active(15, rank=2)
    intermittent = Fault.from_dict({**_example(kind), "every": 4})
    assert [step for step in range(10, 22) if intermittent.active(step, rank=1)] == [12, 16, 20]
    assert intermittent.pattern == "intermittent" and fault.pattern == "transient"


@pytest.mark.parametrize("kind", ALL)
@pytest.mark.parametrize(
    ("field", "value"),
    [("step", -1), ("step", 1.5), ("until", 3), ("every", 0), ("ranks", [-1]), ("ranks", []), ("colour", "red")],
)
def test_a_bad_field_is_refused_naming_it(kind, field, value):
    with pytest.raises(FaultError, match=field):
        Fault.from_dict({**_example(kind), field: value})


@pytest.mark.parametrize("kind", [kind for kind in ALL if KINDS[kind].severity is not None])
@pytest.mark.parametrize("value", [float("nan"), float("inf"), "abc", None, 1e12])
def test_a_severity_outside_the_kinds_range_is_refused(kind, value):
    with pytest.raises(FaultError, match="severity"):
        Fault.from_dict({**_example(kind), "severity": value})


def test_the_old_field_names_say_what_they_became():
    with pytest.raises(FaultError, match="seconds is now severity"):
        Fault.from_dict({"kind": "delay", "step": 3, "seconds": 0.5})
    with pytest.raises(FaultError, match="severity is required"):
        Fault.from_dict({"kind": "gpu", "ranks": [3]})
    (straggler,) = load_schedule([{"kind": "delay", "severity": 0.5, "step": 3, "ranks": [1]}])
    assert straggler.until == 3  # an injector's fault is an event: one step unless until says more
    assert Fault.from_dict({"kind": "gpu", "ranks": [3], "severity": 1.5}).until is None  # a simulated slow GPU stays
