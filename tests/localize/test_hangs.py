"""Hang verdicts from the ranks' exported positions: the adaptive threshold, pauses, gone ranks, other groups,
mismatches. (The real-job versions: tests/lab/test_hanglab.py and tests/exporters/collectives/test_logger.py.)"""

from __future__ import annotations

import pytest

from trainhealth._internal.localize.hangs import (
    group_members,
    hang_result,
    judge_hangs,
    positions_by_job,
    positions_from_samples,
)

WORLD = "default_pg:0"


def _rank(
    rank: int,
    seq: int,
    completed: int,
    inflight: float = 0.0,
    op: str = "all_reduce",
    group: str = WORLD,
    threshold: float | None = 12.0,
) -> list[tuple[str, dict[str, str], float]]:
    labels = {"job": "train", "host": "node-1", "rank": str(rank)}
    out = [
        ("trainhealth_comm_started_seq", {**labels, "group": group}, seq),
        ("trainhealth_comm_completed_seq", {**labels, "group": group}, completed),
        ("trainhealth_comm_inflight_duration_seconds", {**labels, "group": group, "op": op}, inflight),
    ]
    if threshold is not None:
        out.append(("trainhealth_comm_hang_threshold_seconds", labels, threshold))
    return out


def _members(
    ranks: tuple[int, ...] = (0, 1, 2, 3), size: int = 4, group: str = WORLD, positions: tuple[int, ...] | None = None
) -> list[tuple[str, dict[str, str], float]]:
    """The membership series of ``ranks`` (each its own: its group rank, by default its place in ``ranks``)."""
    return [
        (
            "trainhealth_comm_group_member_info",
            {
                "job": "train",
                "host": "node-1",
                "rank": str(rank),
                "group": group,
                "group_rank": str(at),
                "size": str(size),
            },
            1.0,
        )
        for rank, at in zip(ranks, positions if positions is not None else range(len(ranks)))
    ]


def test_a_wait_past_the_jobs_threshold_names_the_rank_behind():
    samples = [
        *_rank(0, 20, 19, 15.0),
        *_rank(1, 20, 19, 15.0),
        *_rank(2, 19, 19),
        *_rank(3, 20, 19, 14.0),
        *_members(),
    ]
    report = judge_hangs(positions_from_samples(samples))
    assert report.threshold_s == 12.0 and report.culprits == (2,)
    result = hang_result(report)
    assert result.verdict == "hang" and result.suspects[0].component == "rank:2"
    assert (
        result.suspects[0].evidence == "rank 2 never entered it (last entered #19); ranks 0, 1, 3 waiting 15 s "
        "in all_reduce #20"
    )


def test_every_member_inside_the_hung_collective_is_waiting_though_its_clock_is_under_the_threshold():
    # rank 3 entered all_reduce #20 a moment after the others: it waits too, its wait not yet past 12 s
    samples = [
        *_rank(0, 20, 19, 15.0),
        *_rank(1, 20, 19, 15.0),
        *_rank(2, 19, 19),
        *_rank(3, 20, 19, 11.0),
        *_members(),
    ]
    (hang,) = judge_hangs(positions_from_samples(samples)).hangs
    assert hang.waiting_ranks == (0, 1, 3) and hang.lagging_ranks == (2,) and hang.waited_s == 15.0


def test_a_wait_under_the_threshold_is_no_hang():
    # the job's ranks say waits of 30 s are ordinary here (their steps are long)
    samples = [*_rank(0, 20, 19, 15.0, threshold=30.0), *_rank(1, 19, 19, threshold=30.0)]
    assert judge_hangs(positions_from_samples(samples)).hangs == ()


def test_ranks_that_export_no_threshold_get_a_minute():
    samples = [*_rank(0, 20, 19, 45.0, threshold=None), *_rank(1, 19, 19, threshold=None)]
    assert judge_hangs(positions_from_samples(samples)).hangs == ()
    samples = [*_rank(0, 20, 19, 61.0, threshold=None), *_rank(1, 19, 19, threshold=None)]
    assert judge_hangs(positions_from_samples(samples)).culprits == (1,)


