"""The collective trace of the Trainer callback and the Accelerate tracker, on two real gloo ranks.

Both trainers wrap the model in DistributedDataParallel themselves, after the integration made its
Monitor, so the integrations register the collective logger's DDP hook once they meet the wrapper:
the trace must hold DDP's bucket all-reduces (before, the Trainer's trace had only its own tiny
``all_gather`` per step, and a straggler's peers' wait in the buckets counted as compute). Each rank
records its own steps (Accelerate calls ``log`` on rank 0 only), and the rows of one optimizer step
carry the number of its ``step`` marker from the first step on.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import torch

from tests.distributed import init_rank, run_ranks
from trainhealth._internal import catalog
from trainhealth.traces import read_trace

pytestmark = pytest.mark.slow  # the slow tier: `pytest -m slow`

STEPS, SLOW_RANK, SLOW_S = 6, 1, 0.2
MONITOR = {
    "comm": True,
    "prometheus": False,
    "otel": False,
    "gpu_backend": "off",
    "model_signals": False,
    "sdc_interval": 0,
    "grad_check_every": 0,
    "detectors": "off",
    "env": {},
}


def _slow_forward(module: torch.nn.Module, rank: int) -> None:
    """The straggler: its forward passes take SLOW_S longer, so its peers wait for it in DDP's buckets."""
    if rank == SLOW_RANK:
        module.register_forward_hook(lambda *_: time.sleep(SLOW_S))


def _hf_rank(rank: int, world: int, port: int, out: str) -> None:
    import transformers

    from trainhealth.integrations.huggingface import TrainhealthCallback

    init_rank(rank, world, port)
    config = transformers.GPT2Config(vocab_size=64, n_positions=16, n_embd=16, n_layer=2, n_head=2)
    torch.manual_seed(0)
    model = transformers.GPT2LMHeadModel(config)
    _slow_forward(model, rank)
    ids = torch.randint(0, 64, (STEPS * 2 * world, 16), generator=torch.Generator().manual_seed(1))
    args = transformers.TrainingArguments(
        output_dir=str(Path(out) / f"trainer-{rank}"),
        per_device_train_batch_size=2,
        max_steps=STEPS,
        logging_steps=100,
        save_strategy="no",
        report_to=[],
        use_cpu=True,
        ddp_backend="gloo",
        disable_tqdm=True,
        dataloader_num_workers=0,
        dataloader_pin_memory=False,
    )
    callback = TrainhealthCallback(trace_dir=out, **MONITOR)
    trainer = transformers.Trainer(
        model=model, args=args, train_dataset=[{"input_ids": r, "labels": r} for r in ids], callbacks=[callback]
    )
    trainer.train()


def _accelerate_rank(rank: int, world: int, port: int, out: str) -> None:
    import accelerate

    from trainhealth.integrations.accelerate import TrainhealthTracker

    init_rank(rank, world, port)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(32, 256), torch.nn.ReLU(), torch.nn.Linear(256, 1))
    _slow_forward(model, rank)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    tracker = TrainhealthTracker(model, optimizer, trace_dir=out, **MONITOR)
    accelerator = accelerate.Accelerator(cpu=True, log_with=[tracker])
    model, optimizer = accelerator.prepare(model, optimizer)
    assert isinstance(model, torch.nn.parallel.DistributedDataParallel)
    accelerator.init_trackers("trainhealth-test")
    data = torch.Generator().manual_seed(rank)
    for step in range(STEPS):
        loss = model(torch.randn(8, 32, generator=data)).pow(2).mean()
        accelerator.backward(loss)
        optimizer.step()
        optimizer.zero_grad()
        accelerator.log({"loss": loss.item(), "tokens": 8}, step=step)  # runs on rank 0 only
    if not accelerator.is_main_process:
        tracker.finish()
    accelerator.end_training()


def _records(out: Path):
    return read_trace([out]).records


def _buckets(records):
    return records[(records["op"] == "all_reduce") & records["async"]]


def _assert_rows_numbered_like_markers(records, first_step: int) -> None:
    """Per rank: one marker per step, and that step's forward and optimizer rows carry its number."""
    steps = list(range(first_step, first_step + STEPS))
    for rank in (0, 1):
        mine = records[records["rank"] == rank]
        assert sorted(mine[mine["op"] == "step"]["step"]) == steps, (rank, mine[mine["op"] == "step"]["step"].tolist())
        for op in ("forward", "optimizer"):
            rows = mine[mine["op"] == op]
            assert sorted(rows["step"]) == steps, (rank, op, rows["step"].tolist())


