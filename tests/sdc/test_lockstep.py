"""The cross-replica checks never hang a job: they run at the optimizer step, on their own group, with a timeout.

Real 2-rank gloo processes. The first case is Accelerate's: ``Accelerator.log`` (and so
``Monitor.step``) runs on the main process only, while every rank steps its optimizer.
"""

from __future__ import annotations

import json

import pytest

from tests.distributed import init_rank, run_ranks

SETTINGS = {"prometheus": False, "otel": False, "gpu_backend": "off", "env": {}}


def _main_process_logs_only(rank, world, port, out):
    import torch
    import torch.distributed as dist

    from trainhealth import Monitor
    from trainhealth._internal import catalog

    init_rank(rank, world, port)
    torch.manual_seed(0)
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(4, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    monitor = Monitor(model, optimizer, grad_check_every=1, sdc_interval=2, **SETTINGS)
    for step in range(6):
        loss = model(torch.randn(8, 4)).pow(2).mean()
        loss.backward()  # DDP's all-reduce: both ranks, every step
        optimizer.step()
        optimizer.zero_grad()
        if rank == 0:
            monitor.step(loss=loss, step=step)
    monitor.flush()
    checks = dict(monitor.store.series(catalog.SDC_CHECKS))
    errors = monitor.store.value(catalog.EXPORTER_ERRORS, ("sdc",))
    monitor.close()
    with open(f"{out}/rank-{rank}.json", "w") as handle:
        json.dump({"checks": {k[0]: v for k, v in checks.items()}, "errors": errors}, handle)
    # leave together, as a job's ranks do: a rank that tears its gloo groups down while its peer still
    # holds them open can be aborted by gloo ("terminate called without an active exception")
    dist.barrier()
    dist.destroy_process_group()


def test_checks_run_in_lockstep_when_only_the_main_process_steps_the_monitor(tmp_path):
    run_ranks(_main_process_logs_only, 2, str(tmp_path), steps=6)
    for rank in (0, 1):
        found = json.loads((tmp_path / f"rank-{rank}.json").read_text())
        assert found["checks"] == {"grad_norm": 6.0, "fingerprint": 3.0}, (rank, found)
        assert not found["errors"]


def _one_rank_stops_stepping(rank, world, port, out):
    import time

    import torch

    from trainhealth import Monitor
    from trainhealth._internal import catalog

    init_rank(rank, world, port)
    model = torch.nn.Linear(4, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    monitor = Monitor(model, optimizer, grad_check_every=1, sdc_interval=0, sdc_timeout=2, **SETTINGS)
    began = time.monotonic()
    for step in range(6 if rank == 0 else 2):  # rank 1 stops stepping its optimizer after two steps
        model(torch.randn(8, 4)).pow(2).mean().backward()
        optimizer.step()
        optimizer.zero_grad()
        monitor.step(step=step)
    elapsed = time.monotonic() - began
    monitor.flush()
    result = {
        "elapsed": elapsed,
        "steps": monitor.store.value(catalog.TRAIN_STEPS),
        "errors": monitor.store.value(catalog.EXPORTER_ERRORS, ("sdc",)),
        "disabled": monitor.health.checks.disabled is not None,
    }
    monitor.close()
    with open(f"{out}/rank-{rank}.json", "w") as handle:
        json.dump(result, handle)
    if rank == 1:
        time.sleep(4)  # stay up past rank 0's timeout, as a rank stuck elsewhere would


@pytest.mark.slow
def test_a_check_that_waits_too_long_is_turned_off_and_counted(tmp_path):
    run_ranks(_one_rank_stops_stepping, 2, str(tmp_path), steps=6)
    waited = json.loads((tmp_path / "rank-0.json").read_text())
    assert waited["steps"] == 6 and waited["errors"] == 1 and waited["disabled"]
    assert waited["elapsed"] < 30  # one timeout of 2 s, not one per step and never gloo's 30 minutes
    stopped = json.loads((tmp_path / "rank-1.json").read_text())
    assert stopped["steps"] == 2 and not stopped["errors"] and not stopped["disabled"]
