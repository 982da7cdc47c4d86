"""One corpus run: real training (autograd, AdamW, the run's schedule, gradient clipping at 1.0,
checkpoints with ``torch.save``) with the scenario's cause applied at its cause step.

Each step records the loss, the gradient norm before clipping, the learning rate and the measured step
time (data, forward, backward, optimizer step and any checkpoint). As mixed-precision trainers do, the
optimizer step is skipped when the gradient norm is not finite.

Small models train fastest on one thread (the corpus runs each in a process of its own):

>>> from trainhealth_lab.corpus.plan import plan_runs
>>> [plan] = plan_runs(["mlp"], ["overflow"], [0], steps=100)
>>> threads = torch.get_num_threads(); torch.set_num_threads(1)
>>> result = train(plan)
>>> torch.set_num_threads(threads)
>>> len(result.signals), bool(result.signals["loss"].iloc[0] > result.signals["loss"].iloc[-1])
(100, True)
>>> import math; math.isnan(result.signals["loss"].iloc[plan.cause_step])
True
"""

from __future__ import annotations

import dataclasses
import math
import random
import tempfile
import time
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from trainhealth_lab.corpus.injections import flip_exponent_bit, float16_overflow, lr_factor, zero_moments
from trainhealth_lab.corpus.plan import RunPlan
from trainhealth_lab.corpus.tasks import TASKS

__all__ = ["RunResult", "train"]

CLIP = 1.0
WEIGHT_DECAY = 0.01


@dataclass(frozen=True)
class RunResult:
    signals: Any  # pandas.DataFrame with the columns of store.SIGNALS_COLUMNS
    injection: dict[str, Any]  # what the cause did (a flipped value, ...); empty for clean runs


def train(plan: RunPlan) -> RunResult:
    """Train ``plan``'s model for ``plan.steps`` steps and return the signals of every step."""
    import pandas as pd

    task = TASKS[plan.model]
    model = task.model(plan.seed)
    parameters = [parameter for parameter in model.parameters() if parameter.requires_grad]
    optimizer = torch.optim.AdamW(parameters, lr=plan.schedule.lr(0), weight_decay=WEIGHT_DECAY)
    data = torch.Generator().manual_seed(plan.seed)
    injection_data = torch.Generator().manual_seed(plan.seed + 1)
    draw = random.Random(f"injection-{plan.run_id}")
    injection: dict[str, Any] = {}
    rows = []
    with tempfile.TemporaryDirectory(prefix="trainhealth-corpus-") as scratch:
        checkpoint = Path(scratch) / "checkpoint.pt"
        for step in range(plan.steps):
            started = time.perf_counter()
            cause = step == plan.cause_step
            lr = plan.schedule.lr(step) * lr_factor(plan.scenario, cause_step=plan.cause_step, step=step)
            for group in optimizer.param_groups:
                group["lr"] = lr
            batch = task.batch(data, seed=plan.seed, shifted=plan.shifted(step))
            if cause and plan.scenario == "corrupted_batch":
                batch = task.corrupt(batch, injection_data)
            if cause and plan.scenario == "bit_flip_param":
                injection = dataclasses.asdict(flip_exponent_bit(parameters, draw))
            if cause and plan.scenario == "optimizer_reset":
                zero_moments(optimizer)
            overflow: AbstractContextManager[None] = (
                float16_overflow(task.output_layer(model)) if cause and plan.scenario == "overflow" else nullcontext()
            )
            with overflow:
                loss = task.loss(model, batch)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            if cause and plan.scenario == "bit_flip_grad":
                grads = [parameter.grad for parameter in parameters if parameter.grad is not None]
                injection = dataclasses.asdict(flip_exponent_bit(grads, draw))
            grad_norm = float(torch.nn.utils.clip_grad_norm_(parameters, CLIP))
            if math.isfinite(grad_norm):
                optimizer.step()
            if plan.is_checkpoint(step):
                torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict()}, checkpoint)
            rows.append((step, loss.item(), grad_norm, lr, time.perf_counter() - started))
    signals = pd.DataFrame(rows, columns=["step", "loss", "grad_norm", "lr", "step_time"])
    return RunResult(signals, injection)
