"""The ``ncclsim`` backend on real ranks: two processes, NCCL's asynchronous semantics over gloo.

Three runs, one per module fixture, each rank writing what it saw to a JSON file that the tests read: a peer that
joins late (the host runs ahead, completion follows the peer, a barrier blocks), every collective the wrappers
record (futures, stream order, the completion hook, values after ``synchronize``), and groups made and destroyed
(with a collective a peer never joins).
"""

from __future__ import annotations

import json
import threading
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist

from tests.distributed import init_rank, run_ranks
from trainhealth_lab import nccl_semantics
from trainhealth_lab.nccl_semantics import BACKEND, WorkInfo, blocking_wait, register, synchronize

LATE_S = 2.0  # how late rank 1 joins the first collective
BARRIER_LATE_S = 1.5  # how late rank 0 reaches the barrier


def _start(rank: int, world: int, port: int, timeout_s: float = 30.0) -> None:
    register()  # in the spawned process, before torch.distributed is initialised
    init_rank(rank, world, port, timeout_s=timeout_s, backend=BACKEND)


def _write(out: str, rank: int, seen: dict[str, Any]) -> None:
    Path(out, f"rank-{rank}.json").write_text(json.dumps(seen))


def _read(out: Path, world: int = 2) -> list[dict[str, Any]]:
    return [json.loads(Path(out, f"rank-{rank}.json").read_text()) for rank in range(world)]


def _hook_record(records: list[dict[str, Any]]):
    def hook(info: WorkInfo) -> None:
        records.append(
            {
                "op": info.op_type.name,
                "seq": info.seq,
                "started": info.time_started.total_seconds(),
                "finished": info.time_finished.total_seconds(),
                "active": info.active_duration.total_seconds(),
                "thread": threading.current_thread().name,
            }
        )

    return hook


# --- a peer that joins late ------------------------------------------------------------------------------------


def _late_peer(rank: int, world: int, port: int, out: str) -> None:
    _start(rank, world, port)
    seen: dict[str, Any] = {}
    first, second = torch.full((3,), float(rank + 1)), torch.full((2,), 10.0 * (rank + 1))
    if rank == 1:
        time.sleep(LATE_S)
        seen["joined_at"] = time.time()
    began, t0 = time.time(), time.perf_counter()
    work = dist.all_reduce(first, async_op=True)
    work.wait()  # what a synchronous all_reduce does after the call
    seen["call_and_wait_s"] = time.perf_counter() - t0
    seen["completed_after_wait"] = work.is_completed()
    t0 = time.perf_counter()
    dist.all_reduce(second)  # synchronous
    seen["sync_call_s"] = time.perf_counter() - t0
    while not work.is_completed() and time.time() - began < 20:
        time.sleep(0.01)
    seen["completed_at"], seen["began"] = time.time(), began
    t0 = time.perf_counter()
    synchronize()
    seen["synchronize_s"] = time.perf_counter() - t0
    seen["first"], seen["second"] = first.tolist(), second.tolist()
    seen["success"] = work.is_success() and work.exception() is None

    # a barrier blocks the host until every rank reached it, and runs after what the stream holds
    if rank == 0:
        time.sleep(BARRIER_LATE_S)
    pending = dist.all_reduce(torch.ones(1), async_op=True)
    seen["pending_completed_before_barrier"] = pending.is_completed()
    t0 = time.perf_counter()
    dist.barrier()
    seen["barrier_s"] = time.perf_counter() - t0
    seen["pending_completed_after_barrier"] = pending.is_completed()
    _write(out, rank, seen)
    dist.destroy_process_group()


@pytest.fixture(scope="module")
def late_peer(tmp_path_factory):
    out = tmp_path_factory.mktemp("late-peer")
    run_ranks(_late_peer, 2, str(out), timeout_s=90)
    return _read(out)


def test_a_synchronous_all_reduce_returns_before_a_late_peer_joins_and_completes_after(late_peer):
    early, late = late_peer
    assert early["call_and_wait_s"] < 0.3 * LATE_S, early  # the host went on: the call did not wait for the peer
    assert early["sync_call_s"] < 0.3 * LATE_S, early
    assert early["completed_after_wait"] is False
    # completion came when the peer joined, not before
    assert early["completed_at"] >= late["joined_at"]
    assert early["completed_at"] - early["began"] >= 0.7 * LATE_S
    assert early["synchronize_s"] < LATE_S  # what was left after completion: the second all_reduce
    for seen in (early, late):
        assert seen["first"] == [3.0, 3.0, 3.0] and seen["second"] == [30.0, 30.0]
        assert seen["success"] is True


