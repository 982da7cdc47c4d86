"""The CI slice of the real-run fault lab: 4 real gloo ranks, DDP, ~30 steps, one straggler and one clean run.

The full suite is ``benchmarks/real_runs.py``; here the lab runs for real and ``localize`` must name the
straggler's GPU and blame nobody in the clean run.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from trainhealth._internal.faults import Fault
from trainhealth._internal.localize.localizer import localize
from trainhealth._internal.traces.io import read_trace
from trainhealth_lab.realrun.baselines import baseline_wait
from trainhealth_lab.realrun.cases import suite_cases
from trainhealth_lab.realrun.launcher import run_case
from trainhealth_lab.realrun.spec import CaseSpec, LabFault, Parallelism, Pattern, lab_fault, truth
from trainhealth_lab.scoring import score

pytest.importorskip("torch")

STEPS = 30
TARGET = 2


def _spec(name: str, fault: Fault) -> CaseSpec:
    return CaseSpec(name, Parallelism.DDP, ranks=4, steps=STEPS, seed=3, fault=fault)


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, object]:
    out = tmp_path_factory.mktemp("lab")
    straggler = _spec("straggler", lab_fault("compute", Pattern.PERSISTENT, target=TARGET, onset=8, severity=2.0))
    clean = _spec("clean", lab_fault("clean"))
    return {"straggler": run_case(straggler, out, live=False), "clean": run_case(clean, out, live=False)}


def _records(outcome):  # type: ignore[no-untyped-def]
    return read_trace([outcome.run_dir])


def test_the_runs_leave_traces_topology_and_truth(runs) -> None:  # type: ignore[no-untyped-def]
    for name, outcome in runs.items():
        assert outcome.status == "ok", outcome.reason
        trace = _records(outcome)
        records = trace.records
        assert sorted(records["rank"].unique()) == [0, 1, 2, 3]
        assert records["step"].max() >= STEPS - 2
        assert (records["op"] == "all_reduce").any()
        assert set(records["host"].unique()) == {f"lab-host-{r}" for r in range(4)}
        assert trace.topology is not None and trace.topology.groups == {"default_pg:0": (0, 1, 2, 3)}
        stored = json.loads((Path(outcome.run_dir) / "truth.json").read_text())
        assert stored["case"] == name and stored["layout"] == "ddp" and stored["ranks"] == 4
    stored = json.loads((Path(runs["straggler"].run_dir) / "truth.json").read_text())
    assert (stored["kind"], stored["target"], stored["onset"], stored["severity"]) == ("compute", TARGET, 8, 2.0)
    assert (stored["expected_verdict"], stored["components"]) == ("compute", [f"gpu:rank-{TARGET}"])
    assert runs["straggler"].measured_slowdown > 1.3  # the injected slowness reached the job's steps


def test_localize_names_the_straggler_gpu(runs) -> None:  # type: ignore[no-untyped-def]
    trace = _records(runs["straggler"])
    result = localize(trace.records, trace.topology)
    assert result.verdict == "compute", result.render()
    assert result.suspects[0].component == f"gpu:rank-{TARGET}", result.render()
    assert not any(TARGET not in s.ranks for s in result.suspects if s.score >= 0.5), result.render()


def test_the_onset_and_the_waiting_are_measured(runs) -> None:  # type: ignore[no-untyped-def]
    trace = _records(runs["straggler"])
    top = localize(trace.records, trace.topology).suspects[0]
    assert top.since_step is not None and abs(top.since_step - 8) <= 2, top.evidence
    assert 1.5 <= top.slowdown <= 2.5, top.evidence  # severity 2 on the rank's compute
    result = localize(trace.records, trace.topology)
    waits = {row["rank"]: row["wait_seconds"] for row in result.details["compute_and_wait"]}
    assert waits[TARGET] < min(w for rank, w in waits.items() if rank != TARGET)  # the straggler waits least


def test_without_step_markers_the_answer_is_right_or_insufficient_never_healthy(runs) -> None:  # type: ignore[no-untyped-def]
    trace = _records(runs["straggler"])
    bare = trace.records[trace.records["op"].isin(("all_reduce",))].assign(step=0)  # what comm.install alone writes
    result = localize(bare.reset_index(drop=True), trace.topology)
    assert result.verdict in ("compute", "insufficient_data"), result.render()
    if result.verdict == "compute":
        assert result.suspects[0].component == f"gpu:rank-{TARGET}", result.render()


def test_localize_blames_nobody_in_the_clean_run(runs) -> None:  # type: ignore[no-untyped-def]
    trace = _records(runs["clean"])
    result = localize(trace.records, trace.topology)
    assert result.verdict in ("healthy", "imbalance"), result.render()
    assert not [s for s in result.suspects if s.score >= 0.5], result.render()


def test_the_naive_baseline_sees_the_straggler_too(runs) -> None:  # type: ignore[no-untyped-def]
    assert baseline_wait(_records(runs["straggler"]).records) == TARGET


def test_a_finished_suite_is_scored_again_from_its_saved_traces(runs, tmp_path, capsys) -> None:  # type: ignore[no-untyped-def]
    from trainhealth_lab.cli import main
    from trainhealth_lab.realrun.suite import RESULTS_FILE, rescore

    results = tmp_path / RESULTS_FILE
    rows = []
    for outcome in runs.values():
        row = outcome.to_dict()
        row.pop("answer", None)
        rows.append(row)
    results.write_text("".join(json.dumps(row, default=str) + "\n" for row in rows))
    again = rescore(results)
    assert [r["localize"] for r in again] == [r["localize"] for r in rows]  # the same code gives the same answers
    assert [r["live_polls"] for r in again] == [r["live_polls"] for r in rows]  # what happened live is kept
    assert main(["score", str(tmp_path)]) == 0
    printed = capsys.readouterr().out
    assert "runs: 2 (2 scored, 0 skipped, 0 failed)" in printed and "false blame over all runs: 0/2" in printed
    assert main(["score", str(tmp_path / "missing")]) == 2


def test_scoring_counts_a_wrong_rank_as_false_blame() -> None:
    t = truth(_spec("s", lab_fault("compute", target=1, onset=5, severity=2.0)))
    assert score(t.expected(), "compute", [("gpu:rank-3", (3,), 0.9)]).false_blame
    assert not score(t.expected(), "compute", [("gpu:rank-3", (3,), 0.9)]).top1
    control = truth(_spec("c", lab_fault("clean")))
    assert score(control.expected(), "compute", [("gpu:rank-0", (0,), 0.7)]).false_blame
    assert not score(control.expected(), "imbalance", []).false_blame


def test_a_spec_written_before_the_one_fault_vocabulary_still_loads() -> None:
    """The ``spec.json`` of runs recorded before (onset, pattern, length, rate_mbit) is read as the same fault."""
    written = _spec("old", lab_fault("link_rate", Pattern.TRANSIENT, 2, 12, 1.8, length=5, rate_mbit=40.0)).to_dict()
    written["fault"] = {
        "kind": "link_rate",
        "pattern": "transient",
        "target": 2,
        "onset": 12,
        "severity": 1.8,
        "length": 5,
        "every": 0,
        "rate_mbit": 40.0,
        "delay_ms": None,
        "stall_s": 0.0,
        "hogs": 0,
    }
    fault = CaseSpec.from_dict(written).fault
    assert (fault.kind, fault.ranks, fault.step, fault.until, fault.params["rate_mbit"]) == (
        "link_rate",
        (2,),
        12,
        16,
        40.0,
    )
    assert fault.pattern == Pattern.TRANSIENT and truth(CaseSpec.from_dict(written)).onset == 12


def test_the_full_suite_covers_the_issue() -> None:
    cases = suite_cases("full", seeds=(0, 1, 2))
    assert len(cases) >= 60
    assert {c.ranks for c in cases} == {4, 8}
    assert {c.layout for c in cases} == set(Parallelism)
    assert {c.kind for c in cases} == set(LabFault)
    assert {c.fault.pattern for c in cases if c.kind is LabFault.COMPUTE} == set(Pattern)


def test_public_names_are_the_labs_own_and_documented() -> None:
    import inspect

    import trainhealth_lab.realrun as realrun

    assert len(set(realrun.__all__)) == len(realrun.__all__)
    for name in realrun.__all__:
        value = getattr(realrun, name)
        if inspect.isclass(value) or inspect.isfunction(value):
            assert value.__module__.startswith("trainhealth_lab.realrun."), (name, value.__module__)
            assert inspect.getdoc(value), f"{name} has no docstring"
