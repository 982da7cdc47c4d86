"""The causes, applied to the real run at its cause step: learning-rate changes, a float16 overflow, bit flips.

>>> lr_factor("lr_blowup", cause_step=10, step=9), lr_factor("lr_blowup", cause_step=10, step=10)
(1.0, 100.0)
>>> round(lr_factor("lr_divergence", cause_step=10, step=110), 1)  # 1.03 ** 100
19.2
>>> import random, torch
>>> flip = flip_exponent_bit([torch.full((4,), 0.1)], random.Random(0))
>>> flip.bit, flip.after > 1e30
(30, True)
>>> weight = torch.nn.Parameter(torch.ones(3))
>>> adam = torch.optim.AdamW([weight])
>>> weight.sum().backward(); adam.step(); zero_moments(adam)
>>> state = adam.state[weight]; int(state["step"]), float(state["exp_avg"].abs().sum())
(1, 0.0)
"""

from __future__ import annotations

import random
import struct
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch

from trainhealth._internal.injectors.bits import flip_bits

__all__ = [
    "BLOWUP_FACTOR",
    "DIVERGENCE_GROWTH",
    "OVERFLOW_SCALE",
    "BitFlip",
    "flip_exponent_bit",
    "float16_overflow",
    "lr_factor",
    "zero_moments",
]

DIVERGENCE_GROWTH = 1.03  # per step
BLOWUP_FACTOR = 100.0
OVERFLOW_SCALE = 3e4
_HIGH_EXPONENT_BITS = range(26, 31)  # float32: flipping one of these from 0 to 1 multiplies by 2**8 .. 2**128


@dataclass(frozen=True)
class BitFlip:
    tensor: int  # index in the sequence given
    element: int  # flat index
    bit: int
    before: float
    after: float


def lr_factor(scenario: str, *, cause_step: int | None, step: int) -> float:
    """The factor on the scheduled learning rate at ``step``."""
    if cause_step is None or step < cause_step:
        return 1.0
    if scenario == "lr_divergence":
        return float(DIVERGENCE_GROWTH ** (step - cause_step))
    return BLOWUP_FACTOR if scenario == "lr_blowup" else 1.0


def _zero_bits(value: float) -> list[int]:
    (bits,) = struct.unpack("<I", struct.pack("<f", value))
    return [bit for bit in _HIGH_EXPONENT_BITS if not bits >> bit & 1]


def flip_exponent_bit(tensors: Sequence[torch.Tensor], draw: random.Random) -> BitFlip:
    """Flip a high exponent bit that is 0 (so the value grows, by 2**8 up to 2**128) of one element,
    drawn with probability proportional to the tensors' sizes."""
    (index,) = draw.choices(range(len(tensors)), weights=[tensor.numel() for tensor in tensors])
    element = draw.randrange(tensors[index].numel())
    value = float(tensors[index].detach().view(-1)[element])
    bit = draw.choice(_zero_bits(value) or [30])
    [(_, before, after)] = flip_bits(tensors[index], [element], bit)
    return BitFlip(index, element, bit, before, after)


def zero_moments(optimizer: torch.optim.Optimizer) -> None:
    """Zero Adam's moment estimates and keep its step count, as a partial checkpoint restore leaves them:
    without the bias correction of a fresh start, the next updates are several times their usual size."""
    for state in optimizer.state.values():
        for moment in ("exp_avg", "exp_avg_sq"):
            state[moment].zero_()


@contextmanager
def float16_overflow(layer: torch.nn.Module) -> Iterator[None]:
    """Run the forward under float16 autocast with ``layer``'s input scaled by :data:`OVERFLOW_SCALE`:
    the activations pass float16's largest value (65504) and the output becomes inf/NaN."""

    def scale(_module: torch.nn.Module, inputs: tuple[Any, ...]) -> tuple[Any, ...]:
        return (inputs[0] * OVERFLOW_SCALE, *inputs[1:])

    handle = layer.register_forward_pre_hook(scale)
    try:
        with torch.autocast("cpu", dtype=torch.float16):
            yield
    finally:
        handle.remove()