def test_a_barrier_blocks_the_host_and_runs_after_what_the_stream_holds(late_peer):
    early, late = late_peer
    assert late["barrier_s"] >= 0.7 * BARRIER_LATE_S, late  # rank 1 waited in the barrier for rank 0
    assert early["barrier_s"] < 0.7 * BARRIER_LATE_S, early
    assert late["pending_completed_before_barrier"] is False  # rank 0 had not issued it yet
    assert late["pending_completed_after_barrier"] is True and early["pending_completed_after_barrier"] is True


# --- every operation: futures, stream order, the hook, values --------------------------------------------------


def _operations(rank: int, world: int, port: int, out: str) -> None:
    _start(rank, world, port)
    group = dist.group.WORLD
    assert isinstance(group, nccl_semantics.NcclSimProcessGroup)
    public: list[dict[str, Any]] = []
    private: list[dict[str, Any]] = []
    group.register_on_completion_hook(_hook_record(public))
    group._register_on_completion_hook(_hook_record(private))  # torch's private name, as on NCCL
    seen: dict[str, Any] = {"backend_is_group": group._get_backend(torch.device("cpu")) is group}
    if rank == 1:
        time.sleep(1.5)  # rank 0 issues everything meanwhile

    # the future is complete at the call; its callbacks run then, before the collective completed
    head = torch.full((4,), float(rank + 1))
    work = dist.all_reduce(head, async_op=True)
    future = work.get_future()
    ran: list[bool] = []
    future.then(lambda fut: ran.append(work.is_completed()))
    seen["future_done_at_call"], seen["completed_at_call"] = future.done(), work.is_completed()
    seen["callback_ran_before_completion"] = ran == [False]
    seen["future_holds_outputs"] = future.done() and future.value()[0] is head

    # every collective the wrappers record, issued at once on rank 0 (rank 1 is still asleep)
    gathered = [torch.empty(2) for _ in range(world)]
    dist.all_gather(gathered, torch.full((2,), float(rank)))
    into = torch.empty(2 * world)
    dist.all_gather_into_tensor(into, torch.full((2,), float(rank)))
    scattered = torch.empty(2)
    dist.reduce_scatter(scattered, [torch.full((2,), float(i + 1)) for i in range(world)])
    scattered_single = torch.empty(2)
    dist.reduce_scatter_tensor(scattered_single, torch.arange(2.0 * world))
    exchanged = [torch.empty(1) for _ in range(world)]
    dist.all_to_all(exchanged, [torch.tensor([10.0 * rank + i]) for i in range(world)])
    exchanged_single = torch.empty(world)
    dist.all_to_all_single(exchanged_single, torch.tensor([10.0 * rank + i for i in range(world)]))
    broadcast = torch.tensor([float(rank)])
    dist.broadcast(broadcast, src=1)
    reduced = torch.tensor([float(rank + 1)])
    dist.reduce(reduced, dst=0)
    gather_list = [torch.empty(1) for _ in range(world)] if rank == 0 else None
    dist.gather(torch.tensor([rank + 5.0]), gather_list, dst=0)
    scatter_to = torch.empty(1)
    dist.scatter(scatter_to, [torch.tensor([7.0 + i]) for i in range(world)] if rank == 0 else None, src=0)
    averaged = torch.tensor([float(rank)])
    dist.all_reduce(averaged, op=dist.ReduceOp.AVG)
    coalesced = [torch.ones(2), torch.full((1,), float(rank))]
    dist.all_reduce_coalesced(coalesced)
    seen["completed_when_issued"] = sum(r["op"] != "SEND" and r["op"] != "RECV" for r in public)

    # point to point: an exchange both ways (it must not deadlock), then a plain send and receive
    mine, theirs = torch.tensor([100.0 + rank]), torch.empty(1)
    peer = 1 - rank
    dist.batch_isend_irecv([dist.P2POp(dist.isend, mine, peer), dist.P2POp(dist.irecv, theirs, peer)])
    plain = torch.tensor([42.0]) if rank == 0 else torch.empty(1)
    if rank == 0:
        dist.send(plain, 1)
    else:
        dist.recv(plain, 0)

    synchronize()
    seen["values"] = {
        "head": head.tolist() == [3.0] * 4,
        "all_gather": [t.tolist() for t in gathered] == [[0.0, 0.0], [1.0, 1.0]],
        "all_gather_into_tensor": into.tolist() == [0.0, 0.0, 1.0, 1.0],
        "reduce_scatter": scattered.tolist() == [2.0 * (rank + 1)] * 2,
        "reduce_scatter_tensor": scattered_single.tolist() == [2.0 * (2 * rank), 2.0 * (2 * rank + 1)],
        "all_to_all": [t.item() for t in exchanged] == [rank, 10.0 + rank],
        "all_to_all_single": exchanged_single.tolist() == [rank, 10.0 + rank],
        "broadcast": broadcast.item() == 1.0,
        "reduce": rank != 0 or reduced.item() == 3.0,
        "gather": rank != 0 or [t.item() for t in gather_list or []] == [5.0, 6.0],
        "scatter": scatter_to.item() == 7.0 + rank,
        "all_reduce_avg": averaged.item() == 0.5,
        "all_reduce_coalesced": [t.tolist() for t in coalesced] == [[2.0, 2.0], [1.0]],
        "exchange": theirs.item() == 100.0 + peer,
        "send_recv": plain.item() == 42.0,
    }
    with blocking_wait():  # object collectives read sizes on the host right after the call
        objects: list[Any] = [None] * world
        dist.all_gather_object(objects, {"rank": rank})
    seen["values"]["all_gather_object"] = objects == [{"rank": 0}, {"rank": 1}]
    seen["issued"] = group._get_sequence_number_for_group()
    seen["public"], seen["private"] = public, private
    _write(out, rank, seen)
    dist.destroy_process_group()


