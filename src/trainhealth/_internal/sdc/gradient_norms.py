"""Per-rank gradient norms before the all-reduce, compared across the data-parallel group.

After the all-reduce every replica holds the same averaged gradient, so a rank
that computed a wrong gradient is invisible there. Before it, each rank's
gradient comes from its own micro-batches: norms differ with the data, but by
a factor of a few at most. On the steps being checked each parameter's
accumulated gradient is measured before DDP's reducer averages it; at the
step's end the ranks all-gather their norms (one float
each) and a rank far from the others' median is an SDC suspect.

A rank whose measurement failed (a hook that raised: counted in
``trainhealth_exporter_errors_total{source="sdc_grad_norm"}``, that parameter no longer
measured) sends :data:`UNKNOWN`: it is neither a suspect nor part of the others' median,
because our own failure must never read as silent data corruption.

>>> compare([1.0, 1.1, 0.9, 1.05, 40.0], factor=4.0)
[4]
>>> compare([1.0, 1.1, UNKNOWN, 1.05, 40.0], factor=4.0)
[4]
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from trainhealth._internal.store import MetricStore

__all__ = ["UNKNOWN", "LocalGradientNorm", "compare", "gather_norms"]

#: What a rank sends when its own norm could not be measured (a norm is never negative).
UNKNOWN = -1.0


def compare(norms: Sequence[float], factor: float = 4.0) -> list[int]:
    """Positions whose norm is non-finite or more than ``factor`` times away from the median of the rest
    (:data:`UNKNOWN` norms are neither)."""
    finite = sorted(n for n in norms if math.isfinite(n) and n >= 0)
    out = []
    for position, norm in enumerate(norms):
        if norm < 0:  # not measured
            continue
        if not math.isfinite(norm):
            out.append(position)
            continue
        others = list(finite)
        others.remove(norm)
        if len(others) < 2:
            continue
        median = (
            others[len(others) // 2]
            if len(others) % 2
            else (others[len(others) // 2 - 1] + others[len(others) // 2]) / 2
        )
        if median > 0 and (norm > factor * median or norm * factor < median):
            out.append(position)
    return out


class LocalGradientNorm:
    """This rank's gradient norm before the data-parallel all-reduce, on armed steps.

    A post-accumulate-grad hook on each parameter reads its ``.grad`` once
    backward has accumulated it: after every tensor hook (a gradient corrupted by
    a hook is seen corrupted) and before DDP's reducer averages it. With gradient
    accumulation the last micro-batch's hook sees the accumulated gradient.
    """

    def __init__(self, torch: Any, parameters: Sequence[Any], store: MetricStore | None = None) -> None:
        self._torch = torch
        self._store = store
        self.armed = False
        self._norms: dict[int, Any] = {}
        self._off: set[int] = set()  # parameters whose hook raised: no longer measured, the norm unknown
        self._handles = [p.register_post_accumulate_grad_hook(self._hook) for p in parameters if p.requires_grad]

    def _hook(self, parameter: Any) -> None:
        if not self.armed or parameter.grad is None or id(parameter) in self._off:
            return
        try:
            with self._torch.no_grad():
                grad = parameter.grad.detach()
                if grad.is_sparse:  # a sparse embedding's gradient: the norm of its stored values
                    grad = grad.coalesce().values()
                # a norm reads the gradient once and allocates nothing of its size (pow(2) would, every check)
                self._norms[id(parameter)] = self._torch.linalg.vector_norm(grad, dtype=self._torch.float32)
        except Exception as error:  # never break backward: this parameter goes unmeasured, the norm unknown
            self._off.add(id(parameter))
            if self._store is not None:
                self._store.record_error("sdc_grad_norm", error)

    def take(self) -> Any:
        """This step's local norm as a device scalar; :data:`UNKNOWN` when nothing was accumulated or a
        parameter goes unmeasured; resets."""
        norms, self._norms = list(self._norms.values()), {}
        if not norms or self._off:
            return self._torch.tensor(UNKNOWN)
        device = norms[0].device
        return self._torch.linalg.vector_norm(self._torch.stack([n.to(device) for n in norms]))

    def close(self) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles = []


def gather_norms(torch: Any, norm: float, group: Any = None) -> list[float]:
    """Every rank's norm (a collective on ``group``: all members call it at the same step)."""
    import torch.distributed as dist

    mine = torch.tensor([norm], dtype=torch.float64)
    everyone = [torch.zeros(1, dtype=torch.float64) for _ in range(dist.get_world_size(group))]
    dist.all_gather(everyone, mine, group=group)
    return [float(t.item()) for t in everyone]
