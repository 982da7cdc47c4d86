"""What the Monitor costs a CPU training step, feature by feature (issues 33 and 52).

    python benchmarks/monitor_overhead.py [--model transformer|encoder|long] [--arms target|all]
                                          [--rounds 60] [--steps 4] [--repeats 3]

Every arm trains its own copy of the same model (same weights, same batches) with AdamW on one
thread. The arms take turns in blocks of ``--steps`` steps, the order rotating and reversing
every round, so drift on a shared machine reaches every arm alike. The first step of each block
is not counted: it pays for what the arm before it left running (a Monitor's export thread
finishing its last step, the collector) and for the caches that arm emptied. The /metrics
scrapes (one a second) run only during their own arm's turn, for the same reason.

* ``baseline`` and ``baseline again``: no Monitor; their difference is the noise floor, and a
  repeat whose floor is outside ±``--floor`` (0.25%) is marked as unable to resolve the target;
* ``core``: a Monitor with every optional feature off (per-step loss, norm, step time and
  throughput, read without stalling and exported on its thread);
* ``core + <feature>``: one default feature on top of it — the model signals (sampled every
  ``stats_every`` steps), NaN provenance (every step), the layer statistics (every
  ``stats_every`` steps), the streaming detectors, /metrics served and scraped once a second;
* ``defaults``: ``Monitor(model, optimizer)`` as a user writes it;
* ``defaults, GIL held``: the same, with the Monitor's background threads no longer handing the
  GIL back between pieces of work (``trainhealth._internal._gil.yield_gil`` a no-op while this
  arm trains), as before issue 52: the difference from ``defaults`` is what the hand-back saves.

``--arms target`` runs the baselines and ``defaults`` only (the figure the targets are judged
on, with rounds to spare for the noise floor); ``--arms all`` adds the ablation.

Not in the arms: the cross-replica checks (they need two ranks or more; a one-process job turns
them off) and the collective logger (off by default; its cost per collective is
benchmarks/comm_overhead.py's figure). Each repeat prints a table: the arm's median step, what
it adds to a step (each round's ratio of the arm's block median to the baseline's, averaged over
the rounds with the lowest and highest fifth left out), in ms and in %, and the feature alone
(the arm less ``core``); then the summary of
the repeats: the median of ``defaults`` against the model's target.

Models:

* ``transformer``: a causal pre-norm transformer built of ``torch.nn.TransformerEncoderLayer``,
  4 layers, d_model 256, 4 heads, batch 8 x 128 tokens, vocabulary 8192; the loop clips the
  gradients and passes ``clip_grad_norm_``'s value to ``Monitor.step``. Target 0.5%.
* ``encoder``: ``torch.nn.TransformerEncoder`` (PyTorch's own container and layers, default
  dropout), 4 layers, d_model 256, 4 heads, batch 8 x 128 vectors, a linear head and an MSE loss;
  the loop a user writes first (``mon.step(loss=loss)``: the Monitor measures the gradient norm
  itself). Target 0.5%.
* ``long``: the transformer over 2 x 1,024 tokens: a step dominated by activations (the
  attention over long sequences, 16.8 M output logits), where per-block reads cost the most.
  Target 1%.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import statistics
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch

from trainhealth import Monitor
from trainhealth._internal._gil import yield_gil

VOCAB, D_MODEL, LAYERS, HEADS = 8192, 256, 4, 4
SHAPES = {"transformer": (8, 128), "encoder": (8, 128), "long": (2, 1024)}  # (batch, sequence)
TARGETS = {"transformer": 0.005, "encoder": 0.005, "long": 0.01}  # what defaults may add to a step
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
    "defaults, GIL held": {},
}
TARGET_ARMS = ["baseline", "baseline again", "defaults"]


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


class EncoderRegressor(torch.nn.Module):
    """``torch.nn.TransformerEncoder`` as its documentation builds it, with a linear head for an MSE loss."""

    def __init__(self, width: int = D_MODEL, layers: int = LAYERS, heads: int = HEADS) -> None:
        super().__init__()
        layer = torch.nn.TransformerEncoderLayer(width, heads, 4 * width, batch_first=True)
        self.encoder = torch.nn.TransformerEncoder(layer, layers)
        self.head = torch.nn.Linear(width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.encoder(x))


@dataclass
class Arm:
    name: str
    model: torch.nn.Module
    optimizer: torch.optim.Optimizer
    monitor: Monitor | None
    steps: list[float]  # the counted steps: every block's but its first
    turn: threading.Event  # set while this arm trains (its /metrics scrapes run only then)
    done: int = 0


def _scrape_every_second(url: str, turn: threading.Event, stop: threading.Event) -> None:
    while not stop.is_set():
        if turn.wait(0.2) and not stop.wait(1.0) and turn.is_set():
            with urllib.request.urlopen(url, timeout=5) as response:
                response.read()


@dataclass(frozen=True)
class Batch:
    inputs: torch.Tensor
    targets: torch.Tensor


def _batches(model_kind: str) -> list[Batch]:
    batch, sequence = SHAPES[model_kind]
    generator = torch.Generator().manual_seed(0)
    if model_kind == "encoder":
        return [
            Batch(
                torch.randn(batch, sequence, D_MODEL, generator=generator),
                torch.randn(batch, sequence, D_MODEL, generator=generator),
            )
            for _ in range(8)
        ]
    tokens = [torch.randint(0, VOCAB, (batch, sequence + 1), generator=generator) for _ in range(8)]
    return [Batch(t[:, :-1], t[:, 1:]) for t in tokens]


def _train(arm: Arm, data: list[Batch], steps: int, batch_tokens: int, counted: bool = True) -> None:
    """``steps`` steps of ``arm``; with ``counted``, every one but the first is timed."""
    for index in range(steps):
        begin = time.perf_counter()
        batch = data[arm.done % len(data)]
        output = arm.model(batch.inputs)
        if isinstance(arm.model, EncoderRegressor):  # the loop a user writes first: the Monitor takes the norm
            loss = torch.nn.functional.mse_loss(output, batch.targets)
            loss.backward()
            arm.optimizer.step()
            arm.optimizer.zero_grad(set_to_none=True)
            if arm.monitor is not None:
                arm.monitor.step(loss=loss, tokens=batch_tokens)
        else:
            loss = torch.nn.functional.cross_entropy(output.reshape(-1, VOCAB), batch.targets.reshape(-1))
            loss.backward()
            norm = torch.nn.utils.clip_grad_norm_(arm.model.parameters(), 1.0)
            arm.optimizer.step()
            arm.optimizer.zero_grad(set_to_none=True)
            if arm.monitor is not None:
                arm.monitor.step(loss=loss, tokens=batch_tokens, grad_norm=norm)
        if counted and index > 0:
            arm.steps.append(time.perf_counter() - begin)
        arm.done += 1


@contextlib.contextmanager
def _gil_held(held: bool) -> Iterator[None]:
    """While ``held``, every trainhealth module's ``yield_gil`` is a no-op (the background threads keep the GIL
    for their whole piece of work, as before issue 52); restored after."""
    patched = []
    if held:
        for name, module in list(sys.modules.items()):
            user = name.startswith("trainhealth") and name != yield_gil.__module__
            if user and getattr(module, "yield_gil", None) is yield_gil:
                patched.append(module)
                module.yield_gil = _hold  # type: ignore[attr-defined]
    try:
        yield
    finally:
        for module in patched:
            module.yield_gil = yield_gil  # type: ignore[attr-defined]


def _hold() -> None:
    """The hand-back turned off."""


def _rehome(arm: Arm) -> None:
    """Move the arm's parameters and optimizer state to new memory. In one run, four copies of one model
    without a Monitor differed by up to 0.7% in step time; new memory every round turns whatever part of
    that comes from where the tensors lie into noise the average takes out, not an arm's lasting bias."""
    with torch.no_grad():
        for parameter in arm.model.parameters():
            parameter.data = parameter.data.clone()
        for state in arm.optimizer.state.values():
            for key, value in state.items():
                if isinstance(value, torch.Tensor) and value.dim() > 0:
                    state[key] = value.clone()


