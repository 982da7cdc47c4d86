"""Monitor overhead on a CPU training step of a small transformer.

    python benchmarks/monitor_overhead.py [--rounds 12] [--steps 20] [--comm]

Model: 4 layers, d_model 256, 4 heads, sequence 128, batch 8, vocabulary 8192,
AdamW. Blocks of steps with and without a Monitor (default settings, /metrics
served on 127.0.0.1 and scraped once a second by another thread) alternate,
and the order inside each round flips, so drift on a shared machine hits both
sides alike. The loop does not pass a gradient norm, so the Monitor computes it
every step — the more expensive case. Prints the median and mean step-time
ratio (target: median overhead <= 1%), the noise floor of that comparison, and
the Monitor's cost measured directly: the extra time inside optimizer.step
(where its hooks run) plus the time inside monitor.step.

With ``--comm`` the process joins a one-rank gloo group, every step (with and
without the Monitor) all-reduces the loss, and the Monitor runs with
``comm=True``: the collective logger wraps torch.distributed, and the Monitor
adds its forward and optimizer hooks and one step marker per step, from which
the logger's flush thread splits each step into compute and wait (the trace
goes to a temporary directory, rewritten every 30 s by default). The forward
pass, where the forward hooks run, is then timed as a component too. A third
arm, ``Monitor(comm=False)`` in the same distributed job, rotates with the other
two, so what ``comm=True`` itself adds is read against a Monitor that already
does its distributed checks (gradient-norm comparison, parameter fingerprints).
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import tempfile
import threading
import time
import urllib.request
from dataclasses import dataclass, field

import torch

from trainhealth import Monitor

VOCAB, D_MODEL, LAYERS, HEADS, SEQ, BATCH = 8192, 256, 4, 4, 128, 8


class SmallTransformer(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(VOCAB, D_MODEL)
        self.layers = torch.nn.ModuleList(
            torch.nn.TransformerEncoderLayer(D_MODEL, HEADS, 4 * D_MODEL, dropout=0.0, batch_first=True, norm_first=True)
            for _ in range(LAYERS)
        )
        self.head = torch.nn.Linear(D_MODEL, VOCAB)
        self.register_buffer("mask", torch.nn.Transformer.generate_square_subsequent_mask(SEQ), persistent=False)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        hidden = self.embed(tokens)
        for layer in self.layers:
            hidden = layer(hidden, src_mask=self.mask, is_causal=True)
        return self.head(hidden)


@dataclass
class Timings:
    """Seconds per timed step: the whole step, optimizer.step (where the Monitor's hooks run), monitor.step."""

    step: list[float] = field(default_factory=list)
    optimizer: list[float] = field(default_factory=list)
    monitor: list[float] = field(default_factory=list)
    forward: list[float] = field(default_factory=list)

    def extend(self, other: Timings) -> None:
        self.step += other.step
        self.optimizer += other.optimizer
        self.monitor += other.monitor
        self.forward += other.forward


def train_block(model, optimizer, data, steps: int, monitor: Monitor | None, comm: bool = False) -> Timings:
    """Timings of ``steps`` steps, after one untimed warm-up step; ``comm``: all-reduce the loss every step."""
    timings = Timings()
    for step in range(steps + 1):
        start = time.perf_counter()
        tokens = data[step % len(data)]
        logits = model(tokens[:, :-1])
        after_forward = time.perf_counter()
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, VOCAB), tokens[:, 1:].reshape(-1))
        loss.backward()
        if comm:
            torch.distributed.all_reduce(loss.detach().clone())
        before_optimizer = time.perf_counter()
        optimizer.step()
        after_optimizer = time.perf_counter()
        optimizer.zero_grad(set_to_none=True)
        before_monitor = time.perf_counter()
        if monitor is not None:
            monitor.step(loss=loss, tokens=BATCH * SEQ)
        end = time.perf_counter()
        if step > 0:
            timings.forward.append(after_forward - start)
            timings.step.append(end - start)
            timings.optimizer.append(after_optimizer - before_optimizer)
            timings.monitor.append(end - before_monitor)
    return timings


def comm_rows_per_step(calls: int = 20_000) -> float:
    """Seconds per step that ``comm=True`` adds on the training thread, timed directly: a forward and an
    optimizer step of a one-weight model under a Monitor with and without ``comm=True``, the comm side also
    appending the step marker Monitor.step adds. That is the forward and optimizer timing hooks and the three
    rows (the collective wrappers' own cost is benchmarks/comm_overhead.py's figure)."""
    probe = torch.nn.Linear(1, 1)
    optimizer = torch.optim.SGD(probe.parameters(), lr=0.0)
    x = torch.zeros(1, 1)

    def per_step(comm: bool) -> float:
        monitor = Monitor(probe, optimizer, env={}, prometheus=False, otel=False, comm=comm, model_signals=False,
                          gpu_backend="off", grad_check_every=0, sdc_interval=0, trace_write_interval=0)
        try:
            began = time.perf_counter()
            for _ in range(calls):
                probe(x)
                optimizer.step()
                if comm:
                    monitor.comm.add_marker("step", 0, began, 0.0)  # what Monitor.step adds with comm=True
            return (time.perf_counter() - began) / calls
        finally:
            monitor.close()

    without = min(per_step(False) for _ in range(3))
    return min(per_step(True) for _ in range(3)) - without


