"""The measured path on traces built by the physics of a synchronous step, one rule at a time.

Each rank computes, then joins its collectives: a collective ends on every member
at max(arrivals) + transfer time. The real-run lab (tests/lab/test_realrun.py)
checks the same rules on real gloo ranks; these traces isolate one rule each.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from trainhealth._internal.localize.localizer import localize


def _trace(
    *,
    ranks=4,
    steps=40,
    slow=None,
    factor=1.0,
    onset=0,
    end=None,
    every=0,
    jitter=0.02,
    uneven=0.0,
    tp=1,
    link=None,
    link_factor=1.0,
    transfer=0.004,
    markers=True,
    seed=0,
    also=None,
):
    """Records of ``ranks`` ranks (data parallel x ``tp``), each step: compute, TP all-reduce, DP all-reduce.

    ``also``: {rank: (factor, first step, end step)}, more slowness beside the fault.
    """
    rng = np.random.default_rng(seed)
    rows = []
    clock = np.zeros(ranks)
    dp_groups = [tuple(range(t, ranks, tp)) for t in range(tp)]
    tp_groups = [tuple(range(d, d + tp)) for d in range(0, ranks, tp)] if tp > 1 else []
    seq = {}
    for step in range(steps):
        begin = clock.copy()
        work = 0.05 * (1 + rng.normal(0, jitter, ranks)) * (1 + uneven * rng.random(ranks))
        hit = slow is not None and step >= onset and (end is None or step < end) and (not every or step % every == 0)
        if hit:
            work[slow] *= factor
        for rank, (more, first, stop) in (also or {}).items():
            if first <= step < stop:
                work[rank] *= more
        arrive = clock + work
        for groups, name in ((tp_groups, "tp"), (dp_groups, "dp")):
            for index, members in enumerate(groups):
                group = f"{name}{index}"
                took = transfer * (link_factor if link is not None and link in members and step >= onset else 1.0)
                finish = max(arrive[m] for m in members) + took
                n = seq[group] = seq.get(group, -1) + 1
                for m in members:
                    rows.append(
                        {
                            "rank": m,
                            "step": step if markers else 0,
                            "op": "all_reduce",
                            "group": group,
                            "seq": n,
                            "start": arrive[m],
                            "duration": finish - arrive[m],
                            "bytes": 1 << 20,
                            "host": f"h{m}",
                        }
                    )
                    arrive[m] = finish
        clock = arrive + 0.002
        if markers:
            rows += [
                {
                    "rank": r,
                    "step": step,
                    "op": "step",
                    "group": None,
                    "seq": None,
                    "start": begin[r],
                    "duration": clock[r] - begin[r],
                    "bytes": 0,
                    "host": f"h{r}",
                }
                for r in range(ranks)
            ]
    frame = pd.DataFrame(rows)
    frame["seq"] = frame["seq"].astype("Int64")
    return frame


def test_a_straggler_is_named_with_its_onset():
    result = localize(_trace(slow=2, factor=1.3, onset=18))
    assert result.verdict == "compute" and [s.component for s in result.suspects] == ["gpu:rank-2"]
    assert "since step 18" in result.suspects[0].evidence and "1.3" in result.suspects[0].evidence
    waits = {row["rank"]: row for row in result.details["compute_and_wait"]}
    assert waits[2]["wait_seconds"] < min(waits[r]["wait_seconds"] for r in (0, 1, 3))  # it waits least


def test_without_step_markers_the_iterations_are_inferred():
    result = localize(_trace(slow=1, factor=1.5, onset=15, markers=False))
    assert result.details["evidence_source"] == "collectives (steps inferred)"
    assert result.verdict == "compute" and result.suspects[0].component == "gpu:rank-1"


def test_a_trace_that_cannot_support_a_verdict_says_so():
    result = localize(_trace(steps=4))
    assert result.verdict == "insufficient_data" and "at least 6" in result.details["reasons"][0]
    alone = _trace(ranks=1, steps=20)
    assert localize(alone).verdict == "insufficient_data"


@pytest.mark.parametrize("seed", range(5))
def test_clean_runs_blame_nobody_at_any_noise(seed):
    for jitter in (0.01, 0.05, 0.15):
        result = localize(_trace(jitter=jitter, seed=seed))
        assert result.suspects == (), (jitter, result.render())
        power = result.details["power"]["slowdown"]
        if result.verdict == "insufficient_data":  # only when this window's noise hides a 1.5x rank
            # None: not even 3x was blamed in 95% of injections
            assert power is None or power > 1.5, power
            assert result.details["reasons"][0].startswith("too noisy to call healthy")
        else:
            assert result.verdict == "imbalance" or (result.verdict == "healthy" and power <= 1.5)
    quiet = localize(_trace(jitter=0.01, seed=seed))
    power = quiet.details["power"]
    # slow from an onset shows against the rank's own steps; slow all window only beyond the 15% allowance for
    # healthy differences between devices
    assert quiet.verdict == "healthy" and power["onset_in_window"] < 1.1 and power["throughout_window"] < 1.3


@pytest.mark.parametrize("seed", range(5))
def test_work_that_moves_is_imbalance(seed):
    result = localize(_trace(uneven=2.0, seed=seed))  # each rank's work drawn 1-3x per step, like sequence lengths
    assert result.suspects == () and result.verdict == "imbalance"
    assert result.details["reasons"][0].startswith("uneven work")
    milder = localize(_trace(uneven=0.5, seed=seed))  # below the 25% that counts as uneven: nobody blamed either way
    assert milder.suspects == () and milder.verdict in ("healthy", "imbalance", "insufficient_data")
    if milder.verdict == "insufficient_data":  # work moving this much hides a 1.5x rank: no finding of health
        assert milder.details["power"]["slowdown"] is None or milder.details["power"]["slowdown"] > 1.5


def test_a_transient_fault_is_an_event_with_its_steps_not_a_faulty_device():
    result = localize(_trace(slow=3, factor=2.0, onset=20, end=25))
    assert result.suspects == () and result.verdict == "healthy", result.render()
    event = result.details["events"][0]
    assert event["component"] == "gpu:rank-3" and "in steps 20-24" in event["evidence"]
    assert event["shape"] == "transient" and "events (not faults:" in result.render()


def test_an_intermittent_fault_is_found_in_its_separate_steps():
    result = localize(_trace(slow=0, factor=2.0, onset=4, every=5, steps=50))
    assert result.suspects[0].component == "gpu:rank-0" and "separate steps" in result.suspects[0].evidence


def test_a_tensor_parallel_straggler_not_its_mate():
    result = localize(_trace(ranks=8, tp=2, slow=5, factor=1.4, onset=12))
    assert [s.component for s in result.suspects] == ["gpu:rank-5"]


def test_a_slow_link_is_communication_and_its_rank_named_when_groups_differ():
    result = localize(_trace(ranks=8, tp=2, link=6, link_factor=4.0, onset=15))
    assert result.verdict == "communication"
    assert result.suspects[0].component == "nic:rank-6" and "since step 15" in result.suspects[0].evidence


def test_a_slow_links_evidence_names_the_size_of_its_collectives():
    # every collective of these traces carries 1 MiB (the trace's `bytes`): a shared rank's link, and a group
    shared = localize(_trace(ranks=8, tp=2, link=6, link_factor=4.0, onset=15)).suspects[0]
    assert shared.component == "nic:rank-6" and " (1 MiB all-reduces), and rank 6 is the one" in shared.evidence
    group = localize(_trace(link=1, link_factor=6.0, onset=15)).suspects[0]
    assert group.component == "group:dp0" and "(ranks 0, 1, 2, 3; 1 MiB all-reduces)" in group.evidence
    unsized = localize(_trace(ranks=8, tp=2, link=6, link_factor=4.0, onset=15).drop(columns="bytes")).suspects[0]
    assert unsized.component == "nic:rank-6" and "MiB" not in unsized.evidence


def test_in_pure_data_parallelism_the_slow_group_is_named_and_the_probe_suggested():
    result = localize(_trace(link=1, link_factor=6.0, onset=15))
    assert result.verdict == "communication"
    assert result.suspects[0].component.startswith("group:") and "trainhealth probe" in result.suspects[0].evidence


def test_a_slow_path_that_adds_little_to_the_step_blames_nobody():
    # 0.2 ms transfers 4x slower add 0.6 ms to a 55 ms step: a busy scheduler does that to tiny messages
    tiny = localize(_trace(ranks=8, tp=2, link=6, link_factor=4.0, transfer=0.0002, onset=15))
    assert tiny.suspects == () and tiny.verdict == "healthy", tiny.render()
    large = localize(_trace(ranks=8, tp=2, link=6, link_factor=4.0, transfer=0.004, onset=15))
    assert large.suspects[0].component == "nic:rank-6"


def test_the_echo_of_a_stragglers_onset_is_no_second_fault():
    # the job re-synchronises around a 3x stall: a peer slower in the two steps it began is not blamed ...
    echo = localize(_trace(slow=2, factor=3.0, onset=20, also={1: (1.3, 20, 22)}))
    assert [s.component for s in echo.suspects] == ["gpu:rank-2"], echo.render()
    # ... the same slowness on its own, later, is an event of its own (it came and went)
    apart = localize(_trace(slow=2, factor=3.0, onset=20, also={1: (1.3, 30, 34)}))
    assert [s.component for s in apart.suspects] == ["gpu:rank-2"], apart.render()
    assert [e["component"] for e in apart.details["events"]] == ["gpu:rank-1"]


def test_a_jobs_first_steps_are_warm_up_not_judged():
    warm = localize(_trace(slow=3, factor=2.0, onset=0, end=3))
    assert warm.suspects == (), warm.render()
    later = localize(_trace(slow=3, factor=2.0, onset=10, end=13))
    assert later.details["events"][0]["component"] == "gpu:rank-3"


def test_a_straggler_of_a_few_late_steps_does_not_explain_a_link_slow_long_before():
    result = localize(_trace(ranks=8, tp=2, link=6, link_factor=4.0, onset=15, also={6: (1.5, 35, 38)}))
    components = [s.component for s in result.suspects]
    assert result.verdict == "communication" and "nic:rank-6" in components, result.render()


def test_step_markers_on_one_rank_only_are_no_finding_of_health():
    # the Monitor on rank 0 alone: the other ranks' steps cannot be measured, so nothing can be called healthy
    frame = _trace(jitter=0.01)
    one_rank = frame[(frame["op"] != "step") | (frame["rank"] == 0)]
    result = localize(one_rank)
    assert result.verdict == "insufficient_data" and result.details["uncovered_ranks"] == [1, 2, 3], result.render()
    assert "ranks 1, 2, 3 measured in fewer than half" in result.details["reasons"][0]
    waits = {row["rank"]: row["compute_seconds"] for row in result.details["compute_and_wait"]}
    assert waits[1] is None and waits[0] > 0  # unmeasured, never reported as 0 s of compute


def _explicit_loop(*, ranks=4, iterations=40, slow=None, sleep=0.015, onset=10, barrier_every=5, seed=0):
    """What a user's own loop writes through the collective logger alone (every record has step 0): compute,
    then dist.all_reduce each iteration and dist.barrier() every ``barrier_every``-th."""
    rng = np.random.default_rng(seed)
    rows, clock, seq = [], np.zeros(ranks), 0
    for iteration in range(iterations):
        arrive = clock + 0.02 * rng.lognormal(0.0, 0.03, ranks)
        if slow is not None and iteration >= onset:
            arrive[slow] += sleep
        ops = [("all_reduce", 1 << 18, 0.001)] + ([("barrier", 0, 0.0002)] if iteration % barrier_every == 4 else [])
        for op, size, took in ops:
            finish = arrive.max() + took
            rows += [
                {
                    "rank": r,
                    "step": 0,
                    "op": op,
                    "group": "default_pg:0",
                    "seq": seq,
                    "start": arrive[r],
                    "duration": finish - arrive[r],
                    "bytes": size,
                    "async": False,
                }
                for r in range(ranks)
            ]
            arrive[:] = finish
            seq += 1
        clock = arrive.copy()
    return pd.DataFrame(rows)


def test_an_explicit_loop_without_markers_names_its_straggler():
    # the reproduction: a 15 ms sleep before one rank's all_reduce from iteration 10 of 40
    result = localize(_explicit_loop(slow=3))
    assert result.details["steps_inferred"]["collectives_per_step"] == [6]  # 5 iterations per period ...
    assert result.details["window"]["steps"][-1] == 39  # ... split into the 40 iterations they hold
    assert result.verdict == "compute" and [s.component for s in result.suspects] == ["gpu:rank-3"]
    assert "since step 10" in result.suspects[0].evidence
    clean = localize(_explicit_loop())
    assert clean.verdict == "healthy" and clean.suspects == () and clean.details["power"]["slowdown"] < 1.5


def test_collectives_with_numbered_steps_see_the_compute_before_the_first_collective():
    # no markers, steps numbered, one blocking all-reduce per step: rank 3 computes 2x for 25 of 60 steps
    frame = _trace(steps=60, slow=3, factor=2.0, onset=35)
    result = localize(frame[frame["op"] != "step"])
    assert result.details["evidence_source"] == "collectives"
    assert result.verdict == "compute" and result.suspects[0].component == "gpu:rank-3", result.render()
