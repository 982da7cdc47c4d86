"""What the Monitor costs a CPU training step, feature by feature (issue 33).

    python benchmarks/monitor_overhead.py [--model transformer|long] [--rounds 40] [--steps 1] [--repeats 3]

Every arm trains its own copy of the same model (same weights, same batches) with AdamW on one
thread; the loop clips the gradients and passes ``clip_grad_norm_``'s value to ``Monitor.step``.
The arms take turns in blocks of ``--steps`` steps (one by default: the arms' steps of a round
run within seconds of each other), the order rotating every round, so drift on a shared machine
reaches every arm alike:

* ``baseline`` and ``baseline again``: no Monitor; their difference is the noise floor;
* ``core``: a Monitor with every optional feature off (per-step loss, norm, step time and
  throughput, read without stalling and exported on its thread);
* ``core + <feature>``: one default feature on top of it — the model signals (sampled every
  ``stats_every`` steps), NaN provenance (every step), the layer statistics (every
  ``stats_every`` steps), the streaming detectors, /metrics served and scraped once a second;
* ``defaults``: ``Monitor(model, optimizer)`` as a user writes it.

Not in the arms: the cross-replica checks (they need two ranks or more; a one-process job turns
them off) and the collective logger (off by default; its cost per collective is
benchmarks/comm_overhead.py's figure). Each repeat prints a table: the arm's median step, what
it adds to a step (the median over rounds of the arm's block median over the baseline's in the
same round), in ms and in %, and the feature alone (the arm less ``core``). The ``baseline
again`` row is the noise floor.

``--model transformer``: 4 layers, d_model 256, 4 heads, batch 8 x 128 tokens, vocabulary 8192.
``--model long``: the same layers over 2 x 1,024 tokens: a step dominated by activations (the
attention over long sequences, 16.8 M output logits), where per-block reads cost the most.
"""

from __future__ import annotations

import argparse
import copy
import statistics
import threading
import time
import urllib.request
from dataclasses import dataclass
from typing import Any

import torch

from trainhealth import Monitor

VOCAB, D_MODEL, LAYERS, HEADS = 8192, 256, 4, 4
SHAPES = {"transformer": (8, 128), "long": (2, 1024)}  # (batch, sequence)
STATS_OFF = 1_000_000  # stats_every beyond the run: the layer statistics never run

#: what each arm turns on over ``core``; None: no Monitor
CORE: dict[str, Any] = dict(
    model_signals=False, nan_provenance=False, detectors="off", prometheus=False, stats_every=STATS_OFF
)
ARMS: dict[str, dict[str, Any] | None] = {
    "baseline": None,
    "baseline again": None,
    "core": CORE,
    "core + model signals": {**CORE, "model_signals": True, "stats_every": 20},
    "core + NaN provenance": {**CORE, "nan_provenance": True},
    "core + layer statistics": {**CORE, "stats_every": 20},
    "core + detectors": {k: v for k, v in CORE.items() if k != "detectors"},
    "core + /metrics served": {**CORE, "prometheus": True},
    "defaults": {},
}


class SmallTransformer(torch.nn.Module):
    """A causal pre-norm transformer (the sizes default to this script's; benchmarks/gpu_truth.py sets its own)."""

    def __init__(
        self, sequence: int, vocab: int = VOCAB, width: int = D_MODEL, layers: int = LAYERS, heads: int = HEADS
    ) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(vocab, width)
        self.layers = torch.nn.ModuleList(
            torch.nn.TransformerEncoderLayer(width, heads, 4 * width, dropout=0.0, batch_first=True, norm_first=True)
            for _ in range(layers)
        )
        self.head = torch.nn.Linear(width, vocab)
        self.register_buffer("mask", torch.nn.Transformer.generate_square_subsequent_mask(sequence), persistent=False)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        hidden = self.embed(tokens)
        for layer in self.layers:
            hidden = layer(hidden, src_mask=self.mask, is_causal=True)
        return self.head(hidden)


@dataclass
class Arm:
    name: str
    model: torch.nn.Module
    optimizer: torch.optim.Optimizer
    monitor: Monitor | None
    steps: list[float]
    done: int = 0


def _scrape_every_second(url: str, stop: threading.Event) -> None:
    while not stop.wait(1.0):
        with urllib.request.urlopen(url, timeout=5) as response:
            response.read()


