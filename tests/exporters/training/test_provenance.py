"""NaN/Inf provenance on real TinyGPT training with top-exponent bit flips: the block that made it.

Which rank made it (local) and which received it, on 4-rank DDP: tests/sdc/test_replica_checks.py.
"""

from __future__ import annotations

import math

import pytest
import torch

from trainhealth._internal import catalog
from trainhealth._internal.demo.tiny_gpt import TinyGPT, synthetic_batch
from trainhealth._internal.exporters.monitor import Monitor
from trainhealth._internal.exporters.training.provenance import (
    HEAD_OR_LOSS,
    OVERFLOW_BOUND,
    BlockOrder,
    Origin,
    Stage,
    Where,
    locate,
)
from trainhealth._internal.injectors.schedule import Injector


def _train_with_flip(target: str, tensor: str, seed: int) -> tuple[Monitor, dict]:
    torch.manual_seed(seed)
    model = TinyGPT(vocab=64, width=32, layers=2, heads=2, context=32)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    injector = Injector(
        [{"kind": "bitflip", "target": target, "tensor": tensor, "bit": 30, "step": 3}],
        model=model,
        optimizer=optimizer,
        rank=0,
        seed=seed,
    )
    with Monitor(model, optimizer, prometheus=False, otel=False, gpu_backend="off", stats_every=10, env={}) as monitor:
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


@pytest.mark.parametrize(
    ("target", "tensor", "block", "stage"),
    [
        # the weight becomes ~1e37, finite: the block's output overflows there, the NaN only appears downstream
        ("parameter", "layers.0.mlp.0.weight", "layers.0", Stage.OUTPUT),
    ],
)
def test_a_top_exponent_flip_is_traced_to_its_block_not_the_head(target, tensor, block, stage):
    monitor, fault = _train_with_flip(target, tensor, seed=0)
    assert abs(fault["changes"][0][2]) > OVERFLOW_BOUND  # the flip made an absurd value (its before was below 2)
    event = monitor.events.recent("nonfinite_origin")[0]
    assert event.attributes == {"block": block, "step": 3, "where": "local", "stage": stage.value}
    assert monitor.store.value(catalog.TRAIN_NONFINITE_ORIGIN, (block,)) == 1.0
    assert monitor.store.value(catalog.TRAIN_NONFINITE_FIRST_STEP, ("local",)) == 3.0


def _train_with_poisoned_logits(values: list[float | None]) -> tuple[Monitor, list[float]]:
    """TinyGPT steps with one logit of the first token replaced by ``values[step]`` (None: left alone)."""
    torch.manual_seed(3)
    model = TinyGPT(vocab=64, width=32, layers=2, heads=2, context=32)
    poison = {"value": None}
    model.lm_head.register_forward_hook(lambda module, args, out: _poisoned(out, poison["value"]))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.0)
    losses = []
    with Monitor(model, optimizer, prometheus=False, otel=False, gpu_backend="off", env={}) as monitor:
        for step, value in enumerate(values):
            poison["value"] = value
            loss = model.loss(synthetic_batch(64, 32, batch=4, seed=0))
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
            monitor.step(loss=loss, step=step)
            losses.append(loss.item())
        monitor.flush()
    return monitor, losses


def test_a_flip_in_the_logits_that_the_loss_ignores_is_no_finding():
    # a huge negative logit leaves the softmax, the loss and the gradients as they were: nothing reached training
    monitor, losses = _train_with_poisoned_logits([None, None, -1e38, None])
    assert losses[2] == pytest.approx(losses[1], rel=1e-3)  # the step computed the same loss (no blow-up)
    assert monitor.events.recent("nonfinite_origin") == []
    assert monitor.store.value(catalog.TRAIN_NONFINITE_FIRST_STEP, ("local",)) is None


def test_a_flip_in_the_logits_that_reaches_the_loss_names_the_head_or_the_loss_by_elimination():
    # the head's logits are never read: every block output finite and the loss not, so the value came after them
    monitor, losses = _train_with_poisoned_logits([None, None, 1e38, None])
    assert not abs(losses[2]) <= OVERFLOW_BOUND  # it reached the loss
    (event,) = monitor.events.recent("nonfinite_origin")
    assert event.attributes == {"block": HEAD_OR_LOSS, "step": 2, "where": "local", "stage": "after_blocks"}
    assert "after the last block: the output head or the loss" in event.summary
    assert monitor.store.value(catalog.TRAIN_NONFINITE_ORIGIN, (HEAD_OR_LOSS,)) == 1.0