COLLECTIVES = [  # NCCL's op types, in the order _operations issues them (a barrier would be ALLREDUCE too)
    "ALLREDUCE",
    "ALLGATHER",
    "_ALLGATHER_BASE",
    "REDUCE_SCATTER",
    "_REDUCE_SCATTER_BASE",
    "ALLTOALL",
    "ALLTOALL_BASE",
    "BROADCAST",
    "REDUCE",
    "GATHER",
    "SCATTER",
    "ALLREDUCE",
    "COALESCED",
    "ALLGATHER",  # all_gather_object: the sizes,
    "ALLGATHER",  # then the objects
]


ISSUED_AT_ONCE = len(COLLECTIVES) - 2  # all but all_gather_object's, issued while rank 1 slept


@pytest.fixture(scope="module")
def operations(tmp_path_factory):
    out = tmp_path_factory.mktemp("operations")
    run_ranks(_operations, 2, str(out), timeout_s=90)
    return _read(out)


def test_a_future_is_complete_at_the_call_and_its_callbacks_run_before_the_collective(operations):
    early = operations[0]
    assert early["future_done_at_call"] is True and early["completed_at_call"] is False
    assert early["callback_ran_before_completion"] is True
    assert early["future_holds_outputs"] is True


def test_operations_complete_in_order_one_after_another_on_the_stream(operations):
    early = operations[0]
    assert early["completed_when_issued"] == 0  # rank 1 was asleep: nothing had run when rank 0 was done issuing
    collectives = [r for r in early["public"] if r["op"] not in ("SEND", "RECV")]
    assert [r["op"] for r in collectives] == COLLECTIVES
    for index, (before, after) in enumerate(zip(collectives, collectives[1:])):
        # started once the one before ended (timedelta keeps microseconds)
        assert after["finished"] - after["active"] >= before["finished"] - 5e-6
        if index + 1 < ISSUED_AT_ONCE:
            assert after["started"] <= before["finished"]  # though issued before that
    assert collectives[0]["finished"] - collectives[0]["started"] >= 0.5  # the head waited for the late peer


def test_the_completion_hook_is_called_once_per_operation_with_increasing_seq(operations):
    for seen in operations:
        collectives = [r for r in seen["public"] if r["op"] not in ("SEND", "RECV")]
        p2p = [r for r in seen["public"] if r["op"] in ("SEND", "RECV")]
        assert [r["seq"] for r in collectives] == list(range(1, len(COLLECTIVES) + 1))
        assert seen["issued"] == len(COLLECTIVES)  # _get_sequence_number_for_group, as NCCL's seqCollective_
        # sends and receives count in their own sequence, as NCCL's seqP2P_: the exchange's two, then one
        assert sorted(r["seq"] for r in p2p) == [1, 2, 3] and len(p2p) == 3
        assert seen["private"] == seen["public"]  # the hook registered through torch's private name: the same calls
        for record in seen["public"]:
            assert record["started"] <= record["finished"] - record["active"] + 5e-6
            assert record["thread"].startswith(f"{BACKEND}-")  # called on a stream thread, not the host's
        assert seen["backend_is_group"] is True


def test_every_operation_lands_the_right_values_after_synchronize(operations):
    for rank, seen in enumerate(operations):
        wrong = [name for name, right in seen["values"].items() if not right]
        assert not wrong, f"rank {rank}: wrong values after synchronize: {wrong}"


