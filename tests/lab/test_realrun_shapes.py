"""Issue 30's shapes in the real-run lab: specs and truth (no processes), and one real markerless job.

The real job is issue 30's reproduction: 4 gloo ranks call ``dist.all_reduce`` themselves every iteration and
``dist.barrier()`` every 5th, with ``trainhealth.comm.install`` alone (no Monitor: every record has step 0);
one rank is ~15 ms slower before its all-reduce from iteration 10 of 40. The localizer must name that rank's
GPU or say ``insufficient_data``, never ``healthy``.
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from trainhealth._internal.faults import Fault
from trainhealth_lab.realrun.cases import SHAPES, issue30_repro, suite_cases
from trainhealth_lab.realrun.spec import (
    CaseSpec,
    Driver,
    Parallelism,
    Pattern,
    Truth,
    lab_fault,
    truth,
)
from trainhealth_lab.realrun.suite import shape_label, shape_summary, shape_table

STRAGGLER = lab_fault("compute", Pattern.PERSISTENT, target=1, onset=10, severity=2.0)


def _spec(
    driver: Driver,
    *,
    ranks: int = 4,
    markers: bool = True,
    fault: Fault = STRAGGLER,
    layout: Parallelism = Parallelism.DDP,
) -> CaseSpec:
    return CaseSpec(f"{driver.value}-{ranks}", layout, ranks, 40, 0, fault, markers=markers, driver=driver)


@pytest.mark.parametrize(
    ("driver", "markers"),
    [
        (Driver.LAB, True),
        (Driver.EXPLICIT, False),
        (Driver.FSDP, True),
        (Driver.FSDP, False),
        (Driver.FSDP2, True),
        (Driver.HF_TRAINER, True),
        (Driver.ACCELERATE, True),
    ],
)
def test_a_spec_of_every_driver_survives_its_json(driver: Driver, markers: bool) -> None:
    spec = _spec(driver, markers=markers)
    assert CaseSpec.from_dict(json.loads(json.dumps(spec.to_dict()))) == spec
    assert spec.to_dict()["driver"] == driver.value
    stored = Truth.from_dict(json.loads(json.dumps(truth(spec).to_dict())))
    assert (stored.driver, stored.markers) == (driver.value, markers)


def test_specs_and_truths_written_before_drivers_are_the_labs_own_loop() -> None:
    data = _spec(Driver.LAB).to_dict()
    del data["driver"]
    assert CaseSpec.from_dict(data).driver is Driver.LAB
    old_truth = truth(_spec(Driver.LAB)).to_dict()
    del old_truth["driver"], old_truth["markers"]
    assert (Truth.from_dict(old_truth).driver, Truth.from_dict(old_truth).markers) == ("lab", True)


def test_accepted_verdicts_per_shape() -> None:
    def accepted(spec: CaseSpec) -> tuple[str, ...]:
        return truth(spec).accepted_verdicts

    assert accepted(_spec(Driver.FSDP)) == ("compute",)  # markers on every rank: a majority to compare with
    assert accepted(_spec(Driver.HF_TRAINER)) == ("compute",)
    assert accepted(_spec(Driver.FSDP, fault=replace(STRAGGLER, step=0))) == ("compute",)  # across ranks, not time
    assert accepted(_spec(Driver.EXPLICIT, markers=False)) == ("compute", "insufficient_data")
    assert accepted(_spec(Driver.FSDP, markers=False)) == ("compute", "insufficient_data")
    assert accepted(_spec(Driver.ACCELERATE)) == ("compute", "insufficient_data")  # rank 0's markers only
    assert accepted(_spec(Driver.FSDP2)) == ("compute", "insufficient_data")  # its collectives are not recorded
    for layout in Parallelism:  # two ranks: no majority, so "insufficient data" is honest
        assert accepted(_spec(Driver.LAB, ranks=2, layout=layout)) == ("compute", "insufficient_data")
    clean = lab_fault("clean")
    assert accepted(_spec(Driver.FSDP, fault=clean)) == ("healthy",)
    assert accepted(_spec(Driver.EXPLICIT, markers=False, fault=clean)) == ("healthy", "insufficient_data")
    assert truth(_spec(Driver.FSDP)).components == ("gpu:rank-1",)
    assert "trace step k+1" in truth(_spec(Driver.HF_TRAINER)).notes[0]


@pytest.mark.parametrize(
    ("changes", "named"),
    [
        ({"driver": Driver.EXPLICIT, "markers": True}, "markers must be False"),
        ({"driver": Driver.FSDP, "layout": Parallelism.DP_PP}, "layout must be ddp"),
        ({"driver": Driver.HF_TRAINER, "markers": False}, "markers must be True"),
        ({"driver": Driver.FSDP, "fault": lab_fault("link_rate", target=1, rate_mbit=10.0)}, "link_rate"),
    ],
)
def test_a_shape_the_lab_cannot_run_is_refused_naming_the_setting(changes: dict[str, object], named: str) -> None:
    with pytest.raises(ValueError, match=named):
        replace(_spec(Driver.LAB), **changes)  # type: ignore[arg-type]


def test_the_shapes_suite_has_every_shape_with_a_straggler_from_mid_run_and_from_the_start_and_a_control() -> None:
    cases = suite_cases("shapes", seeds=(0, 1))
    assert len(cases) == 2 * (3 * len(SHAPES) + 1)
    by_shape: dict[str, list[CaseSpec]] = {}
    for case in cases:
        if "issue30" not in case.name:
            by_shape.setdefault(shape_label(truth(case).to_dict()), []).append(case)
    assert len(by_shape) == len(SHAPES)
    for members in by_shape.values():
        stragglers = [c.fault for c in members if c.fault.target is not None]
        assert sorted(f.step == 0 for f in stragglers) == [False, False, True, True]
        assert all(f.kind == "compute" and f.severity >= 1.5 for f in stragglers)
        assert sum(c.fault.kind == "clean" for c in members) == 2
    assert issue30_repro(0) in cases and issue30_repro(1) in cases


def _row(shape: CaseSpec, verdict: str, *, top1: bool | None, false_blame: bool = False) -> dict[str, object]:
    plan = truth(shape).to_dict()
    right = verdict in plan["accepted_verdicts"]
    return {
        "case": shape.name,
        "status": "ok",
        "reason": "",
        "truth": plan,
        "wall_s": 1.0,
        "localize": {"verdict": verdict, "verdict_right": right, "top1": top1, "false_blame": false_blame},
    }


def test_the_acceptance_lines_count_healthy_answers_for_slow_ranks_and_false_blame() -> None:
    rows = [
        _row(_spec(Driver.HF_TRAINER), "healthy", top1=False),
        _row(_spec(Driver.EXPLICIT, markers=False), "insufficient_data", top1=False),
        _row(_spec(Driver.FSDP), "compute", top1=True),
        _row(_spec(Driver.FSDP, fault=lab_fault("clean")), "compute", top1=None, false_blame=True),
    ]
    lines = shape_summary(rows).splitlines()  # type: ignore[arg-type]
    assert "never `healthy` while a rank is >=1.5x slow: 2/3" in lines
    assert any(line.startswith("false blame: 1/4 runs") for line in lines)
    assert "verdict right or insufficient_data: 2/4" in lines
    table = shape_table(rows)  # type: ignore[arg-type]
    assert "hf_trainer-r4" in table and "healthy 1" in table


def test_issue30_markerless_explicit_collectives_with_a_straggler_are_never_called_healthy(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    from trainhealth._internal.localize.localizer import localize
    from trainhealth._internal.traces.io import read_trace
    from trainhealth_lab.realrun.launcher import run_case

    spec = issue30_repro(0)
    outcome = run_case(spec, tmp_path, live=False, timeout_s=120.0)
    assert outcome.status == "ok", outcome.reason
    trace = read_trace([outcome.run_dir])
    records = trace.records
    # the shape: the collective logger alone, no markers, every record at step 0
    assert set(records["op"].unique()) == {"all_reduce", "barrier"}
    assert (records["step"] == 0).all()
    per_rank = records.groupby("rank")["op"].value_counts().unstack()
    assert (per_rank["all_reduce"] == spec.steps).all() and (per_rank["barrier"] == spec.steps // 5).all()
    assert json.loads((Path(outcome.run_dir) / "truth.json").read_text())["driver"] == "explicit"
    assert outcome.measured_slowdown is not None and outcome.measured_slowdown >= 1.5  # the rank really was slow

    result = localize(records, trace.topology)
    assert result.verdict in ("compute", "insufficient_data"), result.render()
    if result.verdict == "compute":
        assert result.suspects[0].component == f"gpu:rank-{spec.fault.target}", result.render()
