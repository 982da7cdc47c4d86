"""Nothing the Monitor does on the training path raises into the training loop; failures are counted."""

from __future__ import annotations

import pytest
import torch

from tests.helpers import TinyGPT, lm_loss
from trainhealth import ConfigError, Monitor, catalog


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


@pytest.mark.parametrize("bad_step", [
    {"loss": object()},
    {"loss": torch.ones(3)},
    {"loss": 1.0, "tokens": -5},
    {"loss": 1.0, "grad_norm": "large"},
])
def test_bad_step_arguments_are_counted_not_raised(bad_step):
    mon = Monitor(torch.nn.Linear(2, 1), env={}, prometheus=False, otel=False)
    mon.step(**bad_step)
    assert _errors(mon, "monitor") == 1
    mon.step(loss=3.0, tokens=4)
    mon.close()
    assert mon.latest.loss == 3.0 and mon.latest.tokens == 4


@pytest.mark.parametrize("kwargs, setting", [
    ({"stats_every": 0}, "stats_every"),
    ({"peak_flops": -1.0}, "peak_flops"),
    ({"prometheus_port": 70000}, "prometheus_port"),
    ({"tls_certfile": "/nonexistent/cert.pem", "tls_keyfile": "/nonexistent/key.pem"}, "tls_certfile"),
    ({"statsevery": 5}, "statsevery"),
])
def test_configuration_mistakes_fail_at_construction(kwargs, setting):
    with pytest.raises(ConfigError) as error:
        Monitor(torch.nn.Linear(2, 1), env={}, otel=False, **kwargs)
    assert error.value.setting == setting
    assert str(error.value).startswith(setting)


def test_an_invalid_environment_variable_fails_at_construction():
    with pytest.raises(ConfigError, match=r"^stats_every \(TRAINHEALTH_STATS_EVERY\): expected an integer, got 'often'$"):
        Monitor(torch.nn.Linear(2, 1), env={"TRAINHEALTH_STATS_EVERY": "often"})
