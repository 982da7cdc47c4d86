"""One rank of a real-run case: gloo on CPU, a small model, the Monitor and the collective logger.

Run by the launcher as ``python -m trainhealth_lab.realrun.worker --spec spec.json --rank R``
with ``MASTER_ADDR``, ``MASTER_PORT``, ``WORLD_SIZE`` and ``RANK`` set (or ``--ranks`` to fork
them all from one process). The model's kernels are paced sleeps
(:mod:`trainhealth_lab.realrun.kernels`) and each layout's step is in
:mod:`trainhealth_lab.realrun.parallel`; compute faults and controls scale the kernels, and a
data-loader fault sleeps in the data fetch, before forward.

Writes, into the directory of ``spec.json``: ``rank-<R>.<n>.jsonl.gz`` (the collective
logger, appended to while it runs every ``TRAINHEALTH_TRACE_WRITE_INTERVAL``),
``progress/rank-<R>.json`` (the step just finished, for the launcher) and
``progress/steps-rank-<R>.json`` (every step's start, wall time and compute time) at
the end; rank 0 also writes ``topology.json`` and, in link cases, ``probe.json`` when
the link probe is available. With ``markers=False`` there is no Monitor: the collective
logger alone records, so there are no step markers and every record has step 0. A case whose
``driver`` is not ``lab`` runs a shape users run instead: its own collectives or FSDP-style sharding
(:mod:`trainhealth_lab.realrun.shapes`), or a trainer with trainhealth's integration
(:mod:`trainhealth_lab.realrun.trainers`).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

from trainhealth_lab.realrun.kernels import (
    BACKWARD_SHARE,
    FORWARD_SHARE,
    OPTIMIZER_SHARE,
    Clock,
    build_model,
)
from trainhealth_lab.realrun.parallel import STEPS, new_groups
from trainhealth_lab.realrun.rankfiles import StepLog, write_json, write_topology
from trainhealth_lab.realrun.spec import TRAINER_DRIVERS, CaseSpec, Driver, Parallelism, stall_seconds

__all__ = ["main", "run_rank"]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="trainhealth_lab.realrun.worker")
    parser.add_argument("--spec", required=True)
    parser.add_argument("--rank", type=int, help="run this rank")
    parser.add_argument("--ranks", help="fork these ranks (comma-separated) from one process that imported torch once")
    args = parser.parse_args(argv)
    if (args.rank is None) == (args.ranks is None):
        parser.error("give one of --rank and --ranks")
    if args.ranks is not None:
        return _fork_ranks(args.spec, [int(r) for r in args.ranks.split(",")])
    return run_rank(args.spec, args.rank)


def _fork_ranks(spec_path: str, ranks: list[int]) -> int:
    """Import torch and trainhealth once, then fork one child per rank (each with its own RANK and host).

    On 2 cores, eight ranks importing torch each take ~15 s of start-up; forked children share the
    parent's imports. A child that fails ends the others (they would wait for it until the gloo timeout).
    """
    import torch  # noqa: F401  -- preloaded for the children
    import torch._dynamo  # noqa: F401  -- DistributedDataParallel imports it lazily: ~5 s per process
    import torch.distributed  # noqa: F401
    import torch.nn.parallel  # noqa: F401

    import trainhealth._internal.exporters.monitor  # noqa: F401
    import trainhealth._internal.traces.io  # noqa: F401
    import trainhealth.comm  # noqa: F401

    driver = CaseSpec.load(spec_path).driver
    if driver in TRAINER_DRIVERS:  # the trainer and its integration: ~10 s each on 2 cores, once before the fork
        from trainhealth_lab.realrun.trainers import integration

        integration(driver)

    run_dir = Path(spec_path).resolve().parent
    hosts = json.loads(os.environ.get("TRAINHEALTH_LAB_HOSTS", "{}"))
    namespaces = json.loads(os.environ.get("TRAINHEALTH_LAB_NETNS", "{}"))
    children: dict[int, int] = {}
    for rank in ranks:
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                log_path = run_dir / "logs" / f"rank-{rank}.log"
                fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
                os.dup2(fd, 1)
                os.dup2(fd, 2)
                os.environ.update(RANK=str(rank))
                if str(rank) in namespaces:
                    _enter_network_namespace(namespaces[str(rank)])
                if str(rank) in hosts:
                    os.environ["TRAINHEALTH_HOST"] = hosts[str(rank)]
                code = run_rank(spec_path, rank)
            except BaseException:
                import traceback

                traceback.print_exc()
            finally:
                sys.stdout.flush()
                sys.stderr.flush()
                os._exit(code)
        children[pid] = rank
    status = 0
    while children:
        pid, code = os.wait()
        children.pop(pid, None)
        if code != 0 and status == 0:
            status = 1
            for other in children:
                os.kill(other, signal.SIGKILL)
    return status


def _enter_network_namespace(name: str) -> None:
    """Move this (single-threaded, just forked) process into the network namespace ``name``, as ``ip netns exec``."""
    import ctypes

    clone_newnet = 0x40000000
    libc = ctypes.CDLL(None, use_errno=True)
    fd = os.open(f"/run/netns/{name}", os.O_RDONLY)
    try:
        if libc.setns(fd, clone_newnet) != 0:
            error = ctypes.get_errno()
            raise OSError(error, f"setns into network namespace {name}: {os.strerror(error)}")
    finally:
        os.close(fd)


def run_rank(spec_path: str, rank: int) -> int:
    """Train one rank of the case in ``spec_path``."""
    spec = CaseSpec.load(spec_path)
    run_dir = Path(spec_path).resolve().parent
    if spec.pin:
        os.sched_setaffinity(0, {spec.pin[rank]})

    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    torch.manual_seed(spec.seed)  # the same initial weights on every replica
    dist.init_process_group("gloo", rank=rank, world_size=spec.ranks, timeout=timedelta(seconds=90))
    try:
        if spec.driver is Driver.LAB:
            _train(torch, dist, spec, rank, run_dir)
        elif spec.driver in TRAINER_DRIVERS:
            from trainhealth_lab.realrun.trainers import train_with_trainer

            train_with_trainer(torch, dist, spec, rank, run_dir)
        else:  # the shapes users run: their own collectives, FSDP-style sharding
            from trainhealth_lab.realrun.shapes import train_shape

            train_shape(torch, dist, spec, rank, run_dir)
    finally:
        if dist.is_initialized():  # a trainer may have destroyed it already
            dist.destroy_process_group()
    return 0


def _train(torch: Any, dist: Any, spec: CaseSpec, rank: int, run_dir: Path) -> None:
    from trainhealth import comm

    groups, mine = new_groups(dist, spec, rank)
    layers = spec.layers // 2 if spec.layout is Parallelism.DP_PP else spec.layers
    clock = Clock(
        spec.compute_s * FORWARD_SHARE,
        spec.compute_s * BACKWARD_SHARE,
        spec.compute_s * OPTIMIZER_SHARE,
        spec.cpu_share,
    )
    model = build_model(torch, spec, layers, clock)
    train_module = model
    if spec.layout is Parallelism.DDP:
        # small buckets: about one all-reduce per layer, in flight during the rest of backward, as in real DDP
        bucket_mb = (spec.width * spec.width + spec.width) * 4 / 2**20
        train_module = torch.nn.parallel.DistributedDataParallel(model, bucket_cap_mb=bucket_mb)
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
    monitor = None
    if spec.markers:
        from trainhealth._internal.exporters.monitor import Monitor

        monitor = Monitor(
            train_module,
            optimizer,
            comm=True,
            prometheus=False,
            otel=False,
            gpu_backend="off",
            model_signals=False,
            sdc_interval=0,
            grad_check_every=0,
            detectors="off",
        )
    else:  # the collective logger alone: no step, forward or optimizer rows; every record has step 0
        comm.install()
    if spec.layout is Parallelism.DDP:
        comm.instrument_ddp(train_module)

    def optimizer_kernel(*_: Any) -> None:  # registered after the Monitor's hooks
        clock.kernel(clock.optimizer_s)

    optimizer.register_step_pre_hook(optimizer_kernel)
    logger = comm.installed()
    ids = {logger.group_id(None): list(range(spec.ranks))} if logger is not None else {}
    if logger is not None:
        ids.update({logger.group_id(pg): ranks for ranks, pg in mine.values()})
    write_topology(run_dir, spec, rank, {"groups": ids, "host": logger.host if logger is not None else ""})
    step_fn = STEPS[spec.layout](torch, dist, spec, rank, model, train_module, groups, clock)

    steps = StepLog(run_dir, rank, clock)
    try:
        for step in range(spec.steps):
            steps.begin(spec.work_factor(rank, step))
            stall = stall_seconds(spec.fault, rank, step)
            if stall > 0:  # the data fetch of every rank (inputs, or a last stage's labels) comes before forward
                with clock.blocked():  # not the rank's compute: the pacing must not absorb it
                    time.sleep(stall)
            loss = step_fn(step)
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            if monitor is not None:
                monitor.step(loss=loss, tokens=spec.batch, step=step)
            steps.end(step)
        if spec.netns:
            _probe(run_dir, rank)
    finally:
        if monitor is not None:
            monitor.close()  # writes the final trace
        if comm.installed() is not None:
            comm.uninstall()
        steps.close()


def _probe(run_dir: Path, rank: int) -> None:
    """The pairwise link probe, when the package has it; its result (rank 0's) goes to ``probe.json``."""
    try:
        from trainhealth._internal.exporters.collectives.probe import probe_links
    except ImportError as exc:
        if rank == 0:
            write_json(
                run_dir / "probe.json", {"unavailable": f"trainhealth._internal.exporters.collectives.probe: {exc}"}
            )
        return
    try:
        result = probe_links()
    except Exception as exc:  # the lab records it; the scoring goes on without the probe
        if rank == 0:
            write_json(run_dir / "probe.json", {"unavailable": f"probe_links() failed: {type(exc).__name__}: {exc}"})
        return
    if rank == 0 and result is not None:
        data = result.to_dict() if hasattr(result, "to_dict") else result
        write_json(run_dir / "probe.json", data)


if __name__ == "__main__":
    raise SystemExit(main())
