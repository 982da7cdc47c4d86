"""A rank's parallel layout: its process groups and one training step per layout (DDP, DP x PP, DP x TP)."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from typing import Any

from trainhealth_lab.realrun.kernels import Clock
from trainhealth_lab.realrun.spec import CaseSpec, Parallelism

__all__ = ["STEPS", "Groups", "StepFn", "new_groups"]

StepFn = Callable[[int], Any]


@dataclasses.dataclass
class Groups:
    """The process groups of this rank and the topology entries (group id -> members) it knows of."""

    dp: Any = None
    pp: Any = None
    tp: Any = None
    members: dict[str, Any] = dataclasses.field(default_factory=dict)  # group object key -> (desc, ranks)


def new_groups(dist: Any, spec: CaseSpec, rank: int) -> tuple[Groups, dict[str, tuple[list[int], Any]]]:
    """Every rank creates every group in the same order (torch requires it); returns this rank's groups."""
    groups = Groups()
    named: list[tuple[str, list[int], Any]] = []
    n, d = spec.ranks, spec.replicas
    if spec.layout is Parallelism.DP_PP:
        for stage in range(2):
            ranks = [stage * d + i for i in range(d)]
            pg = dist.new_group(ranks, group_desc=f"dp-s{stage}")
            named.append((f"dp-s{stage}", ranks, pg))
            if rank in ranks:
                groups.dp = pg
        for replica in range(d):
            ranks = [replica, d + replica]
            pg = dist.new_group(ranks, group_desc=f"pp-d{replica}")
            named.append((f"pp-d{replica}", ranks, pg))
            if rank in ranks:
                groups.pp = pg
    elif spec.layout is Parallelism.DP_TP:
        for replica in range(n // 2):
            ranks = [2 * replica, 2 * replica + 1]
            pg = dist.new_group(ranks, group_desc=f"tp-d{replica}")
            named.append((f"tp-d{replica}", ranks, pg))
            if rank in ranks:
                groups.tp = pg
        for part in range(2):
            ranks = list(range(part, n, 2))
            pg = dist.new_group(ranks, group_desc=f"dp-t{part}")
            named.append((f"dp-t{part}", ranks, pg))
            if rank in ranks:
                groups.dp = pg
    mine = {desc: (ranks, pg) for desc, ranks, pg in named if rank in ranks}
    return groups, mine


def _flatten_all_reduce(torch: Any, dist: Any, parameters: list[Any], group: Any, size: int, clock: Clock) -> None:
    """The data-parallel gradient all-reduce of a stage or shard: one flat buffer, averaged."""
    grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in parameters]
    flat = torch.cat([g.reshape(-1) for g in grads])
    with clock.blocked():
        dist.all_reduce(flat, group=group)
    flat /= size
    offset = 0
    for p, g in zip(parameters, grads):
        count = g.numel()
        p.grad = flat[offset : offset + count].view_as(g).clone()
        offset += count


def _batch(torch: Any, spec: CaseSpec, rank: int, step: int) -> Any:
    """The data fetch: a batch drawn from (seed, step, replica)."""
    generator = torch.Generator().manual_seed(spec.seed * 1_000_003 + step * 1009 + spec.replica(rank))
    return torch.randn(spec.batch, spec.width, generator=generator)


def _ddp_step(
    torch: Any, dist: Any, spec: CaseSpec, rank: int, model: Any, ddp: Any, groups: Groups, clock: Clock
) -> StepFn:
    def step(index: int) -> Any:
        x = _batch(torch, spec, rank, index)
        loss = ddp(x).pow(2).mean()
        loss.backward()
        # after backward's last kernel, DDP waits for its bucket all-reduces: blocked, not compute
        clock.add_blocked(time.perf_counter() - clock.last_kernel_end)
        return loss.detach()

    return step


def _pp_step(
    torch: Any, dist: Any, spec: CaseSpec, rank: int, model: Any, _: Any, groups: Groups, clock: Clock
) -> StepFn:
    d = spec.replicas
    stage = spec.stage(rank)
    peer = rank + d if stage == 0 else rank - d
    parameters = list(model.parameters())

    def step(index: int) -> Any:
        if stage == 0:
            x = _batch(torch, spec, rank, index)
            h = model(x)
            grad = torch.empty_like(h)
            with clock.blocked():
                dist.send(h.detach(), dst=peer, group=groups.pp)
                dist.recv(grad, src=peer, group=groups.pp)
            h.backward(grad)
            loss = torch.zeros(())
        else:
            h = torch.empty(spec.batch, spec.width)
            with clock.blocked():
                dist.recv(h, src=peer, group=groups.pp)
            h.requires_grad_(True)
            loss = model(h).pow(2).mean()
            loss.backward()
            with clock.blocked():
                dist.send(h.grad, dst=peer, group=groups.pp)
        _flatten_all_reduce(torch, dist, parameters, groups.dp, d, clock)
        return loss.detach()

    return step


def _tp_step(
    torch: Any, dist: Any, spec: CaseSpec, rank: int, model: Any, _: Any, groups: Groups, clock: Clock
) -> StepFn:
    parameters = list(model.parameters())

    def reduce_grad(grad: Any) -> Any:
        reduced = grad.clone()
        with clock.blocked():
            dist.all_reduce(reduced, group=groups.tp)
        return reduced / 2

    def step(index: int) -> Any:
        h = _batch(torch, spec, rank, index)
        for layer in model:
            h = layer(h)
            reduced = h.detach().clone()
            with clock.blocked():
                dist.all_reduce(reduced, group=groups.tp)  # the row-parallel output sum of the pair
            h = h + (reduced / 2 - h).detach()
            if h.requires_grad:
                h.register_hook(reduce_grad)  # and its gradient, in backward
        loss = h.pow(2).mean()
        loss.backward()
        _flatten_all_reduce(torch, dist, parameters, groups.dp, spec.replicas, clock)
        return loss.detach()

    return step


STEPS = {Parallelism.DDP: _ddp_step, Parallelism.DP_PP: _pp_step, Parallelism.DP_TP: _tp_step}
