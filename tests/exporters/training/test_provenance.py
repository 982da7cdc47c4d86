"""NaN/Inf provenance on real TinyGPT training with top-exponent bit flips: the block that made it.

Which rank made it (local) and which received it, on 4-rank DDP: tests/sdc/test_replica_checks.py.
"""

from __future__ import annotations

import math

import pytest
import torch

from trainhealth import catalog
from trainhealth.exporters.monitor import Monitor
from trainhealth.exporters.training.provenance import OVERFLOW_BOUND, BlockOrder, Origin, Stage, Where, locate
from trainhealth.lab.injectors.schedule import Injector
from trainhealth.lab.models.tiny_gpt import TinyGPT, synthetic_batch


def _train_with_flip(target: str, tensor: str, seed: int) -> tuple[Monitor, dict]:
    torch.manual_seed(seed)
    model = TinyGPT(vocab=64, width=32, layers=2, heads=2, context=32)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    injector = Injector([{"kind": "bitflip", "target": target, "tensor": tensor, "bit": 30, "step": 3}],
                        model=model, optimizer=optimizer, rank=0, seed=seed)
    with Monitor(model, optimizer, prometheus=False, otel=False, gpu_backend="off", stats_every=10,
                 env={}) as monitor:
        for step in range(5):
            injector.begin_step(step)
            loss = model.loss(synthetic_batch(64, 32, batch=8, seed=step))
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
            monitor.step(loss=loss, step=step)
        monitor.flush()
    (fault,) = injector.log
    return monitor, fault


@pytest.mark.parametrize(("target", "tensor", "block", "stage"), [
    # the weight becomes ~1e37, finite: the block's output overflows there, the NaN only appears downstream
    ("parameter", "layers.0.mlp.0.weight", "layers.0", Stage.OUTPUT),
    # a corrupted gradient leaves the forward alone: backward meets it in its own block first
    ("gradient", "layers.1.attn.in_proj_weight", "layers.1", Stage.GRADIENT),
])
def test_a_top_exponent_flip_is_traced_to_its_block_not_the_head(target, tensor, block, stage):
    monitor, fault = _train_with_flip(target, tensor, seed=0)
    assert abs(fault["changes"][0][2]) > OVERFLOW_BOUND  # the flip made an absurd value (its before was below 2)
    event = monitor.events.recent("nonfinite_origin")[0]
    assert event.attributes == {"block": block, "step": 3, "where": "local", "stage": stage.value}
    assert monitor.store.value(catalog.TRAIN_NONFINITE_ORIGIN, (block,)) == 1.0
    assert monitor.store.value(catalog.TRAIN_NONFINITE_FIRST_STEP, ("local",)) == 3.0


def test_the_output_check_comes_first_then_the_gradients_in_backward_order_then_the_all_reduce():
    order = BlockOrder(("embed", "layers.0", "layers.1", "lm_head"), ("lm_head", "layers.1", "layers.0", "embed"))
    clean = {"block_peak": [1.0, 5.0, 7.0, 20.0], "grad_peak": [0.1, 0.2, 0.3, 0.01], "grad_norm": 0.5}
    assert locate(clean, order) is None
    # just below the bound is still a value; NaN anywhere after an overflow does not move the origin
    assert locate({**clean, "block_peak": [1.0, OVERFLOW_BOUND, 7.0, math.nan]}, order) == Origin("lm_head",
                                                                                                   Stage.OUTPUT)
    assert locate({**clean, "block_peak": [1.0, 2e36, math.nan, math.nan]}, order) == Origin("layers.0", Stage.OUTPUT)
    # a finite forward: backward reached layers.1 before the upstream blocks its bad gradient flowed into
    assert locate({**clean, "grad_peak": [0.1, math.inf, math.nan, math.nan]}, order) == Origin("layers.1",
                                                                                                 Stage.GRADIENT)
    received = locate({**clean, "grad_norm": math.inf}, order)
    assert received == Origin("all_reduce", Stage.ALL_REDUCE) and received.where is Where.RECEIVED


class _ComplexGainModel(torch.nn.Module):
    """Two ordinary blocks and a complex gain (``torch.aminmax`` refuses complex tensors) on their input."""

    def __init__(self) -> None:
        super().__init__()
        self.gain = torch.nn.Parameter(torch.ones(16, dtype=torch.complex64))
        self.layers = torch.nn.ModuleList([torch.nn.Linear(16, 16), torch.nn.Linear(16, 16)])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = (x * self.gain).real
        for layer in self.layers:
            x = torch.tanh(layer(x))
        return x.pow(2).mean()


def test_a_gradient_that_cannot_be_measured_is_counted_and_never_read_as_received():
    torch.manual_seed(0)
    model = _ComplexGainModel()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    with Monitor(model, optimizer, prometheus=False, otel=False, gpu_backend="off", stats_every=1,
                 env={}) as monitor:
        for step in range(5):
            loss = model(torch.randn(4, 16, generator=torch.Generator().manual_seed(step)))
            loss.backward()
            if step == 3:  # this rank's own gain gradient goes bad, where no hook could look
                model.gain.grad[0] = complex(math.nan, 0.0)
            grad_norm = torch.stack([p.grad.abs().pow(2).sum() for p in model.parameters()]).sum().sqrt()
            optimizer.step()
            optimizer.zero_grad()
            monitor.step(loss=loss, step=step, grad_norm=grad_norm)
        monitor.flush()
    assert monitor.store.value(catalog.EXPORTER_ERRORS, ("provenance",)) == 1.0  # counted once, then off
    origins = [event.attributes for event in monitor.events.recent("nonfinite_origin")]
    assert all(origin["where"] != "received" for origin in origins), origins  # it was made here, unseen
    assert monitor.store.value(catalog.TRAIN_NONFINITE_FIRST_STEP, ("received",)) is None
