"""The Accelerate tracker as documented, with the real Accelerate, on one rank and on two gloo ranks.

Each run trains with ``accelerator.accumulate``, clips with ``accelerator.clip_grad_norm_``
(active: the norm is above the limit), steps a learning-rate scheduler and logs the loss,
the pre-clip gradient norm, the learning rate applied and the tokens with
``accelerator.log``; after each logged step the rank scrapes its Monitor's /metrics on
127.0.0.1 and compares what is exported with what it logged. On two ranks ``accelerator.log``
runs on rank 0 only (the other rank records its steps without the logged values), while both Monitors run the cross-replica checks at every optimizer
step: the run must finish (no rank waits on the other), with every check done.
"""

from __future__ import annotations

import math

import pytest
import torch

from tests.distributed import init_rank, run_ranks
from tests.helpers import Scrape, scrape
from trainhealth._internal import catalog

accelerate = pytest.importorskip("accelerate")

from accelerate.state import AcceleratorState

from trainhealth.integrations.accelerate import TrainhealthTracker

STEPS, MICRO_BATCH, MAX_NORM, REL = 4, 8, 0.05, 1e-5
SETTINGS = {
    "prometheus_addr": "127.0.0.1",
    "prometheus_port": 0,
    "otel": False,
    "gpu_backend": "off",
    "grad_check_every": 1,
    "sdc_interval": 2,
    "sdc_timeout": 30.0,
}


def _optional(metrics: Scrape, spec: catalog.MetricSpec, **labels: str) -> float | None:
    name = spec.prometheus_name
    found = [
        value
        for (n, lab), value in metrics.samples().items()
        if n == name and all(dict(lab).get(k) == v for k, v in labels.items())
    ]
    assert len(found) <= 1, (name, labels, found)
    return found[0] if found else None


def _close(exported: float | None, logged: float, what: str, step: int) -> None:
    assert exported is not None and math.isclose(exported, logged, rel_tol=REL), (
        f"step {step}: {what} exported {exported}, logged {logged}"
    )


def _train(rank: int, world: int, accumulation: int, every_rank_logs: bool) -> list[Scrape]:
    """The documented loop; returns this rank's scrape after each logged step and one at the end."""
    torch.manual_seed(0)  # the same initial replica on every rank
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    scheduler = torch.optim.lr_scheduler.LinearLR(optimizer, start_factor=1.0, end_factor=0.2, total_iters=20)
    tracker = TrainhealthTracker(model, optimizer, **SETTINGS)
    accelerator = accelerate.Accelerator(cpu=True, gradient_accumulation_steps=accumulation, log_with=[tracker])
    assert (accelerator.num_processes, accelerator.process_index) == (world, rank)
    model, optimizer, scheduler = accelerator.prepare(model, optimizer, scheduler)
    accelerator.init_trackers("trainhealth-test")
    monitor = tracker.monitor
    data = torch.Generator().manual_seed(100 + rank)  # each rank its own batches
    scrapes, step, tokens = [], 0, 0
    for _ in range(STEPS * accumulation):
        with accelerator.accumulate(model):
            x = torch.randn(MICRO_BATCH, 8, generator=data)
            loss = (model(x) - x.sum(dim=1, keepdim=True)).pow(2).mean()
            accelerator.backward(loss)
            tokens += MICRO_BATCH
            if accelerator.sync_gradients:
                grad_norm = accelerator.clip_grad_norm_(model.parameters(), MAX_NORM)
                lr = scheduler.get_last_lr()[0]
            optimizer.step()
            scheduler.step()
            optimizer.zero_grad()
        if not accelerator.sync_gradients:
            continue
        assert float(grad_norm) > 2 * MAX_NORM  # clipping is active
        values = {"loss": loss.item(), "grad_norm": grad_norm.item(), "lr": lr, "tokens": tokens}
        accelerator.log(values, step=step)
        if every_rank_logs and not accelerator.is_main_process:
            tracker.log(values, step=step)  # the documented way for the other ranks to record their own steps
        if accelerator.is_main_process or every_rank_logs:
            assert monitor.flush()
            metrics = scrape(monitor.metrics_url)
            _close(_optional(metrics, catalog.TRAIN_LOSS), values["loss"], "loss", step)
            _close(_optional(metrics, catalog.TRAIN_GRAD_NORM), values["grad_norm"], "grad_norm", step)
            _close(_optional(metrics, catalog.TRAIN_LEARNING_RATE, param_group="0"), lr, "lr", step)
            assert _optional(metrics, catalog.TRAIN_STEP) == step
            assert _optional(metrics, catalog.TRAIN_STEPS) == step + 1
            scrapes.append(metrics)
        step, tokens = step + 1, 0
    assert step == STEPS
    assert monitor.flush()
    scrapes.append(scrape(monitor.metrics_url))
    accelerator.end_training()
    tracker.finish()  # rank 0's is closed by end_training already; the others' here (else at exit)
    return scrapes


@pytest.fixture
def fresh_accelerate_state():
    AcceleratorState._reset_state(reset_partial_state=True)
    yield
    AcceleratorState._reset_state(reset_partial_state=True)


@pytest.mark.parametrize("accumulation", [1, 4])
def test_one_rank_exports_what_accelerator_log_logged(accumulation, fresh_accelerate_state):
    scrapes = _train(0, 1, accumulation, every_rank_logs=False)
    final = scrapes[-1]
    assert _optional(final, catalog.TRAIN_TOKENS) == STEPS * accumulation * MICRO_BATCH
    assert _optional(final, catalog.SDC_CHECKS, check="grad_norm") is None  # one replica: nothing to compare


def _rank(rank: int, world: int, port: int, accumulation: int, every_rank_logs: bool) -> None:
    init_rank(rank, world, port)
    scrapes = _train(rank, world, accumulation, every_rank_logs)
    final = scrapes[-1]
    steps = _optional(final, catalog.TRAIN_STEPS)
    if rank == 0 or every_rank_logs:
        assert steps == STEPS and len(scrapes) == STEPS + 1
        assert _optional(final, catalog.TRAIN_TOKENS) == STEPS * accumulation * MICRO_BATCH
    else:  # accelerator.log did nothing here: the rank records its own steps, each once the next forward begins
        assert steps == STEPS - 1  # the last one at tracker.finish(), after this scrape
        assert _optional(final, catalog.TRAIN_STEP) == STEPS - 2  # numbered like rank 0's logged steps
    # the checks ran at every optimizer step on both ranks, none timed out
    assert _optional(final, catalog.SDC_CHECKS, check="grad_norm") == STEPS
    assert _optional(final, catalog.SDC_CHECKS, check="fingerprint") == STEPS // 2
    assert _optional(final, catalog.SDC_SUSPECT, check="fingerprint") == 0  # DDP kept the replicas identical
    assert not _optional(final, catalog.EXPORTER_ERRORS, source="sdc")


@pytest.mark.parametrize(
    ("accumulation", "every_rank_logs"),
    [(1, False), (4, True)],
    ids=["accumulation-1-rank0-logs", "accumulation-4-every-rank-logs"],
)
def test_two_ranks_finish_and_export_what_was_logged(accumulation, every_rank_logs):
    run_ranks(_rank, 2, accumulation, every_rank_logs, timeout_s=90)
