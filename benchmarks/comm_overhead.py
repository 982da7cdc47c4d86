"""Collective logger costs: per-operation overhead, memory per record, data kept by the abnormal filter.

    python benchmarks/comm_overhead.py

1. Overhead: all_reduce of a 16-float tensor on a one-rank gloo group, in blocks of
   20,000 calls alternating between the unwrapped and the wrapped function (7 rounds);
   the figure is the median over rounds of (wrapped - unwrapped) time per call.
   Target (issue 4): <= 1 us per operation on CPU. Gloo's own time varies by more than the
   logger's on a busy machine, so the wrapper is also timed around a no-op function with
   all_reduce's signature (15 rounds x 200,000 calls): the bookkeeping alone, steadier.
   End to end (issue 32), as a training job pays it: the logger installed with its flush
   thread running (metrics into a store, as under the Monitor), a 1-element all_reduce,
   40 pairs of 4,000-call blocks alternating wrapped and unwrapped; the median difference and
   the pairs' quartiles. Measured twice: in this process, free to use every core, and in a
   child pinned to one core, where the flush thread's work shares the caller's core. The flush
   thread's own work per record is timed apart, on batches of 4,000. Beside it, the floor of any
   recorder written in Python, measured the same way: a wrapper that reads the clock before and
   after the call and appends one record tuple, with no logger behind it.
2. Memory: the logger's traced heap after filling its ring with 1x and 2x its size.
3. Data reduction: a real 4-rank gloo run of 300 iterations in which one rank computes
   30 ms longer in 10% of them; the share of records the abnormal filter keeps is what
   would leave the node under Holmes's ship-only-abnormal scheme (Holmes: 96.6% less).
"""

from __future__ import annotations

import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
import tracemalloc
from pathlib import Path
from typing import NamedTuple

import torch
import torch.distributed as dist

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # for tests.distributed when run from anywhere

import trainhealth.comm  # noqa: E402
from tests.distributed import free_port, init_rank, run_ranks  # noqa: E402
from trainhealth._internal.exporters.collectives.logger import CollectiveLogger  # noqa: E402


class Alternation(NamedTuple):
    """Seconds per call: the medians, and the median and quartiles of the pairs' differences."""

    unwrapped: float
    wrapped: float
    difference: float
    low: float
    high: float


def _alternating(unwrapped, wrapped, tensor, rounds: int, calls: int, between=lambda: None) -> Alternation:
    """Blocks of ``calls`` alternating which goes first; ``between`` runs after each block."""

    def per_call(function) -> float:
        begin = time.perf_counter()
        for _ in range(calls):
            function(tensor)
        return (time.perf_counter() - begin) / calls

    per_call(unwrapped), per_call(wrapped)  # warm up
    base, instrumented = [], []
    for index in range(rounds):
        order = (unwrapped, wrapped) if index % 2 == 0 else (wrapped, unwrapped)
        for function in order:
            (base if function is unwrapped else instrumented).append(per_call(function))
            between()
    differences = [w - u for w, u in zip(instrumented, base)]
    low, _, high = statistics.quantiles(differences, n=4)
    return Alternation(
        statistics.median(base), statistics.median(instrumented), statistics.median(differences), low, high
    )


def overhead(rounds: int = 7, calls: int = 20_000) -> Alternation:
    init_rank(0, 1, free_port())
    unwrapped = dist.all_reduce
    logger = trainhealth.comm.install()
    wrapped = dist.all_reduce
    trainhealth.comm.uninstall()
    logger.stop = lambda: None  # keep the ring usable after uninstall; the flush thread is already stopped
    # the queue cleared after each block: what the flush thread would have drained
    figures = _alternating(unwrapped, wrapped, torch.ones(16), rounds, calls, logger._pending.clear)
    dist.destroy_process_group()
    return figures


def end_to_end(pairs: int = 40, calls: int = 4_000) -> Alternation:
    """Seconds per 1-element all_reduce with the logger installed and its flush thread aggregating into a store,
    as in a training job."""
    from trainhealth._internal.store import MetricStore

    init_rank(0, 1, free_port())
    unwrapped = dist.all_reduce
    trainhealth.comm.install(store=MetricStore())
    figures = _alternating(unwrapped, dist.all_reduce, torch.ones(1), pairs, calls)
    trainhealth.comm.uninstall()
    dist.destroy_process_group()
    return figures


