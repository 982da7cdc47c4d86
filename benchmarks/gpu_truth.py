"""The pod on a real GPU: NVML, the Monitor on CUDA, the collective logger on NCCL, measured (issue 36).

    python benchmarks/gpu_truth.py                  # on a GPU machine: every section, about 5 minutes
    python benchmarks/gpu_truth.py --sections nvml,export
    python benchmarks/gpu_truth.py --rehearse       # on CPU: every code path, tiny sizes, no GPU figure

Without an NVIDIA GPU (NVML or CUDA missing) it exits 2 with one line naming what is missing.
Each section prints its figures, or FAILED with the error and goes on; the exit status is 1 when
a section failed.

* ``nvml``: every reading of the GPU sampler on every GPU, its series or NVML's answer
  (NOT_SUPPORTED and the reason); every GPU metric of the catalogue produced or not and why; XID
  event registration; DCGM profiling fields or the fallback; the sampling cost per pass.
* ``export``: ``trainhealth export`` serving /metrics from the GPU, scraped idle and under a
  matmul load: power, SM clock and utilization in both scrapes.
* ``monitor``: a ~220M-parameter transformer step (bf16 autocast, fused AdamW, batch sized for
  steps of >= 100 ms) with ``Monitor(model, optimizer)`` (every default feature) against none, in
  alternating blocks of 20 steps, 200 steps each: median step, spread, overhead; then Monitor
  steps under ``torch.cuda.set_sync_debug_mode("warn")``: the synchronisations raised from
  trainhealth's code.
* ``exporter``: the same step with ``trainhealth export --interval 0.1`` sampling beside it,
  against without, in alternating blocks; the baseline's own block-to-block spread for scale.
* ``nccl``: a world-size-1 NCCL group with the collective logger: durations from the completion
  hook's CUDA events against the profiler's device times, async operations, host cost per call.
* ``nccl_hang``: a collective stuck on the device: a ~8 s CUDA sleep kernel queued before an
  NCCL all-reduce on the same stream. The call returns at enqueue; the rank must still count it in
  flight (``trainhealth_comm_inflight_duration_seconds`` grows, the watcher says ``in_collective``)
  until the device ran it. With two or more GPUs, also two ranks where rank 1 skips an all-reduce:
  rank 0's in-flight time must grow past its hang threshold.
* ``sdc``: a bit-30 flip into a block's output and into a gradient under the Monitor on CUDA,
  and a clean run; the cross-replica fingerprint of three copies of a model on the device, one
  flipped.
"""

from __future__ import annotations

import argparse
import copy
import os
import socket
import statistics
import subprocess
import sys
import threading
import time
import traceback
import urllib.request
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

SECTIONS = ("nvml", "export", "monitor", "exporter", "nccl", "nccl_hang", "sdc")


@dataclass(frozen=True)
class Setup:
    """Where the sections run: ``cuda`` on a GPU, ``cpu`` in a rehearsal (simulated GPUs, gloo, tiny sizes)."""

    device: str
    rehearse: bool

    @property
    def backend(self) -> str:
        return "simulated" if self.rehearse else "nvml"


def missing_gpu() -> str | None:
    """What this machine lacks for the GPU run, or None."""
    missing = []
    try:
        import pynvml

        pynvml.nvmlInit()
        pynvml.nvmlShutdown()
    except Exception as error:  # NVMLError_LibraryNotFound, a driver that does not answer
        missing.append(f"NVML ({error})")
    try:
        import torch

        if not torch.cuda.is_available():
            missing.append(f"CUDA (torch {torch.__version__}: torch.cuda.is_available() is False)")
    except ImportError as error:
        missing.append(f"torch ({error})")
    return "; ".join(missing) or None


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _scrape(url: str, series: tuple[tuple[str, str], ...]) -> dict[str, float]:
    """The first sample of each (family, text its labels contain) in ``series`` from a /metrics page."""
    with urllib.request.urlopen(url, timeout=10) as response:
        text = response.read().decode()
    found: dict[str, float] = {}
    for line in text.splitlines():
        for family, labels in series:
            key = f"{family}{{{labels}}}" if labels else family
            if key not in found and line.startswith(family + "{") and labels in line:
                found[key] = float(line.rsplit(" ", 1)[1])
    return found


