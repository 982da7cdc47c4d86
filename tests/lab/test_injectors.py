"""Fault injectors on a real model: what they change, when, and the ground truth they write."""

from __future__ import annotations

import json
import math
import time

import pytest
import torch

from trainhealth._internal.events import EventLog
from trainhealth._internal.injectors.bits import flip_bits, float_layout, resolve_bit
from trainhealth._internal.injectors.schedule import Injector, ScheduleError, load_schedule


def _model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))


@pytest.mark.parametrize(
    "dtype, bit, field",
    [
        (torch.float32, 31, "sign"),
        (torch.float32, 30, "exponent-high"),
        (torch.float32, 22, "mantissa-high"),
        (torch.float64, 62, "exponent-high"),
        (torch.float16, 14, "exponent-high"),
        (torch.bfloat16, 14, "exponent-high"),
    ],
)
def test_bit_fields_and_flips_match_ieee_754(dtype, bit, field):
    layout = float_layout(dtype)
    assert resolve_bit(field, layout, lambda choices: choices[0]) == bit
    tensor = torch.tensor([0.75, -3.0], dtype=dtype)
    original = tensor.clone()
    ((index, before, after),) = flip_bits(tensor, [0], bit)
    assert index == 0
    assert before == 0.75 and after == tensor[0].item() != 0.75
    flip_bits(tensor, [0], bit)  # flipping twice restores the value exactly
    assert torch.equal(tensor, original)
    if field == "sign":
        assert after == -0.75


def test_a_parameter_flip_changes_exactly_the_logged_elements(tmp_path):
    model = _model()
    before = {name: p.detach().clone() for name, p in model.named_parameters()}
    truth = tmp_path / "faults.jsonl"
    events = EventLog(logger=None)
    injector = Injector(
        [
            {
                "kind": "bitflip",
                "target": "parameter",
                "tensor": "2.weight",
                "bit": "exponent-high",
                "count": 3,
                "step": 5,
                "ranks": [0],
            }
        ],
        model=model,
        rank=0,
        ground_truth=truth,
        events=events,
    )
    for step in range(5):
        injector.begin_step(step)
    assert all(torch.equal(p, before[n]) for n, p in model.named_parameters())
    injector.begin_step(5)
    (entry,) = [json.loads(line) for line in truth.read_text().splitlines()]
    assert entry["step"] == 5 and entry["rank"] == 0 and entry["tensor"] == "2.weight" and entry["bit"] == 30
    changed = (model[2].weight.detach().view(-1) != before["2.weight"].view(-1)).nonzero().flatten().tolist()
    assert sorted(changed) == sorted(index for index, _, _ in entry["changes"])
    assert [e.name for e in events.recent()] == ["fault_injected"]


def test_other_ranks_and_steps_are_left_alone():
    model = _model()
    injector = Injector(
        [{"kind": "nan", "target": "parameter", "tensor": "0.bias", "step": 1, "ranks": [3]}], model=model, rank=1
    )
    for step in range(4):
        injector.begin_step(step)
    assert injector.log == [] and torch.isfinite(model[0].bias).all()


def test_gradient_faults_hit_the_gradient_before_the_optimizer_sees_it():
    model = _model()
    injector = Injector([{"kind": "inf", "target": "gradient", "tensor": "2.bias", "step": 0}], model=model, rank=0)
    injector.begin_step(0)
    model(torch.randn(4, 8)).sum().backward()
    assert torch.isinf(model[2].bias.grad).sum() == 1 and torch.isfinite(model[0].weight.grad).all()
    model.zero_grad()
    injector.begin_step(1)  # the hook is gone after its step
    model(torch.randn(4, 8)).sum().backward()
    assert torch.isfinite(model[2].bias.grad).all()


def test_activation_faults_corrupt_a_module_output():
    model = _model()
    injector = Injector(
        [{"kind": "nan", "target": "activation", "tensor": "1", "step": 2, "count": 2}], model=model, rank=0
    )
    injector.begin_step(2)
    out = model(torch.randn(4, 8))
    assert torch.isnan(out).any()
    assert injector.log[0]["tensor"] == "1" and injector.log[0]["target"] == "activation"


def test_activation_faults_reach_a_transposed_output_before_the_modules_other_hooks():
    torch.manual_seed(0)
    model = torch.nn.ModuleDict({"attn": torch.nn.MultiheadAttention(8, 2, batch_first=True)})
    seen = []
    model["attn"].register_forward_hook(lambda module, inputs, output: seen.append(int(output[0].isnan().sum())))
    injector = Injector([{"kind": "nan", "target": "activation", "tensor": "attn", "step": 0}], model=model, rank=0)
    injector.begin_step(0)
    x = torch.randn(2, 5, 8)
    out, _ = model["attn"](x, x, x, need_weights=False)
    # the attention output is a transposed view: the NaN goes into a contiguous copy that replaces it
    assert int(out.isnan().sum()) == 1 and seen == [1]


