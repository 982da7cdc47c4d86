"""One rank of the demo: real DDP training of TinyGPT on gloo, instrumented, with faults injected on schedule.

Each rank serves its own /metrics (port base + rank), records collectives into
the trace directory (rewritten every 20 steps, so the analyzer localizes while
the job runs), samples a simulated GPU (labelled backend="simulated") and
sends a progress line per step to the demo's terminal. All ranks stop at the
same step: every step they all-reduce a stop flag (Ctrl-C, or the end).
"""

from __future__ import annotations

import json
import os
import queue
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from trainhealth._internal.faults import Fault

__all__ = ["MODEL_SHAPE", "DemoConfig", "rank_main", "tensor_names"]

#: The default detectors, with the spike score over 200 steps instead of OLMo 2's 1,000 (a demo is short), and
#: the z-score on loss and gradient norm at 6 instead of 4: a rank's loss here is the mean over one batch of 256
#: tokens, heavy-tailed, and clean development runs (seed 0) reached z = 4.6-4.9 while the injected spike scored
#: 13-58 (docs/benchmarks.md, "Demo runs").
DEMO_DETECTORS = (
    "loss=zscore(direction=up,threshold=6),spike(window=200),nonfinite;"
    "grad_norm=zscore(direction=up,threshold=6),spike(window=200),nonfinite;"
    "step_time=delta(min_consecutive=2),level_shift(direction=up,min_relative=0.25,threshold=16);"
    "throughput=level_shift(direction=down,min_relative=0.25,threshold=16);"
    "comm_duration=level_shift(direction=up,min_relative=1)"
)
#: A nominal peak for one CPU core's float32 FLOP/s, so the demo's MFU panel has a scale (not a measurement).
CPU_PEAK_FLOPS = 5e10
CHECKPOINT_EVERY = 100
#: The demo's model: TinyGPT of this shape.
MODEL_SHAPE = {"vocab": 128, "width": 64, "layers": 2, "heads": 4, "context": 32}
FORWARDED_EVENTS = (
    "anomaly",
    "sdc_suspect",
    "gpu.xid",
    "gpu.lost",
    "fault_injected",
    "loss_spike_unrecovered",
    "nonfinite_origin",
)


@dataclass(frozen=True)
class DemoConfig:
    ranks: int
    duration_s: float
    out: str
    addr: str
    port_base: int
    faults: list[Fault] | None  # None: the built-in schedule
    master_port: int
    pace_s: float = 0.1  # host work per step on top of the tiny model, so steps look like a real job's
    job: str = "demo"  # the logical name (job_name)
    run_id: str | None = None  # the job label: this demo run's own id, shared with the demo's analyzer
    seed: int = 0


def rank_main(rank: int, config: DemoConfig, progress: Any, stop: Any) -> None:
    import signal

    import torch
    import torch.distributed as dist

    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C reaches the demo process, which stops every rank in step
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})  # blocked by the demo while it started the ranks
    torch.set_num_threads(1)
    _log_to_file(Path(config.out) / "logs" / f"rank-{rank}.log")
    os.environ.update(
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(config.master_port),
        RANK=str(rank),
        LOCAL_RANK=str(rank),
        WORLD_SIZE=str(config.ranks),
    )
    dist.init_process_group("gloo", rank=rank, world_size=config.ranks)
    try:
        _train(rank, config, progress, stop, torch, dist)
    except Exception as exc:  # the terminal shows it; the other ranks stop at their next collective
        _send(progress, {"rank": rank, "error": f"{type(exc).__name__}: {exc}"})
        raise
    finally:
        dist.destroy_process_group()


def _log_to_file(path: Path) -> None:
    """This rank's warnings and log records go to ``path``, not to the terminal the live view draws on."""
    import logging

    path.parent.mkdir(parents=True, exist_ok=True)
    handler = logging.FileHandler(path, encoding="utf-8")
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(logging.INFO)
    logging.captureWarnings(True)  # warnings.warn (torch's UserWarnings) becomes a record of the file


