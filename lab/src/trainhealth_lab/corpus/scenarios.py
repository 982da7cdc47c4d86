"""The scenarios of the corpus: what is done to a run at its cause step, and which kind of event it makes.

>>> SCENARIOS["lr_divergence"].kind.value, SCENARIOS["overflow"].kind.value
('divergence', 'sharp')
>>> CLEAN_VARIANTS
{'clean_cosine': 'cosine_restart', 'clean_step': 'step'}
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

__all__ = ["CLEAN_VARIANTS", "SCENARIOS", "EventKind", "Scenario"]


class EventKind(str, Enum):
    """How an event shows in the signals: none, a sharp change, a slow divergence, a level shift."""

    NONE = "none"
    SHARP = "sharp"
    DIVERGENCE = "divergence"
    SHIFT = "shift"


@dataclass(frozen=True)
class Scenario:
    name: str
    kind: EventKind
    cause: str


SCENARIOS = {
    scenario.name: scenario
    for scenario in (
        Scenario("clean", EventKind.NONE, "nothing: warm-up, schedule changes and checkpoints only"),
        Scenario(
            "lr_divergence", EventKind.DIVERGENCE, "learning rate multiplied by 1.03 every step from the cause step"
        ),
        Scenario("lr_blowup", EventKind.SHARP, "learning rate multiplied by 100 from the cause step"),
        Scenario("corrupted_batch", EventKind.SHARP, "one batch of random tokens, or of inputs x10 with random labels"),
        Scenario("bad_shard", EventKind.SHIFT, "data from a shifted distribution for 15% of the run"),
        Scenario("overflow", EventKind.SHARP, "one forward under float16 autocast with the output layer's input x3e4"),
        Scenario("bit_flip_param", EventKind.SHARP, "an exponent bit of one parameter element flipped"),
        Scenario("bit_flip_grad", EventKind.SHARP, "an exponent bit of one gradient element flipped"),
        Scenario(
            "optimizer_reset",
            EventKind.SHIFT,
            "the optimizer's moments zeroed, its step count kept (a partial checkpoint restore)",
        ),
    )
}

#: The clean runs made per model and seed ("clean" in ``--scenarios``), and their schedules.
CLEAN_VARIANTS = {"clean_cosine": "cosine_restart", "clean_step": "step"}