def test_an_announced_pause_holds_the_verdict():
    samples = [
        *_rank(0, 20, 19, 40.0),
        *_rank(1, 19, 19),
        ("trainhealth_comm_paused", {"job": "train", "rank": "1", "reason": "checkpoint"}, 1.0),
        ("trainhealth_comm_paused", {"job": "train", "rank": "0", "reason": "evaluation"}, 0.0),
    ]
    report = judge_hangs(positions_from_samples(samples))
    assert report.hangs == () and report.paused == ("rank 1: checkpoint",)


def test_a_gone_rank_is_named_with_where_it_was_last():
    live = [
        *_rank(0, 20, 19, 40.0),
        *_rank(1, 20, 19, 40.0),
        *_rank(3, 20, 19, 40.0),
        *_members((0, 1, 3), 4, positions=(0, 1, 3)),
    ]
    gone = [
        ("trainhealth_comm_started_seq", {"job": "train", "rank": "2", "group": WORLD}, 19.0),
        ("trainhealth_comm_watch_timestamp_seconds", {"job": "train", "rank": "2"}, 1_800_000_000.0),
        *_members((2,), 4, positions=(2,)),  # its membership series as Prometheus last saw it
    ]
    report = judge_hangs(positions_from_samples(live, gone))
    (hang,) = report.hangs
    assert hang.lagging_ranks == (2,) and hang.lagging_at == {} and report.culprits == (2,)
    assert hang.verdict == (
        "rank 2 missing since 08:00:00 UTC (last at #19 of default_pg:0); ranks 0, 1, 3 waiting 40 s in all_reduce #20"
    )
    assert hang_result(report).suspects[0].evidence.startswith("rank 2 missing since 08:00:00 UTC")


def test_a_member_that_never_reported_is_missing_without_a_time():
    live = [*_rank(0, 20, 19, 40.0), *_rank(1, 20, 19, 40.0), *_members((0, 1), 3)]
    (hang,) = judge_hangs(positions_from_samples(live)).hangs
    assert hang.lagging_ranks == (2,) and hang.verdict.startswith("rank 2 missing; ")


def test_a_data_parallel_member_that_never_reported_is_named_by_its_groups_stride():
    # 16 ranks, tensor parallel 4: data-parallel group 1 is ranks 1, 5, 9, 13; rank 9 never reported anything
    dp = "mesh_dp:6"
    samples = [s for r in (1, 5, 13) for s in _rank(r, 20, 19, 40.0, group=dp)]
    samples += _members((1, 5, 13), 4, dp, positions=(0, 1, 3))
    report = judge_hangs(positions_from_samples(samples))
    (hang,) = report.hangs
    assert hang.group == dp and hang.lagging_ranks == (9,) and hang.missing_group_ranks == ()
    assert report.culprits == (9,) and hang.verdict == "rank 9 missing; ranks 1, 5, 13 waiting 40 s in all_reduce #20"


def test_a_missing_member_off_any_stride_is_named_by_its_group_rank():
    # members 0, 1 and 7 in group ranks 0, 1, 3: no one stride puts them there, so group rank 2's rank is unknown
    odd = "odd:3"
    samples = [s for r in (0, 1, 7) for s in _rank(r, 20, 19, 40.0, group=odd)]
    samples += _members((0, 1, 7), 4, odd, positions=(0, 1, 3))
    report = judge_hangs(positions_from_samples(samples))
    (hang,) = report.hangs
    assert hang.lagging_ranks == () and hang.missing_group_ranks == (2,) and hang.is_hang
    assert hang.verdict == (
        "group rank 2 of odd:3 missing (never reported; the global rank unknown); ranks 0, 1, 7 waiting 40 s in "
        "all_reduce #20"
    )
    assert hang.to_dict()["missing_group_ranks"] == [2]
    (suspect,) = hang_result(report).suspects
    assert suspect.ranks == () and suspect.group == odd and suspect.component == "group_rank:odd:3/2"
    assert suspect.evidence.startswith("group rank 2 of odd:3 missing: no rank reports that place")


