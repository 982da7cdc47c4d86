"""The shapes users run, as one rank of a real-run case: their own collectives, FSDP-style sharding, trainers.

The lab's own loop (:mod:`trainhealth_lab.realrun.worker`) makes the shapes the localizer was built on:
DDP buckets, pipeline send/recv, TP all-reduces, all under the Monitor. A case whose
:class:`~trainhealth_lab.realrun.spec.Driver` is not ``lab`` runs here instead, on the same paced
kernels (:class:`~trainhealth_lab.realrun.kernels.Clock`) and the same fault schedule:

* ``explicit``: the loop calls ``dist.all_reduce`` on a gradient-sized tensor after each step's compute
  and ``dist.barrier()`` every 5th step, with ``trainhealth.comm.install(trace_dir=...)`` alone: no
  Monitor, so no step markers and every record has step 0 (issue 30's reproduction);
* ``fsdp``: every layer's weights live as a flat shard per rank; before each layer's forward and again
  before its backward the rank gathers the full flat weights (``dist.all_gather_into_tensor``), and
  after its backward reduces and scatters the layer's flat gradient (``dist.reduce_scatter_tensor``),
  as FSDP does (synchronously, without prefetch); with the Monitor, or with the collective logger
  alone (``markers=False``);
* ``fsdp2``: torch's own FSDP2 (``fully_shard`` on every layer and the root) over the lab's model, with the
  Monitor; its collectives run inside FSDP's hooks, so the kernels are unpaced sleeps
  (:class:`~trainhealth_lab.realrun.kernels.Clock` ``paced=False``). torch 2.13's FSDP2 calls
  ``dist.all_gather_single`` and ``dist.reduce_scatter_single``, which the collective logger does not wrap:
  its trace holds the Monitor's markers and no collective.

(``hf_trainer`` and ``accelerate`` are in :mod:`trainhealth_lab.realrun.trainers`.)

gloo on CPU runs both ``all_gather_into_tensor`` and ``reduce_scatter_tensor`` (torch 2.13 deprecates
them for ``all_gather_single`` / ``reduce_scatter_single``, which its own FSDP2 calls): nothing is
emulated.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from trainhealth_lab.realrun.kernels import (
    BACKWARD_SHARE,
    FORWARD_SHARE,
    OPTIMIZER_SHARE,
    Clock,
    build_model,
)
from trainhealth_lab.realrun.rankfiles import StepLog, write_topology
from trainhealth_lab.realrun.spec import CaseSpec, Driver, stall_seconds

__all__ = ["BARRIER_EVERY", "MONITOR_SETTINGS", "clock_for", "default_topology", "stall", "train_shape"]

#: The explicit loop's ``dist.barrier()`` period, in iterations.
BARRIER_EVERY = 5
#: The Monitor as the lab runs it: the collective logger and its markers on, every exporter and check off.
MONITOR_SETTINGS: dict[str, Any] = {
    "comm": True,
    "prometheus": False,
    "otel": False,
    "gpu_backend": "off",
    "model_signals": False,
    "sdc_interval": 0,
    "grad_check_every": 0,
    "detectors": "off",
}


def clock_for(spec: CaseSpec, *, paced: bool = True) -> Clock:
    """The kernels of one rank of ``spec``."""
    return Clock(
        spec.compute_s * FORWARD_SHARE,
        spec.compute_s * BACKWARD_SHARE,
        spec.compute_s * OPTIMIZER_SHARE,
        spec.cpu_share,
        paced=paced,
    )


def stall(spec: CaseSpec, rank: int, step: int, clock: Clock) -> None:
    """A data-loader fault's sleep in the data fetch (not the rank's compute: the pacing does not absorb it)."""
    seconds = stall_seconds(spec.fault, rank, step)
    if seconds > 0:
        with clock.blocked():
            time.sleep(seconds)


def default_topology(dist: Any, spec: CaseSpec, rank: int, run_dir: Path) -> None:
    """``topology.json`` for a job of one data-parallel group (every rank), with the logger's group id."""
    from trainhealth import comm

    logger = comm.installed()
    groups = {logger.group_id(None): list(range(spec.ranks))} if logger is not None else {}
    write_topology(run_dir, spec, rank, {"groups": groups, "host": logger.host if logger is not None else ""})


