"""Bounded layer-group labels from parameter names.

A parameter belongs to the first numbered block on its path (``layers.3``,
``transformer.h.11``) or else to its top-level module (``embed``, ``lm_head``).
Wrapper prefixes added by DDP, FSDP, activation checkpointing and
``torch.compile`` are ignored. When there are more groups than allowed,
consecutive numbered blocks are merged into ranges, so the label set stays
bounded whatever the depth of the model.

>>> names = ["embed.weight", "layers.0.attn.weight", "layers.0.mlp.weight", "layers.1.attn.weight", "head.weight"]
>>> group_parameters(names, max_groups=8).labels
('embed', 'layers.0', 'layers.1', 'head')
>>> g = group_parameters([f"module.blocks.{i}.w" for i in range(10)], max_groups=3)
>>> g.labels
('blocks.0-3', 'blocks.4-7', 'blocks.8-9')
>>> g.index
(0, 0, 0, 0, 1, 1, 1, 1, 2, 2)
>>> group_parameters(["0.weight", "0.bias", "2.weight"], max_groups=8).labels  # torch.nn.Sequential
('0', '2')
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

__all__ = ["LayerGrouping", "group_parameters"]

_WRAPPER_PARTS = frozenset({"module", "_orig_mod", "_fsdp_wrapped_module", "_checkpoint_wrapped_module"})
OTHER = "other"


@dataclass(frozen=True)
class LayerGrouping:
    """``labels[index[i]]`` is the layer group of parameter ``i``."""

    labels: tuple[str, ...]
    index: tuple[int, ...]


@dataclass(frozen=True)
class _Key:
    prefix: str
    number: int | None  # None: an unnumbered top-level module


def _key(name: str) -> _Key:
    parts = [part for part in name.split(".") if part not in _WRAPPER_PARTS]
    if not parts:
        return _Key(name, None)
    for position, part in enumerate(parts[:-1]):
        if part.isdigit():
            return _Key(".".join(parts[:position]), int(part))
    return _Key(parts[0], None)


def group_parameters(names: Sequence[str], max_groups: int) -> LayerGrouping:
    """Assign each parameter name a layer-group label; at most ``max_groups`` labels."""
    if max_groups < 1:
        raise ValueError("max_groups must be >= 1")
    keys = [_key(name) for name in names]
    plain = list(dict.fromkeys(k.prefix for k in keys if k.number is None))
    numbered: dict[str, int] = {}
    for k in keys:
        if k.number is not None:
            numbered[k.prefix] = max(numbered.get(k.prefix, -1), k.number)
    budget = max(max_groups - len(plain), len(numbered))  # at least one range per container
    width = 1
    while sum(math.ceil((top + 1) / width) for top in numbered.values()) > budget:
        width += 1

    def label(k: _Key) -> str:
        if k.number is None:
            return k.prefix
        low = (k.number // width) * width
        high = min(low + width - 1, numbered[k.prefix])
        block = f"{low}-{high}" if width > 1 and high > low else str(k.number if width == 1 else low)
        return f"{k.prefix}.{block}" if k.prefix else block  # a top-level Sequential numbers its blocks "0", "1"

    raw = [label(k) for k in keys]
    ordered = list(dict.fromkeys(raw))
    if len(ordered) > max_groups:  # too many unnumbered modules: keep the first ones
        kept = set(ordered[: max_groups - 1])
        raw = [r if r in kept else OTHER for r in raw]
        ordered = list(dict.fromkeys(raw))
    position = {lab: i for i, lab in enumerate(ordered)}
    return LayerGrouping(tuple(ordered), tuple(position[r] for r in raw))