def measure(model_kind: str, rounds: int, steps: int, names: list[str]) -> list[Arm]:
    """The counted step times of the arms ``names``, in rotating blocks."""
    batch, sequence = SHAPES[model_kind]
    torch.manual_seed(0)
    template: torch.nn.Module = EncoderRegressor() if model_kind == "encoder" else SmallTransformer(sequence)
    data = _batches(model_kind)
    arms, stop = [], threading.Event()
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
        arm = Arm(name, model, optimizer, monitor, [], threading.Event())
        if monitor is not None and monitor.metrics_url is not None:
            threading.Thread(
                target=_scrape_every_second, args=(monitor.metrics_url, arm.turn, stop), daemon=True
            ).start()
        _train(arm, data, 3, batch * sequence, counted=False)  # warm up: allocator, kernels, the Monitor's first steps
        arms.append(arm)
    try:
        for index in range(rounds):
            turn = index % len(arms)
            order = arms[turn:] + arms[:turn]
            for arm in reversed(order) if index % 2 else order:
                _rehome(arm)
                arm.turn.set()
                with _gil_held(arm.name == "defaults, GIL held"):
                    _train(arm, data, steps, batch * sequence)
                arm.turn.clear()
    finally:
        stop.set()
        for arm in arms:
            if arm.monitor is not None:
                arm.monitor.close()
    return arms