def floor(pairs: int = 40, calls: int = 4_000) -> Alternation:
    """Seconds per 1-element all_reduce added by the least a Python recorder does: two clock reads and one record
    appended (no sequence numbers, no in-flight mark, no flush thread)."""
    init_rank(0, 1, free_port())
    unwrapped, clock, records = dist.all_reduce, time.perf_counter, []
    append = records.append

    def least(tensor):
        t0 = clock()
        work = unwrapped(tensor)
        end = clock()
        append((0, "all_reduce", "default_pg:0", 0, t0, end - t0, tensor.nbytes, None, False))
        return work

    figures = _alternating(unwrapped, least, torch.ones(1), pairs, calls, records.clear)
    dist.destroy_process_group()
    return figures


def bookkeeping(rounds: int = 15, calls: int = 200_000) -> float:
    """Seconds the wrapper adds per call around a no-op with ``all_reduce``'s signature (no gloo)."""

    def no_op_all_reduce(tensor, op=None, group=None, async_op=False):
        return None

    class Tensor:  # all the wrapper reads of a tensor
        nbytes = 64

    logger = CollectiveLogger(rank=0)
    logger._group_ids[id(None)] = "default_pg:0"  # what the first call would resolve through torch.distributed
    wrapped = logger.wrap("all_reduce", no_op_all_reduce)
    tensor = Tensor()

    def per_call(function) -> float:
        begin = time.perf_counter()
        for _ in range(calls):
            function(tensor)
        return (time.perf_counter() - begin) / calls

    per_call(no_op_all_reduce), per_call(wrapped)  # warm up
    differences = []
    for _ in range(rounds):
        differences.append(per_call(wrapped) - per_call(no_op_all_reduce))
        logger._pending.clear()
    return statistics.median(differences)


def flush_cost(batch: int = 4_000, rounds: int = 200) -> float:
    """Seconds the flush thread spends per record, aggregating batches of ``batch`` collectives into a store."""
    from trainhealth._internal.store import MetricStore

    logger = CollectiveLogger(rank=0, store=MetricStore())
    seq, times = 0, []
    for _ in range(rounds):
        now = time.perf_counter()
        for _ in range(batch):
            logger.end("all_reduce", "default_pg:0", seq, now + seq * 1e-5, 9e-6, 4, None, False)
            seq += 1
        begin = time.perf_counter()
        logger.flush()
        times.append(time.perf_counter() - begin)
    return statistics.median(times) / batch


def memory(ring: int = 65_536) -> tuple[float, float]:
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    logger = CollectiveLogger(rank=0, ring_size=ring)
    marks = []
    for _ in range(2):
        for seq in range(ring):
            logger.end("all_reduce", "default_pg:0", seq, time.perf_counter(), 1e-4, 4096, None, False)
        logger.flush()
        marks.append(tracemalloc.get_traced_memory()[0] - before)
    tracemalloc.stop()
    return marks[0] / 1e6, marks[1] / 1e6


