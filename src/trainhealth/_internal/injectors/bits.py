"""Bit-level corruption of floating-point tensors, the way faulty hardware does it.

A bit is named by its index (0 = the mantissa's lowest bit) or by its field:
``sign``, ``exponent`` (any exponent bit), ``exponent-high`` (the exponent's top
bit: the value becomes huge or tiny), ``mantissa`` (any mantissa bit),
``mantissa-high`` (its top bit: the value changes by up to 50%) and
``mantissa-low`` (its bottom bit: a change in the last place).

>>> import torch
>>> t = torch.tensor([1.0, 0.5, 3.0])
>>> flip_bits(t, indices=[1], bit=30)  # float32 bit 30 is the exponent's top bit
[(1, 0.5, 1.7014118346046923e+38)]
>>> flip_bits(t, indices=[0], bit=22)  # the mantissa's top bit
[(0, 1.0, 1.5)]
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

__all__ = ["BIT_FIELDS", "FloatLayout", "flip_bits", "float_layout", "resolve_bit", "set_values"]

BIT_FIELDS = ("sign", "exponent", "exponent-high", "mantissa", "mantissa-high", "mantissa-low")


@dataclass(frozen=True)
class FloatLayout:
    """How a floating-point type lays out its bits, and the integer type of the same width."""

    bits: int
    mantissa: int  # mantissa bits: 0 .. mantissa-1
    integer: Any  # torch integer dtype of the same width

    @property
    def exponent(self) -> range:
        return range(self.mantissa, self.bits - 1)


def float_layout(dtype: Any) -> FloatLayout:
    """The bit layout of a torch floating-point dtype."""
    import torch

    layouts = {
        torch.float32: FloatLayout(32, 23, torch.int32),
        torch.float64: FloatLayout(64, 52, torch.int64),
        torch.float16: FloatLayout(16, 10, torch.int16),
        torch.bfloat16: FloatLayout(16, 7, torch.int16),
    }
    if dtype not in layouts:
        raise ValueError(f"cannot flip bits of {dtype}: only float16, bfloat16, float32 and float64 tensors")
    return layouts[dtype]


def resolve_bit(bit: int | str, layout: FloatLayout, choose: Any) -> int:
    """The bit index for ``bit`` (an index or a field name); ``choose(seq)`` picks within a field."""
    if isinstance(bit, int):
        if not 0 <= bit < layout.bits:
            raise ValueError(f"bit {bit} is outside a {layout.bits}-bit float")
        return bit
    fields = {
        "sign": [layout.bits - 1],
        "exponent": list(layout.exponent),
        "exponent-high": [layout.bits - 2],
        "mantissa": list(range(layout.mantissa)),
        "mantissa-high": [layout.mantissa - 1],
        "mantissa-low": [0],
    }
    if bit not in fields:
        raise ValueError(f"unknown bit {bit!r}: an index or one of {', '.join(BIT_FIELDS)}")
    return int(choose(fields[bit]))


def flip_bits(tensor: Any, indices: Sequence[int], bit: int) -> list[tuple[int, float, float]]:
    """Flip ``bit`` of the elements at flat ``indices`` of ``tensor`` in place; returns (index, before, after).

    The tensor must be contiguous (parameters and gradients are). Runs on the
    tensor's device; only the changed values are read back.
    """
    import torch

    layout = float_layout(tensor.dtype)
    if not tensor.is_contiguous():
        raise ValueError("cannot flip bits of a non-contiguous tensor")
    flat = tensor.detach().view(-1)
    where = torch.as_tensor(list(indices), dtype=torch.long, device=flat.device)
    before = flat[where].tolist()
    mask_value = 1 << bit
    if bit == layout.bits - 1:
        mask_value -= 1 << layout.bits  # the sign bit is the integer type's most negative value
    with torch.no_grad():
        integers = flat.view(layout.integer)
        integers[where] = integers[where] ^ torch.tensor(mask_value, dtype=layout.integer, device=flat.device)
    after = flat[where].tolist()
    return list(zip((int(i) for i in indices), before, after))


def set_values(tensor: Any, indices: Sequence[int], value: float) -> list[tuple[int, float, float]]:
    """Set the elements at flat ``indices`` to ``value`` (NaN, inf) in place; returns (index, before, after)."""
    import torch

    flat = tensor.detach().view(-1)
    where = torch.as_tensor(list(indices), dtype=torch.long, device=flat.device)
    before = flat[where].tolist()
    with torch.no_grad():
        flat[where] = value
    return [(int(i), b, value) for i, b in zip(indices, before)]
