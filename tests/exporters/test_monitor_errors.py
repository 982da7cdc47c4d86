"""Nothing the Monitor does on the training path raises into the training loop; failures are counted."""

from __future__ import annotations

import pytest
import torch

from tests.helpers import TinyGPT, lm_loss
from trainhealth import ConfigError, Monitor
from trainhealth._internal import catalog


def _errors(mon: Monitor, source: str) -> float:
    return mon.store.value(catalog.EXPORTER_ERRORS, (source,)) or 0.0


def test_a_device_fault_inside_an_optimizer_hook_does_not_reach_the_loop(monkeypatch):
    torch.manual_seed(0)
    model = TinyGPT()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    mon = Monitor(model, optimizer, stats_every=1, env={}, prometheus=False, otel=False)

    def device_fault(*args, **kwargs):  # what a CUDA error looks like to the hook
        raise RuntimeError("CUDA error: an illegal memory access was encountered")

    with monkeypatch.context() as patch:
        patch.setattr(torch, "_foreach_norm", device_fault)
        lm_loss(model, 0).backward()
        before = model.head.weight.detach().clone()
        optimizer.step()  # the hooks fail inside this call
        assert not torch.equal(before, model.head.weight)  # the optimizer still updated the model
        optimizer.zero_grad()
        mon.step(loss=1.0)
    assert _errors(mon, "optimizer_hook") >= 1

    lm_loss(model, 1).backward()  # the device recovered: statistics flow again
    optimizer.step()
    mon.step(loss=2.0)
    mon.close()
    assert mon.latest.loss == 2.0 and mon.latest.grad_norm > 0 and mon.latest.layers


@pytest.mark.parametrize(
    "bad_step",
    [
        {"loss": object()},
        {"loss": torch.ones(3)},
        {"loss": 1.0, "tokens": -5},
        {"loss": 1.0, "grad_norm": "large"},
    ],
)
def test_bad_step_arguments_are_counted_not_raised(bad_step):
    mon = Monitor(torch.nn.Linear(2, 1), env={}, prometheus=False, otel=False)
    mon.step(**bad_step)
    assert _errors(mon, "monitor") == 1
    mon.step(loss=3.0, tokens=4)
    mon.close()
    assert mon.latest.loss == 3.0 and mon.latest.tokens == 4


@pytest.mark.parametrize(
    "kwargs, setting",
    [
        ({"stats_every": 0}, "stats_every"),
        ({"peak_flops": -1.0}, "peak_flops"),
        ({"prometheus_port": 70000}, "prometheus_port"),
        ({"tls_certfile": "/nonexistent/cert.pem", "tls_keyfile": "/nonexistent/key.pem"}, "tls_certfile"),
        ({"statsevery": 5}, "statsevery"),
    ],
)
def test_configuration_mistakes_fail_at_construction(kwargs, setting):
    with pytest.raises(ConfigError) as error:
        Monitor(torch.nn.Linear(2, 1), env={}, otel=False, **kwargs)
    assert error.value.setting == setting
    assert str(error.value).startswith(setting)


def test_an_invalid_environment_variable_fails_at_construction():
    with pytest.raises(
        ConfigError, match=r"^stats_every \(TRAINHEALTH_STATS_EVERY\): expected an integer, got 'often'$"
    ):
        Monitor(torch.nn.Linear(2, 1), env={"TRAINHEALTH_STATS_EVERY": "often"})


class RelativeStepSGD(torch.optim.Optimizer):
    """A real torch optimizer that keeps no learning rate in its param groups (``lr`` is None), as
    Hugging Face's Adafactor with ``relative_step=True`` does: the step size comes from the step count."""

    def __init__(self, params) -> None:
        super().__init__(params, {"lr": None})

    @torch.no_grad()
    def step(self, closure=None):
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is None:
                    continue
                state = self.state[p]
                state["step"] = state.get("step", 0) + 1
                p.add_(p.grad, alpha=-0.1 / state["step"] ** 0.5)


def _train(mon: Monitor, model, optimizer, steps: int) -> None:
    for step in range(steps):
        lm_loss(model, step).backward()
        optimizer.step()
        mon.step(loss=lm_loss(model, step).detach(), tokens=8)
        optimizer.zero_grad()


def _assert_recorded_without_learning_rate(mon: Monitor, steps: int) -> None:
    assert mon.store.value(catalog.TRAIN_STEPS) == steps
    assert mon.store.value(catalog.TRAIN_LOSS) == pytest.approx(mon.latest.loss)
    assert mon.store.value(catalog.TRAIN_GRAD_NORM) > 0
    assert mon.store.value(catalog.TRAIN_TOKENS) == 8 * steps
    assert [labels for labels, _ in mon.store.series(catalog.TRAIN_LAYER_GRAD_NORM)]  # the heavy statistics too
    assert not mon.store.series(catalog.TRAIN_LEARNING_RATE)
    assert mon.latest.learning_rates == (None,)
    assert _errors(mon, "learning_rate") == steps  # one per step: the signal is skipped each time
    assert _errors(mon, "monitor") == 0