def train_shape(torch: Any, dist: Any, spec: CaseSpec, rank: int, run_dir: Path) -> None:
    """Train one rank of ``spec`` (driver ``explicit``, ``fsdp`` or ``fsdp2``; the process group is initialised)."""
    from trainhealth import comm

    try:
        if spec.driver is Driver.EXPLICIT:
            _explicit(torch, dist, spec, rank, run_dir)
        elif spec.driver is Driver.FSDP:
            _fsdp(torch, dist, spec, rank, run_dir)
        elif spec.driver is Driver.FSDP2:
            _fsdp2(torch, dist, spec, rank, run_dir)
        else:
            raise ValueError(f"driver {spec.driver.value} is not a shape of this module")
    finally:
        if comm.installed() is not None:
            comm.uninstall()  # writes the rest of the trace


def _explicit(torch: Any, dist: Any, spec: CaseSpec, rank: int, run_dir: Path) -> None:
    """Compute, ``dist.all_reduce`` of the gradient, ``dist.barrier()`` every 5th iteration, the update."""
    from trainhealth import comm

    comm.install(trace_dir=run_dir)  # the collective logger alone, as the user runs it
    default_topology(dist, spec, rank, run_dir)
    clock = clock_for(spec)
    grad = torch.zeros(spec.layers * (spec.width * spec.width + spec.width))
    steps = StepLog(run_dir, rank, clock)
    try:
        for step in range(spec.steps):
            steps.begin(spec.work_factor(rank, step))
            stall(spec, rank, step, clock)
            clock.kernel(clock.forward_s + clock.backward_s)
            grad.fill_(float(rank))
            with clock.blocked():
                dist.all_reduce(grad)
                if (step + 1) % BARRIER_EVERY == 0:
                    dist.barrier()
            clock.kernel(clock.optimizer_s)
            steps.end(step)
    finally:
        steps.close()


def _fsdp(torch: Any, dist: Any, spec: CaseSpec, rank: int, run_dir: Path) -> None:
    """Per-layer gather before forward and before backward, reduce-scatter of each layer's gradient."""
    from trainhealth import comm

    clock = clock_for(spec)
    model = _sharded_stack(torch, dist, spec, rank, clock)
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
    monitor = None
    if spec.markers:
        from trainhealth._internal.exporters.monitor import Monitor

        monitor = Monitor(model, optimizer, **MONITOR_SETTINGS)
    else:
        comm.install()

    def optimizer_kernel(*_: Any) -> None:  # after the Monitor's hooks, inside its optimizer row
        clock.kernel(clock.optimizer_s)

    optimizer.register_step_pre_hook(optimizer_kernel)
    default_topology(dist, spec, rank, run_dir)
    steps = StepLog(run_dir, rank, clock)
    try:
        for step in range(spec.steps):
            steps.begin(spec.work_factor(rank, step))
            stall(spec, rank, step, clock)
            generator = torch.Generator().manual_seed(spec.seed * 1_000_003 + step * 1009 + rank)
            out = model(torch.randn(spec.batch, spec.width, generator=generator))
            loss = out.pow(2).mean()
            model.backward(2 * out / out.numel())
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            if monitor is not None:
                monitor.step(loss=loss, tokens=spec.batch, step=step)
            steps.end(step)
    finally:
        if monitor is not None:
            monitor.close()
        steps.close()


