"""A trace-driven cluster simulator: collective-operation traces of DP x PP x TP (x CP x EP) jobs.

Every stage runs a 1F1B pipeline schedule of ``microbatches`` forward and
backward passes per step; each pass is compute followed by the stage's
tensor-, context- and expert-parallel collectives; activations and gradients
travel between stages by send/recv; each step ends with the data-parallel
gradient all-reduce and the optimizer. A collective ends at the latest member's
arrival plus its transfer time (the ByteDance what-if model), so a member that
waits shows it in its duration. Noise: lognormal jitter, a fixed per-GPU speed
spread (up to 14%: PRISM's healthy fleet), rare GC pauses and a slow drift; a
scenario with :class:`~trainhealth._internal.simulator.noise.ProductionNoise` adds
uneven work and transient hiccups (drawn from their own stream of the seed, so
everything else is drawn as without them; the hiccups are in
:attr:`SimulatedTrace.hiccups`).

The faults it injects and the controls are those of a :class:`Scenario`
(:mod:`trainhealth._internal.simulator.scenario`). Everything it writes is marked simulated: the
``simulated`` column, ``"simulated": true`` in the topology and ground truth,
and host names ``sim-node-*``.

>>> from trainhealth._internal.simulator.cluster import ClusterLayout
>>> trace = simulate(Scenario(ClusterLayout(dp=2, pp=2, tp=2), steps=3, microbatches=2, seed=1))
>>> sorted(trace.records["op"].unique())
['all_reduce', 'backward', 'forward', 'optimizer', 'recv', 'send']
>>> instance = trace.records[(trace.records["group"] == "dp-c0-t0-s1") & (trace.records["seq"] == 0)]
>>> bool(abs((instance["start"] + instance["duration"]).diff().iloc[-1]) < 1e-9)  # members end together
True
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from trainhealth._internal._files import write_json
from trainhealth._internal.simulator.cluster import ClusterLayout
from trainhealth._internal.simulator.noise import Hiccup, realise_noise
from trainhealth._internal.simulator.recorder import GroupNames, Recorder, group_view
from trainhealth._internal.simulator.scenario import Control, Scenario, Timing

__all__ = ["SimulatedTrace", "simulate"]


@dataclass(frozen=True)
class SimulatedTrace:
    records: pd.DataFrame
    topology: dict[str, Any]
    ground_truth: dict[str, Any]
    hiccups: tuple[Hiccup, ...] = ()  # the production noise's transient irregularities (none without it)

    def write(self, directory: str | os.PathLike[str]) -> list[Path]:
        """``trace.parquet``, ``topology.json`` and ``ground_truth.json`` in ``directory``."""
        from trainhealth._internal.traces.io import write_trace

        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        write_trace(self.records, directory / "trace.parquet")
        write_json(directory / "topology.json", self.topology)
        write_json(directory / "ground_truth.json", self.ground_truth)
        return [directory / "trace.parquet", directory / "topology.json", directory / "ground_truth.json"]


def _schedule(stage: int, stages: int, microbatches: int) -> list[tuple[str, int]]:
    """1F1B: warm-up forwards, then one forward one backward, then the remaining backwards."""
    warmup = min(stages - stage - 1, microbatches)
    order = [("F", m) for m in range(warmup)]
    backward = 0
    for m in range(warmup, microbatches):
        order += [("F", m), ("B", backward)]
        backward += 1
    order += [("B", m) for m in range(backward, microbatches)]
    return order


def simulate(scenario: Scenario) -> SimulatedTrace:
    """Run ``scenario`` and return its records, topology and ground truth."""
    layout, timing = scenario.layout, scenario.timing
    rng = np.random.default_rng(scenario.seed)
    world, stages = layout.world, layout.pp
    speed = 1.0 + rng.uniform(0.0, timing.gpu_spread, world)
    ranks_of = [layout.stage_ranks(s) for s in range(stages)]
    hosts = layout.host_of(np.arange(world))
    base = np.full(stages, timing.forward)
    if scenario.control is Control.STAGE_IMBALANCE:
        base[-1] *= timing.stage_imbalance
    recorder = Recorder()
    free = [np.zeros(ranks.shape) for ranks in ranks_of]
    names = GroupNames(layout, recorder)
    noise = None
    if scenario.noise is not None:
        noise = realise_noise(scenario.noise, layout, scenario.steps, scenario.microbatches, scenario.seed)

    def compute(
        step: int,
        s: int,
        kind: str,
        start: np.ndarray,
        seqlen: np.ndarray,
        slow: np.ndarray,
        extra: np.ndarray | None = None,
    ) -> np.ndarray:
        ranks = ranks_of[s]
        work = base[s] * (timing.backward_factor if kind == "backward" else 1.0)
        drift = 1.0 + timing.drift * step / max(1, scenario.steps - 1)
        duration = (
            work
            * speed[ranks]
            * slow[ranks]
            * drift
            * seqlen[:, None, None]
            * np.exp(rng.normal(0, timing.jitter, ranks.shape))
        )
        gc = rng.random(ranks.shape) < timing.gc_rate
        duration = duration + gc * rng.uniform(*timing.gc_pause, ranks.shape)
        if extra is not None:
            duration = duration + extra[ranks]
        recorder.add(ranks, step, kind, start, duration)
        return start + duration

    def collective(
        step: int, s: int, op: str, axis: str, arrival: np.ndarray, seconds: float, path: np.ndarray, nbytes: int
    ) -> np.ndarray:
        ranks = ranks_of[s]
        grouped, ungroup = group_view(arrival, axis, layout)
        factor, _ = group_view(path[ranks], axis, layout)
        member_hosts, _ = group_view(hosts[ranks], axis, layout)
        inter = member_hosts.max(axis=-1) > member_hosts.min(axis=-1)  # NICs and switches only carry these
        slowdown = np.where(inter, factor.max(axis=-1), 1.0)
        latest = grouped.max(axis=-1)
        end = latest + seconds * slowdown * np.exp(rng.normal(0, timing.comm_jitter, latest.shape))
        end_each = ungroup(np.broadcast_to(end[..., None], grouped.shape))
        codes = names.codes(axis, s)
        unique, member_of = np.unique(codes, return_inverse=True)
        seq = recorder.next_seq(unique)[member_of].reshape(codes.shape)
        recorder.add(ranks, step, op, arrival, end_each - arrival, group=codes, seq=seq, nbytes=nbytes)
        return end_each

    for step in range(scenario.steps):
        slow = np.ones(world)
        path = np.ones(world)
        for fault in scenario.faults:
            if not fault.active(step):
                continue
            affected = slow if fault.kind == "gpu" else path  # the GPUs compute, or the NICs and switches transfer
            affected[list(fault.ranks)] *= fault.severity
        seqlen = np.ones((scenario.microbatches, layout.dp))
        if scenario.control is Control.SEQLEN_IMBALANCE:
            seqlen = np.exp(rng.normal(0, timing.seqlen_sigma, seqlen.shape))
        passes_slow, stalled = slow, None
        if noise is not None:
            seqlen = seqlen * noise.work[step]
            passes_slow = slow * noise.compute_factor[step]
            path = path * noise.path_factor[step]
            stalled = noise.compute_extra[step]
        forward_done: dict[tuple[int, int], np.ndarray] = {}
        backward_done: dict[tuple[int, int], np.ndarray] = {}
        order = [_schedule(s, stages, scenario.microbatches) for s in range(stages)]
        position = [0] * stages
        while any(position[s] < len(order[s]) for s in range(stages)):
            progressed = False
            for s in range(stages):
                while position[s] < len(order[s]):
                    kind, m = order[s][position[s]]
                    source = (s - 1, m) if kind == "F" else (s + 1, m)
                    done = forward_done if kind == "F" else backward_done
                    needs_peer = (kind == "F" and s > 0) or (kind == "B" and s < stages - 1)
                    if needs_peer and source not in done:
                        break
                    start = free[s]
                    if needs_peer:
                        start = _transfer(
                            recorder,
                            names,
                            layout,
                            step,
                            source[0],
                            s,
                            done[source],
                            start,
                            ranks_of,
                            hosts,
                            path,
                            timing,
                            rng,
                        )
                    pass_kind = "forward" if kind == "F" else "backward"
                    first_pass = kind == "F" and m == 0  # a stall holds up the step's first pass
                    end = compute(step, s, pass_kind, start, seqlen[m], passes_slow, stalled if first_pass else None)
                    for axis, op, seconds in (
                        ("tp", "all_reduce", timing.tp_all_reduce),
                        ("cp", "all_gather", timing.cp_all_gather),
                        ("ep", "all_to_all", timing.ep_all_to_all),
                    ):
                        if getattr(layout, axis) > 1:
                            end = collective(step, s, op, axis, end, seconds, path, nbytes=1 << 24)
                    (forward_done if kind == "F" else backward_done)[(s, m)] = end
                    free[s] = end
                    position[s] += 1
                    progressed = True
            if not progressed:
                raise RuntimeError("pipeline schedule deadlocked")  # cannot happen with 1F1B
        for s in range(stages):
            end = free[s]
            if layout.dp > 1:
                end = collective(step, s, "all_reduce", "dp", end, timing.dp_all_reduce, path, nbytes=1 << 28)
            opt = (
                timing.optimizer
                * speed[ranks_of[s]]
                * slow[ranks_of[s]]
                * np.exp(rng.normal(0, timing.jitter, end.shape))
            )
            recorder.add(ranks_of[s], step, "optimizer", end, opt)
            free[s] = end + opt
    records = recorder.frame(layout)
    members = records.dropna(subset=["group"]).groupby("group", observed=True)["rank"].unique()
    topology = {
        "simulated": True,
        "groups": {str(g): sorted(int(r) for r in ranks) for g, ranks in members.items()},
        "hosts": {str(r): layout.host_name(int(layout.host_of(r))) for r in range(world)},
        "parallelism": layout.parallelism(),
        "switches": {str(r): f"leaf-{int(layout.leaf_of(r))}" for r in range(world)},
    }
    truth = scenario.ground_truth()
    if noise is None:
        return SimulatedTrace(records, topology, truth)
    truth["noise"]["hiccups"] = noise.counts()
    return SimulatedTrace(records, topology, truth, noise.hiccups)


def _transfer(
    recorder: Recorder,
    names: GroupNames,
    layout: ClusterLayout,
    step: int,
    source: int,
    target: int,
    ready: np.ndarray,
    posted: np.ndarray,
    ranks_of: list[np.ndarray],
    hosts: np.ndarray,
    path: np.ndarray,
    timing: Timing,
    rng: np.random.Generator,
) -> np.ndarray:
    """Send from stage ``source`` to ``target``: it ends when both sides are there plus the transfer."""
    senders, receivers = ranks_of[source], ranks_of[target]
    inter = hosts[senders] != hosts[receivers]
    seconds = np.where(inter, timing.p2p_inter * np.maximum(path[senders], path[receivers]), timing.p2p_intra)
    end = np.maximum(ready, posted) + seconds * np.exp(rng.normal(0, timing.comm_jitter, ready.shape))
    codes = names.codes("pp", source, target)
    seq = recorder.next_seq(codes.reshape(-1)).reshape(codes.shape)
    recorder.add(senders, step, "send", ready, end - ready, group=codes, seq=seq, nbytes=1 << 22, peer=receivers)
    recorder.add(receivers, step, "recv", posted, end - posted, group=codes, seq=seq, nbytes=1 << 22, peer=senders)
    return end
