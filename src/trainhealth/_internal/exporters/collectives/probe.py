"""A pairwise link probe: which rank's links are slow, measured rather than inferred.

When every collective spans every rank, passive collective timings can say "communication is
slow" but not through which link. :func:`probe_links` confirms a suspicion the way Greyhound
does, with a micro-benchmark: every pair of ranks exchanges a small message (latency: round
trip / 2) and a large one (bandwidth) over a process group of its own, pairs scheduled
round-robin so each rank is in at most one pair at a time. Every rank gets the same
:class:`ProbeResult` (:mod:`trainhealth._internal.exporters.collectives.probe_result`, with its JSON form);
:meth:`ProbeResult.slow_ranks` names the rank whose links are all slow compared with the spread
of the other links, or returns None.

Call it on every rank at the same point of the program (a training loop may call it at a
checkpoint or between steps). A peer that does not answer within ``timeout_s`` never raises
into the caller: its links are reported as failed (``failed`` holds the reason, latency
infinite, bandwidth 0), and a probe that falls out of step returns ``complete=False`` with
what this rank measured. Mistakes in the call (torch.distributed not initialised, bad sizes)
raise at once.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Iterable, Sequence
from datetime import timedelta
from types import SimpleNamespace
from typing import Any

from trainhealth._internal.exporters.collectives.probe_result import (
    PROBE_FORMAT,
    LinkMeasurement,
    LinkMetric,
    ProbeResult,
    SlowRank,
)

__all__ = ["PROBE_FORMAT", "LinkMeasurement", "LinkMetric", "ProbeResult", "SlowRank", "probe_links", "round_robin"]

log = logging.getLogger(__name__)


def round_robin(ranks: Sequence[int]) -> list[list[tuple[int, int]]]:
    """Rounds of disjoint pairs covering every pair once (the circle method).

    >>> round_robin([0, 1, 2, 3])
    [[(0, 3), (1, 2)], [(0, 2), (1, 3)], [(0, 1), (2, 3)]]
    """
    slots: list[int | None] = list(ranks) + ([None] if len(ranks) % 2 else [])
    rounds = []
    for _ in range(len(slots) - 1):
        pairs = []
        for index in range(len(slots) // 2):
            a, b = slots[index], slots[len(slots) - 1 - index]
            if a is not None and b is not None:
                pairs.append((min(a, b), max(a, b)))
        rounds.append(sorted(pairs))
        slots = [slots[0], slots[-1], *slots[1:-1]]
    return rounds


def _untraced(dist: Any) -> Any:
    """send, recv and barrier on the process group's own methods: the probe's traffic is monitoring, not
    training, and must not enter the collective trace the localizer reads (``trainhealth.comm`` wraps the
    module's functions, and their unwrapped versions still call the wrapped ``isend`` and ``irecv``)."""

    def send(tensor: Any, peer: int, group: Any, tag: int) -> None:
        group.send([tensor], dist.get_group_rank(group, peer), tag).wait()

    def recv(tensor: Any, peer: int, group: Any, tag: int) -> None:
        group.recv([tensor], dist.get_group_rank(group, peer), tag).wait()

    def barrier(group: Any) -> None:
        group.barrier().wait()

    return SimpleNamespace(send=send, recv=recv, barrier=barrier)


def _exchange(dist, group, buffers, me: int, peer: int, base_tag: int) -> list[float]:  # noqa: ANN001
    """One ping-pong per buffer with ``peer`` (the lower rank sends first); the round-trip times."""
    times = []
    for index, buffer in enumerate(buffers):
        start = time.perf_counter()
        if me < peer:
            dist.send(buffer, peer, group=group, tag=base_tag + index)
            dist.recv(buffer, peer, group=group, tag=base_tag + index)
        else:
            dist.recv(buffer, peer, group=group, tag=base_tag + index)
            dist.send(buffer, peer, group=group, tag=base_tag + index)
        times.append(time.perf_counter() - start)
    return times


def probe_links(
    *,
    group=None,
    sizes: Iterable[int] = (4096, 1 << 20),
    repeats: int = 5,  # noqa: ANN001
    timeout_s: float = 60.0,
) -> ProbeResult:
    """Measure every pair of ranks of ``group`` (default: all) and return the same result on every rank.

    Every rank of ``group`` calls it at the same point. It creates its own gloo process group
    (``timeout_s`` bounds every wait in it) and destroys it on return. The smallest of
    ``sizes`` (bytes) measures latency, the largest bandwidth. The whole round-robin schedule
    runs ``repeats`` times after a warm-up pass, each pair exchanging one message of each size
    per pass, and the fastest pass counts; a barrier of the probe group ends every round. The
    time taken is about ``(repeats + 1) × (ranks - 1)`` rounds of the slowest pair's exchange.
    """
    import torch
    import torch.distributed as dist

    sizes = tuple(sorted(set(int(size) for size in sizes)))
    if len(sizes) < 2 or sizes[0] < 1:
        raise ValueError(f"sizes needs two or more distinct positive byte counts, got {sizes!r}")
    if not isinstance(repeats, int) or repeats < 1:
        raise ValueError(f"repeats must be a positive integer, got {repeats!r}")
    if not timeout_s > 0:
        raise ValueError(f"timeout_s must be positive, got {timeout_s!r}")
    if not dist.is_available() or not dist.is_initialized():
        raise RuntimeError("probe_links needs torch.distributed initialised (init_process_group) on every rank")
    me = dist.get_rank()
    if group is None:
        ranks = tuple(range(dist.get_world_size()))
    else:
        ranks = tuple(sorted(dist.get_process_group_ranks(group)))
        if me not in ranks:
            raise ValueError(f"rank {me} is not in the group passed to probe_links")

    from trainhealth._internal.identity import Identity

    host = Identity.from_env().host
    timeout = timedelta(seconds=timeout_s)
    probe_group = dist.new_group(
        ranks=list(ranks), backend="gloo", timeout=timeout, use_local_synchronization=group is not None
    )
    untraced = _untraced(dist)
    schedule = round_robin(ranks)
    partners = [{rank: (a, b, index) for index, (a, b) in enumerate(pairs) for rank in (a, b)} for pairs in schedule]
    buffers = [torch.zeros(size, dtype=torch.uint8) for size in sizes]
    times: dict[tuple[int, int], list[list[float]]] = {}
    failures: dict[tuple[int, int], str] = {}
    notes: list[str] = []
    complete = True
    width = max(len(pairs) for pairs in schedule) * len(sizes) if schedule else 1
    try:
        # Pass 0 warms every connection up; the passes spread each pair's repeats over time,
        # so a burst of other load slows one pass, not the fastest of them.
        for repeat in range(repeats + 1):
            for round_index, pairing in enumerate(partners):
                if me in pairing:
                    a, b, pair_index = pairing[me]
                    peer = b if me == a else a
                    if (a, b) not in failures:
                        tag = 1 + ((repeat * len(schedule) + round_index) * width) + pair_index * len(sizes)
                        try:
                            measured = _exchange(untraced, probe_group, buffers, me, peer, tag)
                            if repeat:
                                times.setdefault((a, b), []).append(measured)
                        except RuntimeError as exc:  # a peer that did not answer in time, a broken connection
                            log.warning("link probe: rank %d <-> %d failed: %s", me, peer, exc)
                            failures[(a, b)] = f"{type(exc).__name__}: {exc}"[:300]
                untraced.barrier(group=probe_group)
    except RuntimeError as exc:
        complete = False
        notes.append(f"rank {me}: the probe fell out of step: {exc}"[:300])
    try:
        mine = [LinkMeasurement(a, b, math.inf, 0.0, failed=reason) for (a, b), reason in failures.items()]
        mine += [
            LinkMeasurement.from_round_trips(a, b, sizes, passes)
            for (a, b), passes in times.items()
            if (a, b) not in failures and a == me
        ]
        gathered: list[Any] = [None] * len(ranks)
        if complete:
            try:
                dist.all_gather_object(gathered, {"rank": me, "host": host, "links": mine}, group=probe_group)
            except RuntimeError as exc:
                complete = False
                notes.append(f"rank {me}: gathering the measurements failed: {exc}"[:300])
        if not complete:
            gathered = [{"rank": me, "host": host, "links": mine}]
    finally:
        try:
            dist.destroy_process_group(probe_group)
        except Exception as exc:  # noqa: BLE001 - cleanup must not raise into the training loop
            log.warning("link probe: destroying its process group failed: %s", exc)
    links: dict[tuple[int, int], LinkMeasurement] = {}
    for part in gathered:
        for m in part["links"]:
            key = (m.source, m.target)
            if key not in links or links[key].failed is None and m.failed is not None:
                links[key] = m  # a failure seen by either end wins
    hosts = {part["rank"]: part["host"] for part in gathered}
    return ProbeResult(
        tuple(sorted(links.values(), key=lambda m: (m.source, m.target))),
        ranks,
        hosts,
        sizes,
        repeats,
        complete,
        tuple(notes),
    )