def _run(rank: int, world: int, port: int, out: str, iterations: int, slow_rank: int) -> None:
    init_rank(rank, world, port)
    logger = trainhealth.comm.install(trace_dir=out)
    slow = set(random.Random(7).sample(range(60, iterations), iterations // 10))
    tensor = torch.ones(4096)
    for step in range(iterations):
        logger.step = step
        time.sleep(0.003)
        if rank == slow_rank and step in slow:
            time.sleep(0.03)
        dist.all_reduce(tensor)
        dist.all_reduce(tensor[:256])
    logger.flush()
    Path(out, f"counts-{rank}.json").write_text(
        json.dumps([logger._flushed_total, len(logger.abnormal_records), sorted(slow)])
    )
    trainhealth.comm.uninstall()
    dist.destroy_process_group()


def reduction(iterations: int = 300, world: int = 4, slow_rank: int = 2) -> tuple[int, int, int, int]:
    with tempfile.TemporaryDirectory() as out:
        run_ranks(_run, world, out, iterations, slow_rank, steps=iterations)
        counts = [json.loads(Path(out, f"counts-{r}.json").read_text()) for r in range(world)]
        total = sum(c[0] for c in counts)
        kept = sum(c[1] for c in counts)
        trace_bytes = sum(f.stat().st_size for f in Path(out).glob("rank-*.jsonl.gz"))
        kept_bytes = sum(f.stat().st_size for f in Path(out, "abnormal").glob("rank-*.jsonl.gz"))
    return total, kept, trace_bytes, kept_bytes


def _end_to_end_on_one_core() -> tuple[Alternation, Alternation]:
    """:func:`end_to_end` and :func:`floor` in a child process pinned to one core before torch starts its threads:
    the flush thread, gloo's and the caller all share it, so every cycle of ours shows."""
    cpu = min(os.sched_getaffinity(0))
    result = subprocess.run(
        [sys.executable, __file__, "--end-to-end"],
        capture_output=True,
        text=True,
        check=True,
        preexec_fn=lambda: os.sched_setaffinity(0, {cpu}),
    )
    logger, least = json.loads(result.stdout.splitlines()[-1])
    return Alternation(*logger), Alternation(*least)


def main() -> None:
    os.environ.pop("TRAINHEALTH_TRACE_DIR", None)
    if sys.argv[1:] == ["--end-to-end"]:
        print(json.dumps([list(end_to_end()), list(floor())]))
        return
    base, wrapped, difference, _, _ = overhead()
    print(
        f"all_reduce of 16 floats, 1-rank gloo: {base * 1e6:.2f} us unwrapped, {wrapped * 1e6:.2f} us wrapped; "
        f"logging overhead (median of 7 rounds x 20,000 calls): {difference * 1e6:.3f} us per operation"
    )
    on_one_core, least = _end_to_end_on_one_core()
    for cpus, figures in ((len(os.sched_getaffinity(0)), end_to_end()), (1, on_one_core)):
        print(
            f"end to end, as a job pays it (installed, flush thread aggregating into a store; 1-element all_reduce, "
            f"median of 40 pairs x 4,000 calls; {cpus} core{'s' if cpus > 1 else ''}): "
            f"{figures.unwrapped * 1e6:.2f} us unwrapped, {figures.wrapped * 1e6:.2f} us wrapped, "
            f"{figures.difference * 1e6:.2f} us per operation (pairs' quartiles {figures.low * 1e6:.2f} to "
            f"{figures.high * 1e6:.2f})"
        )
    print(
        f"the floor of a Python recorder (two clock reads, one record appended, nothing else; same measurement, "
        f"1 core): {least.difference * 1e6:.2f} us per operation (pairs' quartiles {least.low * 1e6:.2f} to "
        f"{least.high * 1e6:.2f})"
    )
    print(
        f"the wrapper's bookkeeping alone, around a no-op with all_reduce's signature (median of 15 rounds x "
        f"200,000 calls): {bookkeeping() * 1e9:.0f} ns per operation"
    )
    print(
        f"the flush thread's work, batches of 4,000 records aggregated into a store (median of 200): "
        f"{flush_cost() * 1e9:.0f} ns per record"
    )
    one, two = memory()
    print(
        f"memory: {one:.1f} MB with the ring (65,536 records) full, {two:.1f} MB after twice as many records "
        f"({one * 1e6 / 65_536:.0f} bytes per record; bounded by the ring size)"
    )
    total, kept, trace_bytes, kept_bytes = reduction()
    print(
        f"abnormal filter, 4 gloo ranks x 300 iterations x 2 all-reduces, one rank 30 ms slow in 10% of them: "
        f"kept {kept} of {total} records ({100 * kept / total:.1f}%, {100 * (1 - kept / total):.1f}% less data; "
        f"files {kept_bytes / 1e3:.0f} kB of {trace_bytes / 1e3:.0f} kB)"
    )


if __name__ == "__main__":
    main()