def test_learning_rate_and_delay_faults_undo_themselves():
    model = _model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    injector = Injector(
        [{"kind": "lr_scale", "severity": 100.0, "step": 3}, {"kind": "delay", "severity": 0.05, "step": 4}],
        model=model,
        optimizer=optimizer,
        rank=0,
    )
    injector.begin_step(3)
    assert optimizer.param_groups[0]["lr"] == pytest.approx(10.0)
    began = time.perf_counter()
    injector.begin_step(4)
    assert time.perf_counter() - began >= 0.05
    assert optimizer.param_groups[0]["lr"] == pytest.approx(0.1)
    assert [e["kind"] for e in injector.log] == ["lr_scale", "delay"]


def test_schedules_from_yaml_and_their_errors(tmp_path):
    good = tmp_path / "faults.yaml"
    good.write_text(
        "faults:\n  - {kind: bitflip, target: gradient, tensor: '*', bit: 3, step: 10, until: 12, ranks: 1}\n"
    )
    (spec,) = load_schedule(good)
    assert (spec.kind, spec.step, spec.until, spec.ranks, spec.params["bit"]) == ("bitflip", 10, 12, (1,), 3)
    for text, message in (
        ("- {kind: meteor, step: 1}", "kind must be one of"),
        ("- {kind: nan, target: weights, step: 1}", "target must be one of"),
        ("- {kind: delay, step: 1}", "severity is required (above 0 up to 3600)"),
        ("- {kind: delay, step: 1, severity: 0}", "severity must be above 0 up to 3600, got 0.0"),
        ("- {kind: delay, seconds: 1, step: 1}", "unknown field(s) seconds (seconds is now severity)"),
        ("- {kind: gpu, fault: xid, step: 1}", "got 'gpu' (kind gpu is now simulated_gpu)"),
        ("- {kind: nan, step: 1, ranks: []}", "ranks must name at least one rank"),
        ("- {kind: nan, step: 1, colour: red}", "unknown field(s) colour"),
        ("- {kind: nan}", "step is required"),
    ):
        bad = tmp_path / "bad.yaml"
        bad.write_text(text)
        with pytest.raises(ScheduleError, match=message.replace("(", r"\(").replace(")", r"\)")):
            load_schedule(bad)
    with pytest.raises(ScheduleError, match="need the model"):
        Injector([{"kind": "nan", "step": 1}], rank=0)


def test_bit_positions_differ_in_damage():
    value = torch.tensor([0.5])
    flip_bits(value, [0], 0)
    assert value.item() == pytest.approx(0.5, rel=1e-6)  # the last place
    value = torch.tensor([0.5])
    flip_bits(value, [0], 30)
    assert value.item() > 1e37 and math.isfinite(value.item())  # the exponent's top bit


def test_a_collective_delay_lands_inside_the_recorded_collectives_and_leaves_with_close():
    # the logger checks no field for it: the injector records torch.distributed again around sleeping originals
    import torch.distributed as dist

    import trainhealth.comm
    from tests.distributed import free_port, init_rank

    init_rank(0, 1, free_port())
    logger = trainhealth.comm.install()
    recorded = dist.all_reduce
    try:
        ddp = torch.nn.parallel.DistributedDataParallel(_model())
        trainhealth.comm.instrument_ddp(ddp)
        injector = Injector([{"kind": "collective_delay", "severity": 0.05, "step": 1}], rank=0)
        for step in range(3):
            injector.begin_step(step)
            dist.all_reduce(torch.ones(2))
            ddp(torch.ones(2, 8)).sum().backward()
        injector.close()
        assert dist.all_reduce is recorded  # the logger's own wrapper again
        logger.flush()
        rows = logger.records()
        rows = rows[rows["op"] == "all_reduce"]
        slow = rows[rows["duration"] >= 0.05]
        # step 1's explicit all-reduce and its DDP bucket, nothing else; numbered on as before (no gap, no repeat)
        assert len(slow) == 2 and set(slow["step"]) <= {0, 1}, rows
        for _, by_group in rows.groupby("group"):
            assert list(by_group["seq"]) == list(
                range(by_group["seq"].iloc[0], by_group["seq"].iloc[0] + len(by_group))
            )
    finally:
        trainhealth.comm.uninstall()
        dist.destroy_process_group()
