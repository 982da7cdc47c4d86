"""A trace-driven cluster simulator: collective-operation traces of DP x PP x TP (x CP x EP) jobs.

Every stage runs a 1F1B pipeline schedule of ``microbatches`` forward and
backward passes per step; each pass is compute followed by the stage's
tensor-, context- and expert-parallel collectives; activations and gradients
travel between stages by send/recv; each step ends with the data-parallel
gradient all-reduce and the optimizer. A collective ends at the latest member's
arrival plus its transfer time (the ByteDance what-if model), so a member that
waits shows it in its duration. Noise: lognormal jitter, a fixed per-GPU speed
spread (up to 14%: PRISM's healthy fleet), rare GC pauses and a slow drift.

Injected faults, with ground truth: a slow GPU (compute x severity), a slow NIC
or link of one rank (its inter-host transfers x severity), every NIC of one host,
a slow leaf switch (every inter-host transfer of its hosts x severity) — transient or persistent,
severity 1.02 to 3. Negative controls: fault-free, a longer last pipeline stage,
and varying sequence lengths. Everything it writes is marked simulated: the
``simulated`` column, ``"simulated": true`` in the topology and ground truth,
and host names ``sim-node-*``.

>>> from trainhealth.lab.simulator.cluster import ClusterLayout
>>> trace = simulate(Scenario(ClusterLayout(dp=2, pp=2, tp=2), steps=3, microbatches=2, seed=1))
>>> sorted(trace.records["op"].unique())
['all_reduce', 'backward', 'forward', 'optimizer', 'recv', 'send']
>>> instance = trace.records[(trace.records["group"] == "dp-c0-t0-s1") & (trace.records["seq"] == 0)]
>>> bool(abs((instance["start"] + instance["duration"]).diff().iloc[-1]) < 1e-9)  # members end together
True
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from enum import Enum
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from trainhealth.lab.simulator.cluster import ClusterLayout

__all__ = ["Control", "ClusterFaultKind", "InjectedFault", "Scenario", "SimulatedTrace", "Timing", "simulate"]


class ClusterFaultKind(str, Enum):
    GPU = "gpu"  # the GPU computes slowly (throttling, a degraded HBM stack)
    NIC = "nic"  # one rank's NIC or link: its inter-host transfers are slow
    HOST = "host"  # every NIC of one host (a host-level network problem)
    SWITCH = "switch"  # a leaf switch: every inter-host transfer of the hosts under it


class Control(str, Enum):
    NONE = "none"
    STAGE_IMBALANCE = "stage_imbalance"
    SEQLEN_IMBALANCE = "seqlen_imbalance"


@dataclass(frozen=True)
class InjectedFault:
    """``target`` is a rank (gpu, nic), a host index (host) or a leaf switch (switch);
    active in steps ``[start_step, end_step)``."""

    kind: ClusterFaultKind
    target: int
    severity: float
    start_step: int = 0
    end_step: int | None = None

    def __post_init__(self) -> None:
        if not 1.0 < self.severity <= 10.0:
            raise ValueError("severity must be in (1, 10]")

    def active(self, step: int) -> bool:
        return self.start_step <= step and (self.end_step is None or step < self.end_step)


@dataclass(frozen=True)
class Timing:
    """Seconds per operation of a healthy, average GPU (transfers include their latency)."""

    forward: float = 0.020
    backward_factor: float = 2.0
    optimizer: float = 0.005
    tp_all_reduce: float = 0.0010
    cp_all_gather: float = 0.0015
    ep_all_to_all: float = 0.0040
    p2p_intra: float = 0.0005
    p2p_inter: float = 0.0020
    dp_all_reduce: float = 0.030
    jitter: float = 0.02  # lognormal sigma of compute
    comm_jitter: float = 0.05
    gpu_spread: float = 0.14  # fixed speed factor per GPU: 1 + U(0, spread)
    gc_rate: float = 0.0005  # per compute op
    gc_pause: tuple[float, float] = (0.03, 0.12)
    drift: float = 0.02  # slowdown of every GPU over the whole run
    stage_imbalance: float = 1.5
    seqlen_sigma: float = 0.25


@dataclass(frozen=True)
class Scenario:
    layout: ClusterLayout
    steps: int = 20
    microbatches: int = 4
    seed: int = 0
    faults: tuple[InjectedFault, ...] = ()
    control: Control = Control.NONE
    timing: Timing = field(default_factory=Timing)

    def __post_init__(self) -> None:
        if self.steps < 1 or self.microbatches < 1:
            raise ValueError("steps and microbatches must be >= 1")
        for fault in self.faults:
            limit = {ClusterFaultKind.SWITCH: int(self.layout.leaf_of(self.layout.world - 1)) + 1,
                     ClusterFaultKind.HOST: int(self.layout.host_of(self.layout.world - 1)) + 1}.get(fault.kind, self.layout.world)
            if not 0 <= fault.target < limit:
                raise ValueError(f"{fault.kind.value} fault target {fault.target} is outside the cluster")

    def ground_truth(self) -> dict[str, Any]:
        """What a localizer should find, for evaluation."""
        layout = self.layout
        faults = []
        for fault in self.faults:
            if fault.kind is ClusterFaultKind.SWITCH:
                per_leaf = layout.gpus_per_host * layout.hosts_per_leaf
                ranks = [r for r in range(fault.target * per_leaf, (fault.target + 1) * per_leaf) if r < layout.world]
                component = f"switch:leaf-{fault.target}"
            elif fault.kind is ClusterFaultKind.HOST:
                per_host = layout.gpus_per_host
                ranks = [r for r in range(fault.target * per_host, (fault.target + 1) * per_host) if r < layout.world]
                component = f"host:{layout.host_name(fault.target)}"
            else:
                ranks = [fault.target]
                component = f"{fault.kind.value}:rank-{fault.target}"
            faults.append({**asdict(fault), "kind": fault.kind.value, "ranks": ranks, "component": component,
                           "host": layout.host_name(int(layout.host_of(ranks[0])))})
        if faults:
            verdict = "compute" if self.faults[0].kind is ClusterFaultKind.GPU else "communication"  # the first is the one to find
        else:
            verdict = "imbalance" if self.control is not Control.NONE else "healthy"
        return {"simulated": True, "verdict": verdict, "control": self.control.value, "faults": faults,
                "layout": asdict(layout), "steps": self.steps, "microbatches": self.microbatches, "seed": self.seed}


_OPS = ("forward", "backward", "optimizer", "all_reduce", "all_gather", "all_to_all", "send", "recv")
_OP = {name: code for code, name in enumerate(_OPS)}


class _Recorder:
    """Collects records as numpy chunks; groups are interned to integer codes."""

    def __init__(self) -> None:
        self.chunks: list[tuple[np.ndarray, ...]] = []
        self.groups: list[str] = []
        self._group_codes: dict[str, int] = {}
        self._seq: dict[int, int] = {}

    def group(self, name: str) -> int:
        code = self._group_codes.get(name)
        if code is None:
            code = self._group_codes[name] = len(self.groups)
            self.groups.append(name)
        return code

    def next_seq(self, codes: np.ndarray) -> np.ndarray:
        """One new instance for each group code (numbered per group)."""
        out = np.empty(len(codes), dtype=np.int64)
        for position, code in enumerate(codes.tolist()):
            out[position] = self._seq[code] = self._seq.get(code, -1) + 1
        return out

    def add(self, ranks: np.ndarray, step: int, op: str, start: np.ndarray, duration: np.ndarray,
            group: np.ndarray | None = None, seq: np.ndarray | None = None, nbytes: int = 0,
            peer: np.ndarray | None = None) -> None:
        n = ranks.size
        self.chunks.append((
            ranks.reshape(-1).astype(np.int32), np.full(n, step, dtype=np.int32), np.full(n, _OP[op], dtype=np.int8),
            (group.reshape(-1) if group is not None else np.full(n, -1)).astype(np.int32),
            (seq.reshape(-1) if seq is not None else np.full(n, -1)).astype(np.int64),
            np.broadcast_to(start, ranks.shape).reshape(-1).astype(np.float64),
            np.broadcast_to(duration, ranks.shape).reshape(-1).astype(np.float64),
            np.full(n, nbytes, dtype=np.int64),
            (peer.reshape(-1) if peer is not None else np.full(n, -1)).astype(np.int32),
        ))

    def frame(self, layout: ClusterLayout) -> pd.DataFrame:
        columns = [np.concatenate(parts) for parts in zip(*self.chunks)]
        rank, step, op, group, seq, start, duration, nbytes, peer = columns
        hosts = [layout.host_name(h) for h in range(int(layout.host_of(layout.world - 1)) + 1)]
        frame = pd.DataFrame({
            "rank": rank.astype(np.int64), "step": step.astype(np.int64),
            "op": pd.Categorical.from_codes(op, categories=list(_OPS)),
            "group": pd.Categorical.from_codes(group, categories=self.groups),
            "seq": pd.array(np.where(seq >= 0, seq, 0), dtype="Int64"),
            "start": start, "duration": duration,
            "bytes": pd.array(nbytes, dtype="Int64"),
            "host": pd.Categorical.from_codes((rank // layout.gpus_per_host).astype(np.int64), categories=hosts),
            "gpu": (rank % layout.gpus_per_host).astype(np.int64),
            "peer": pd.array(peer, dtype="Int64"),
        })
        frame.loc[seq < 0, "seq"] = pd.NA
        frame.loc[peer < 0, "peer"] = pd.NA
        frame["simulated"] = True
        return frame.sort_values(["rank", "start"], kind="stable").reset_index(drop=True)


@dataclass(frozen=True)
class SimulatedTrace:
    records: pd.DataFrame
    topology: dict[str, Any]
    ground_truth: dict[str, Any]

    def write(self, directory: str | os.PathLike[str]) -> list[Path]:
        """``trace.parquet``, ``topology.json`` and ``ground_truth.json`` in ``directory``."""
        from trainhealth.traces.io import write_trace

        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        write_trace(self.records, directory / "trace.parquet")
        (directory / "topology.json").write_text(json.dumps(self.topology, indent=2, sort_keys=True) + "\n")
        (directory / "ground_truth.json").write_text(json.dumps(self.ground_truth, indent=2, sort_keys=True) + "\n")
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
    leaves = layout.leaf_of(np.arange(world))
    base = np.full(stages, timing.forward)
    if scenario.control is Control.STAGE_IMBALANCE:
        base[-1] *= timing.stage_imbalance
    recorder = _Recorder()
    free = [np.zeros(ranks.shape) for ranks in ranks_of]
    names = _GroupNames(layout, recorder)

    def compute(step: int, s: int, kind: str, start: np.ndarray, seqlen: np.ndarray, slow: np.ndarray) -> np.ndarray:
        ranks = ranks_of[s]
        work = base[s] * (timing.backward_factor if kind == "backward" else 1.0)
        drift = 1.0 + timing.drift * step / max(1, scenario.steps - 1)
        duration = work * speed[ranks] * slow[ranks] * drift * seqlen[:, None, None] * np.exp(rng.normal(0, timing.jitter, ranks.shape))
        gc = rng.random(ranks.shape) < timing.gc_rate
        duration = duration + gc * rng.uniform(*timing.gc_pause, ranks.shape)
        recorder.add(ranks, step, kind, start, duration)
        return start + duration

    def collective(step: int, s: int, op: str, axis: str, arrival: np.ndarray, seconds: float, path: np.ndarray,
                   nbytes: int) -> np.ndarray:
        ranks = ranks_of[s]
        grouped, ungroup = _group_view(arrival, axis, layout)
        factor, _ = _group_view(path[ranks], axis, layout)
        member_hosts, _ = _group_view(hosts[ranks], axis, layout)
        inter = member_hosts.max(axis=-1) > member_hosts.min(axis=-1)  # NICs and switches only carry these
        slowdown = np.where(inter, factor.max(axis=-1), 1.0)
        latest = grouped.max(axis=-1)
        end = latest + seconds * slowdown * np.exp(rng.normal(0, timing.comm_jitter, latest.shape))
        end_each = ungroup(np.broadcast_to(end[..., None], grouped.shape))
        codes = names.codes(axis, s)
        seq = recorder.next_seq(np.unique(codes))
        seq_of = dict(zip(np.unique(codes).tolist(), seq.tolist()))
        recorder.add(ranks, step, op, arrival, end_each - arrival, group=codes,
                     seq=np.vectorize(seq_of.get)(codes), nbytes=nbytes)
        return end_each

    for step in range(scenario.steps):
        slow = np.ones(world)
        path = np.ones(world)
        for fault in scenario.faults:
            if not fault.active(step):
                continue
            if fault.kind is ClusterFaultKind.GPU:
                slow[fault.target] *= fault.severity
            elif fault.kind is ClusterFaultKind.NIC:
                path[fault.target] *= fault.severity
            elif fault.kind is ClusterFaultKind.HOST:
                path[hosts == fault.target] *= fault.severity
            else:
                path[leaves == fault.target] *= fault.severity
        seqlen = np.ones((scenario.microbatches, layout.dp))
        if scenario.control is Control.SEQLEN_IMBALANCE:
            seqlen = np.exp(rng.normal(0, timing.seqlen_sigma, seqlen.shape))
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
                        start = _transfer(recorder, names, layout, step, source[0], s, done[source], start, ranks_of,
                                          hosts, path, timing, rng)
                    pass_kind = "forward" if kind == "F" else "backward"
                    end = compute(step, s, pass_kind, start, seqlen[m], slow)
                    for axis, op, seconds in (("tp", "all_reduce", timing.tp_all_reduce),
                                              ("cp", "all_gather", timing.cp_all_gather),
                                              ("ep", "all_to_all", timing.ep_all_to_all)):
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
            opt = timing.optimizer * speed[ranks_of[s]] * slow[ranks_of[s]] * np.exp(rng.normal(0, timing.jitter, end.shape))
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
    return SimulatedTrace(records, topology, scenario.ground_truth())


class _GroupNames:
    """Group ids per axis and stage as a (dp, cp, tp) array of interned codes."""

    def __init__(self, layout: ClusterLayout, recorder: _Recorder) -> None:
        self._layout, self._recorder = layout, recorder
        self._cache: dict[tuple[str, int], np.ndarray] = {}

    def codes(self, axis: str, stage: int, other: int | None = None) -> np.ndarray:
        key = (axis, stage if other is None else stage * 100_000 + other)
        found = self._cache.get(key)
        if found is not None:
            return found
        layout = self._layout
        d, c, t = np.meshgrid(np.arange(layout.dp), np.arange(layout.cp), np.arange(layout.tp), indexing="ij")
        if axis == "tp":
            names = [f"tp-d{a}-c{b}-s{stage}" for a, b, _ in zip(d.ravel(), c.ravel(), t.ravel())]
        elif axis == "cp":
            names = [f"cp-d{a}-t{x}-s{stage}" for a, _, x in zip(d.ravel(), c.ravel(), t.ravel())]
        elif axis == "ep":
            names = [f"ep-b{a // layout.ep}-c{b}-t{x}-s{stage}" for a, b, x in zip(d.ravel(), c.ravel(), t.ravel())]
        elif axis == "dp":
            names = [f"dp-c{b}-t{x}-s{stage}" for _, b, x in zip(d.ravel(), c.ravel(), t.ravel())]
        else:  # pipeline link between stage and other
            low, high = min(stage, other), max(stage, other)  # type: ignore[type-var]
            names = [f"pp-d{a}-c{b}-t{x}-s{low}-{high}" for a, b, x in zip(d.ravel(), c.ravel(), t.ravel())]
        found = np.array([self._recorder.group(name) for name in names]).reshape(d.shape)
        self._cache[key] = found
        return found


def _group_view(values: np.ndarray, axis: str,
                layout: ClusterLayout) -> tuple[np.ndarray, Callable[[np.ndarray], np.ndarray]]:
    """``values`` (dp, cp, tp) rearranged with the group's members on the last axis, and the inverse."""
    dp, cp, tp = values.shape
    if axis == "tp":
        return values, lambda grouped: grouped
    if axis == "cp":
        moved = values.transpose(0, 2, 1)
        return moved, lambda grouped: grouped.transpose(0, 2, 1)
    if axis == "dp":
        moved = values.transpose(1, 2, 0)
        return moved, lambda grouped: grouped.transpose(2, 0, 1)
    blocks = values.reshape(dp // layout.ep, layout.ep, cp, tp).transpose(0, 2, 3, 1)  # ep
    return blocks, lambda grouped: grouped.transpose(0, 3, 1, 2).reshape(dp, cp, tp)


def _transfer(recorder: _Recorder, names: _GroupNames, layout: ClusterLayout, step: int, source: int, target: int,
              ready: np.ndarray, posted: np.ndarray, ranks_of: list[np.ndarray], hosts: np.ndarray,
              path: np.ndarray, timing: Timing, rng: np.random.Generator) -> np.ndarray:
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


def with_fault(scenario: Scenario, fault: InjectedFault) -> Scenario:
    return replace(scenario, faults=scenario.faults + (fault,))
