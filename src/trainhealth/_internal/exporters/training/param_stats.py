"""Gradient, parameter and update statistics computed on the parameters' device.

Everything here returns tensors and never reads a value on the host, so it can
run inside optimizer hooks without a host-device synchronisation; the Monitor
reads the results later through :class:`~trainhealth._internal.exporters.training.readout.DeferredReadout`.

>>> import torch
>>> params = [torch.nn.Parameter(torch.ones(4)), torch.nn.Parameter(torch.ones(4))]
>>> params[0].grad, params[1].grad = torch.full((4,), 3.0), torch.full((4,), 4.0)
>>> stats = ParameterStats(torch, params, group_index=(0, 1), n_groups=2)
>>> float(stats.grad_norm())
10.0
>>> [float(v) for v in stats.grad_norms_by_group()[1]]
[6.0, 8.0]
"""

from __future__ import annotations

from collections.abc import Sequence
from types import ModuleType
from typing import Any

__all__ = ["ParameterStats", "UpdateStats"]

Tensor = Any  # torch.Tensor, without importing torch at module import
_MAX_CACHED_INDEXES = 64


class UpdateStats:
    """Device tensors describing one optimizer update, by layer group and in total."""

    def __init__(
        self,
        update_norms: Tensor,
        param_norms: Tensor,
        total_update: Tensor,
        total_param: Tensor,
        cosine: Tensor | None,
    ) -> None:
        self.update_norms = update_norms
        self.param_norms = param_norms
        self.total_update = total_update
        self.total_param = total_param
        self.cosine = cosine