# --- nvml ----------------------------------------------------------------------------------
def nvml_section(setup: Setup) -> list[str]:
    import pynvml

    from trainhealth._internal.catalog import gpu as gpu_catalog
    from trainhealth._internal.catalog.spec import MetricSpec
    from trainhealth._internal.events import EventLog
    from trainhealth._internal.exporters.gpu.readings import READINGS
    from trainhealth._internal.exporters.gpu.sampler import GpuSampler
    from trainhealth._internal.exporters.gpu.xid_watcher import XidWatcher
    from trainhealth._internal.store import MetricStore

    nvml: Any = pynvml
    if setup.rehearse:
        from trainhealth._internal.exporters.gpu.simulated import SimulatedNvml

        nvml = SimulatedNvml(gpus=2)
    nvml.nvmlInit()
    lines = [f"driver {nvml.nvmlSystemGetDriverVersion()}, {nvml.nvmlDeviceGetCount()} GPU(s)"]
    produced: set[str] = set()
    for index in range(nvml.nvmlDeviceGetCount()):
        handle = nvml.nvmlDeviceGetHandleByIndex(index)
        lines.append(f"GPU {index}: {nvml.nvmlDeviceGetName(handle)}")
        for name, reading in READINGS:
            try:
                triples = reading(nvml, handle)
            except pynvml.NVMLError as error:
                lines.append(f"  {name:<24} NOT READ: {type(error).__name__}: {error}")
                continue
            produced.update(spec.name for spec, _, _ in triples)
            shown = ", ".join(f"{spec.prometheus_name}{list(extra) or ''}={value:g}" for spec, extra, value in triples)
            lines.append(f"  {name:<24} {shown or '(no series)'}")
    store, events = MetricStore(), EventLog()
    sampler = GpuSampler(store, nvml, backend=setup.backend, events=events)
    sampler.start(thread=False)
    costs = []
    for _ in range(20):
        began = time.perf_counter()
        sampler.sample_once()
        costs.append(time.perf_counter() - began)
    for family in store.snapshot():
        produced.add(family.spec.name)
    lines.append(
        f"sampling pass, all GPUs (median of 20): {1e3 * statistics.median(costs):.1f} ms "
        f"(min {1e3 * min(costs):.1f}, max {1e3 * max(costs):.1f})"
    )
    catalogue = [spec for spec in vars(gpu_catalog).values() if isinstance(spec, MetricSpec)]
    event_driven = {gpu_catalog.GPU_XID_ERRORS.name, gpu_catalog.GPU_XID_LAST_TIMESTAMP.name}
    profiling = {gpu_catalog.GPU_SM_ACTIVE.name, gpu_catalog.GPU_TENSOR_ACTIVE.name, gpu_catalog.GPU_DRAM_ACTIVE.name}
    absent = [spec.prometheus_name for spec in catalogue if spec.name not in produced | event_driven | profiling]
    lines.append(
        f"catalogue: {len(catalogue)} GPU metrics; produced by this GPU: "
        f"{len([s for s in catalogue if s.name in produced])}; "
        f"on XID events only: {len(event_driven)}; DCGM profiling: {len(profiling)}; "
        f"not produced: {', '.join(absent) or 'none'}"
    )
    for gpu in sampler._gpus:  # noqa: SLF001 - a diagnostic script may look inside
        lines.append(
            f"GPU {gpu.index}: the sampler skips (NOT_SUPPORTED): {', '.join(sorted(gpu.unsupported)) or 'nothing'}"
        )
    watcher = XidWatcher(store, nvml, sampler.gpus, events=events)
    lines.append(f"XID events: {'registered' if watcher.start() else 'not available (polling the counters only)'}")
    watcher.close()
    try:
        from trainhealth._internal.exporters.gpu.dcgm import DcgmProfiler

        profiler = DcgmProfiler()
        time.sleep(2)
        lines.append(f"DCGM profiling fields: {profiler.read([index for index, _, _ in sampler.gpus])}")
        profiler.close()
    except Exception as error:  # DcgmUnavailable, or an error of DCGM's own bindings
        lines.append(f"DCGM: not used ({error}); the fallback: NVML utilization only, no SM/tensor/DRAM activity")
    sampler.close()
    return lines