def _train(rank: int, config: DemoConfig, progress: Any, stop: Any, torch: Any, dist: Any) -> None:
    from trainhealth._internal.demo.schedule import default_schedule
    from trainhealth._internal.demo.tiny_gpt import TinyGPT, synthetic_batch
    from trainhealth._internal.exporters.collectives import install as comm
    from trainhealth._internal.exporters.monitor import Monitor
    from trainhealth._internal.injectors.schedule import Injector

    out = Path(config.out)
    torch.manual_seed(config.seed)
    shape = MODEL_SHAPE
    model = TinyGPT(**shape)
    ddp = torch.nn.parallel.DistributedDataParallel(model)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    parameters = sum(p.numel() for p in model.parameters())
    monitor = Monitor(
        ddp,
        optimizer,
        job=config.job,
        run_id=config.run_id,
        comm=True,
        trace_dir=str(out / "traces"),
        gpu_backend="simulated",
        simulated_gpus=config.ranks,
        gpu_sample_interval=1.0,
        prometheus_addr=config.addr,
        prometheus_port=config.port_base + rank,
        comm_flush_interval=1.0,
        stats_every=10,
        sdc_interval=50,
        detectors=DEMO_DETECTORS,
        flops_per_token=6.0 * parameters,
        peak_flops=CPU_PEAK_FLOPS,
    )
    seen: dict[tuple[str, ...], float] = {}
    monitor.events.add_listener(lambda event: _forward(event, rank, progress, seen))
    comm.instrument_ddp(ddp)  # DDP's bucket all-reduces bypass torch.distributed: record them with a comm hook

    def one_step(step: int) -> tuple[float, Any]:
        began = time.perf_counter()
        tokens = synthetic_batch(shape["vocab"], shape["context"], 8, seed=config.seed * 1_000_003 + step * 64 + rank)
        logits = ddp(tokens[:, :-1])
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, shape["vocab"]), tokens[:, 1:].reshape(-1))
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        time.sleep(config.pace_s)
        monitor.step(loss=loss, tokens=tokens.numel(), step=step)
        return time.perf_counter() - began, loss

    # calibrate: how many steps fit in the duration, agreed by every rank
    timings = [one_step(step)[0] for step in range(5)]
    slowest = torch.tensor([sum(timings) / len(timings)], dtype=torch.float64)
    dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
    steps = max(60, int(config.duration_s / float(slowest)))
    schedule = config.faults if config.faults is not None else default_schedule(steps, config.ranks, float(slowest))
    injector = Injector(
        schedule,
        model=model,
        optimizer=optimizer,
        rank=rank,
        seed=config.seed,
        ground_truth=out / "faults.jsonl",
        events=monitor.events,
        simulated_gpu=monitor.gpu.simulator if monitor.gpu is not None else None,
    )
    _send(progress, {"rank": rank, "steps": steps, "metrics_url": monitor.metrics_url, "schedule": schedule})
    history: list[dict[str, Any]] = []
    flag = torch.zeros(1)
    try:
        for step in range(5, steps):
            injector.begin_step(step)
            seconds, loss = one_step(step)
            flag[0] = 1.0 if stop.is_set() else 0.0
            dist.all_reduce(flag, op=dist.ReduceOp.MAX)
            row = {
                "step": step,
                "time": time.time(),
                "loss": float(loss.detach()),
                "step_time": seconds,
                **_step_split(monitor),
                **_gpu_readings(monitor, rank),
            }
            history.append(row)
            _send(progress, {"rank": rank, **row})
            logger = comm.installed() if step % 20 == 0 else None
            if logger is not None:
                logger.write_trace()
            if step % CHECKPOINT_EVERY == 0 and rank == 0:
                began = time.perf_counter()
                torch.save({"step": step, "model": model.state_dict()}, out / "checkpoint.pt")
                monitor.checkpoint_saved(step, time.perf_counter() - began)
            if flag[0] > 0:
                break
    finally:
        injector.close()
        monitor.close()  # writes the final trace
        (out / "history").mkdir(parents=True, exist_ok=True)
        (out / "history" / f"rank-{rank}.json").write_text(json.dumps({"rank": rank, "steps": history}))
        _send(progress, {"rank": rank, "done": True})


def tensor_names(target: str) -> list[str]:
    """The names a tensor fault's ``tensor`` glob is matched against in the demo's model: its floating-point
    parameters (``parameter``, ``gradient``) or its modules (``activation``)."""
    from trainhealth._internal.demo.tiny_gpt import TinyGPT

    model = TinyGPT(**MODEL_SHAPE)
    if target == "activation":
        return [name for name, _ in model.named_modules() if name]
    return [name for name, parameter in model.named_parameters() if parameter.is_floating_point()]


def _step_split(monitor: Any) -> dict[str, float | None]:
    """Compute and wait of this rank's last accounted step, as the collective logger exports them."""
    from trainhealth._internal import catalog

    readings = {
        "compute": monitor.store.value(catalog.TRAIN_LAST_STEP_COMPUTE),
        "wait": monitor.store.value(catalog.TRAIN_LAST_STEP_WAIT),
    }
    return {name: None if value is None else float(value) for name, value in readings.items()}


def _gpu_readings(monitor: Any, rank: int) -> dict[str, float | None]:
    from trainhealth._internal import catalog

    store = monitor.store

    def value(spec: catalog.MetricSpec, **match: str) -> float | None:
        for labels, reading in store.series(spec):
            named = dict(zip(spec.labels, labels))
            if named.get("gpu") == str(rank) and all(named.get(k) == v for k, v in match.items()):
                return float(reading)
        return None

    xids = [
        float(v)
        for labels, v in store.series(catalog.GPU_XID_ERRORS)
        if dict(zip(catalog.GPU_XID_ERRORS.labels, labels)).get("gpu") == str(rank)
    ]
    return {
        "temperature": value(catalog.GPU_TEMPERATURE),
        "sm_clock": value(catalog.GPU_CLOCK, clock="sm"),
        "gpu_up": value(catalog.GPU_UP),
        "xids": sum(xids) if xids else 0.0,
    }


def _forward(event: Any, rank: int, progress: Any, seen: dict[tuple[str, ...], float]) -> None:
    """Events for the terminal: each fault once, each kind of anomaly at most every 30 s."""
    if event.name not in FORWARDED_EVENTS:
        return
    attributes = event.attributes
    key = (
        event.name,
        str(attributes.get("kind", "")),
        str(attributes.get("signal", "")),
        str(attributes.get("detector", "")),
    )
    quiet_for = float("inf") if event.name == "fault_injected" else 30.0
    if event.time - seen.get(key, -float("inf")) < quiet_for:
        return
    seen[key] = event.time
    _send(
        progress,
        {
            "rank": rank,
            "event": event.name,
            "summary": event.summary,
            "time": event.time,
            "signal": attributes.get("signal"),
            "step": attributes.get("step"),
        },
    )


def _send(progress: Any, message: dict[str, Any]) -> None:
    try:
        progress.put_nowait(message)
    except (queue.Full, ValueError, OSError):
        pass
