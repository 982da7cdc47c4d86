"""The layout of a simulated training job: parallel groups, ranks, hosts and switches.

Ranks are numbered Megatron's way, tensor-parallel fastest:
``rank = tp + TP * (cp + CP * (dp + DP * pp))``, eight GPUs to a host and
``hosts_per_leaf`` hosts under each leaf switch, so a tensor-parallel group
shares a host (NVLink) while data-parallel, expert-parallel and pipeline
traffic crosses hosts (NICs and switches). Expert-parallel groups split each
data-parallel group into blocks of ``ep`` replicas.

>>> layout = ClusterLayout(dp=2, pp=2, tp=4)
>>> layout.world, layout.rank(dp=1, pp=1, tp=3), layout.host_of(13), layout.leaf_of(13)
(16, 15, 1, 0)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import overload

import numpy as np

__all__ = ["ClusterLayout"]


@dataclass(frozen=True)
class ClusterLayout:
    dp: int
    pp: int
    tp: int = 1
    cp: int = 1
    ep: int = 1
    gpus_per_host: int = 8
    hosts_per_leaf: int = 16

    def __post_init__(self) -> None:
        for name in ("dp", "pp", "tp", "cp", "ep", "gpus_per_host", "hosts_per_leaf"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1")
        if self.dp % self.ep:
            raise ValueError("ep must divide dp (expert-parallel groups split the data-parallel ones)")

    @property
    def world(self) -> int:
        return self.dp * self.pp * self.tp * self.cp

    @property
    def per_stage(self) -> int:
        return self.dp * self.cp * self.tp

    @property
    def dimensions(self) -> int:
        """How many parallel dimensions are in use (size > 1)."""
        return sum(1 for size in (self.dp, self.pp, self.tp, self.cp, self.ep) if size > 1)

    def rank(self, *, dp: int, pp: int, tp: int = 0, cp: int = 0) -> int:
        return tp + self.tp * (cp + self.cp * (dp + self.dp * pp))

    def stage_ranks(self, pp: int) -> np.ndarray:
        """The ranks of stage ``pp`` as a (dp, cp, tp) array."""
        base = self.per_stage * pp
        return base + np.arange(self.per_stage).reshape(self.dp, self.cp, self.tp)

    @overload
    def host_of(self, rank: int) -> int: ...
    @overload
    def host_of(self, rank: np.ndarray) -> np.ndarray: ...

    def host_of(self, rank: int | np.ndarray) -> int | np.ndarray:
        return rank // self.gpus_per_host

    @overload
    def leaf_of(self, rank: int) -> int: ...
    @overload
    def leaf_of(self, rank: np.ndarray) -> np.ndarray: ...

    def leaf_of(self, rank: int | np.ndarray) -> int | np.ndarray:
        return rank // (self.gpus_per_host * self.hosts_per_leaf)

    def host_name(self, host: int) -> str:
        return f"sim-node-{host:04d}"

    def parallelism(self) -> dict[str, int]:
        return {
            name: size
            for name, size in (("dp", self.dp), ("pp", self.pp), ("tp", self.tp), ("cp", self.cp), ("ep", self.ep))
            if size > 1
        }