# --- export ---------------------------------------------------------------------------------
def _export(setup: Setup, interval_s: float) -> tuple[subprocess.Popen, str]:
    port = _free_port()
    argv = [sys.executable, "-m", "trainhealth", "export", "--addr", "127.0.0.1", "--port", str(port)]
    argv += ["--interval", str(interval_s), "--backend", setup.backend]
    process = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    url = f"http://127.0.0.1:{port}/metrics"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            _scrape(url, ())
            return process, url
        except OSError:
            if process.poll() is not None:
                raise RuntimeError(f"trainhealth export exited {process.returncode}: {process.stderr.read().decode()}")
            time.sleep(0.2)
    process.kill()
    raise RuntimeError("trainhealth export did not answer within 60 s")


def _burn(setup: Setup, seconds: float) -> None:
    """Matrix products on the device for ``seconds``."""
    import torch

    size = 256 if setup.rehearse else 8192
    a = torch.randn(size, size, device=setup.device, dtype=torch.float32 if setup.rehearse else torch.bfloat16)
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        for _ in range(10):
            a = (a @ a).clamp_(-1, 1)
        if setup.device == "cuda":
            torch.cuda.synchronize()


def export_section(setup: Setup) -> list[str]:
    series = (
        ("trainhealth_gpu_power_watts", 'gpu="0"'),
        ("trainhealth_gpu_clock_hertz", 'clock="sm"'),
        ("trainhealth_gpu_utilization_ratio", 'gpu="0"'),
    )
    process, url = _export(setup, interval_s=0.5)
    try:
        time.sleep(2)
        idle = _scrape(url, series)
        burn = threading.Thread(target=_burn, args=(setup, 6.0))
        burn.start()
        time.sleep(4)
        loaded = _scrape(url, series)
        burn.join()
    finally:
        process.terminate()
        process.wait(timeout=30)
    lines = [f"scraped {url} twice: idle, then under matmul load"]
    for family, labels in series:
        name = f"{family}{{{labels}}}"
        before, after = idle.get(name), loaded.get(name)
        changed = "changed" if before is not None and after is not None and before != after else "SAME or missing"
        lines.append(f"  {name}: idle {before}, loaded {after} ({changed})")
    lines.append(f"trainhealth export exit status after SIGTERM: {process.returncode}")
    return lines


# --- the training step ---------------------------------------------------------------------
def _transformer(setup: Setup) -> tuple[Any, Any, Any, int]:
    """A causal transformer, its fused AdamW, one step's tokens and their count: ~220M parameters on a GPU
    (benchmarks/monitor_overhead.py's model at other sizes), tiny on CPU."""
    import torch
    from monitor_overhead import SmallTransformer

    vocab, width, layers, heads, sequence, batch = (
        (512, 64, 2, 4, 64, 4) if setup.rehearse else (32768, 1024, 12, 16, 1024, 24)
    )
    torch.manual_seed(0)
    model = SmallTransformer(sequence, vocab, width, layers, heads).to(setup.device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=setup.device == "cuda")
    tokens = torch.randint(0, vocab, (batch, sequence + 1), device=setup.device)
    return model, optimizer, tokens, batch * sequence


def _step(setup: Setup, model: Any, optimizer: Any, tokens: Any, monitor: Any, count: int) -> None:
    import torch

    with torch.autocast(setup.device, dtype=torch.bfloat16):
        logits = model(tokens[:, :-1])
        loss = torch.nn.functional.cross_entropy(
            logits.reshape(-1, logits.shape[-1]).float(), tokens[:, 1:].reshape(-1)
        )
    loss.backward()
    norm = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    if monitor is not None:
        monitor.step(loss=loss, tokens=count, grad_norm=norm)


def _timed_block(setup: Setup, arm: tuple, steps: int) -> list[float]:
    import torch

    model, optimizer, tokens, count, monitor = arm
    times = []
    for _ in range(steps):
        began = time.perf_counter()
        _step(setup, model, optimizer, tokens, monitor, count)
        if setup.device == "cuda":
            torch.cuda.synchronize()  # the step's end, as the next step's data would wait for it
        times.append(time.perf_counter() - began)
    return times


def _spread(times: list[float]) -> str:
    low, _, high = statistics.quantiles(times, n=4)
    return f"median {1e3 * statistics.median(times):.1f} ms, quartiles {1e3 * low:.1f}-{1e3 * high:.1f} ms"