def _train(arm: Arm, data: list[torch.Tensor], steps: int, batch_tokens: int) -> None:
    for _ in range(steps):
        begin = time.perf_counter()
        tokens = data[arm.done % len(data)]
        logits = arm.model(tokens[:, :-1])
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, VOCAB), tokens[:, 1:].reshape(-1))
        loss.backward()
        norm = torch.nn.utils.clip_grad_norm_(arm.model.parameters(), 1.0)
        arm.optimizer.step()
        arm.optimizer.zero_grad(set_to_none=True)
        if arm.monitor is not None:
            arm.monitor.step(loss=loss, tokens=batch_tokens, grad_norm=norm)
        arm.steps.append(time.perf_counter() - begin)
        arm.done += 1


def measure(model_kind: str, rounds: int, steps: int, names: list[str]) -> list[Arm]:
    """The step times of the arms ``names``, in rotating blocks."""
    batch, sequence = SHAPES[model_kind]
    torch.manual_seed(0)
    template = SmallTransformer(sequence)
    generator = torch.Generator().manual_seed(0)
    data = [torch.randint(0, VOCAB, (batch, sequence + 1), generator=generator) for _ in range(8)]
    arms, stops = [], []
    for name in names:
        settings = ARMS[name]
        model = copy.deepcopy(template)
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
        monitor = None
        if settings is not None:
            monitor = Monitor(
                model,
                optimizer,
                env={},
                otel=False,
                gpu_backend="off",
                prometheus_addr="127.0.0.1",
                prometheus_port=0,
                **settings,
            )
            if monitor.metrics_url is not None:
                stop = threading.Event()
                threading.Thread(target=_scrape_every_second, args=(monitor.metrics_url, stop), daemon=True).start()
                stops.append(stop)
        arm = Arm(name, model, optimizer, monitor, [])
        _train(arm, data, 2, batch * sequence)  # warm up: allocator, kernels, the Monitor's first steps
        arm.steps.clear()
        arms.append(arm)
    try:
        for index in range(rounds):
            turn = index % len(arms)
            order = arms[turn:] + arms[:turn]
            for arm in reversed(order) if index % 2 else order:
                _train(arm, data, steps, batch * sequence)
    finally:
        for stop in stops:
            stop.set()
        for arm in arms:
            if arm.monitor is not None:
                arm.monitor.close()
    return arms


def _added(arm: Arm, reference: Arm, steps: int) -> float:
    """The median over rounds of the arm's block median over the reference's block median in the same round,
    less one: each round's blocks ran minutes apart at most, so the machine's drift cancels."""
    blocks = range(0, len(arm.steps), steps)
    return (
        statistics.median(
            statistics.median(arm.steps[i : i + steps]) / statistics.median(reference.steps[i : i + steps])
            for i in blocks
        )
        - 1
    )


def table(arms: list[Arm], steps: int) -> list[str]:
    by_name = {arm.name: arm for arm in arms}
    base = by_name["baseline"]
    step = statistics.median(base.steps)
    lines = [f"{'arm':<26}{'median step':>12}{'added to a step':>22}{'feature alone':>22}"]
    for arm in arms:
        added = _added(arm, base, steps)
        text = f"{arm.name:<26}{statistics.median(arm.steps) * 1e3:>9.1f} ms{added * step * 1e3:>10.2f} ms ({100 * added:+.2f}%)"
        if arm.name.startswith("core +"):
            alone = added - _added(by_name["core"], base, steps)
            text += f"{alone * step * 1e3:>10.2f} ms ({100 * alone:+.2f}%)"
        lines.append(text)
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", choices=sorted(SHAPES), default="transformer")
    parser.add_argument("--rounds", type=int, default=40)
    parser.add_argument("--steps", type=int, default=1, help="steps per block")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument(
        "--only",
        action="append",
        choices=list(ARMS),
        metavar="ARM",
        help="measure only this arm (repeatable; the baselines and core always run)",
    )
    args = parser.parse_args()
    names = (
        list(ARMS)
        if not args.only
        else ["baseline", "baseline again", "core"]
        + [name for name in ARMS if name in args.only and name not in ("baseline", "baseline again", "core")]
    )
    torch.set_num_threads(1)
    batch, sequence = SHAPES[args.model]
    print(
        f"model {args.model}: {LAYERS} layers, d_model {D_MODEL}, batch {batch} x {sequence} tokens, vocabulary "
        f"{VOCAB}; torch {torch.__version__}, 1 thread; {len(names)} arms x {args.rounds} rounds x {args.steps} steps"
    )
    for repeat in range(args.repeats):
        arms = measure(args.model, args.rounds, args.steps, names)
        print(f"\nrepeat {repeat + 1}:")
        print("\n".join(table(arms, args.steps)))


if __name__ == "__main__":
    main()