def _added(arm: Arm, reference: Arm, counted: int) -> float:
    """What the arm adds to a step: each round's ratio of the arm's block median to the reference's (their blocks
    ran seconds apart, so the machine's drift cancels), less one, averaged over the rounds with the lowest and
    highest fifth left out (a trimmed mean: about 1.5 times the precision of the median of ratios, whose spread
    here is about 1.6% a round)."""
    ratios = sorted(
        statistics.median(arm.steps[i : i + counted]) / statistics.median(reference.steps[i : i + counted])
        for i in range(0, len(arm.steps), counted)
    )
    cut = len(ratios) // 5
    return statistics.fmean(ratios[cut : len(ratios) - cut]) - 1


def table(arms: list[Arm], counted: int) -> tuple[list[str], dict[str, float]]:
    """The repeat's table, and what each arm adds to a step (a fraction)."""
    by_name = {arm.name: arm for arm in arms}
    base = by_name["baseline"]
    step = statistics.median(base.steps)
    added = {arm.name: _added(arm, base, counted) for arm in arms}
    lines = [f"{'arm':<26}{'median step':>12}{'added to a step':>22}{'feature alone':>22}"]
    for arm in arms:
        share = added[arm.name]
        text = f"{arm.name:<26}{statistics.median(arm.steps) * 1e3:>9.1f} ms{share * step * 1e3:>10.2f} ms ({100 * share:+.2f}%)"
        if arm.name.startswith("core +"):
            alone = share - added["core"]
            text += f"{alone * step * 1e3:>10.2f} ms ({100 * alone:+.2f}%)"
        lines.append(text)
    return lines, added


def summary(model_kind: str, repeats: list[dict[str, float]], floor: float) -> list[str]:
    """The repeats against the model's target: the median of ``defaults``, each repeat's noise floor."""
    target = TARGETS[model_kind]
    floors = [added["baseline again"] for added in repeats]
    resolved = all(abs(f) <= floor for f in floors)
    lines = [
        f"noise floors (baseline again): {', '.join(f'{100 * f:+.2f}%' for f in floors)}; "
        f"{'each' if resolved else 'NOT each'} within +/-{100 * floor:.2f}%"
    ]
    if "defaults" in repeats[0]:
        defaults = [added["defaults"] for added in repeats]
        median = statistics.median(defaults)
        verdict = "met" if median <= target else "NOT met"
        if not resolved:
            verdict = "unresolved (a noise floor is outside its bound)"
        lines.append(
            f"defaults: {', '.join(f'{100 * d:+.2f}%' for d in defaults)}; median of {len(defaults)} repeats "
            f"{100 * median:+.2f}% against a target of {100 * target:.1f}%: {verdict}"
        )
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", choices=sorted(SHAPES), default="transformer")
    parser.add_argument("--arms", choices=("target", "all"), default="target")
    parser.add_argument("--rounds", type=int, default=60)
    parser.add_argument("--steps", type=int, default=4, help="steps per block (the first is not counted)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--floor", type=float, default=0.0025, help="the noise floor a repeat must stay within")
    parser.add_argument(
        "--only",
        action="append",
        choices=list(ARMS),
        metavar="ARM",
        help="measure only this arm (repeatable; the baselines and core always run)",
    )
    args = parser.parse_args()
    for name, value in (("--rounds", args.rounds), ("--repeats", args.repeats)):
        if value < 1:
            parser.error(f"{name} must be at least 1, got {value}")
    if args.steps < 2:
        parser.error(f"--steps must be at least 2 (the first step of a block is not counted), got {args.steps}")
    if args.only:
        names = ["baseline", "baseline again", "core"] + [
            name for name in ARMS if name in args.only and name not in ("baseline", "baseline again", "core")
        ]
    else:
        names = list(ARMS) if args.arms == "all" else TARGET_ARMS
    torch.set_num_threads(1)
    batch, sequence = SHAPES[args.model]
    what = "vectors" if args.model == "encoder" else f"tokens, vocabulary {VOCAB}"
    print(
        f"model {args.model}: {LAYERS} layers, d_model {D_MODEL}, batch {batch} x {sequence} {what}; torch "
        f"{torch.__version__}, 1 thread; {len(names)} arms x {args.rounds} rounds x {args.steps} steps "
        f"({args.steps - 1} counted)"
    )
    repeats = []
    for repeat in range(args.repeats):
        arms = measure(args.model, args.rounds, args.steps, names)
        lines, added = table(arms, args.steps - 1)
        repeats.append(added)
        print(f"\nrepeat {repeat + 1}:")
        print("\n".join(lines), flush=True)
    print()
    print("\n".join(summary(args.model, repeats, args.floor)))


if __name__ == "__main__":
    main()