# --- groups made and destroyed; a collective a peer never joins ------------------------------------------------


def _groups(rank: int, world: int, port: int, out: str) -> None:
    _start(rank, world, port)
    seen: dict[str, Any] = {"cycles": []}
    for cycle in range(3):
        group = dist.new_group([0, 1], backend=BACKEND)
        completions: list[dict[str, Any]] = []
        group._register_on_completion_hook(_hook_record(completions))
        value = torch.tensor([float(rank + cycle)])
        dist.all_reduce(value, group=group)
        synchronize(group)
        seen["cycles"].append(
            {
                "ranks": dist.get_process_group_ranks(group),
                "backend": dist.get_backend(group),
                "value": value.item(),
                "completions": len(completions),
                "name": group.group_name,
            }
        )
        dist.destroy_process_group(group)
    alone = dist.new_group([0], backend=BACKEND)
    seen["alone_is_member"] = alone != dist.GroupMember.NON_GROUP_MEMBER
    if rank == 0:
        dist.destroy_process_group(alone)
    seen["threads"] = sorted(t.name for t in threading.enumerate() if t.name.startswith(f"{BACKEND}-"))

    # a collective the peer never joins: the call returns, synchronize raises after the group's timeout,
    # later operations fail at once, and destroying the group does not wait on it
    stuck = dist.new_group([0, 1], backend=BACKEND, timeout=timedelta(seconds=2))
    if rank == 0:
        t0 = time.perf_counter()
        work = dist.all_reduce(torch.ones(1), group=stuck, async_op=True)
        seen["stuck_call_s"] = time.perf_counter() - t0
        try:
            synchronize(stuck)
            seen["synchronize_raised"] = None
        except dist.DistBackendError as exc:
            seen["synchronize_raised"] = type(exc).__name__
        seen["stuck_s"] = time.perf_counter() - t0
        seen["stuck_work"] = [work.is_completed(), work.is_success(), work.exception() is not None]
        later = dist.all_reduce(torch.ones(1), group=stuck, async_op=True)
        deadline = time.perf_counter() + 5
        while not later.is_completed() and time.perf_counter() < deadline:
            time.sleep(0.01)
        seen["later_failed"] = later.is_completed() and later.exception() is not None
        t0 = time.perf_counter()
        dist.destroy_process_group(stuck)
        seen["destroy_s"] = time.perf_counter() - t0
        dist.barrier()  # the default group is unharmed
    else:
        dist.barrier()  # keeps its end of the stuck group open until rank 0 is done with it: a timeout, not a hangup
        dist.destroy_process_group(stuck)
    ones = torch.ones(1)
    dist.all_reduce(ones)
    synchronize()
    seen["default_after"] = ones.item()
    _write(out, rank, seen)
    dist.destroy_process_group()
    seen["threads_after"] = sorted(t.name for t in threading.enumerate() if t.name.startswith(f"{BACKEND}-"))
    _write(out, rank, seen)


@pytest.fixture(scope="module")
def groups(tmp_path_factory):
    out = tmp_path_factory.mktemp("groups")
    run_ranks(_groups, 2, str(out), timeout_s=90)
    return _read(out)


def test_groups_can_be_made_used_and_destroyed_again_and_again(groups):
    for rank, seen in enumerate(groups):
        cycles = seen["cycles"]
        assert [c["value"] for c in cycles] == [1.0, 3.0, 5.0]
        assert all(c["ranks"] == [0, 1] and c["backend"] == BACKEND and c["completions"] == 1 for c in cycles)
        assert len({c["name"] for c in cycles}) == 3
        assert seen["alone_is_member"] is (rank == 0)
        assert seen["threads"] == []  # the destroyed groups' stream threads ended (the default group used none yet)
        assert seen["threads_after"] == []
        assert seen["default_after"] == 2.0


def test_a_collective_a_peer_never_joins_fails_after_the_group_timeout(groups):
    early = groups[0]
    assert early["stuck_call_s"] < 0.5
    assert early["synchronize_raised"] == "DistBackendError"
    assert 1.5 <= early["stuck_s"] < 15
    assert early["stuck_work"] == [True, False, True]
    assert early["later_failed"] is True
    assert early["destroy_s"] < 5


def test_register_is_idempotent_and_synchronize_refuses_other_groups():
    assert register() == register() == BACKEND
    assert BACKEND in dist.Backend.backend_list
    with pytest.raises(TypeError, match="ncclsim"):
        synchronize(object())