def test_a_learning_rate_of_none_is_skipped_and_counted_and_the_rest_is_recorded():
    torch.manual_seed(0)
    model = TinyGPT()
    optimizer = RelativeStepSGD(model.parameters())
    assert optimizer.param_groups[0]["lr"] is None
    with Monitor(model, optimizer, env={}, prometheus=False, otel=False, gpu_backend="off", stats_every=2) as mon:
        _train(mon, model, optimizer, 4)
        mon.flush()
        _assert_recorded_without_learning_rate(mon, 4)


def test_hugging_face_adafactor_with_relative_steps_is_monitored():
    optimization = pytest.importorskip("transformers.optimization")
    torch.manual_seed(0)
    model = TinyGPT()
    optimizer = optimization.Adafactor(
        model.parameters(), lr=None, relative_step=True, scale_parameter=True, warmup_init=True
    )
    with Monitor(model, optimizer, env={}, prometheus=False, otel=False, gpu_backend="off", stats_every=2) as mon:
        _train(mon, model, optimizer, 4)
        mon.flush()
        _assert_recorded_without_learning_rate(mon, 4)
        assert mon.store.value(catalog.TRAIN_UPDATE_RATIO) > 0  # the update is still measured around its step


def test_one_group_without_a_learning_rate_leaves_the_others():
    model = torch.nn.Sequential(torch.nn.Linear(3, 3), torch.nn.Linear(3, 1))
    optimizer = torch.optim.SGD([{"params": model[0].parameters()}, {"params": model[1].parameters()}], lr=0.1)
    optimizer.param_groups[1]["lr"] = torch.tensor(0.05)  # a tensor learning rate is read with the step
    with Monitor(model, optimizer, env={}, prometheus=False, otel=False, gpu_backend="off") as mon:
        model[1](torch.ones(2, 3)).sum().backward()  # group 0 has no gradient: SGD never reads its rate
        optimizer.param_groups[0]["lr"] = "warmup"  # as a misbehaving scheduler might leave it
        optimizer.step()  # the rates are read at the optimizer step, the one they apply to
        mon.step(loss=1.0)
        mon.flush()
        assert mon.latest.learning_rates == (None, pytest.approx(0.05))
        assert dict(mon.store.series(catalog.TRAIN_LEARNING_RATE)) == {("1",): pytest.approx(0.05)}
        assert _errors(mon, "learning_rate") == 1 and mon.latest.loss == 1.0


class NotATorchOptimizer:
    """An optimizer of another library: it steps the parameters but has neither param_groups nor step hooks."""

    def __init__(self, params) -> None:
        self.params = list(params)

    @torch.no_grad()
    def step(self) -> None:
        for p in self.params:
            p.add_(p.grad, alpha=-0.1)

    def zero_grad(self) -> None:
        for p in self.params:
            p.grad = None


def test_an_unexpected_optimizer_is_counted_and_the_model_still_monitored():
    torch.manual_seed(0)
    model = TinyGPT()
    optimizer = NotATorchOptimizer(model.parameters())
    with Monitor(model, optimizer, env={}, prometheus=False, otel=False, gpu_backend="off", stats_every=1) as mon:
        assert _errors(mon, "optimizer") == 1  # counted once, at construction
        for step in range(3):
            loss = lm_loss(model, step)
            loss.backward()
            optimizer.step()
            mon.step(loss=loss, tokens=8)  # before zero_grad: the gradients come from the model
            optimizer.zero_grad()
        mon.flush()
        assert mon.store.value(catalog.TRAIN_STEPS) == 3
        assert mon.latest.grad_norm > 0 and mon.latest.layers
        assert _errors(mon, "learning_rate") == 3 and _errors(mon, "monitor") == 0


def test_a_missing_gradient_is_skipped_and_counted_not_reported_as_zero():
    model = torch.nn.Linear(3, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    with Monitor(model, optimizer, env={}, prometheus=False, otel=False, gpu_backend="off", stats_every=1) as mon:
        optimizer.step()  # no backward: no parameter has a gradient
        mon.step(loss=2.0, tokens=4)
        model(torch.ones(1, 3)).sum().backward()
        optimizer.step()
        mon.step(loss=1.0, tokens=4)
        mon.flush()
        assert _errors(mon, "grad_norm") == 1
        assert mon.store.value(catalog.TRAIN_STEPS) == 2 and mon.store.value(catalog.TRAIN_TOKENS) == 8
        assert mon.latest.grad_norm > 0  # the next step, with gradients, is measured again


def test_a_failing_detector_leaves_the_metrics():
    mon = Monitor(torch.nn.Linear(2, 1), env={}, prometheus=False, otel=False, gpu_backend="off")

    def broken(*args, **kwargs):
        raise RuntimeError("detector bug")

    mon.detectors.observe = broken  # a data source that fails, as a detector bug would
    mon.step(loss=1.5)
    mon.step(loss=2.5)
    mon.close()
    assert mon.store.value(catalog.TRAIN_LOSS) == 2.5 and mon.store.value(catalog.TRAIN_STEPS) == 2
    assert _errors(mon, "detectors") >= 2
