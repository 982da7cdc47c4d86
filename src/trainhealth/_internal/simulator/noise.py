"""Production noise for the cluster simulator: uneven work and transient hiccups that no faulty device causes.

A healthy production job is far less regular than the simulator's default
noise. :class:`ProductionNoise` describes what it adds, and :func:`realise_noise`
draws one seeded realisation of it for a layout and a number of steps:

* **uneven work** — each replica's work per micro-batch drawn from a lognormal
  (packed variable-length sequences: attention cost varies with the pack), and
  MoE routing skew that moves expert work between the ranks of each
  expert-parallel group (layouts with ``ep > 1``), redrawn every step;
* **GC pauses** — a random rank stalls for 1 to 3 steps;
* **page-cache misses** — a random rank stalls for a single step;
* **a slow data shard** — the first pipeline stage of a random replica waits
  for its data for a few steps;
* **checkpoint steps** — every ``checkpoint_every`` steps every rank computes
  slower for 1 to 3 steps, each by its own amount (storage contention), and the
  ranks of replica 0, which write the model's shards, slower still;
* **transient NIC congestion** — a random rank's inter-host transfers take 5
  to 10% longer for 3 to 6 steps.

Rates are per device (rank, replica or NIC) and per 100 steps, so a larger job
has proportionally more hiccups, as a real one does: at the defaults a 64-rank
job has about 3 GC pauses, 6 page-cache misses, 2 congestion episodes and one
slow shard (8 replicas) every 100 steps. Pauses are in seconds against the
default :class:`~trainhealth._internal.simulator.scenario.Timing` (a forward pass of
20 ms). Faults inside this noise are ordinary
:class:`~trainhealth._internal.faults.Fault`\\ s; a recurrent
transient fault is several of them on one device
(:func:`~trainhealth._internal.simulator.scenario.recurrent_fault`). A scenario
carries its noise (``Scenario(..., noise=ProductionNoise())``) and
:func:`~trainhealth._internal.simulator.simulate.simulate` applies it.

>>> from trainhealth._internal.simulator.cluster import ClusterLayout
>>> realised = realise_noise(ProductionNoise(), ClusterLayout(dp=8, pp=2, tp=4), steps=1000, microbatches=1, seed=0)
>>> realised.compute_factor.shape, realised.work.shape
((1000, 64), (1000, 1, 8))
>>> sorted({hiccup.kind.value for hiccup in realised.hiccups})
['checkpoint', 'congestion', 'data_stall', 'gc_pause', 'page_cache_miss']
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass
from enum import Enum

import numpy as np

from trainhealth._internal.simulator.cluster import ClusterLayout

__all__ = ["Hiccup", "HiccupKind", "ProductionNoise", "RealisedNoise", "realise_noise"]

#: the noise draws from its own stream of the scenario's seed, so the default noise is drawn as without it
NOISE_STREAM = 0x5EED


class HiccupKind(str, Enum):
    GC_PAUSE = "gc_pause"  # a rank stalls (garbage collection) for 1-3 steps
    PAGE_CACHE_MISS = "page_cache_miss"  # a rank stalls for one step
    DATA_STALL = "data_stall"  # a replica's first stage waits for its data shard for a few steps
    CHECKPOINT = "checkpoint"  # every rank computes slower, each by its own amount
    CONGESTION = "congestion"  # a rank's inter-host transfers take longer


@dataclass(frozen=True)
class Hiccup:
    """One transient irregularity of a healthy job, active in steps ``[start_step, end_step)``.

    ``target`` is a rank (GC pause, page-cache miss, congestion), a replica
    (data stall) or ``None`` (checkpoint: every rank). ``magnitude`` is the
    seconds added per step (stalls), the mean slowdown factor (checkpoint) or the
    factor on transfer times (congestion).
    """

    kind: HiccupKind
    target: int | None
    start_step: int
    end_step: int
    magnitude: float

    def ranks(self, layout: ClusterLayout) -> np.ndarray:
        """The ranks it touches."""
        if self.target is None:
            return np.arange(layout.world)
        if self.kind is HiccupKind.DATA_STALL:
            return layout.stage_ranks(0)[self.target].reshape(-1)
        return np.array([self.target])


@dataclass(frozen=True)
class ProductionNoise:
    """What a healthy production job adds to the simulator's default noise (rates per device per 100 steps)."""

    work_sigma: float = 0.08  # lognormal sigma of a replica's work per micro-batch (packed sequences)
    moe_skew: float = 0.30  # lognormal sigma of the expert load of each rank of an expert-parallel group
    moe_share: float = 0.40  # share of a pass's compute spent in the experts
    gc_rate: float = 0.05  # GC pauses per rank
    gc_steps: tuple[int, int] = (1, 3)
    gc_pause: tuple[float, float] = (0.02, 0.15)  # seconds per step
    page_cache_rate: float = 0.10  # page-cache misses per rank (one step each)
    page_cache_pause: tuple[float, float] = (0.005, 0.05)
    data_stall_rate: float = 0.10  # slow data shards per replica
    data_stall_steps: tuple[int, int] = (2, 6)
    data_stall_pause: tuple[float, float] = (0.01, 0.06)
    checkpoint_every: int = 200  # steps; 0: no checkpoints
    checkpoint_steps: tuple[int, int] = (1, 3)
    checkpoint_slowdown: tuple[float, float] = (0.01, 0.06)  # per rank, compute x (1 + U(range))
    checkpoint_writer_slowdown: tuple[float, float] = (0.05, 0.25)  # replica 0 (the writers), x (1 + U(range)) more
    congestion_rate: float = 0.03  # congestion episodes per NIC (rank)
    congestion_steps: tuple[int, int] = (3, 6)
    congestion_factor: tuple[float, float] = (1.05, 1.10)

    def __post_init__(self) -> None:
        for name in (
            "work_sigma",
            "moe_skew",
            "gc_rate",
            "page_cache_rate",
            "data_stall_rate",
            "congestion_rate",
            "checkpoint_every",
        ):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0")
        if not 0 <= self.moe_share <= 1:
            raise ValueError("moe_share must be in [0, 1]")
        for name in ("gc_steps", "data_stall_steps", "checkpoint_steps", "congestion_steps"):
            low, high = getattr(self, name)
            if not 1 <= low <= high:
                raise ValueError(f"{name} must be (low, high) with 1 <= low <= high")
        for name in (
            "gc_pause",
            "page_cache_pause",
            "data_stall_pause",
            "checkpoint_slowdown",
            "checkpoint_writer_slowdown",
            "congestion_factor",
        ):
            low, high = getattr(self, name)
            if not 0 <= low <= high:
                raise ValueError(f"{name} must be (low, high) with 0 <= low <= high")
        if self.congestion_factor[0] < 1:
            raise ValueError("congestion_factor must be >= 1")


