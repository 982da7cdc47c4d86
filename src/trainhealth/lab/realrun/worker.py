"""One rank of a real-run case: gloo on CPU, a small model, the Monitor and the collective logger.

Run by the launcher as ``python -m trainhealth.lab.realrun.worker --spec spec.json --rank R``
with ``MASTER_ADDR``, ``MASTER_PORT``, ``WORLD_SIZE`` and ``RANK`` set. The model's
"kernels" live inside autograd (the forward and backward of every layer) and in the
optimizer's step: on a CPU box a sleeping host thread is what a slow GPU kernel looks
like from the host, and a sleep does not take a core from the other ranks.

The kernels are *paced* (:class:`Clock`): each kernel of a step (every layer's forward
and backward, the optimizer's) ends when the nominal kernel time so far, times the work
factor (:meth:`CaseSpec.work_factor`), has passed since the step began, not counting
time blocked in this rank's own collectives. The host's own work (the torch math, autograd,
DDP, the Monitor) and late wake-ups are absorbed into the sleeps instead of adding to
them, so 8 ranks sharing 2 cores compute as evenly as 4, and a compute fault of
severity s makes the rank's compute per step s times as long. A ``cpu_share`` of each
kernel is a CPU-bound loop instead of a sleep (host-side launch overhead and
preprocessing); it is not paced, so a rank that loses its CPU to a competing process
really computes longer. A data-loader fault sleeps in the data fetch, before forward.

Writes, into the directory of ``spec.json``: ``rank-<R>.parquet`` (the collective
logger, rewritten while it runs every ``TRAINHEALTH_TRACE_WRITE_INTERVAL``),
``progress/rank-<R>.json`` (the step just finished, for the launcher) and
``progress/steps-rank-<R>.json`` (every step's start, wall time and compute time) at
the end; rank 0 also writes ``topology.json`` and, in link cases, ``probe.json`` when
the link probe is available. With ``markers=False`` there is no Monitor: the collective
logger alone records, so there are no step markers and every record has step 0.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import os
import signal
import sys
import time
from collections.abc import Callable, Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

from trainhealth.lab.realrun.spec import CaseSpec, Parallelism

__all__ = ["main", "run_rank"]

FORWARD_SHARE, BACKWARD_SHARE, OPTIMIZER_SHARE = 0.3, 0.6, 0.1


class Clock:
    """This rank's kernels, paced per step and scaled by the step's work factor (set once per step by the loop).

    The kernels of a step end when ``nominal x factor`` seconds of compute have passed since the step
    began (:meth:`begin_step`): the host's own work before a kernel is absorbed into its sleep. Time in
    :meth:`blocked` (this rank's collectives) does not count, and neither does the wall time of the
    CPU-bound share, which is measured in CPU time so that a rank that loses its core computes longer.
    """

    def __init__(self, forward_s: float, backward_s: float, optimizer_s: float, cpu_share: float = 0.0) -> None:
        self.base = (forward_s, backward_s, optimizer_s)
        self.cpu_share = cpu_share
        self.factor = 1.0
        self._began = 0.0
        self._blocked = 0.0  # seconds in collectives this step
        self._owed = 0.0  # paced kernel seconds due this step so far
        self._spun = 0.0  # wall seconds of the CPU-bound share this step
        self._busy = 0.0
        self.last_kernel_end = 0.0

    @property
    def forward_s(self) -> float:
        return self.base[0] * self.factor

    @property
    def backward_s(self) -> float:
        return self.base[1] * self.factor

    @property
    def optimizer_s(self) -> float:
        return self.base[2] * self.factor

    def begin_step(self, factor: float) -> None:
        """A step begins now: its host work up to each kernel counts as kernel time."""
        self.factor = factor
        self._began = self.last_kernel_end = time.perf_counter()
        self._blocked = self._owed = self._spun = self._busy = 0.0

    def kernel(self, seconds: float) -> None:
        """One kernel of ``seconds`` (already scaled by the factor): a CPU-bound share, then a paced sleep."""
        spin = seconds * self.cpu_share
        if spin > 0:
            began, cpu_began = time.perf_counter(), time.thread_time()
            while time.thread_time() - cpu_began < spin:
                pass
            self._spun += time.perf_counter() - began
        self._owed += seconds - spin
        elapsed = self._elapsed() - self._spun
        if self._owed > elapsed:
            time.sleep(self._owed - elapsed)
        self.last_kernel_end = time.perf_counter()
        self._busy = self._elapsed()

    def _elapsed(self) -> float:
        return time.perf_counter() - self._began - self._blocked

    def add_blocked(self, seconds: float) -> None:
        self._blocked += max(0.0, seconds)

    @contextlib.contextmanager
    def blocked(self) -> Iterator[None]:
        """Time spent in this rank's own collective (not compute: the pacing skips it)."""
        began = time.perf_counter()
        try:
            yield
        finally:
            self.add_blocked(time.perf_counter() - began)

    def busy_s(self) -> float:
        """Seconds this step computed: from its start to its last kernel's end, less the time blocked."""
        return self._busy


def _build(torch: Any, spec: CaseSpec, layers: int, clock: Clock) -> Any:
    """A stack of ``layers`` Linear+ReLU layers whose forward and backward each sleep like a kernel."""
    nn: Any = torch.nn

    class Kernel(torch.autograd.Function):
        @staticmethod
        def forward(ctx: Any, x: Any) -> Any:
            clock.kernel(clock.forward_s / layers)
            return x.clone()

        @staticmethod
        def backward(ctx: Any, grad: Any) -> Any:
            clock.kernel(clock.backward_s / layers)
            return grad

    class Layer(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.linear = nn.Linear(spec.width, spec.width)

        def forward(self, x: Any) -> Any:
            return Kernel.apply(torch.relu(self.linear(x)))

    return nn.Sequential(*[Layer() for _ in range(layers)])


@dataclasses.dataclass
class _Groups:
    """The process groups of this rank and the topology entries (group id -> members) it knows of."""

    dp: Any = None
    pp: Any = None
    tp: Any = None
    members: dict[str, Any] = dataclasses.field(default_factory=dict)  # group object key -> (desc, ranks)


def _new_groups(dist: Any, spec: CaseSpec, rank: int) -> tuple[_Groups, dict[str, tuple[list[int], Any]]]:
    """Every rank creates every group in the same order (torch requires it); returns this rank's groups."""
    groups = _Groups()
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


def _write_json(path: Path, data: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(path.name + ".partial")
    partial.write_text(json.dumps(data, sort_keys=True, indent=2) + "\n", encoding="utf-8")
    os.replace(partial, path)


def _write_topology(run_dir: Path, spec: CaseSpec, rank: int, fragment: dict[str, Any], timeout_s: float = 60.0) -> None:
    """Each rank writes its groups and host; rank 0 merges them into ``topology.json`` (no collective needed)."""
    parts = run_dir / "progress"
    _write_json(parts / f"topology-rank-{rank}.json", fragment)
    if rank != 0:
        return
    deadline = time.monotonic() + timeout_s
    found: dict[int, dict[str, Any]] = {}
    while len(found) < spec.ranks and time.monotonic() < deadline:
        for other in range(spec.ranks):
            path = parts / f"topology-rank-{other}.json"
            if other not in found and path.is_file():
                found[other] = json.loads(path.read_text(encoding="utf-8"))
        if len(found) < spec.ranks:
            time.sleep(0.05)
    groups: dict[str, list[int]] = {}
    hosts: dict[str, str] = {}
    for other, part in sorted(found.items()):
        groups.update(part["groups"])
        hosts[str(other)] = part["host"]
    parallelism = {"dp": spec.replicas}
    if spec.layout is Parallelism.DP_PP:
        parallelism["pp"] = 2
    elif spec.layout is Parallelism.DP_TP:
        parallelism["tp"] = 2
    _write_json(run_dir / "topology.json", {"groups": dict(sorted(groups.items())), "hosts": hosts,
                                             "parallelism": parallelism})


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
        p.grad = flat[offset:offset + count].view_as(g).clone()
        offset += count


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="trainhealth.lab.realrun.worker")
    parser.add_argument("--spec", required=True)
    parser.add_argument("--rank", type=int, help="run this rank")
    parser.add_argument("--ranks", help="fork these ranks (comma-separated) from one process that imported torch once")
    args = parser.parse_args(argv)
    if (args.rank is None) == (args.ranks is None):
        parser.error("give one of --rank and --ranks")
    if args.ranks is not None:
        return _fork_ranks(args.spec, [int(r) for r in args.ranks.split(",")])
    return run_rank(args.spec, args.rank)


def _fork_ranks(spec_path: str, ranks: list[int]) -> int:
    """Import torch and trainhealth once, then fork one child per rank (each with its own RANK and host).

    On 2 cores, eight ranks importing torch each take ~15 s of start-up; forked children share the
    parent's imports. A child that fails ends the others (they would wait for it until the gloo timeout).
    """
    import torch  # noqa: F401  -- preloaded for the children
    import torch._dynamo  # noqa: F401  -- DistributedDataParallel imports it lazily: ~5 s per process
    import torch.distributed  # noqa: F401
    import torch.nn.parallel  # noqa: F401

    import trainhealth.comm  # noqa: F401
    import trainhealth.exporters.monitor  # noqa: F401
    import trainhealth.traces.io  # noqa: F401

    run_dir = Path(spec_path).resolve().parent
    hosts = json.loads(os.environ.get("TRAINHEALTH_LAB_HOSTS", "{}"))
    namespaces = json.loads(os.environ.get("TRAINHEALTH_LAB_NETNS", "{}"))
    children: dict[int, int] = {}
    for rank in ranks:
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                log_path = run_dir / "logs" / f"rank-{rank}.log"
                fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
                os.dup2(fd, 1)
                os.dup2(fd, 2)
                os.environ.update(RANK=str(rank))
                if str(rank) in namespaces:
                    _enter_network_namespace(namespaces[str(rank)])
                if str(rank) in hosts:
                    os.environ["TRAINHEALTH_HOST"] = hosts[str(rank)]
                code = run_rank(spec_path, rank)
            except BaseException:
                import traceback

                traceback.print_exc()
            finally:
                sys.stdout.flush()
                sys.stderr.flush()
                os._exit(code)
        children[pid] = rank
    status = 0
    while children:
        pid, code = os.wait()
        children.pop(pid, None)
        if code != 0 and status == 0:
            status = 1
            for other in children:
                os.kill(other, signal.SIGKILL)
    return status


def _enter_network_namespace(name: str) -> None:
    """Move this (single-threaded, just forked) process into the network namespace ``name``, as ``ip netns exec``."""
    import ctypes

    clone_newnet = 0x40000000
    libc = ctypes.CDLL(None, use_errno=True)
    fd = os.open(f"/run/netns/{name}", os.O_RDONLY)
    try:
        if libc.setns(fd, clone_newnet) != 0:
            error = ctypes.get_errno()
            raise OSError(error, f"setns into network namespace {name}: {os.strerror(error)}")
    finally:
        os.close(fd)


def run_rank(spec_path: str, rank: int) -> int:
    """Train one rank of the case in ``spec_path``."""
    spec = CaseSpec.load(spec_path)
    run_dir = Path(spec_path).resolve().parent
    if spec.pin:
        os.sched_setaffinity(0, {spec.pin[rank]})

    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    torch.manual_seed(spec.seed)  # the same initial weights on every replica
    dist.init_process_group("gloo", rank=rank, world_size=spec.ranks, timeout=timedelta(seconds=90))
    try:
        _train(torch, dist, spec, rank, run_dir)
    finally:
        dist.destroy_process_group()
    return 0


def _train(torch: Any, dist: Any, spec: CaseSpec, rank: int, run_dir: Path) -> None:
    from trainhealth import comm

    groups, mine = _new_groups(dist, spec, rank)
    layers = spec.layers // 2 if spec.layout is Parallelism.DP_PP else spec.layers
    clock = Clock(spec.compute_s * FORWARD_SHARE, spec.compute_s * BACKWARD_SHARE, spec.compute_s * OPTIMIZER_SHARE,
                  spec.cpu_share)
    model = _build(torch, spec, layers, clock)
    train_module = model
    if spec.layout is Parallelism.DDP:
        # small buckets: about one all-reduce per layer, in flight during the rest of backward, as in real DDP
        bucket_mb = (spec.width * spec.width + spec.width) * 4 / 2**20
        train_module = torch.nn.parallel.DistributedDataParallel(model, bucket_cap_mb=bucket_mb)
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
    monitor = None
    if spec.markers:
        from trainhealth.exporters.monitor import Monitor

        monitor = Monitor(train_module, optimizer, comm=True, prometheus=False, otel=False, gpu_backend="off",
                          model_signals=False, sdc_interval=0, grad_check_every=0, detectors="off")
    else:  # the collective logger alone: no step, forward or optimizer rows; every record has step 0
        comm.install()
    if spec.layout is Parallelism.DDP:
        comm.instrument_ddp(train_module)

    def optimizer_kernel(*_: Any) -> None:  # registered after the Monitor's hooks
        clock.kernel(clock.optimizer_s)

    optimizer.register_step_pre_hook(optimizer_kernel)
    logger = comm.installed()
    ids = {logger.group_id(None): list(range(spec.ranks))} if logger is not None else {}
    if logger is not None:
        ids.update({logger.group_id(pg): ranks for ranks, pg in mine.values()})
    _write_topology(run_dir, spec, rank, {"groups": ids, "host": logger.host if logger is not None else ""})
    step_fn = _STEPS[spec.layout](torch, dist, spec, rank, model, train_module, groups, clock)

    timings: list[list[float]] = []
    progress = run_dir / "progress" / f"rank-{rank}.json"
    try:
        for step in range(spec.steps):
            began, cpu = time.time(), time.process_time()
            clock.begin_step(spec.work_factor(rank, step))
            stall = spec.fault.stall(rank, step)
            if stall > 0:  # the data fetch of every rank (inputs, or a last stage's labels) comes before forward
                with clock.blocked():  # not the rank's compute: the pacing must not absorb it
                    time.sleep(stall)
            loss = step_fn(step)
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            if monitor is not None:
                monitor.step(loss=loss, tokens=spec.batch, step=step)
            timings.append([step, began, time.time() - began, clock.busy_s(), time.process_time() - cpu])
            _write_json(progress, {"step": step, "time": time.time()})
        if spec.netns:
            _probe(run_dir, rank)
    finally:
        if monitor is not None:
            monitor.close()  # writes the final trace
        if comm.installed() is not None:
            comm.uninstall()
        _write_json(run_dir / "progress" / f"steps-rank-{rank}.json", timings)


def _probe(run_dir: Path, rank: int) -> None:
    """The pairwise link probe, when the package has it; its result (rank 0's) goes to ``probe.json``."""
    try:
        from trainhealth.exporters.collectives.probe import probe_links
    except ImportError as exc:
        if rank == 0:
            _write_json(run_dir / "probe.json", {"unavailable": f"trainhealth.exporters.collectives.probe: {exc}"})
        return
    try:
        result = probe_links()
    except Exception as exc:  # the lab records it; the scoring goes on without the probe
        if rank == 0:
            _write_json(run_dir / "probe.json", {"unavailable": f"probe_links() failed: {type(exc).__name__}: {exc}"})
        return
    if rank == 0 and result is not None:
        data = result.to_dict() if hasattr(result, "to_dict") else result
        _write_json(run_dir / "probe.json", data)


def _batch(torch: Any, spec: CaseSpec, rank: int, step: int) -> Any:
    """The data fetch: a batch drawn from (seed, step, replica)."""
    generator = torch.Generator().manual_seed(spec.seed * 1_000_003 + step * 1009 + spec.replica(rank))
    return torch.randn(spec.batch, spec.width, generator=generator)


StepFn = Callable[[int], Any]


def _ddp_step(torch: Any, dist: Any, spec: CaseSpec, rank: int, model: Any, ddp: Any, groups: _Groups,
              clock: Clock) -> StepFn:
    def step(index: int) -> Any:
        x = _batch(torch, spec, rank, index)
        loss = ddp(x).pow(2).mean()
        loss.backward()
        # after backward's last kernel, DDP waits for its bucket all-reduces: blocked, not compute
        clock.add_blocked(time.perf_counter() - clock.last_kernel_end)
        return loss.detach()

    return step


def _pp_step(torch: Any, dist: Any, spec: CaseSpec, rank: int, model: Any, _: Any, groups: _Groups,
             clock: Clock) -> StepFn:
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


def _tp_step(torch: Any, dist: Any, spec: CaseSpec, rank: int, model: Any, _: Any, groups: _Groups,
             clock: Clock) -> StepFn:
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


_STEPS = {Parallelism.DDP: _ddp_step, Parallelism.DP_PP: _pp_step, Parallelism.DP_TP: _tp_step}

if __name__ == "__main__":
    raise SystemExit(main())