def test_a_gone_member_is_placed_by_its_own_last_series_where_no_stride_would():
    odd = "odd:3"
    live = [s for r in (0, 1, 7) for s in _rank(r, 20, 19, 40.0, group=odd)]
    live += _members((0, 1, 7), 4, odd, positions=(0, 1, 3))
    gone = _members((4,), 4, odd, positions=(2,))
    (hang,) = judge_hangs(positions_from_samples(live, gone)).hangs
    assert hang.lagging_ranks == (4,) and hang.missing_group_ranks == ()


@pytest.mark.parametrize(
    ("seen", "size", "expected"),
    [
        ({0: 0, 1: 1, 2: 2, 3: 3}, 4, ((0, 1, 2, 3), ())),  # everyone reports
        ({0: 0, 1: 1, 3: 3}, 4, ((0, 1, 2, 3), ())),  # the world, or a tensor-parallel group: stride 1
        ({1: 4100, 3: 12292}, 4, ((4, 4100, 8196, 12292), ())),  # data parallel over TP 4096: the first inferred
        ({0: 12, 2: 4}, 3, ((12, 8, 4), ())),  # ranks listed downwards
        ({1: 3}, 2, ((3,), (0,))),  # one member seen: no stride
        ({0: 0, 1: 1, 3: 7}, 4, ((0, 1, 7), (2,))),  # off any one stride
        ({1: 2, 2: 5}, 4, ((2, 5), (0, 3))),  # the line would put group rank 0 at rank -1
    ],
)
def test_group_members_infers_only_what_one_stride_explains(seen, size, expected):
    assert group_members(seen, size) == expected


def test_membership_series_that_cannot_be_a_groups_are_left_out():
    live = [*_rank(0, 20, 19, 40.0), *_rank(1, 20, 19, 40.0), *_members((0, 1), 3)]
    bogus = _members((5, 6, 7), 3, positions=(9, 1, 0))  # a group rank past the size
    bogus[1][1]["size"] = str(1 << 30)  # a size no job has
    bogus[2][1]["size"] = "many"
    positions = positions_from_samples(live + bogus)
    assert positions.members == {WORLD: (0, 1, 2)} and positions.unplaced == {}


def test_a_rank_blocked_in_another_group_is_named_with_that_collective():
    side = "side:1"
    samples = [
        *_rank(0, 20, 19, 40.0),
        *_rank(1, 20, 19, 40.0),
        *_rank(3, 20, 19, 40.0),
        *_members(),
        *_rank(2, 19, 19),
        *_rank(2, 0, -1, 39.0, group=side),
        *_rank(1, -1, -1, group=side),
    ]
    report = judge_hangs(positions_from_samples(samples))
    assert report.hangs[0].group == WORLD and report.culprits == (2,)  # the largest group first
    assert report.hangs[0].doing[2] == "in all_reduce #0 of side:1 for 39 s"
    assert report.hangs[1].group == side and report.hangs[1].lagging_ranks == (1,)


def test_ranks_in_different_collectives_at_one_sequence_number_are_a_mismatch():
    samples = [*_rank(0, 20, 19, 40.0), *_rank(1, 20, 19, 40.0), *_rank(2, 20, 19, 40.0, op="broadcast")]
    (hang,) = judge_hangs(positions_from_samples(samples)).hangs
    assert hang.op == "all_reduce" and hang.mismatch == {2: "broadcast"} and hang.lagging_ranks == ()
    assert "mismatch: rank 2 is in broadcast #20" in hang.verdict
    assert hang_result(judge_hangs(positions_from_samples(samples))).suspects[0].component == "rank:2"