def _overhead(base_blocks: list[list[float]], other_blocks: list[list[float]]) -> float:
    """The median over block pairs of the other arm's block median over the baseline's, less one."""
    return (
        statistics.median(
            statistics.median(other) / statistics.median(base) for base, other in zip(base_blocks, other_blocks)
        )
        - 1
    )


def monitor_section(setup: Setup) -> list[str]:
    import torch

    from trainhealth import Monitor

    blocks, per_block = (2, 3) if setup.rehearse else (10, 20)
    model, optimizer, tokens, count = _transformer(setup)
    twin = copy.deepcopy(model)
    twin_optimizer = torch.optim.AdamW(twin.parameters(), lr=1e-4, fused=setup.device == "cuda")
    parameters = sum(p.numel() for p in model.parameters())
    monitor = Monitor(
        twin, twin_optimizer, prometheus_addr="127.0.0.1", prometheus_port=0, gpu_backend=setup.backend, env={}
    )
    base_arm, monitored = (model, optimizer, tokens, count, None), (twin, twin_optimizer, tokens, count, monitor)
    try:
        _timed_block(setup, base_arm, 3)  # warm up: allocator, kernels, the Monitor's first steps
        _timed_block(setup, monitored, 3)
        base_blocks, monitor_blocks = [], []
        for index in range(blocks):
            order = (base_arm, monitored) if index % 2 == 0 else (monitored, base_arm)
            for arm in order:
                (base_blocks if arm is base_arm else monitor_blocks).append(_timed_block(setup, arm, per_block))
        lines = [
            f"model: {parameters / 1e6:.0f}M parameters, bf16 autocast, fused AdamW "
            f"({blocks} blocks of {per_block} steps per arm, alternating)",
            f"  without a Monitor: {_spread(sum(base_blocks, []))}",
            f"  Monitor(model, optimizer), every default: {_spread(sum(monitor_blocks, []))}",
            f"  overhead (median over block pairs): {100 * _overhead(base_blocks, monitor_blocks):+.2f}%",
        ]
        if setup.device == "cuda":
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                torch.cuda.set_sync_debug_mode("warn")
                try:
                    _timed_block(setup, monitored, per_block)
                finally:
                    torch.cuda.set_sync_debug_mode("default")
            ours = sorted(
                {f"{w.filename}:{w.lineno}" for w in caught if "trainhealth" in w.filename and "sync" in str(w.message)}
            )
            others = len([w for w in caught if "trainhealth" not in w.filename])
            lines.append(
                f"  synchronisations under set_sync_debug_mode('warn') over {per_block} Monitor steps: "
                f"{len(ours)} place(s) in trainhealth{': ' + ', '.join(ours) if ours else ''}; "
                f"{others} warning(s) elsewhere (the loop's clip_grad_norm_ and torch's own)"
            )
        return lines
    finally:
        monitor.close()


def exporter_section(setup: Setup) -> list[str]:
    blocks, per_block = (2, 3) if setup.rehearse else (6, 20)
    model, optimizer, tokens, count = _transformer(setup)
    arm = (model, optimizer, tokens, count, None)
    _timed_block(setup, arm, 3)
    alone, beside, again = [], [], []
    for index in range(blocks):
        first = _timed_block(setup, arm, per_block)
        process, _ = _export(setup, interval_s=0.1)
        try:
            with_exporter = _timed_block(setup, arm, per_block)
        finally:
            process.terminate()
            process.wait(timeout=30)
        second = _timed_block(setup, arm, per_block)
        alone.append(first if index % 2 == 0 else second)
        again.append(second if index % 2 == 0 else first)
        beside.append(with_exporter)
    return [
        f"training step alone: {_spread(sum(alone, []))}",
        f"with trainhealth export sampling every 0.1 s beside it: {_spread(sum(beside, []))}",
        f"  change (median over block pairs): {100 * _overhead(alone, beside):+.2f}%; "
        f"the step against itself (noise): {100 * _overhead(alone, again):+.2f}%",
    ]


