"""One rank of a hang-lab job: a small training loop with the Monitor, and the case's behaviour.

Run as ``python -m trainhealth_lab.hangs.rank CASE.json`` with torch.distributed's
environment (``RANK``, ``WORLD_SIZE``, ``MASTER_ADDR``, ``MASTER_PORT``). Each step
computes for ``step_s`` (a matmul loop) and all-reduces the gradients of a small model
explicitly, with a barrier every 10th step, on the case's ``backend``
(:mod:`~trainhealth_lab.hangs.backends`): on ``ncclsim`` the calls return at once and the
host blocks in the backend's ``synchronize()`` where a GPU job reads a value (the gradient
norm, before the optimizer step), outside every collective call. At ``onset_step`` the
case's target does what the case says; it writes ``onset-<rank>.json`` (the unix time it
began) first. ``hf_save`` runs a Hugging Face Trainer instead (:mod:`~trainhealth_lab.hangs.hf`).

Hangs (``kind``):

* ``host_stall``: the target blocks in host code (:func:`load_batch`, as a data loader that never returns).
* ``other_group``: the target enters an all-reduce of a side group with its ``partner``, who never comes:
  it is blocked in a collective of another process group while the world waits for it.
* ``dead_open``: the target dies, but a child it forked keeps its sockets open (a killed container whose
  connections are not closed): its peers stay blocked, its /metrics stops answering.
* ``churn_groups_hang``: ``churn_groups`` (below), and the target stalls in host code at the onset: the
  default group must still be named while groups come and go.
* ``disk_stall``: the target stalls in host code, and from the same moment the disk under the trace
  directory stalls for ``pause_s`` (every rank's ``os.fsync`` blocks: :class:`~.faults.DiskStall`).
* ``endless_pause``: the target (rank 0 in the benchmark) saves inside ``monitor.pause("checkpoint")`` three times for ``pause_s``
  (10 steps apart, before the onset), then enters it at the onset and never leaves; its peers wait for it.
  With ``pause_limit_s`` set, the Monitor is given it as ``comm_pause_limit``.
* ``healthy``: nothing (the healthy job of ``two_jobs``, whose hung job runs ``host_stall``).

Crashes: ``exit_plain`` (the target returns from training early, ``sys.exit(0)``: its connections close
and its peers' all-reduce fails within a second) and ``size_mismatch`` (the target all-reduces a tensor of
another size at the onset step: gloo aborts the rank that receives it and the others fail).

Controls (no hang, nobody may be paged):

* ``checkpoint`` / ``evaluation``: the target (rank 0 in the benchmark) saves / evaluates for ``pause_s``
  inside ``Monitor.pause``.
* ``startup_barrier``: the target reaches the first barrier ``pause_s`` late.
* ``setup_barriers``: three barriers at start-up, as ``main_process_first`` around data preparation
  makes them (everyone syncs; the main process prepares for 2 s while the others wait; then they
  prepare while it waits), then the target spends ``pause_s`` (20-40 s by seed) before its first
  all-reduce, in which the others wait: a rank that builds its data or compiles longer than the rest.
* ``slow_loader``: the target's loader opens a new shard with its first batch and at every
  ``onset_step``-th step after, each opening taking ``pause_s`` to ``pause_s + 3`` s (12-15 s in the
  benchmark): what streaming datasets do (fetching a shard from object storage, decompressing it,
  refilling the shuffle buffer). Each opening holds its peers in the gradient all-reduce above the
  10 s hang floor, so only a threshold learnt from the job's own history (the first opening, at
  start-up, then each later one) keeps it from paging; the onset is the first opening after start-up.
* ``long_collective``: every rank all-gathers its loss each step, and at the onset every rank's
  all-gather takes ``pause_s`` longer (:class:`~.faults.SlowCollective`, under trainhealth's wrapper):
  a slow collective every rank entered, not a hang.
* ``churn_groups``: each step every rank creates a group of all ranks (``dist.new_group``), all-reduces
  on it and destroys it (``destroy_process_group(group)``), as jobs that build groups per phase do.
"""

from __future__ import annotations

import json
import os
import random
import sys
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

from trainhealth_lab.hangs.backends import Backend, open_backend
from trainhealth_lab.hangs.faults import DiskStall, SlowCollective
from trainhealth_lab.hangs.workload import load_batch, monitor_settings, onset

__all__ = ["main"]

#: kinds whose target stalls in host code at the onset
STALLS = ("host_stall", "churn_groups_hang", "disk_stall")
#: kinds whose onset comes before the first step (the others' is the target's ``onset_step``)
AT_START = ("startup_barrier", "setup_barriers")
#: how many short pauses ``endless_pause`` makes before the endless one, 10 steps apart
EARLIER_PAUSES = 3


def _compute(torch: Any, seconds: float) -> None:
    a = torch.ones(64, 64)
    deadline = time.perf_counter() + seconds
    while time.perf_counter() < deadline:
        a = (a @ a).clamp_(-1, 1)