@dataclass(frozen=True)
class RealisedNoise:
    """One draw of :class:`ProductionNoise` for a layout: per step, what multiplies or adds to each rank's passes."""

    work: np.ndarray  # (steps, microbatches, dp): each replica's work factor
    compute_factor: np.ndarray  # (steps, world): factor on every forward and backward pass (MoE skew, checkpoints)
    compute_extra: np.ndarray  # (steps, world): seconds added to the step's first forward pass (stalls)
    path_factor: np.ndarray  # (steps, world): factor on the rank's inter-host transfers (congestion)
    hiccups: tuple[Hiccup, ...]

    def counts(self) -> dict[str, int]:
        """Hiccups per kind."""
        counted = Counter(hiccup.kind.value for hiccup in self.hiccups)
        return {kind.value: counted.get(kind.value, 0) for kind in HiccupKind}


def realise_noise(
    noise: ProductionNoise, layout: ClusterLayout, steps: int, microbatches: int, seed: int
) -> RealisedNoise:
    """Draw ``noise`` for ``layout`` over ``steps`` (vectorised; the seed's own noise stream).

    >>> layout = ClusterLayout(dp=4, pp=2, tp=8)
    >>> a = realise_noise(ProductionNoise(), layout, steps=200, microbatches=2, seed=3)
    >>> b = realise_noise(ProductionNoise(), layout, steps=200, microbatches=2, seed=3)
    >>> a.hiccups == b.hiccups, bool((a.compute_extra == b.compute_extra).all())
    (True, True)
    """
    rng = np.random.default_rng([seed, NOISE_STREAM])
    world = layout.world
    work = np.exp(rng.normal(0.0, noise.work_sigma, (steps, microbatches, layout.dp)))
    compute_factor = _moe_skew(noise, layout, steps, rng)
    compute_extra = np.zeros((steps, world))
    path_factor = np.ones((steps, world))
    hiccups: list[Hiccup] = []

    def episodes(
        kind: HiccupKind, rate: float, devices: int, lengths: tuple[int, int], magnitudes: tuple[float, float]
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        count = rng.poisson(rate * devices * steps / 100.0)
        target = rng.integers(0, devices, count)
        start = rng.integers(0, steps, count)
        stop = np.minimum(start + rng.integers(lengths[0], lengths[1] + 1, count), steps)
        size = rng.uniform(*magnitudes, count)
        hiccups.extend(Hiccup(kind, int(t), int(a), int(b), float(m)) for t, a, b, m in zip(target, start, stop, size))
        return target, start, stop, size

    for kind, rate, lengths, pause in (
        (HiccupKind.GC_PAUSE, noise.gc_rate, noise.gc_steps, noise.gc_pause),
        (HiccupKind.PAGE_CACHE_MISS, noise.page_cache_rate, (1, 1), noise.page_cache_pause),
    ):
        rank, start, stop, size = episodes(kind, rate, world, lengths, pause)
        for step, active in _active_steps(start, stop):
            np.add.at(compute_extra, (step, rank[active]), size[active])
    replica, start, stop, size = episodes(
        HiccupKind.DATA_STALL, noise.data_stall_rate, layout.dp, noise.data_stall_steps, noise.data_stall_pause
    )
    loaders = layout.stage_ranks(0).reshape(layout.dp, -1)  # a replica's first-stage ranks wait for its data
    for step, active in _active_steps(start, stop):
        rows = np.repeat(step, loaders.shape[1])
        np.add.at(
            compute_extra, (rows, loaders[replica[active]].reshape(-1)), np.repeat(size[active], loaders.shape[1])
        )
    rank, start, stop, size = episodes(
        HiccupKind.CONGESTION, noise.congestion_rate, world, noise.congestion_steps, noise.congestion_factor
    )
    for step, active in _active_steps(start, stop):
        np.multiply.at(path_factor, (step, rank[active]), size[active])
    if noise.checkpoint_every:
        for first in range(noise.checkpoint_every - 1, steps, noise.checkpoint_every):
            last = min(first + int(rng.integers(noise.checkpoint_steps[0], noise.checkpoint_steps[1] + 1)), steps)
            slowdown = 1.0 + rng.uniform(*noise.checkpoint_slowdown, world)
            writers = np.concatenate([layout.stage_ranks(stage)[0].reshape(-1) for stage in range(layout.pp)])
            slowdown[writers] *= 1.0 + rng.uniform(*noise.checkpoint_writer_slowdown)
            compute_factor[first:last] *= slowdown
            hiccups.append(Hiccup(HiccupKind.CHECKPOINT, None, first, last, float(slowdown.mean())))
    hiccups.sort(
        key=lambda hiccup: (hiccup.start_step, hiccup.kind.value, -1 if hiccup.target is None else hiccup.target)
    )
    return RealisedNoise(work, compute_factor, compute_extra, path_factor, tuple(hiccups))


def _moe_skew(noise: ProductionNoise, layout: ClusterLayout, steps: int, rng: np.random.Generator) -> np.ndarray:
    """Per step and rank, the factor on its compute from the share of the tokens its experts received: expert
    work moves between the ranks of an expert-parallel group (blocks of ``ep`` replicas); the group's total
    stays the same."""
    factor = np.ones((steps, layout.world))
    if layout.ep < 2 or noise.moe_skew == 0 or noise.moe_share == 0:
        return factor
    load = np.exp(rng.normal(0.0, noise.moe_skew, (steps, layout.world)))
    for stage in range(layout.pp):
        ranks = layout.stage_ranks(stage)  # (dp, cp, tp); an expert group: ep consecutive replicas, same cp, tp
        blocks = ranks.reshape(layout.dp // layout.ep, layout.ep, layout.cp, layout.tp)
        shares = load[:, blocks]
        shares = shares / shares.mean(axis=2, keepdims=True)
        factor[:, blocks] = (1.0 - noise.moe_share) + noise.moe_share * shares
    return factor


def _active_steps(start: np.ndarray, stop: np.ndarray) -> Iterable[tuple[np.ndarray, np.ndarray]]:
    """For each offset into the episodes, the step each still-running episode is at and which episodes run."""
    longest = int((stop - start).max()) if len(start) else 0
    for offset in range(longest):
        active = start + offset < stop
        yield (start + offset)[active], active