def _assert_ddp_buckets(records, first_step: int) -> None:
    """DDP's bucket all-reduces on both ranks in every step, and the straggler's peer waiting in them."""
    steps = list(range(first_step, first_step + STEPS))
    buckets = _buckets(records)
    for rank in (0, 1):
        per_step = buckets[buckets["rank"] == rank].groupby("step").size()
        assert list(per_step.index) == steps and per_step.nunique() == 1, (rank, per_step.to_dict())
    assert (buckets.groupby(["group", "seq"])["rank"].nunique() == 2).all()
    # the peer waits for the straggler inside the buckets: collective time, no longer counted as compute
    waited = buckets[buckets["step"] > first_step].groupby(["rank", "step"])["duration"].sum().groupby("rank").median()
    assert waited[1 - SLOW_RANK] > SLOW_S / 2 > waited[SLOW_RANK], waited.to_dict()


@pytest.fixture(scope="module")
def trainer_trace(tmp_path_factory):
    pytest.importorskip("transformers")
    out = tmp_path_factory.mktemp("hf-trace")
    run_ranks(_hf_rank, 2, str(out), timeout_s=240)  # the step loop is the Trainer's: not read
    return _records(out)


@pytest.fixture(scope="module")
def accelerate_trace(tmp_path_factory):
    pytest.importorskip("accelerate")
    out = tmp_path_factory.mktemp("accelerate-trace")
    run_ranks(_accelerate_rank, 2, str(out), steps=STEPS)
    return _records(out)


def test_trainer_trace_has_ddp_bucket_all_reduces(trainer_trace):
    _assert_ddp_buckets(trainer_trace, first_step=1)


def test_trainer_rows_carry_their_markers_step_from_the_first_step(trainer_trace):
    _assert_rows_numbered_like_markers(trainer_trace, first_step=1)  # the Trainer's global_step: 1 first
    gathers = trainer_trace[(trainer_trace["op"] == "all_gather") & (trainer_trace["step"] <= STEPS)]
    assert gathers["step"].min() == 1  # the Trainer's own all_gather of the first step carries its number


def test_accelerate_trace_has_ddp_bucket_all_reduces(accelerate_trace):
    _assert_ddp_buckets(accelerate_trace, first_step=0)


def test_accelerate_every_rank_records_its_own_steps(accelerate_trace):
    _assert_rows_numbered_like_markers(accelerate_trace, first_step=0)  # the numbers accelerator.log was given


@pytest.mark.parametrize("log_before_step", [False, True], ids=["log-after-optimizer-step", "log-before-it"])
def test_accelerate_one_marker_per_optimizer_step_wherever_the_loop_logs(tmp_path, log_before_step):
    """One process: a loop logging after ``optimizer.step()`` or before it records each step once."""
    accelerate = pytest.importorskip("accelerate")
    from accelerate.state import AcceleratorState

    import trainhealth.comm
    from trainhealth.integrations.accelerate import TrainhealthTracker

    AcceleratorState._reset_state(reset_partial_state=True)
    try:
        model = torch.nn.Linear(4, 1)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
        tracker = TrainhealthTracker(model, optimizer, trace_dir=str(tmp_path), **MONITOR)
        accelerator = accelerate.Accelerator(cpu=True, log_with=[tracker])
        model, optimizer = accelerator.prepare(model, optimizer)
        accelerator.init_trackers("trainhealth-test")
        for step in range(STEPS):
            loss = model(torch.randn(2, 4)).pow(2).mean()
            accelerator.backward(loss)
            if log_before_step:
                accelerator.log({"loss": loss.item()}, step=step)
            optimizer.step()
            optimizer.zero_grad()
            if not log_before_step:
                accelerator.log({"loss": loss.item()}, step=step)
        accelerator.end_training()
    finally:
        AcceleratorState._reset_state(reset_partial_state=True)
    assert trainhealth.comm.installed() is None  # the Monitor owned the logger and wrote the trace
    records = _records(tmp_path)
    assert sorted(records[records["op"] == "step"]["step"]) == list(range(STEPS))
    assert tracker.monitor.store.value(catalog.TRAIN_STEPS) == STEPS
