"""One rank trained by a trainer with trainhealth's integration: the Hugging Face ``Trainer`` or an Accelerate loop.

Both run as their pages in docs/integrations.md show, on the gloo process group the worker
initialised (Accelerate, under both, finds it and keeps it):

* ``hf_trainer``: a tiny GPT-2 (``layers`` blocks, 64 wide, 16 tokens) under ``transformers.Trainer``
  with ``TrainhealthCallback(comm=True)``; the Trainer wraps the model in DDP itself. The lab's
  kernels are forward hooks on the decoder blocks (:func:`~trainhealth_lab.realrun.kernels.pace_blocks`)
  and an optimizer pre-step hook; a lab callback starts each step's pacing at ``on_step_begin``. The
  Monitor's step markers carry ``state.global_step``, one more than the lab's step index.
* ``accelerate``: the lab's paced MLP under ``Accelerator(log_with=[TrainhealthTracker(...)])``,
  ``accelerator.log`` once per step (Accelerate calls trackers on the main process only; the
  integration records every rank's steps itself).

Both integrations record DDP's bucket all-reduces (they instrument the DDP model the trainer
wraps), as the collective logger does under ``Monitor(comm=True)``.

The integrations are imported when a rank of their driver starts (:func:`integration`), as a user's
training script imports them (each imports its trainer, which the other drivers do not need).
"""

from __future__ import annotations

import time
from pathlib import Path
from types import ModuleType
from typing import Any

from trainhealth_lab.realrun.kernels import Clock, build_model, pace_blocks
from trainhealth_lab.realrun.rankfiles import StepLog
from trainhealth_lab.realrun.shapes import (
    MONITOR_SETTINGS,
    clock_for,
    default_topology,
    stall,
)
from trainhealth_lab.realrun.spec import CaseSpec, Driver

__all__ = ["GPT2_SIZE", "INTEGRATIONS", "integration", "train_with_trainer"]

#: The tiny GPT-2 of ``hf_trainer``: vocabulary, sequence length, width, heads.
GPT2_SIZE = (128, 16, 64, 2)
#: Each trainer driver's integration, by the import path users write (docs/integrations.md).
INTEGRATIONS = {
    Driver.HF_TRAINER: "trainhealth.integrations.huggingface",
    Driver.ACCELERATE: "trainhealth.integrations.accelerate",
}


def integration(driver: Driver) -> ModuleType:
    """The integration module a user of ``driver`` imports (it imports the trainer and checks its version, so it
    is imported only when that driver runs)."""
    if driver is Driver.HF_TRAINER:
        from trainhealth.integrations import huggingface

        return huggingface
    if driver is Driver.ACCELERATE:
        from trainhealth.integrations import accelerate

        return accelerate
    raise ValueError(f"driver {driver.value} is not a trainer's")


def train_with_trainer(torch: Any, dist: Any, spec: CaseSpec, rank: int, run_dir: Path) -> None:
    """Train one rank of ``spec`` (driver ``hf_trainer`` or ``accelerate``)."""
    if spec.driver is Driver.HF_TRAINER:
        _hf_trainer(torch, dist, spec, rank, run_dir)
    elif spec.driver is Driver.ACCELERATE:
        _accelerate(torch, dist, spec, rank, run_dir)
    else:
        raise ValueError(f"driver {spec.driver.value} is not a trainer's")


def _pace_optimizer(optimizer: Any, clock: Clock) -> None:
    """The optimizer's kernel, after the Monitor's hooks; the wait for DDP's buckets before it is not compute."""
    base = getattr(optimizer, "optimizer", optimizer)  # Accelerate's wrapper steps the torch optimizer

    def optimizer_kernel(*_: Any) -> None:
        clock.add_blocked(time.perf_counter() - clock.last_kernel_end)
        clock.kernel(clock.optimizer_s)

    base.register_step_pre_hook(optimizer_kernel)


def _hf_trainer(torch: Any, dist: Any, spec: CaseSpec, rank: int, run_dir: Path) -> None:
    import transformers

    TrainhealthCallback = integration(Driver.HF_TRAINER).TrainhealthCallback
    clock = clock_for(spec)
    vocab, length, width, heads = GPT2_SIZE
    torch.manual_seed(spec.seed)
    config = transformers.GPT2Config(
        vocab_size=vocab, n_positions=length, n_embd=width, n_layer=spec.layers, n_head=heads
    )
    model = transformers.GPT2LMHeadModel(config)
    pace_blocks(torch, model.transformer.h, clock)
    generator = torch.Generator().manual_seed(spec.seed)
    ids = torch.randint(0, vocab, (spec.steps * spec.batch * spec.ranks, length), generator=generator)
    data = [{"input_ids": row, "labels": row} for row in ids]
    args = transformers.TrainingArguments(
        output_dir=str(run_dir / "trainer"),
        per_device_train_batch_size=spec.batch,
        max_steps=spec.steps,
        learning_rate=1e-3,
        logging_steps=10,
        save_strategy="no",
        report_to=[],
        use_cpu=True,
        ddp_backend="gloo",
        disable_tqdm=True,
        dataloader_num_workers=0,
        dataloader_pin_memory=False,
        seed=spec.seed,
    )
    steps = StepLog(run_dir, rank, clock)

    class LabPacing(transformers.TrainerCallback):  # after trainhealth's callback: its Monitor hooks first
        def on_train_begin(self, args: Any, state: Any, control: Any, optimizer: Any = None, **kwargs: Any) -> None:
            _pace_optimizer(optimizer, clock)
            default_topology(dist, spec, rank, run_dir)

        def on_step_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            steps.begin(spec.work_factor(rank, state.global_step))
            stall(spec, rank, state.global_step, clock)

        def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            steps.end(state.global_step - 1)

    callbacks = [TrainhealthCallback(**MONITOR_SETTINGS), LabPacing()]
    trainer = transformers.Trainer(model=model, args=args, train_dataset=data, callbacks=callbacks)
    try:
        trainer.train()
    finally:
        steps.close()


def _accelerate(torch: Any, dist: Any, spec: CaseSpec, rank: int, run_dir: Path) -> None:
    from accelerate import Accelerator

    TrainhealthTracker = integration(Driver.ACCELERATE).TrainhealthTracker
    clock = clock_for(spec)
    torch.manual_seed(spec.seed)
    model = build_model(torch, spec, spec.layers, clock)
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
    tracker = TrainhealthTracker(model, optimizer, **MONITOR_SETTINGS)  # on every rank, before Accelerator(...)
    accelerator = Accelerator(cpu=True, log_with=[tracker])
    generator = torch.Generator().manual_seed(spec.seed)
    inputs = torch.randn(spec.steps * spec.batch * spec.ranks, spec.width, generator=generator)
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(inputs), batch_size=spec.batch)
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    accelerator.init_trackers("trainhealth-lab")
    _pace_optimizer(optimizer, clock)
    default_topology(dist, spec, rank, run_dir)
    steps = StepLog(run_dir, rank, clock)
    try:
        for step, (x,) in enumerate(loader):
            if step >= spec.steps:
                break
            steps.begin(spec.work_factor(rank, step))
            stall(spec, rank, step, clock)
            loss = model(x).pow(2).mean()
            accelerator.backward(loss)
            optimizer.step()
            optimizer.zero_grad()
            accelerator.log({"loss": loss.item(), "tokens": len(x)}, step=step)  # rank 0's tracker only
            steps.end(step)
    finally:
        steps.close()
        if not accelerator.is_main_process:
            tracker.finish()  # the main process's closes in end_training
        accelerator.end_training()
