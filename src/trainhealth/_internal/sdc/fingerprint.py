"""Cross-replica fingerprints: replicas that should hold identical weights, checked bit for bit.

Data-parallel replicas apply the same averaged gradient to the same weights, so
their parameters are bit-identical — until a device computes a wrong value
without an error (silent data corruption). Every ``interval`` steps each replica
fingerprints every parameter on its device: the tensor's bits read as integers
and summed modulo 2**64, which changes with any single flipped bit. The small
vectors are all-gathered across the data-parallel group and each tensor is
voted on; a replica in the minority is an SDC suspect, with the tensors named.
A corrupted weight stays corrupted (the same update is applied to it as to the
others), so a check every few hundred steps still finds it.

``check`` runs one collective and reads one small tensor back: call it between
steps (the Monitor does, every ``sdc_interval`` steps).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Any

__all__ = ["FingerprintCheck", "Mismatch", "fingerprint", "vote"]


@dataclass(frozen=True)
class Mismatch:
    """A replica whose fingerprint of ``tensors`` differs from the majority of the group."""

    rank: int
    tensors: tuple[str, ...]


def fingerprint(tensors: list[Any]) -> Any:
    """One int64 per tensor: its bits as integers, summed modulo 2**64 (on the tensors' device)."""
    import torch

    widths = {1: torch.int8, 2: torch.int16, 4: torch.int32, 8: torch.int64}
    sums: list[torch.Tensor] = []
    for tensor in tensors:
        flat = tensor.detach().reshape(-1)
        if flat.dtype.is_floating_point or flat.dtype.is_complex:
            flat = flat.view(widths[flat.element_size()])
        total = flat.sum(dtype=torch.int64)  # accumulates in int64 without a copy; wraps modulo 2**64
        sums.append(total if not sums else total.to(sums[0].device))
    return torch.stack(sums) if sums else torch.zeros(0, dtype=torch.int64)


def vote(fingerprints: list[list[int]], names: list[str], ranks: list[int]) -> list[Mismatch]:
    """The replicas outside the majority of each tensor's fingerprint (no majority: everyone is named).

    >>> vote([[1, 5], [1, 5], [1, 6]], ["a", "b"], [0, 1, 2])
    [Mismatch(rank=2, tensors=('b',))]
    """
    flagged: dict[int, list[str]] = {}
    for position, name in enumerate(names):
        values = [row[position] for row in fingerprints]
        common, count = Counter(values).most_common(1)[0]
        if count == len(values):
            continue
        majority = count * 2 > len(values)
        for rank, value in zip(ranks, values):
            if value != common or not majority:
                flagged.setdefault(rank, []).append(name)
    return [Mismatch(rank, tuple(tensors)) for rank, tensors in sorted(flagged.items())]


class FingerprintCheck:
    """Fingerprints ``model``'s parameters across the data-parallel ``group``: ranks holding replicas of the
    same parameters (default: every rank, as in pure data parallelism). ``group`` must be a gloo group
    (``trainhealth._internal.sdc.groups.host_group``): fingerprints travel on the host."""

    def __init__(self, model: Any, group: Any = None) -> None:
        import torch.distributed as dist

        self._dist = dist
        self.group = group
        named = [(name.removeprefix("module."), p) for name, p in model.named_parameters()]
        self.names = [name for name, _ in named]
        self._parameters = [p for _, p in named]
        self.ranks = dist.get_process_group_ranks(group) if group is not None else list(range(dist.get_world_size()))

    def check(self) -> list[Mismatch]:
        """All-gather every replica's fingerprint and vote (a collective: every member must call it)."""
        import torch

        mine = fingerprint(self._parameters).cpu()  # the one read back from the device: one integer per tensor
        gathered = [torch.zeros_like(mine) for _ in self.ranks]
        self._dist.all_gather(gathered, mine, group=self.group)
        rows = torch.stack(gathered).tolist()
        return vote(rows, self.names, self.ranks)
