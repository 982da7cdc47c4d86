"""A gradient norm we could not measure is never silent data corruption: a rank that had nothing to measure on
a check step (no backward) or whose hook raised sends "unknown", on real 2-rank gloo, and no SDC event follows;
a hook's failure is counted."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch

from tests.distributed import init_rank, run_ranks
from trainhealth._internal import catalog
from trainhealth._internal.exporters.monitor import Monitor
from trainhealth._internal.sdc.gradient_norms import UNKNOWN, LocalGradientNorm, compare
from trainhealth._internal.store import MetricStore


def _model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Linear(8, 8))


def _train(rank: int, world: int, port: int, out: str) -> None:
    init_rank(rank, world, port)
    model = _model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    with Monitor(
        model, optimizer, prometheus=False, otel=False, gpu_backend="off", env={}, grad_check_every=1, sdc_interval=0
    ) as monitor:
        for step in range(4):
            batch = torch.randn(4, 8, generator=torch.Generator().manual_seed(step))
            loss = model(batch).pow(2).mean()
            if not (rank == 1 and step == 2):  # an empty batch on this rank: it steps without a backward
                loss.backward()
            optimizer.step()  # in lockstep with its peer: the checks run here
            optimizer.zero_grad()
            monitor.step(loss=loss, step=step)
        monitor.flush()
        Path(out, f"rank-{rank}.json").write_text(
            json.dumps(
                {
                    "checks": monitor.store.value(catalog.SDC_CHECKS, ("grad_norm",)),
                    "mismatches": monitor.store.value(catalog.SDC_MISMATCHES, ("grad_norm",)),
                    "events": [event.summary for event in monitor.events.recent("sdc_suspect")],
                }
            )
        )
    torch.distributed.destroy_process_group()


def test_a_gradient_norm_that_was_not_measured_raises_no_sdc_event(tmp_path):
    run_ranks(_train, 2, str(tmp_path), steps=4)
    for rank in range(2):
        seen = json.loads((tmp_path / f"rank-{rank}.json").read_text())
        assert seen["checks"] >= 3.0 and not seen["mismatches"] and seen["events"] == [], seen  # checked, no page


def test_a_one_process_job_has_no_replica_to_compare_and_no_hook_on_its_backward_pass():
    model = _model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    with Monitor(model, optimizer, prometheus=False, otel=False, gpu_backend="off", env={}, grad_check_every=1) as mon:
        for step in range(3):
            model(torch.randn(4, 8)).pow(2).mean().backward()
            optimizer.step()
            optimizer.zero_grad()
            mon.step(step=step)
        mon.flush()
        # each hook would cost every parameter a Python call and a read of its gradient, every step
        assert not any(getattr(p, "_post_accumulate_grad_hooks", None) for p in model.parameters())
        assert mon.store.value(catalog.SDC_CHECKS, ("grad_norm",)) is None


def test_a_sparse_embeddings_local_gradient_norm_is_the_norm_of_its_values():
    embedding = torch.nn.Embedding(10, 4, sparse=True)
    linear = torch.nn.Linear(4, 1)
    local = LocalGradientNorm(torch, [*embedding.parameters(), *linear.parameters()])
    local.armed = True
    linear(embedding(torch.tensor([1, 3, 3]))).sum().backward()
    dense = torch.cat(
        [embedding.weight.grad.to_dense().reshape(-1)] + [p.grad.reshape(-1) for p in linear.parameters()]
    )
    assert float(local.take()) == pytest.approx(float(dense.norm()), rel=1e-6)
    local.close()


def test_an_unknown_norm_is_neither_a_suspect_nor_part_of_the_reference():
    assert compare([1.0, UNKNOWN, 1.1, 0.9]) == []
    assert compare([1.0, UNKNOWN, 1.1, 0.9, 1.05, 40.0]) == [5]  # the measured ones still compared
    assert compare([math.nan, UNKNOWN, 1.0, 1.1]) == [0]  # a real non-finite norm is still a finding


class _TorchWhoseNoGradRaises:
    """torch, except that ``no_grad`` raises: a hook failing inside torch, as an unsupported gradient makes it."""

    def __getattr__(self, name: str):
        return getattr(torch, name)

    def no_grad(self):
        raise RuntimeError("not supported for this gradient")


def test_a_hook_that_raises_is_counted_once_and_leaves_the_norm_unknown():
    model = _model()
    store = MetricStore()
    norm = LocalGradientNorm(_TorchWhoseNoGradRaises(), list(model.parameters()), store)
    for _ in range(2):
        norm.armed = True
        model(torch.randn(2, 8)).pow(2).mean().backward()  # the hooks run, and raise into nobody
        assert float(norm.take()) == UNKNOWN
    assert store.value(catalog.EXPORTER_ERRORS, ("sdc_grad_norm",)) == 4.0  # each parameter once, then off