def scrape_every_second(url: str, stop: threading.Event) -> None:
    while not stop.wait(1.0):
        with urllib.request.urlopen(url, timeout=5) as response:
            response.read()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=12)
    parser.add_argument("--steps", type=int, default=20, help="timed steps per block")
    parser.add_argument("--comm", action="store_true",
                        help="Monitor(comm=True) on a one-rank gloo group: collective logger, hooks, step markers")
    args = parser.parse_args()
    trace_dir = None
    if args.comm:
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            port = sock.getsockname()[1]
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
        torch.distributed.init_process_group("gloo", rank=0, world_size=1)
        trace_dir = tempfile.mkdtemp(prefix="trainhealth-bench-")

    torch.manual_seed(0)
    model = SmallTransformer()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    generator = torch.Generator().manual_seed(0)
    data = [torch.randint(0, VOCAB, (BATCH, SEQ + 1), generator=generator) for _ in range(8)]
    train_block(model, optimizer, data, 3, None, args.comm)  # warm up allocator and kernels

    base, monitored, plain = Timings(), Timings(), Timings()
    base_by_parity: tuple[list[float], list[float]] = ([], [])
    # with --comm a third arm, Monitor(comm=False) in the same distributed job, separates what comm=True adds
    # from what the Monitor already does when torch.distributed is up (gradient-norm checks, fingerprints)
    arms = ["none", "comm", "plain"] if args.comm else ["none", "monitor"]
    for round_index in range(args.rounds):
        order = arms[round_index % len(arms):] + arms[:round_index % len(arms)]
        if round_index % 2:
            order.reverse()
        for arm in order:
            if arm == "none":
                block = train_block(model, optimizer, data, args.steps, None, args.comm)
                base.extend(block)
                base_by_parity[round_index % 2].extend(block.step)
                continue
            monitor = Monitor(model, optimizer, env={}, prometheus_addr="127.0.0.1", prometheus_port=0, otel=False,
                              comm=arm == "comm", trace_dir=trace_dir)
            stop = threading.Event()
            scraper = threading.Thread(target=scrape_every_second, args=(monitor.metrics_url, stop), daemon=True)
            scraper.start()
            (plain if arm == "plain" else monitored).extend(
                train_block(model, optimizer, data, args.steps, monitor, args.comm))
            stop.set()
            scraper.join()
            monitor.close()

    median, mean = statistics.median, statistics.fmean
    n_params = sum(p.numel() for p in model.parameters())
    print(f"model: {LAYERS} layers, d_model {D_MODEL}, seq {SEQ}, batch {BATCH}, {n_params / 1e6:.1f}M parameters, "
          f"torch {torch.__version__}, {torch.get_num_threads()} threads")
    setup = "Monitor(comm=True): collective logger, forward/optimizer hooks, step markers" if args.comm else "Monitor"
    print(f"steps: {len(base.step)} without and {len(monitored.step)} with {setup}, {args.rounds} interleaved rounds")
    print(f"median step: {median(base.step) * 1e3:.1f} ms without, {median(monitored.step) * 1e3:.1f} ms with")
    print(f"overhead, end to end (median step-time ratio): {100 * (median(monitored.step) / median(base.step) - 1):+.2f}%")
    print(f"overhead, end to end (mean step-time ratio, heavy steps included): {100 * (mean(monitored.step) / mean(base.step) - 1):+.2f}%")
    noise = median(base_by_parity[1]) / median(base_by_parity[0])
    print(f"noise floor of the end-to-end figures (odd vs even baseline rounds): {100 * (noise - 1):+.2f}%")
    hooks_median = median(monitored.optimizer) - median(base.optimizer)
    hooks_mean = mean(monitored.optimizer) - mean(base.optimizer)
    print(f"added by the optimizer hooks: median {hooks_median * 1e3:.2f} ms, mean {hooks_mean * 1e3:.2f} ms per step")
    print(f"inside monitor.step: median {median(monitored.monitor) * 1e3:.2f} ms, mean {mean(monitored.monitor) * 1e3:.2f} ms per step")
    forward_median = forward_mean = 0.0
    if args.comm:
        forward_median = median(monitored.forward) - median(base.forward)
        forward_mean = mean(monitored.forward) - mean(base.forward)
        print(f"added to the forward pass (its hooks): median {forward_median * 1e3:.2f} ms, "
              f"mean {forward_mean * 1e3:.2f} ms per step")
    added_median = (hooks_median + median(monitored.monitor) + forward_median) / median(base.step)
    added_mean = (hooks_mean + mean(monitored.monitor) + forward_mean) / mean(base.step)
    print(f"overhead, from the measured components: median {100 * added_median:.2f}%, mean {100 * added_mean:.2f}% of a step")
    if args.comm:
        print(f"Monitor(comm=False) in the same job: median step {median(plain.step) * 1e3:.1f} ms, "
              f"{100 * (median(plain.step) / median(base.step) - 1):+.2f}% (mean {100 * (mean(plain.step) / mean(base.step) - 1):+.2f}%)")
        print(f"what comm=True adds to that Monitor (median step-time ratio): "
              f"{100 * (median(monitored.step) / median(plain.step) - 1):+.2f}% "
              f"(mean {100 * (mean(monitored.step) / mean(plain.step) - 1):+.2f}%)")
        rows = comm_rows_per_step()
        print(f"comm=True's step marker, forward and optimizer rows, timed directly: {rows * 1e6:.1f} us per step, "
              f"{100 * rows / median(base.step):.3f}% of a median step")
    if args.comm:
        torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main()