# --- nccl -----------------------------------------------------------------------------------
def nccl_section(setup: Setup) -> list[str]:
    import torch
    import torch.distributed as dist
    from torch.profiler import ProfilerActivity, profile

    import trainhealth.comm

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(_free_port()), RANK="0", WORLD_SIZE="1")
    backend = "gloo" if setup.rehearse else "nccl"
    dist.init_process_group(backend, rank=0, world_size=1)
    lines = [f"process group: {backend}, world size 1"]
    try:
        unwrapped = dist.all_reduce
        logger = trainhealth.comm.install()
        big = torch.ones((1 << 14) if setup.rehearse else (1 << 26), device=setup.device)  # 256 MB on the GPU
        calls = 20
        activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if setup.device == "cuda" else [])
        with profile(activities=activities) as profiled:
            for _ in range(calls):
                dist.all_reduce(big)
            for _ in range(calls):
                dist.all_reduce(big, async_op=True).wait()
            if setup.device == "cuda":
                torch.cuda.synchronize()
        time.sleep(0.5)
        logger.flush()
        records = logger.records()
        records = records[records["op"] == "all_reduce"]
        device_events = [
            event.time_range.elapsed_us() * 1e-6
            for event in profiled.events()
            if str(getattr(event, "device_type", "")).endswith("CUDA") and "nccl" in event.name.lower()
        ]
        logged = list(records["duration"])
        lines.append(
            f"records: {len(records)} all_reduce ({int(records['async'].sum())} async) of {2 * calls} calls; "
            f"logged durations median {1e3 * statistics.median(logged):.3f} ms"
            if logged
            else "records: none"
        )
        if device_events:
            ratio = statistics.median(logged) / statistics.median(device_events) if logged else float("nan")
            lines.append(
                f"profiler's NCCL kernels: {len(device_events)}, median {1e3 * statistics.median(device_events):.3f} ms; "
                f"logged / profiler = {ratio:.3f} ({'within' if abs(ratio - 1) <= 0.05 else 'NOT within'} 5%)"
            )
        else:
            lines.append("profiler's NCCL kernels: none found (world size 1: NCCL may copy in place without a kernel)")
        small = torch.ones(1, device=setup.device)
        wrapped = dist.all_reduce

        def per_call(function: Callable, count: int = 2000) -> float:
            began = time.perf_counter()
            for _ in range(count):
                function(small)
            if setup.device == "cuda":
                torch.cuda.synchronize()
            return (time.perf_counter() - began) / count

        per_call(unwrapped), per_call(wrapped)
        pairs = [(per_call(wrapped), per_call(unwrapped)) for _ in range(10)]
        differences = [w - u for w, u in pairs]
        lines.append(
            f"host cost per call, 1-element all_reduce (10 pairs of 2,000-call blocks): unwrapped "
            f"{1e6 * statistics.median(u for _, u in pairs):.2f} us, wrapped {1e6 * statistics.median(w for w, _ in pairs):.2f} us, "
            f"logger {1e6 * statistics.median(differences):+.2f} us per call"
        )
        trainhealth.comm.uninstall()
    finally:
        dist.destroy_process_group()
    return lines


# --- nccl_hang --------------------------------------------------------------------------------
def _inflight(monitor: Any) -> tuple[float, tuple | None]:
    """The longest in-flight time the Monitor exports now, and its stuck labels (None when not stuck)."""
    from trainhealth._internal import catalog

    waits = [float(value) for _, value in monitor.store.series(catalog.COMM_INFLIGHT_DURATION)]
    stuck = monitor.store.series(catalog.COMM_STUCK_DURATION)
    return max(waits, default=0.0), stuck[0][0] if stuck else None


def _hang_monitor(setup: Setup) -> Any:
    from trainhealth import Monitor

    return Monitor(
        comm=True, gpu_backend="off", prometheus=False, otel=False, comm_flush_interval=0.2, comm_hang_floor=2.0
    )