def _fsdp2(torch: Any, dist: Any, spec: CaseSpec, rank: int, run_dir: Path) -> None:
    """torch's ``fully_shard`` on every layer and the root, under the Monitor (or the logger alone)."""
    from torch.distributed.fsdp import fully_shard

    from trainhealth import comm

    clock = clock_for(spec, paced=False)
    torch.manual_seed(spec.seed)
    model = build_model(torch, spec, spec.layers, clock)
    for layer in model:
        fully_shard(layer)
    fully_shard(model)
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
    monitor = None
    if spec.markers:
        from trainhealth._internal.exporters.monitor import Monitor

        monitor = Monitor(model, optimizer, **MONITOR_SETTINGS)
    else:
        comm.install()
    optimizer.register_step_pre_hook(lambda *_: clock.kernel(clock.optimizer_s))
    default_topology(dist, spec, rank, run_dir)
    steps = StepLog(run_dir, rank, clock)
    try:
        for step in range(spec.steps):
            steps.begin(spec.work_factor(rank, step))
            stall(spec, rank, step, clock)
            generator = torch.Generator().manual_seed(spec.seed * 1_000_003 + step * 1009 + rank)
            loss = model(torch.randn(spec.batch, spec.width, generator=generator)).pow(2).mean()
            loss.backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            if monitor is not None:
                monitor.step(loss=loss.detach(), tokens=spec.batch, step=step)
            steps.end(step)
    finally:
        if monitor is not None:
            monitor.close()
        steps.close()


def _sharded_stack(torch: Any, dist: Any, spec: CaseSpec, rank: int, clock: Clock) -> Any:
    """A stack of Linear+ReLU layers, each layer's weight and bias one flat buffer sharded over the ranks.

    ``forward`` gathers each layer before running it and keeps its input; ``backward`` gathers each layer
    again (the full weights were freed after forward, as FSDP reshards), recomputes the layer with autograd,
    and reduce-scatters its flat gradient into the shard's ``grad`` (averaged over the ranks). A
    ``torch.nn.Module``, so the Monitor hooks its forward.
    """
    nn: Any = torch.nn
    width, world, layers = spec.width, spec.ranks, spec.layers
    numel = width * width + width
    padded = -(-numel // world) * world
    size = padded // world

    def layer_math(x: Any, flat: Any) -> Any:
        weight, bias = flat[: width * width].view(width, width), flat[width * width : numel]
        return torch.relu(x @ weight.T + bias)

    class ShardedStack(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            torch.manual_seed(spec.seed)  # the same full weights on every rank; each keeps its slice
            shards = []
            for _ in range(layers):
                linear, full = nn.Linear(width, width), torch.zeros(padded)
                full[:numel] = torch.cat([linear.weight.detach().reshape(-1), linear.bias.detach()])
                shards.append(nn.Parameter(full[rank * size : (rank + 1) * size].clone()))
            self.shards = nn.ParameterList(shards)
            self._inputs: list[Any] = []

        def _gather(self, index: int) -> Any:
            full = torch.empty(padded)
            with clock.blocked():
                dist.all_gather_into_tensor(full, self.shards[index].detach())
            return full

        def forward(self, x: Any) -> Any:
            self._inputs = []
            h = x
            with torch.no_grad():
                for index in range(layers):
                    full = self._gather(index)
                    clock.kernel(clock.forward_s / layers)
                    self._inputs.append(h)
                    h = layer_math(h, full)
            return h

        def backward(self, grad: Any) -> None:
            for index in reversed(range(layers)):
                full = self._gather(index).requires_grad_(True)
                x = self._inputs[index].detach().requires_grad_(True)
                with torch.enable_grad():
                    layer_math(x, full).backward(grad)
                clock.kernel(clock.backward_s / layers)
                shard_grad = torch.empty(size)
                with clock.blocked():
                    dist.reduce_scatter_tensor(shard_grad, full.grad)
                self.shards[index].grad = shard_grad / world
                grad = x.grad
            self._inputs = []

    return ShardedStack()
