"""One rank of a hang-lab job: a small training loop on gloo with the Monitor, and the case's behaviour.

Run as ``python -m trainhealth_lab.hangs.rank CASE.json`` with torch.distributed's
environment (``RANK``, ``WORLD_SIZE``, ``MASTER_ADDR``, ``MASTER_PORT``). Each step
computes for ``step_s`` (a matmul loop) and all-reduces the gradients of a small model
explicitly, with a barrier every 10th step. At ``onset_step`` the case's target does
what the case says; it writes ``onset-<rank>.json`` (the unix time it began) first.

Behaviours (``kind``):

* ``host_stall``: the target blocks in host code (:func:`load_batch`, as a data loader that never returns).
* ``other_group``: the target enters an all-reduce of a side group with its ``partner``, who never comes:
  it is blocked in a collective of another process group while the world waits for it.
* ``dead_open``: the target dies, but a child it forked keeps its sockets open (a killed container whose
  connections are not closed): its peers stay blocked, its /metrics stops answering.
* ``exit_plain``: the target returns from training early (``sys.exit(0)``, as a loop whose data ran out):
  its connections close, and its peers' all-reduce fails with gloo's "Connection closed by peer" within a
  second. The job ends; the peers' failure is the evidence.
* ``size_mismatch``: the target all-reduces a tensor of another size at the onset step (a bug: a model built
  differently on one rank). gloo aborts the rank that receives it and the others fail: a crash, not a hang.
* controls: ``checkpoint`` (rank 0 saves for ``pause_s`` inside ``Monitor.pause``), ``evaluation`` (rank 0
  evaluates for ``pause_s`` inside ``Monitor.pause``), ``startup_barrier`` (the target reaches the first
  barrier ``pause_s`` late), ``slow_loader`` (the target's batches take ``pause_s`` for 20 steps, then recover).
"""

from __future__ import annotations

import json
import os
import sys
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

__all__ = ["load_batch", "main"]


def load_batch(seconds: float) -> None:
    """The data loader: returns after ``seconds`` (forever, for a stall)."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        time.sleep(0.05)


def _compute(torch: Any, seconds: float) -> None:
    a = torch.ones(64, 64)
    deadline = time.perf_counter() + seconds
    while time.perf_counter() < deadline:
        a = (a @ a).clamp_(-1, 1)


def _onset(out: Path, rank: int) -> None:
    (out / f"onset-{rank}.json").write_text(json.dumps({"rank": rank, "time": time.time()}))


def main(case_path: str) -> None:
    import torch
    import torch.distributed as dist

    from trainhealth import Monitor

    case = json.loads(Path(case_path).read_text())
    out = Path(case["out"])
    rank = int(os.environ["RANK"])
    kind, target, onset = case["kind"], int(case["target"]), int(case["onset_step"])
    torch.set_num_threads(1)
    dist.init_process_group("gloo", timeout=timedelta(seconds=case["collective_timeout_s"]))
    side = dist.new_group([target, case["partner"]]) if kind == "other_group" else None
    torch.manual_seed(0)  # identical replicas, as DDP's first broadcast makes them: the SDC checks stay quiet
    model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.Linear(64, 64))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    monitor = Monitor(
        model,
        optimizer,
        env={**os.environ},
        comm=True,
        gpu_backend="off",
        otel=False,
        prometheus_addr="127.0.0.1",
        prometheus_port=int(case["metrics_ports"][rank]),
        trace_dir=str(out / "traces"),
        detectors="off",
    )
    data = torch.Generator().manual_seed(1000 * case["seed"] + rank)  # each rank its own batches
    (out / f"ready-{rank}").write_text("")
    if kind == "startup_barrier" and rank == target:
        _onset(out, rank)
        time.sleep(case["pause_s"])
    dist.barrier()
    for step in range(case["steps"]):
        if step == onset and rank == target:
            _onset(out, rank)
            if kind == "host_stall":
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
        if step == onset and kind in ("checkpoint", "evaluation") and rank == 0:
            _onset(out, rank)
            with monitor.pause(kind):
                load_batch(case["pause_s"])
            if kind == "checkpoint":
                monitor.checkpoint_saved(step, case["pause_s"])
        if kind == "slow_loader" and rank == target and onset <= step < onset + 20:
            if step == onset:
                _onset(out, rank)
            load_batch(case["pause_s"])
        x = torch.randn(8, 64, generator=data)
        loss = model(x).pow(2).mean()
        loss.backward()
        _compute(torch, case["step_s"])
        for parameter in model.parameters():
            dist.all_reduce(parameter.grad)
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