def _skipping_rank(rank: int, world: int, port: int, results: Any) -> None:
    """Two NCCL ranks; rank 1 skips the sixth all-reduce (waits 12 s): rank 0's call returns, its work does not."""
    import torch
    import torch.distributed as dist

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world))
    torch.cuda.set_device(rank)
    dist.init_process_group("nccl", rank=rank, world_size=world, device_id=torch.device("cuda", rank))
    monitor = _hang_monitor(Setup("cuda", False))
    x = torch.ones(1 << 20, device="cuda")
    for step in range(5):
        dist.all_reduce(x)
        torch.cuda.synchronize()
        monitor.step(loss=1.0, step=step)
    if rank == 1:
        time.sleep(12.0)
        dist.all_reduce(x)
        torch.cuda.synchronize()
    else:
        began = time.perf_counter()
        dist.all_reduce(x)
        returned = time.perf_counter() - began
        seen, stuck = 0.0, None
        deadline = time.monotonic() + 10.0
        while time.monotonic() < deadline:  # the host is free: the collective waits on the device
            time.sleep(0.2)
            wait, labels = _inflight(monitor)
            seen, stuck = max(seen, wait), stuck or labels
        torch.cuda.synchronize()
        results.put((returned, seen, stuck))
    monitor.close()
    dist.destroy_process_group()


def nccl_hang_section(setup: Setup) -> list[str]:
    import torch
    import torch.distributed as dist

    if setup.rehearse:
        return [
            "CPU rehearsal: no device to hold a collective; the NCCL-semantics CPU backend covers this path "
            "(tests/exporters/collectives/test_logger.py, the hang lab)"
        ]
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(_free_port()), RANK="0", WORLD_SIZE="1")
    dist.init_process_group("nccl", rank=0, world_size=1)
    lines = []
    try:
        monitor = _hang_monitor(setup)
        x = torch.ones(1 << 20, device="cuda")
        for step in range(5):
            dist.all_reduce(x)
            torch.cuda.synchronize()
            monitor.step(loss=1.0, step=step)
        rate_khz = getattr(torch.cuda.get_device_properties(0), "clock_rate", 0) or 1_500_000
        torch.cuda._sleep(int(8.0 * rate_khz * 1e3))  # about 8 s of device time before the collective
        began = time.perf_counter()
        dist.all_reduce(x)
        returned = time.perf_counter() - began
        seen, stuck = 0.0, None
        deadline = time.monotonic() + 6.0
        while time.monotonic() < deadline:
            time.sleep(0.2)
            wait, labels = _inflight(monitor)
            seen, stuck = max(seen, wait), stuck or labels
        torch.cuda.synchronize()
        time.sleep(0.6)
        after, _ = _inflight(monitor)
        lines.append(
            f"one GPU, a collective queued behind an 8 s kernel: the call returned in {1e3 * returned:.2f} ms; "
            f"in flight seen up to {seen:.1f} s while the host was free (watcher: "
            f"{stuck[0] if stuck else 'not stuck'}); after the device ran it: {after:.1f} s"
        )
        monitor.close()
    finally:
        dist.destroy_process_group()
    if torch.cuda.device_count() >= 2:
        import torch.multiprocessing as mp

        results = mp.get_context("spawn").SimpleQueue()
        mp.start_processes(_skipping_rank, args=(2, _free_port(), results), nprocs=2, join=True, start_method="spawn")
        returned, seen, stuck = results.get()
        lines.append(
            f"two GPUs, rank 1 12 s late for an all-reduce: rank 0's call returned in {1e3 * returned:.2f} ms; "
            f"its in-flight time reached {seen:.1f} s (watcher: {stuck[0] if stuck else 'not stuck'})"
        )
    else:
        lines.append("one GPU only: the two-rank case (rank 1 skips an all-reduce) needs two")
    return lines