def test_two_groups_waiting_on_each_other_are_read_from_the_largest():
    # rank 2 entered a side group's all-reduce its partner (rank 1) never entered; the world's wait is younger
    side = "side:1"
    samples = [
        *_rank(0, 20, 19, 8.0),
        *_rank(1, 20, 19, 8.0),
        *_rank(3, 20, 19, 8.0),
        *_members(),
        *_rank(2, 19, 19),
        *_rank(2, 0, -1, 13.0, group=side),
        *_members((1, 2), 2, side),
    ]
    report = judge_hangs(positions_from_samples(samples))
    assert [h.group for h in report.hangs] == [WORLD, side] and report.culprits == (2,)


def test_a_monitoring_group_waiting_behind_the_hang_is_not_its_root():
    # ranks 2 and 3 wait in the SDC checks' own group for rank 0, which waits in the world's all-reduce for rank 1
    sdc = "trainhealth_sdc:2"
    samples = [
        *_rank(0, 20, 19, 30.0),
        *_rank(2, 19, 19),
        *_rank(3, 19, 19),
        *_members(),
        *_rank(0, 4, 4, group=sdc),
        *_rank(2, 5, 4, 29.0, group=sdc),
        *_rank(3, 5, 4, 29.0, group=sdc),
        *_members((2, 3), 4, sdc, positions=(2, 3)),
    ]
    gone = [("trainhealth_comm_started_seq", {"job": "train", "rank": "1", "group": WORLD}, 19.0)]
    report = judge_hangs(positions_from_samples(samples, gone))
    assert report.hangs[0].group == WORLD and report.culprits[0] == 1
    assert report.hangs[1].group == sdc and report.hangs[1].lagging_ranks == (0, 1)


def test_a_long_collective_every_member_entered_is_slow_not_a_hang():
    # a 25 s all-gather at start-up: both ranks entered #1, the job's threshold is the 10 s floor
    samples = [s for r in range(4) for s in _rank(r, 1, 0, 25.0, op="all_gather", threshold=10.0)]
    report = judge_hangs(positions_from_samples([*samples, *_members()]))
    assert report.hangs == () and [(h.group, h.op, h.seq) for h in report.slow] == [(WORLD, "all_gather", 1)]
    assert report.slow[0].waiting_ranks == (0, 1, 2, 3) and not report.slow[0].is_hang
    assert "a slow collective, not a hang" in report.slow[0].verdict
    # the same wait with one member behind is a hang naming it
    behind = [*_rank(0, 1, 0, 25.0, "all_gather", threshold=10.0), *_rank(1, 1, 0, 25.0, "all_gather", threshold=10.0)]
    behind += [*_rank(2, 0, 0, threshold=10.0), *_rank(3, 1, 0, 25.0, "all_gather", threshold=10.0), *_members()]
    report = judge_hangs(positions_from_samples(behind))
    assert report.slow == () and report.culprits == (2,)
    result = hang_result(report)
    assert result.verdict == "hang" and [s.component for s in result.suspects] == ["rank:2"]
    assert all(s.kind == "rank" for s in result.suspects)  # never a link


def test_two_jobs_sharing_ranks_and_groups_are_judged_apart():
    """Ranks 0-1 of group default_pg:0 in two jobs: a hung one (rank 1 behind) and a healthy one, whose rank 1 is
    at the group's number. Read together they would hide or invent a hang; per job, only the hung one is named."""

    def job(name: str, seq1: int, inflight: float) -> list:
        return [
            (metric, {**labels, "job": name}, value)
            for metric, labels, value in [*_rank(0, 41, 40, inflight), *_rank(1, seq1, seq1 - (seq1 == 41))]
        ]

    hung, healthy = job("run-a", 40, 30.0), job("run-b", 41, 0.0)
    with pytest.raises(ValueError, match="positions_by_job"):
        positions_from_samples(hung + healthy)
    reports = {name: judge_hangs(p) for name, p in positions_by_job(healthy + hung).items()}
    assert reports["run-a"].culprits == (1,) and reports["run-b"].hangs == ()
