"""Where the Monitor's time on the training thread goes, piece by piece (issue 52).

    python benchmarks/monitor_pieces.py [--model encoder|transformer|long] [--steps 100]

monitor_overhead.py says what the Monitor adds to a step; this says where it goes. One copy of
the model trains with ``Monitor(model, optimizer)`` at its defaults (one thread, the loop of
monitor_overhead.py) while a timer wraps each piece the training thread runs: the optimizer
hooks (and, inside the first, the gradient norm the Monitor takes when the loop passes none),
``Monitor.step``, and the model hooks (the sampled signals, NaN provenance's block sums). Each
piece's time is summed over the steps after a warm-up and printed per step, in ms and as a share
of the median step. The timers are this script's, around the product's functions; the pieces
are not additive with what monitor_overhead.py measures (that includes the export thread's
share of the GIL and the caches the pieces evict).
"""

from __future__ import annotations

import argparse
import copy
import functools
import statistics
import time
from collections.abc import Callable
from typing import Any

import torch
from monitor_overhead import SHAPES, Arm, EncoderRegressor, SmallTransformer, _batches, _train

from trainhealth import Monitor
from trainhealth._internal.exporters.steps import StepRecorder
from trainhealth._internal.exporters.training.model_signals import ModelSignals
from trainhealth._internal.exporters.training.param_stats import ParameterStats
from trainhealth._internal.exporters.training.provenance import Provenance

#: (class, method, piece): methods timed on every call
CALLS = [
    (StepRecorder, "before_optimizer_step", "optimizer pre-hook (gradient norm included)"),
    (ParameterStats, "grad_norm", "  of which: the gradient norm"),
    (StepRecorder, "after_optimizer_step", "optimizer post-hook (layer statistics' update)"),
    (StepRecorder, "record", "Monitor.step"),
]
#: (class, hook factory, piece): the hooks those factories make are timed on every call
HOOKS = [
    (ModelSignals, "_mha_hook", "sampled signals: attention"),
    (ModelSignals, "_block_hook", "sampled signals: activation RMS"),
    (ModelSignals, "_head_hook", "sampled signals: output log Z"),
    (Provenance, "_output_hook", "NaN provenance: block sums"),
    (Provenance, "_gradient_hook", "NaN provenance: local gradient sums"),
]


def _timed(function: Callable[..., Any], piece: str, spent: dict[str, float]) -> Callable[..., Any]:
    @functools.wraps(function)
    def timed(*args: Any, **kwargs: Any) -> Any:
        begin = time.perf_counter()
        try:
            return function(*args, **kwargs)
        finally:
            spent[piece] = spent.get(piece, 0.0) + time.perf_counter() - begin

    return timed


def _timed_factory(factory: Callable[..., Any], piece: str, spent: dict[str, float]) -> Callable[..., Any]:
    @functools.wraps(factory)
    def make(*args: Any, **kwargs: Any) -> Any:
        return _timed(factory(*args, **kwargs), piece, spent)

    return make


def measure(model_kind: str, steps: int) -> tuple[dict[str, float], float]:
    """Seconds per step of each piece, and the median step."""
    spent: dict[str, float] = {}
    for owner, name, piece in CALLS:
        setattr(owner, name, _timed(getattr(owner, name), piece, spent))
    for owner, name, piece in HOOKS:
        setattr(owner, name, _timed_factory(getattr(owner, name), piece, spent))
    batch, sequence = SHAPES[model_kind]
    torch.manual_seed(0)
    model: torch.nn.Module = EncoderRegressor() if model_kind == "encoder" else SmallTransformer(sequence)
    model = copy.deepcopy(model)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    monitor = Monitor(model, optimizer, env={}, otel=False, gpu_backend="off", prometheus=False)
    arm = Arm("defaults", model, optimizer, monitor, [], None)  # type: ignore[arg-type]
    data = _batches(model_kind)
    try:
        _train(arm, data, 20, batch * sequence, counted=False)  # warm-up: one full stats_every period
        spent.clear()
        _train(arm, data, steps + 1, batch * sequence)  # the first step is not counted
    finally:
        monitor.close()
    return {piece: total / (steps + 1) for piece, total in spent.items()}, statistics.median(arm.steps)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", choices=sorted(SHAPES), default="encoder")
    parser.add_argument("--steps", type=int, default=100, help="a multiple of stats_every (20) spreads its steps")
    args = parser.parse_args()
    if args.steps < 1:
        parser.error(f"--steps must be at least 1, got {args.steps}")
    torch.set_num_threads(1)
    per_step, step = measure(args.model, args.steps)
    print(
        f"model {args.model}; torch {torch.__version__}, 1 thread; {args.steps} steps; median step {step * 1e3:.1f} ms"
    )
    print(f"{'piece':<48}{'per step':>12}{'of a step':>12}")
    order = [piece for _, _, piece in CALLS + HOOKS]
    for piece in order:
        if piece in per_step:
            seconds = per_step[piece]
            print(f"{piece:<48}{seconds * 1e3:>9.3f} ms{100 * seconds / step:>11.2f}%")
    total = sum(seconds for piece, seconds in per_step.items() if not piece.startswith("  "))
    print(f"{'all of them':<48}{total * 1e3:>9.3f} ms{100 * total / step:>11.2f}%")


if __name__ == "__main__":
    main()