# --- sdc ------------------------------------------------------------------------------------
def _provenance_run(setup: Setup, fault: dict | None) -> tuple[list[dict], list[str]]:
    """The origins NaN provenance named and the anomalies raised over six steps of TinyGPT with ``fault``."""
    import torch

    from trainhealth import Monitor
    from trainhealth._internal.demo.tiny_gpt import TinyGPT, synthetic_batch
    from trainhealth._internal.injectors.schedule import Injector

    torch.manual_seed(0)
    model = TinyGPT(vocab=64, width=64, layers=3, heads=4, context=32).to(setup.device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    injector = Injector([fault] if fault else [], model=model, optimizer=optimizer, rank=0, seed=0)
    with Monitor(model, optimizer, prometheus=False, otel=False, gpu_backend="off", env={}) as monitor:
        for step in range(6):
            injector.begin_step(step)
            loss = model.loss(synthetic_batch(64, 32, batch=8, seed=step).to(setup.device))
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
            monitor.step(loss=loss, step=step)
        monitor.flush()
    injector.close()
    origins = [event.attributes for event in monitor.events.recent("nonfinite_origin")]
    anomalies = [
        f"{event.attributes['detector']} on {event.attributes['signal']} at step {event.attributes['step']}"
        for event in monitor.events.recent("anomaly")
    ]
    return origins, anomalies


def sdc_section(setup: Setup) -> list[str]:
    import torch

    from trainhealth._internal.demo.tiny_gpt import TinyGPT
    from trainhealth._internal.injectors.bits import flip_bits
    from trainhealth._internal.sdc.fingerprint import fingerprint, vote

    lines = []
    cases = {
        "clean": None,
        "bit 30 of layers.1's output": {
            "kind": "bitflip",
            "target": "activation",
            "tensor": "layers.1",
            "bit": 30,
            "step": 3,
        },
        "bit 30 of a gradient of layers.0": {
            "kind": "bitflip",
            "target": "gradient",
            "tensor": "layers.0.mlp.0.weight",
            "bit": 30,
            "step": 3,
        },
    }
    for name, fault in cases.items():
        origins, anomalies = _provenance_run(setup, fault)
        lines.append(
            f"NaN provenance, {name}: {origins or 'nothing named'} (rank 0); anomalies: {', '.join(anomalies) or 'none'}"
        )
    lines.append(
        "  (one process: gradients are not measured, as a bad gradient can only be local there; the gradient "
        "norm's nonfinite detector names the step, and 2+ ranks name the block)"
    )
    torch.manual_seed(0)
    replicas = [TinyGPT(vocab=64, width=64, layers=3, heads=4, context=32).to(setup.device)]
    replicas += [copy.deepcopy(replicas[0]) for _ in range(2)]
    names = [name for name, _ in replicas[0].named_parameters()]
    clean = vote([fingerprint(list(r.parameters())).tolist() for r in replicas], names, [0, 1, 2])
    target = dict(replicas[2].named_parameters())["layers.0.mlp.0.weight"]
    flip_bits(target.data, [5], 30)
    flipped = vote([fingerprint(list(r.parameters())).tolist() for r in replicas], names, [0, 1, 2])
    lines.append(
        f"fingerprint vote, three copies on {setup.device} (a stand-in for three replicas): clean {clean or 'no one'}; "
        f"bit 30 flipped in copy 2's layers.0.mlp.0.weight: {flipped}"
    )
    return lines


RUNNERS: dict[str, Callable[[Setup], list[str]]] = {
    "nvml": nvml_section,
    "export": export_section,
    "monitor": monitor_section,
    "exporter": exporter_section,
    "nccl": nccl_section,
    "nccl_hang": nccl_hang_section,
    "sdc": sdc_section,
}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sections", default=",".join(SECTIONS), help=f"comma-separated, of {', '.join(SECTIONS)}")
    parser.add_argument("--rehearse", action="store_true", help="run every path on CPU with tiny sizes: no GPU figure")
    options = parser.parse_args()
    chosen = [name.strip() for name in options.sections.split(",") if name.strip()]
    unknown = [name for name in chosen if name not in RUNNERS]
    if unknown or not chosen:
        parser.error(f"--sections: unknown {', '.join(unknown) or '(none given)'}; choose from {', '.join(SECTIONS)}")
    if not options.rehearse:
        missing = missing_gpu()
        if missing is not None:
            print(f"gpu_truth: needs an NVIDIA GPU; missing here: {missing}", file=sys.stderr)
            return 2
    setup = Setup("cpu" if options.rehearse else "cuda", options.rehearse)
    import torch

    device = (
        "CPU rehearsal (simulated GPUs, gloo): no figure below is a GPU figure"
        if setup.rehearse
        else (
            f"{torch.cuda.get_device_name(0)} x {torch.cuda.device_count()}, CUDA {torch.version.cuda}, torch {torch.__version__}"
        )
    )
    print(f"gpu_truth {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}: {device}", flush=True)
    failed = False
    for name in chosen:
        began = time.monotonic()
        print(f"== {name}", flush=True)
        try:
            for line in RUNNERS[name](setup):
                print(line, flush=True)
        except Exception:  # a section's failure is this script's finding: printed, and the others still run
            failed = True
            print("FAILED:\n" + traceback.format_exc(), flush=True)
        print(f"({name}: {time.monotonic() - began:.0f} s)", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