class ParameterStats:
    """Norms of a fixed list of parameters, their gradients and their updates, by layer group.

    ``group_index[i]`` is the layer group of ``params[i]``. Updates are measured
    by snapshotting the parameters before an optimizer step
    (:meth:`snapshot_before_update`) and differencing after it
    (:meth:`measure_update`); a snapshot costs one copy of the parameters and
    lives only across that step (two copies when consecutive updates are
    compared).
    """

    def __init__(self, torch: ModuleType, params: Sequence[Tensor], group_index: Sequence[int], n_groups: int) -> None:
        if len(params) != len(group_index):
            raise ValueError("one group index per parameter")
        self._torch = torch
        self.params = list(params)
        self.n_groups = n_groups
        self._group_index = tuple(group_index)
        self._index_tensors: dict[Any, Tensor] = {}  # cached index vectors, keyed by device (and positions)
        self._snapshot: list[Tensor] | None = None
        self._previous_update: list[Tensor] | None = None

    # --- norms ----------------------------------------------------------------------
    def _device(self) -> Any:
        return self.params[0].device if self.params else self._torch.device("cpu")

    def _norms(self, tensors: Sequence[Tensor | None]) -> Tensor:
        """L2 norm of each tensor (0 for a missing one) as a float32 vector on the first parameter's device."""
        torch = self._torch
        device = self._device()
        buckets: dict[tuple[Any, Any], list[int]] = {}
        for i, tensor in enumerate(tensors):
            if tensor is not None:
                buckets.setdefault((tensor.device, tensor.dtype), []).append(i)
        if len(buckets) == 1 and len(next(iter(buckets.values()))) == len(tensors):  # the usual case: one stack
            dense = [_dense_values(tensor) for tensor in tensors]
            return torch.stack(torch._foreach_norm(dense, 2, dtype=torch.float32)).to(device=device)
        out = torch.zeros(len(tensors), dtype=torch.float32, device=device)
        for positions in buckets.values():
            dense = [_dense_values(tensors[i]) for i in positions]
            norms = torch.stack(torch._foreach_norm(dense, 2, dtype=torch.float32)).to(device=device)
            out.index_copy_(0, self._index_tensor(tuple(positions), device), norms)
        return out

    def _index_tensor(self, positions: tuple[int, ...], device: Any) -> Tensor:
        key = (device, positions)
        index = self._index_tensors.get(key)
        if index is None:
            if len(self._index_tensors) >= _MAX_CACHED_INDEXES:  # e.g. MoE: the set of gradients varies
                self._index_tensors.clear()
            index = self._index_tensors[key] = self._torch.tensor(positions, device=device)
        return index

    def _by_group(self, norms: Tensor) -> Tensor:
        torch = self._torch
        index = self._index_tensor(self._group_index, norms.device)
        squares = torch.zeros(self.n_groups, dtype=norms.dtype, device=norms.device)
        return squares.index_add_(0, index, norms * norms).sqrt()

    def has_gradients(self) -> bool:
        """Whether any parameter has a gradient (checked on the host; stops at the first that has one)."""
        return any(p.grad is not None for p in self.params)

    def grad_norm(self) -> Tensor:
        """Total L2 norm of the current gradients (0-d tensor)."""
        with self._torch.no_grad():
            return self._torch.linalg.vector_norm(self._norms([p.grad for p in self.params]))

    def grad_norms_by_group(self) -> tuple[Tensor, Tensor]:
        """``(total, per_group)`` L2 norms of the current gradients."""
        with self._torch.no_grad():
            norms = self._norms([p.grad for p in self.params])
            return self._torch.linalg.vector_norm(norms), self._by_group(norms)

    def param_norms_by_group(self) -> tuple[Tensor, Tensor]:
        """``(total, per_group)`` L2 norms of the parameters."""
        with self._torch.no_grad():
            norms = self._norms([p.detach() for p in self.params])
            return self._torch.linalg.vector_norm(norms), self._by_group(norms)

    # --- updates --------------------------------------------------------------------
    def snapshot_before_update(self) -> None:
        """Copy the parameters; call right before the optimizer updates them."""
        with self._torch.no_grad():
            self._snapshot = [p.detach().clone() for p in self.params]

    def measure_update(self, *, keep_for_next: bool, measure: bool = True) -> UpdateStats | None:
        """Measure the update since :meth:`snapshot_before_update`.

        With ``keep_for_next`` the update is kept so the next measured update can
        report the cosine between the two; with ``measure=False`` it is only
        kept. Returns ``None`` without a snapshot or without ``measure``.
        """
        torch = self._torch
        snapshot, self._snapshot = self._snapshot, None
        if snapshot is None:
            return None
        with torch.no_grad():
            current = [p.detach() for p in self.params]
            # In place: the snapshot becomes (before - after), the negated update. Norms and
            # the cosine of two consecutive negated updates equal those of the updates.
            torch._foreach_sub_(snapshot, current)
            if not measure:
                self._previous_update = snapshot if keep_for_next else None
                return None
            update_norms = self._norms(snapshot)
            param_norms = self._norms(current)
            total_update = torch.linalg.vector_norm(update_norms)
            cosine = None
            previous = self._previous_update
            if previous is not None:
                dot = torch.zeros((), dtype=torch.float32, device=update_norms.device)
                for now, before in zip(snapshot, previous):
                    dot += torch.dot(now.reshape(-1).float(), before.reshape(-1).float()).to(dot.device)
                previous_norm = torch.linalg.vector_norm(self._norms(previous))
                cosine = dot / (total_update * previous_norm).clamp_min(torch.finfo(torch.float32).tiny)
            self._previous_update = snapshot if keep_for_next else None
            return UpdateStats(
                update_norms=self._by_group(update_norms),
                param_norms=self._by_group(param_norms),
                total_update=total_update,
                total_param=torch.linalg.vector_norm(param_norms),
                cosine=cosine,
            )

    def release(self) -> None:
        """Drop any snapshot or kept update (frees their memory)."""
        self._snapshot = None
        self._previous_update = None


def _dense_values(tensor: Tensor) -> Tensor:
    """The stored values of ``tensor``; a sparse gradient (sparse embeddings) has the norm of its values."""
    if tensor.is_sparse:
        return tensor.coalesce().values()
    return tensor
