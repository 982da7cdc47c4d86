"""Monitor on a real model trained on the CPU, read back through a real /metrics scrape.

Every exported value is compared with one computed here, independently of trainhealth.
"""

from __future__ import annotations

import math

import pytest
import torch

from tests.helpers import BATCH, SEQ, TinyGPT, expected_group, lm_loss, scrape
from trainhealth import Monitor
from trainhealth._internal import catalog

ENV = {
    "RANK": "1",
    "LOCAL_RANK": "1",
    "WORLD_SIZE": "2",
    "TORCHELASTIC_RUN_ID": "job-a",
    "NODE_NAME": "node-x",
}
SERVE = {"prometheus_addr": "127.0.0.1", "prometheus_port": 0, "otel": False}


def _param_groups(model: torch.nn.Module) -> list[dict]:
    decay = [p for n, p in model.named_parameters() if p.ndim >= 2]
    no_decay = [p for n, p in model.named_parameters() if p.ndim < 2]
    return [{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}]


def _group_norms(named: list[tuple[str, torch.Tensor]]) -> dict[str, float]:
    squares: dict[str, float] = {}
    for name, tensor in named:
        group = expected_group(name)
        squares[group] = squares.get(group, 0.0) + float(tensor.double().pow(2).sum())
    return {group: math.sqrt(total) for group, total in squares.items()}


def test_scraped_values_match_independent_computation():
    torch.manual_seed(0)
    model = TinyGPT()
    optimizer = torch.optim.AdamW(_param_groups(model), lr=1e-3)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0 / (1 + step))
    names = [name for name, _ in model.named_parameters()]
    steps, every = 9, 4  # heavy statistics at optimizer steps 0, 4 and 8: the last step is heavy
    with Monitor(model, optimizer, flops_per_token=1e6, peak_flops=1e9, stats_every=every, env=ENV, **SERVE) as mon:
        deltas: dict[int, list[torch.Tensor]] = {}
        for step in range(steps):
            loss = lm_loss(model, step)
            loss.backward()
            grads = [p.grad.detach().clone() for p in model.parameters()]
            before = [p.detach().clone() for p in model.parameters()]
            lrs = [group["lr"] for group in optimizer.param_groups]  # the rates this step applies
            optimizer.step()
            deltas[step] = [p.detach() - b for p, b in zip(model.parameters(), before)]
            optimizer.zero_grad()
            scheduler.step()
            mon.step(loss=loss, tokens=BATCH * SEQ)
        mon.flush()
        got = scrape(mon.metrics_url)
        assert lrs != [group["lr"] for group in optimizer.param_groups]  # the scheduler has moved on since

    assert got.status == 200
    assert got.value("trainhealth_train_loss") == pytest.approx(float(loss.detach()), rel=1e-6)
    expected_norm = float(torch.nn.utils.get_total_norm(grads))
    assert got.value("trainhealth_train_grad_norm") == pytest.approx(expected_norm, rel=1e-5)
    assert got.value("trainhealth_train_steps_total") == steps
    assert got.value("trainhealth_train_step") == steps - 1
    assert got.value("trainhealth_train_tokens_total") == steps * BATCH * SEQ
    for position, lr in enumerate(lrs):
        assert got.value("trainhealth_train_learning_rate", param_group=str(position)) == pytest.approx(lr)

    # step timing, throughput and MFU are consistent with each other
    assert got.value("trainhealth_train_step_duration_seconds_count") == steps - 1
    last = got.value("trainhealth_train_last_step_duration_seconds")
    assert 0 < last <= got.value("trainhealth_train_step_duration_seconds_sum")
    throughput = got.value("trainhealth_train_throughput_tokens_per_second")
    assert throughput == pytest.approx(BATCH * SEQ / last, rel=1e-9)
    assert got.value("trainhealth_train_mfu_ratio") == pytest.approx(throughput * 1e6 / 1e9, rel=1e-9)

    # per layer group, on the last (heavy) step
    grad_norms = _group_norms(list(zip(names, grads)))
    params_after = _group_norms([(n, p.detach()) for n, p in model.named_parameters()])
    updates = _group_norms(list(zip(names, deltas[steps - 1])))
    assert sorted(g["layer_group"] for g in got.labels_of("trainhealth_train_layer_grad_norm")) == sorted(grad_norms)
    for group, norm in grad_norms.items():
        assert got.value("trainhealth_train_layer_grad_norm", layer_group=group) == pytest.approx(norm, rel=1e-4)
        assert got.value("trainhealth_train_layer_param_norm", layer_group=group) == pytest.approx(
            params_after[group], rel=1e-4
        )
        ratio = updates[group] / params_after[group]
        assert got.value("trainhealth_train_layer_update_ratio", layer_group=group) == pytest.approx(ratio, rel=1e-3)
    total_update = math.sqrt(sum(v * v for v in updates.values()))
    total_param = math.sqrt(sum(v * v for v in params_after.values()))
    assert got.value("trainhealth_train_param_norm") == pytest.approx(total_param, rel=1e-4)
    assert got.value("trainhealth_train_update_ratio") == pytest.approx(total_update / total_param, rel=1e-3)
    now, previous = (torch.cat([d.reshape(-1) for d in deltas[s]]).double() for s in (steps - 1, steps - 2))
    cosine = float(now @ previous / (now.norm() * previous.norm()))
    assert got.value("trainhealth_train_update_cosine") == pytest.approx(cosine, abs=1e-3)


