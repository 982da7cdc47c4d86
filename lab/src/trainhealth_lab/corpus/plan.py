"""What each corpus run does: its model, seed, scenario, schedule, cause step and checkpoints.

The cause step is drawn from the run's seed within 40-70% of the run, well after warm-up. The runs
of one model and seed share their initial weights and data; scenario runs take the schedule of
``clean_cosine`` on even seeds and of ``clean_step`` on odd ones.

>>> [plan.run_id for plan in plan_runs(["mlp"], ["clean", "overflow"], [3], steps=1000)]
['mlp-clean_cosine-s3', 'mlp-clean_step-s3', 'mlp-overflow-s3']
>>> plan = plan_runs(["mlp"], ["bad_shard"], [3], steps=1000)[0]
>>> 400 <= plan.cause_step <= 700, plan.shard_end - plan.cause_step + 1, plan.schedule.kind
(True, 150, 'step')
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass

from trainhealth_lab.corpus.scenarios import CLEAN_VARIANTS
from trainhealth_lab.corpus.schedule import Schedule, draw_schedule
from trainhealth_lab.corpus.tasks import TASKS

__all__ = ["CAUSE_RANGE", "RunPlan", "plan_runs"]

#: Where the cause step falls, as fractions of the run.
CAUSE_RANGE = (0.4, 0.7)
SHARD_FRACTION = 0.15
CHECKPOINTS = 10  # per run


@dataclass(frozen=True)
class RunPlan:
    model: str
    scenario: str
    variant: str  # the scenario, or the clean variant
    seed: int
    steps: int
    schedule: Schedule
    checkpoint_every: int
    cause_step: int | None
    shard_end: int | None  # the last step of a bad shard

    @property
    def run_id(self) -> str:
        return f"{self.model}-{self.variant}-s{self.seed}"

    def is_checkpoint(self, step: int) -> bool:
        return (step + 1) % self.checkpoint_every == 0

    def shifted(self, step: int) -> bool:
        return self.cause_step is not None and self.shard_end is not None and self.cause_step <= step <= self.shard_end


def _plan(model: str, scenario: str, variant: str, seed: int, steps: int, schedule_kind: str) -> RunPlan:
    schedule = draw_schedule(schedule_kind, steps=steps, peak=TASKS[model].peak_lr, seed=f"{model}-{seed}")
    every = max(10, steps // CHECKPOINTS)
    if scenario == "clean":
        return RunPlan(model, scenario, variant, seed, steps, schedule, every, None, None)
    draw = random.Random(f"cause-{model}-{scenario}-{seed}")
    cause = draw.randint(round(CAUSE_RANGE[0] * steps), round(CAUSE_RANGE[1] * steps))
    shard_end = min(steps - 1, cause + round(SHARD_FRACTION * steps) - 1) if scenario == "bad_shard" else None
    return RunPlan(model, scenario, variant, seed, steps, schedule, every, cause, shard_end)


def plan_runs(models: Sequence[str], scenarios: Sequence[str], seeds: Sequence[int], *, steps: int) -> list[RunPlan]:
    """The runs for every model, seed and scenario ("clean" makes one run per clean variant)."""
    plans: list[RunPlan] = []
    for model in models:
        for seed in seeds:
            for scenario in scenarios:
                if scenario == "clean":
                    plans.extend(
                        _plan(model, scenario, variant, seed, steps, kind) for variant, kind in CLEAN_VARIANTS.items()
                    )
                else:
                    kind = list(CLEAN_VARIANTS.values())[seed % 2]
                    plans.append(_plan(model, scenario, scenario, seed, steps, kind))
    return plans