def _poisoned(logits: torch.Tensor, value: float | None) -> torch.Tensor:
    if value is None:
        return logits
    logits = logits.clone()
    logits.view(-1)[5] = value  # one logit of the first token
    return logits


def test_on_one_process_a_gradient_flip_is_counted_but_never_read_as_received():
    # local gradients are measured only where an all-reduce could bring another rank's value (4-rank DDP, where a
    # gradient flip is traced to its rank and block: tests/sdc/test_replica_checks.py); here the norm shows it
    monitor, fault = _train_with_flip("gradient", "layers.1.attn.in_proj_weight", seed=0)
    assert abs(fault["changes"][0][2]) > OVERFLOW_BOUND
    assert not monitor.events.recent("nonfinite_origin")
    assert monitor.store.value(catalog.TRAIN_NONFINITE_ORIGIN, ("all_reduce",)) is None
    assert monitor.store.value(catalog.TRAIN_NONFINITE_STEPS, ("grad_norm",)) >= 1


def test_the_output_check_comes_first_then_the_loss_then_the_gradients_in_backward_order_then_the_all_reduce():
    order = BlockOrder(("embed", "layers.0", "layers.1"), ("lm_head", "layers.1", "layers.0", "embed"))
    clean = {"block_peak": [1.0, 5.0, 7.0], "grad_peak": [0.1, 0.2, 0.3, 0.01], "loss": 2.0, "grad_norm": 0.5}
    assert locate(clean, order) is None
    nan_loss = {**clean, "loss": math.nan, "grad_norm": math.nan}
    # just below the bound is still a value; NaN anywhere after an overflow does not move the origin
    assert locate({**nan_loss, "block_peak": [1.0, OVERFLOW_BOUND, math.nan]}, order) == Origin(
        "layers.1", Stage.OUTPUT
    )
    assert locate({**nan_loss, "block_peak": [1.0, 2e36, math.nan]}, order) == Origin("layers.0", Stage.OUTPUT)
    # every block output finite, the loss not: after the last block, whatever the gradients then held
    assert locate({**nan_loss, "grad_peak": [math.nan] * 4}, order) == Origin(HEAD_OR_LOSS, Stage.AFTER_BLOCKS)
    assert locate({**clean, "loss": 3e38}, order) == Origin(HEAD_OR_LOSS, Stage.AFTER_BLOCKS)  # overflowing
    # a finite forward and loss: backward reached layers.1 before the upstream blocks its bad gradient flowed into
    bad_norm = {**clean, "grad_norm": math.inf}
    assert locate({**bad_norm, "grad_peak": [0.1, math.inf, math.nan, math.nan]}, order) == Origin(
        "layers.1", Stage.GRADIENT
    )
    received = locate(bad_norm, order)
    assert received == Origin("all_reduce", Stage.ALL_REDUCE) and received.where is Where.RECEIVED


def test_a_bad_value_that_reached_neither_the_loss_nor_the_gradient_norm_is_no_finding():
    order = BlockOrder(("embed", "layers.0"), ("layers.0", "embed"))
    absorbed = {"block_peak": [1.0, 2e36], "grad_peak": [math.inf, 0.1], "loss": 2.0, "grad_norm": 0.5}
    assert locate(absorbed, order) is None
    assert locate({**absorbed, "grad_norm": math.nan}, order) == Origin("layers.0", Stage.OUTPUT)
    # a loop that reports neither: the bad block output is named on its own
    assert locate({"block_peak": [1.0, 2e36]}, order) == Origin("layers.0", Stage.OUTPUT)


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
    # the gradient hooks as a DDP rank has them (on one process there are none: nothing can be received)
    from trainhealth._internal.exporters.training.model_signals import ModelSignals
    from trainhealth._internal.store import MetricStore

    torch.manual_seed(0)
    model, store = _ComplexGainModel(), MetricStore()
    signals = ModelSignals(torch, model, ["layers.0", "layers.1"], store=store, signals=False, gradients=True)
    for step in range(3):
        model(torch.randn(4, 16, generator=torch.Generator().manual_seed(step))).backward()
        tensors, order = signals.take()
        model.zero_grad()
    assert store.value(catalog.EXPORTER_ERRORS, ("provenance",)) == 1.0  # counted once, then off
    read = {name: tensor.tolist() for name, tensor, _ in tensors}
    assert not order.complete and len(read["grad_peak"]) == 4  # the linear layers' weights and biases, not the gain
    # the gain's gradient goes bad where no hook looks: the norm after the all-reduce is bad, the origin unknown
    assert locate({**read, "grad_norm": math.nan}, order) is None