def test_identity_labels_and_rank_info():
    model = TinyGPT()
    with Monitor(model, env=ENV, **SERVE) as mon:
        mon.flush()
        got = scrape(mon.metrics_url)
    (info,) = got.labels_of("trainhealth_rank_info")
    assert info == {
        "job": "job-a",
        "host": "node-x",
        "rank": "1",
        "local_rank": "1",
        "world_size": "2",
        "gpu_uuid": "",
        "pod": "",
        "namespace": "",
        "job_name": "",  # the logical name (TRAINHEALTH_JOB): none given here
    }
    (build,) = got.labels_of("trainhealth_build_info")
    assert build["version"] and build["torch_version"] == torch.__version__
    for (name, labels), _ in got.samples().items():
        if name.startswith("trainhealth_"):
            assert dict(labels)["rank"] == "1", name


def test_caller_supplied_grad_norm_is_the_pre_clip_norm():
    torch.manual_seed(1)
    model = TinyGPT()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    with Monitor(model, optimizer, env={}, **SERVE) as mon:
        for step in range(3):
            lm_loss(model, step).backward()
            pre_clip = torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm=1e-3)
            optimizer.step()
            optimizer.zero_grad()
            mon.step(loss=1.0, grad_norm=pre_clip)
        mon.flush()
        got = scrape(mon.metrics_url)
    assert float(pre_clip) > 1e-2  # clipping was active, so the two norms differ
    assert got.value("trainhealth_train_grad_norm") == pytest.approx(float(pre_clip), rel=1e-6)
    assert mon.latest.grad_norm == pytest.approx(float(pre_clip), rel=1e-6)


def test_without_optimizer_the_gradients_are_read_at_step():
    torch.manual_seed(2)
    model = TinyGPT()
    with Monitor(model, stats_every=1, env={}, **SERVE) as mon:
        lm_loss(model, 0).backward()
        expected = float(torch.nn.utils.get_total_norm([p.grad for p in model.parameters()]))
        mon.step(loss=2.0)
        mon.flush()
        got = scrape(mon.metrics_url)
    assert got.value("trainhealth_train_grad_norm") == pytest.approx(expected, rel=1e-5)
    expected_params = _group_norms([(n, p.detach()) for n, p in model.named_parameters()])
    for group, norm in expected_params.items():
        assert got.value("trainhealth_train_layer_param_norm", layer_group=group) == pytest.approx(norm, rel=1e-4)
    assert got.labels_of("trainhealth_train_update_ratio") == []  # no optimizer, no update


def test_sparse_embedding_gradients_are_measured():
    torch.manual_seed(3)
    model = TinyGPT(sparse_embedding=True)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    with Monitor(model, optimizer, env={}, **SERVE) as mon:
        lm_loss(model, 0).backward()
        squares = sum(
            float((p.grad.coalesce().values() if p.grad.is_sparse else p.grad).double().pow(2).sum())
            for p in model.parameters()
        )
        optimizer.step()
        mon.step(loss=1.0)
        mon.flush()
        got = scrape(mon.metrics_url)
    assert got.value("trainhealth_train_grad_norm") == pytest.approx(math.sqrt(squares), rel=1e-5)
    assert got.labels_of("trainhealth_exporter_errors_total") == []


def test_nonfinite_loss_and_gradients_are_counted():
    model = torch.nn.Linear(3, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    with Monitor(model, optimizer, env={}, **SERVE) as mon:
        model(torch.ones(1, 3)).sum().backward()
        model.weight.grad[0, 0] = float("nan")
        optimizer.step()
        optimizer.zero_grad()
        mon.step(loss=float("inf"))
        model(torch.ones(1, 3)).sum().backward()
        optimizer.step()
        mon.step(loss=float("nan"))
        mon.flush()
        got = scrape(mon.metrics_url)
    assert got.value("trainhealth_train_nonfinite_steps_total", signal="loss") == 2
    # only the first step had a NaN gradient (a linear layer's weight gradient is its input)
    assert got.value("trainhealth_train_nonfinite_steps_total", signal="grad_norm") == 1
    assert math.isnan(got.value("trainhealth_train_loss"))


def test_close_is_idempotent_and_stops_serving():
    mon = Monitor(torch.nn.Linear(2, 2), env={}, **SERVE)
    url = mon.metrics_url
    assert scrape(url).status == 200
    mon.close()
    mon.close()
    mon.step(loss=1.0)  # after close: ignored, no error
    with pytest.raises(OSError):
        scrape(url)


def test_a_one_layer_model_records_every_step_under_its_own_group_label():
    model = torch.nn.Sequential(torch.nn.Linear(4, 1))  # one layer group: "0"
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.5)
    applied = []
    with Monitor(model, optimizer, stats_every=2, env=ENV, prometheus=False, otel=False) as mon:
        for step in range(6):
            model(torch.randn(8, 4)).pow(2).mean().backward()
            applied.append(optimizer.param_groups[0]["lr"])
            optimizer.step()
            optimizer.zero_grad()
            scheduler.step()  # before Monitor.step, as Lightning and Hugging Face do
            mon.step(step=step)
            mon.flush()
            assert mon.latest.learning_rates == (pytest.approx(applied[-1]),)
        assert mon.store.value(catalog.TRAIN_STEPS) == 6
        assert mon.store.value(catalog.EXPORTER_ERRORS, ("monitor",)) is None
        assert [labels for labels, _ in mon.store.series(catalog.TRAIN_LAYER_GRAD_NORM)] == [("0",)]