def _shard_open_s(case: dict[str, Any], step: int) -> float:
    """How long the slow loader's shard opening at ``step`` takes: ``pause_s`` to ``pause_s + 3`` s, by seed."""
    return float(case["pause_s"]) + 3.0 * random.Random(1000 * case["seed"] + step).random()


def _setup_barriers(dist: Any, rank: int) -> None:
    """Three barriers, as set-up code makes them: a ``wait_for_everyone``, then ``main_process_first``
    around data preparation (the main process prepares while the others wait, then they prepare from its
    cache while it waits)."""
    dist.barrier()
    if rank != 0:
        dist.barrier()
    load_batch(2.0 if rank == 0 else 0.2)
    if rank == 0:
        dist.barrier()
    dist.barrier()


def _churn(dist: Any, torch: Any, world: int, backend: Backend) -> None:
    """A group made, used once and destroyed, as every step of a job that builds groups per phase."""
    group = dist.new_group(list(range(world)))
    dist.all_reduce(torch.ones(4), group=group)
    backend.synchronize()  # its collective done before the group goes
    dist.destroy_process_group(group)


def main(case_path: str) -> None:
    case = json.loads(Path(case_path).read_text())
    if case["kind"] == "hf_save":
        from trainhealth_lab.hangs.hf import main as train_with_trainer

        train_with_trainer(case)
        return
    _train(case)


def _train(case: dict[str, Any]) -> None:
    import torch
    import torch.distributed as dist

    from trainhealth import Monitor

    out = Path(case["out"])
    rank, world = int(os.environ["RANK"]), int(case["world"])
    kind, target, onset_step = case["kind"], int(case["target"]), int(case["onset_step"])
    backend = open_backend(case["backend"])
    torch.set_num_threads(1)
    # the lab's faults, installed before the Monitor wraps torch.distributed: its wrappers sit above them
    gather = SlowCollective("all_gather") if kind == "long_collective" else None
    if kind == "disk_stall":
        DiskStall(out, case["pause_s"])
    dist.init_process_group(backend.torch_name, timeout=timedelta(seconds=case["collective_timeout_s"]))
    side = dist.new_group([target, case["partner"]]) if kind == "other_group" else None
    torch.manual_seed(0)  # identical replicas, as DDP's first broadcast makes them: the SDC checks stay quiet
    model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.Linear(64, 64))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    monitor = Monitor(model, optimizer, **monitor_settings(case, rank))
    data = torch.Generator().manual_seed(1000 * case["seed"] + rank)  # each rank its own batches
    (out / f"ready-{rank}").write_text("")
    if kind == "startup_barrier" and rank == target:
        onset(out, rank)
        time.sleep(case["pause_s"])
    dist.barrier()
    if kind == "setup_barriers":
        _setup_barriers(dist, rank)
        if rank == target:
            onset(out, rank)
            load_batch(case["pause_s"])  # its data, its first compilation: the others wait in the first all-reduce
    earlier_pauses = {onset_step - 10 * k for k in range(1, EARLIER_PAUSES + 1)}
    for step in range(case["steps"]):
        if step == onset_step and rank == target and kind not in AT_START:
            onset(out, rank)
            if kind in STALLS:
                load_batch(3600.0)
            elif kind == "other_group":
                dist.all_reduce(torch.ones(4), group=side)
            elif kind == "exit_plain":
                sys.exit(0)
            elif kind == "size_mismatch":
                dist.all_reduce(torch.zeros(64 * 64 + 64))  # where its peers reduce the first weight's 64 x 64
            elif kind == "dead_open":
                if os.fork() == 0:  # the child keeps every socket of the rank open, and does nothing
                    time.sleep(3600.0)
                    os._exit(0)
                os._exit(1)
        if rank == target and kind == "endless_pause" and (step in earlier_pauses or step == onset_step):
            with monitor.pause("checkpoint"):
                load_batch(case["pause_s"] if step != onset_step else 3600.0)
            monitor.checkpoint_saved(step, case["pause_s"])
        if step == onset_step and kind in ("checkpoint", "evaluation") and rank == target:
            with monitor.pause(kind):
                load_batch(case["pause_s"])
            if kind == "checkpoint":
                monitor.checkpoint_saved(step, case["pause_s"])
        if kind == "slow_loader" and rank == target and step % onset_step == 0:
            load_batch(_shard_open_s(case, step))
        x = torch.randn(8, 64, generator=data)
        loss = model(x).pow(2).mean()
        loss.backward()
        _compute(torch, case["step_s"])
        for parameter in model.parameters():
            dist.all_reduce(parameter.grad)
        if gather is not None:  # the loss of every rank, for the log
            if step == onset_step:
                gather.arm(case["pause_s"])
            dist.all_gather([torch.zeros(1) for _ in range(world)], loss.detach().reshape(1))
        if kind in ("churn_groups", "churn_groups_hang"):
            _churn(dist, torch, world, backend)
        backend.synchronize()  # the gradient norm read before the optimizer step: on a GPU the host waits here
        optimizer.step()
        optimizer.zero_grad()
        if step % 10 == 9:
            dist.barrier()
        monitor.step(loss=loss.detach(), tokens=8)
    (out / f"done-{rank}").write_text("")
    monitor.close()
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1])
