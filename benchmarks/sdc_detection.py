"""SDC detection on real 4-rank DDP training (gloo, CPU): detection rate, steps to detect, false positives.

    python benchmarks/sdc_detection.py              # the grid and the overhead (about 15 minutes on 2 cores)
    python benchmarks/sdc_detection.py --seeds 1 --no-overhead
    python benchmarks/sdc_detection.py --provenance   # NaN/Inf provenance of bit-30 flips (about 5 minutes)

Each trial trains trainhealth._internal.demo.tiny_gpt.TinyGPT for 250 steps with the
Monitor at its default settings (fingerprints every 100 steps, local gradient
norms every 10) and injects one fault on one rank at a step between 110 and
190: a bit flip at a given position (31 sign, 30-23 exponent, 22-0 mantissa of
float32) in a parameter, a gradient (before the all-reduce) or an activation,
once (one element, one step), as a burst (64 elements, one step) or repeatedly
(one element every step for 20 steps). Clean trials inject nothing. Per detector
(fingerprint, peer gradient norm, loss spike, non-finite) it reports the share
of trials it caught (after the injection; fingerprint and gradient norm must
name the injected rank), the median steps from injection to detection, and the
clean trials on which it fired (false positives).

Provenance (``--provenance``): 60-step trials, each with one flip of bit 30 (the top
exponent bit: a float32 below 2 becomes about 1e38 or inf/NaN) at a step between 20 and
40 on one random rank, in a parameter, a gradient (before the all-reduce) or an activation
chosen at random from a seeded list over the embedding, both blocks and lm_head. What a trial
expects follows from what reached training: when some rank's loss or gradient norm (after the
all-reduce) went NaN, infinite or above the overflow bound, the alert's rule must name the
injected rank (the rank whose first origin is local, the lowest first step if several) and
that rank's origin block must hold the flipped tensor (for lm_head, also ``head_or_loss``: the
head is judged by elimination, never read). A flip that left every loss and gradient norm
finite (a huge negative logit the softmax ignored, a zero gradient that became 2.0) did not
corrupt training: it expects nothing named. Clean trials show false origins and the largest
magnitudes measured (of a tensor's sum, what the hooks take).

The cost of the provenance hooks is timed in this process (CPU time): the overhead model
below, single-threaded, alternating rounds of 10 steps with and without them (they run
every step).

Overhead: a larger model (width 256, 4 layers, 128 tokens) with fingerprints
every step, so that many are timed; the cost at the default interval is the
median check time over 100 median steps.
"""

from __future__ import annotations

import argparse
import json
import math
import random
import statistics
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.distributed import init_rank, run_ranks  # noqa: E402
from trainhealth._internal.exporters.training.provenance import HEAD_OR_LOSS, OVERFLOW_BOUND  # noqa: E402
from trainhealth_lab.bench.sdc import Trial, run_trials  # noqa: E402

WORLD = 4
BITS = {"sign": 31, "exponent-30": 30, "exponent-27": 27, "exponent-23": 23, "mantissa-22": 22, "mantissa-0": 0}
RATES = {"once": (1, 0), "burst": (64, 0), "repeated": (1, 19)}  # (elements, extra steps)
TENSORS = {
    "parameter": "layers.1.mlp.0.weight",
    "gradient": "layers.0.attn.in_proj_weight",
    "activation": "layers.0.mlp",
}
DETECTORS = ("fingerprint", "grad_norm", "loss_spike", "nonfinite")
PROVENANCE_BLOCKS = ("embed", "layers.0", "layers.1", "lm_head")
HEAD = "lm_head"  # never read: a flip there is named by elimination (after the last block: the head or the loss)
_WEIGHTS = (
    "embed.weight",
    "layers.0.attn.in_proj_weight",
    "layers.0.attn.out_proj.weight",
    "layers.0.norm1.weight",
    "layers.0.mlp.0.weight",
    "layers.0.mlp.2.weight",
    "layers.1.attn.in_proj_weight",
    "layers.1.norm2.weight",
    "layers.1.mlp.0.weight",
    "layers.1.mlp.2.bias",
    "lm_head.weight",
)
PROVENANCE_TARGETS = {
    "parameter": _WEIGHTS,
    "gradient": _WEIGHTS,
    "activation": ("embed", "layers.0.attn", "layers.0.mlp", "layers.0", "layers.1.attn", "layers.1.mlp", "lm_head"),
}


def grid(seeds: int, steps: int) -> list[Trial]:
    trials = []
    for seed in range(seeds):
        for target, tensor in TENSORS.items():
            for field, bit in BITS.items():
                for rate, (count, extra) in RATES.items():
                    chooser = random.Random(f"{seed}-{target}-{field}-{rate}")
                    step, rank = chooser.randint(110, 190), chooser.randrange(WORLD)
                    fault = {
                        "kind": "bitflip",
                        "target": target,
                        "tensor": tensor,
                        "bit": bit,
                        "count": count,
                        "step": step,
                        "until": step + extra,
                        "ranks": [rank],
                    }
                    trials.append(Trial(f"{target}/{field}/{rate}/{seed}", (fault,), steps, seed=seed))
    trials += [Trial(f"clean/{seed}", (), steps, seed=100 + seed) for seed in range(max(10, seeds * 5))]
    return trials


def loss_spike_trials(seeds: int, steps: int) -> list[Trial]:
    """Not SDC: learning-rate blow-ups (x30 for 5 steps), to show what the loss-spike detector catches."""
    trials = []
    for seed in range(seeds):
        chooser = random.Random(f"lr-{seed}")
        step = chooser.randint(110, 190)
        trials.append(
            Trial(
                f"lr_scale/x30/5-steps/{seed}",
                ({"kind": "lr_scale", "factor": 30.0, "step": step, "until": step + 4},),
                steps,
                seed=seed,
            )
        )
    return trials


def provenance_trials(per_kind: int, clean: int, steps: int, first_seed: int = 0) -> list[Trial]:
    trials = []
    for kind, tensors in PROVENANCE_TARGETS.items():
        for seed in range(first_seed, first_seed + per_kind):
            chooser = random.Random(f"provenance-{kind}-{seed}")
            tensor, step, rank = chooser.choice(tensors), chooser.randint(20, 40), chooser.randrange(WORLD)
            fault = {
                "kind": "bitflip",
                "target": kind,
                "tensor": tensor,
                "bit": 30,
                "count": 1,
                "step": step,
                "ranks": [rank],
            }
            trials.append(Trial(f"provenance/{kind}/{seed}", (fault,), steps, seed=seed))
    return trials + [
        Trial(f"clean/{seed}", (), steps, seed=300 + seed, measure_peaks=True)
        for seed in range(first_seed, first_seed + clean)
    ]


def named_rank(results: list[dict]) -> int | None:
    """The rank the alert names: the one whose first origin is local (the lowest step if several; ranks that
    only received it otherwise); None when none reported one or two tie."""
    origins = {r["rank"]: r["origin"] for r in results if r["origin"] is not None}
    pool = {rank: o for rank, o in origins.items() if o["where"] == "local"} or origins
    if not pool:
        return None
    first = min(o["step"] for o in pool.values())
    ranks = [rank for rank, o in pool.items() if o["step"] == first]
    return ranks[0] if len(ranks) == 1 else None


def provenance_report(by_trial: dict[str, list[dict]], seconds: float) -> None:
    counts: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))
    misses, unreached = [], []
    clean, false_origins, peaks = 0, 0, {"output": 0.0, "gradient": 0.0}
    for name, results in sorted(by_trial.items()):
        if name.startswith("clean/"):
            clean += 1
            false_origins += any(r["origin"] is not None for r in results)
            for r in results:
                for key in peaks:
                    peaks[key] = max(peaks[key], r["clean_peaks"][key])
            continue
        kind = name.split("/")[1]
        (fault,) = [e for r in results for e in r["injected"]]
        after = fault["changes"][0][2]
        row = counts[kind]
        row["trials"] += 1
        row["stayed small"] += math.isfinite(after) and abs(after) <= OVERFLOW_BOUND
        if all(r["reached_training"] is None for r in results):  # the loss and gradients stayed finite throughout
            row["did not reach"] += 1
            unreached.append(f"{name} ({fault['tensor']}, {after:.3g})")
            named = [(r["rank"], r["origin"]) for r in results if r["origin"] is not None]
            row["nothing named"] += not named
            if named:
                misses.append(
                    f"{name}: flipped {fault['tensor']} on rank {fault['rank']}, nothing reached training; named {named}"
                )
            continue
        row["reached"] += 1
        truth = next(
            b for b in reversed(PROVENANCE_BLOCKS) if fault["tensor"] == b or fault["tensor"].startswith(b + ".")
        )
        accepted = {truth, HEAD_OR_LOSS} if truth == HEAD else {truth}  # the head is named by elimination
        rank = named_rank(results)
        origin = next((r["origin"] for r in results if r["rank"] == rank), None)
        row["rank"] += rank == fault["rank"]
        right = rank == fault["rank"] and origin is not None and origin["block"] in accepted
        row["rank + block"] += right
        if not right:
            misses.append(
                f"{name}: flipped {fault['tensor']} on rank {fault['rank']} at step {fault['step']}; "
                f"origins {[(r['rank'], r['origin']) for r in results]}"
            )
    print(
        "| target | trials | reached the loss or gradients | faulty rank named | rank and block named "
        "| did not reach training | of those, nothing named |"
    )
    print("|---|---|---|---|---|---|---|")
    total: dict[str, int] = defaultdict(int)
    for kind in PROVENANCE_TARGETS:
        row = counts[kind]
        for key, value in row.items():
            total[key] += value
        print(_provenance_row(kind, row))
    print(_provenance_row("all", total))
    print(f"\nflips that left the value at or below the bound ({OVERFLOW_BOUND:.0e}): {total['stayed small']}")
    print(
        f"clean runs: {clean}, with an origin reported (false origins): {false_origins}; largest measured "
        f"magnitude (of a tensor's sum): block output {peaks['output']:.3g}, local gradient {peaks['gradient']:.3g}"
    )
    print(f"wall time: {seconds:.0f} s")
    print("flips that did not reach training (tensor, value after):", ", ".join(unreached) or "none")
    for miss in misses:
        print("miss:", miss)


def _provenance_row(kind: str, row: dict[str, int]) -> str:
    def share(key: str, of: str) -> str:
        return f"{row[key] / row[of]:.0%} ({row[key]}/{row[of]})" if row[of] else "none"

    return (
        f"| {kind} | {row['trials']} | {row['reached']} | {share('rank', 'reached')} | "
        f"{share('rank + block', 'reached')} | {row['did not reach']} | {share('nothing named', 'did not reach')} |"
    )


def provenance_overhead(rounds: int = 10, steps: int = 10) -> None:
    import torch

    from trainhealth._internal.demo.tiny_gpt import TinyGPT, synthetic_batch
    from trainhealth._internal.exporters.model_health import transformer_blocks
    from trainhealth._internal.exporters.training.model_signals import ModelSignals

    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = TinyGPT(vocab=256, width=256, layers=4, heads=4, context=128)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    batches = [synthetic_batch(256, 128, 8, seed=i) for i in range(steps)]

    def round_ms(hooked: bool) -> float:
        signals = ModelSignals(torch, model, transformer_blocks(torch, model)) if hooked else None
        times = []
        for batch in batches:
            began = time.process_time()  # CPU time: the machine may be shared, wall time would measure that
            model.loss(batch).backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            if signals is not None:
                signals.take()
            times.append(time.process_time() - began)
        if signals is not None:
            signals.close()
        return statistics.median(times) * 1000

    round_ms(False)  # warm-up
    plain, hooked = [], []
    for _ in range(rounds):
        plain.append(round_ms(False))
        hooked.append(round_ms(True))
    base, extra = statistics.median(plain), statistics.median(hooked) - statistics.median(plain)
    parameters = sum(p.numel() for p in model.parameters())
    print(
        f"\nprovenance hooks: model of {parameters / 1e6:.1f} M parameters ({len(list(model.parameters()))} tensors), "
        f"one CPU thread, median CPU time of a step {base:.1f} ms without them, {extra:+.2f} ms with them "
        f"({extra / base:+.1%}; medians of {rounds} alternating rounds of {steps} steps)"
    )


def _rank_main(rank: int, world: int, port: int, trials: list[Trial], out: str, shape: dict | None, batch: int) -> None:
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    init_rank(rank, world, port, timeout_s=300)
    results = run_trials(rank, world, trials, model_shape=shape, batch=batch)
    Path(out, f"rank-{rank}.json").write_text(json.dumps([r.to_dict() for r in results]))
    dist.destroy_process_group()


def run(trials: list[Trial], shape: dict | None = None, batch: int = 8) -> dict[str, list[dict]]:
    with tempfile.TemporaryDirectory() as out:
        run_ranks(_rank_main, WORLD, trials, out, shape, batch, timeout_s=3600)
        by_trial: dict[str, list[dict]] = defaultdict(list)
        for rank in range(WORLD):
            for result in json.loads(Path(out, f"rank-{rank}.json").read_text()):
                by_trial[result["trial"]].append(result)
    return by_trial


def first_detection(results: list[dict], detector: str, after: int, rank: int | None) -> int | None:
    steps = [
        d["step"]
        for r in results
        for d in r["detections"]
        if d["detector"] == detector and d["step"] >= after and (rank is None or d["rank"] == rank)
    ]
    return min(steps) if steps else None


def report(by_trial: dict[str, list[dict]]) -> None:
    rows: dict[tuple[str, ...], dict[str, list]] = defaultdict(lambda: defaultdict(list))
    clean_fired: dict[str, int] = defaultdict(int)
    clean = 0
    for name, results in sorted(by_trial.items()):
        if name.startswith("clean/"):
            clean += 1
            for detector in DETECTORS:
                clean_fired[detector] += any(d["detector"] == detector for r in results for d in r["detections"])
            continue
        target, field, rate, _ = name.split("/")
        (fault,) = [e for r in results for e in r["injected"]][:1] or [None]
        if fault is None:
            continue
        step, rank = fault["step"], (fault["rank"] if target != "lr_scale" else None)
        for key in ((target, field, rate), (target, "*", "*"), ("*", field, "*"), ("*", "*", rate)):
            delays = []
            for detector in DETECTORS:
                named = rank if detector in ("fingerprint", "grad_norm") else None
                found = first_detection(results, detector, step, named)
                rows[key][detector].append(None if found is None else found - step)
                if found is not None:
                    delays.append(found - step)
            rows[key]["any"].append(min(delays) if delays else None)

    def cell(delays: list) -> str:
        hits = [d for d in delays if d is not None]
        rate = f"{len(hits) / len(delays):.0%}"
        return f"{rate} ({statistics.median(hits):.0f})" if hits else rate

    print("detection rate (median steps to detect), by target, bit and rate:\n")
    print("| target | bit | rate | trials | fingerprint | grad_norm | loss_spike | nonfinite | any |")
    print("|---|---|---|---|---|---|---|---|---|")
    for key in sorted(rows, key=lambda k: (k.count("*"), k)):
        delays = rows[key]
        print(
            f"| {' | '.join(key)} | {len(delays['any'])} | "
            + " | ".join(cell(delays[d]) for d in DETECTORS)
            + f" | {cell(delays['any'])} |"
        )
    print(
        f"\nfalse positives over {clean} clean runs (runs on which the detector fired): "
        + ", ".join(f"{d} {clean_fired[d]}" for d in DETECTORS)
    )


def overhead(steps: int) -> None:
    shape = {"vocab": 256, "width": 256, "layers": 4, "heads": 4, "context": 128}
    trial = Trial("overhead", (), steps, settings={"sdc_interval": 1, "grad_check_every": 0})
    plain = Trial("plain", (), steps, settings={"sdc_group": "off", "model_signals": False})
    by_trial = run([plain, trial], shape=shape, batch=8)
    step = statistics.median(r["step_seconds"] for r in by_trial["plain"])
    check = statistics.median(r["check_seconds"]["fingerprint"] for r in by_trial["overhead"])
    parameters = 256 * 256 * 12 * 4 + 256 * 256 * 2 + 128 * 256
    print(
        f"\noverhead: model of {parameters / 1e6:.1f} M parameters, 4 ranks, median step {step * 1000:.1f} ms, "
        f"fingerprint check {check * 1000:.2f} ms -> {check / (100 * step):.3%} of training time at "
        f"sdc_interval=100 ({check / (10 * step):.2%} at 10)"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=2)
    parser.add_argument("--steps", type=int, default=250)
    parser.add_argument("--no-overhead", action="store_true")
    parser.add_argument(
        "--loss-spikes", action="store_true", help="only the learning-rate blow-up trials (8 seeds) and 10 clean runs"
    )
    parser.add_argument(
        "--provenance",
        action="store_true",
        help="only the NaN/Inf provenance trials: bit-30 flips, 60 steps (--per-kind per target kind)",
    )
    parser.add_argument("--per-kind", type=int, default=10)
    parser.add_argument("--clean", type=int, default=6)
    parser.add_argument(
        "--first-seed", type=int, default=100, help="provenance seeds start here (0-9 were used while developing it)"
    )
    args = parser.parse_args()
    if args.provenance:
        trials = provenance_trials(args.per_kind, args.clean, 60, args.first_seed)
        print(f"{len(trials)} trials of 60 steps, {WORLD} ranks (gloo, CPU)", flush=True)
        began = time.perf_counter()
        by_trial = run(trials)
        provenance_report(by_trial, time.perf_counter() - began)
        provenance_overhead()
        return
    if args.loss_spikes:
        trials = loss_spike_trials(8, args.steps) + [
            Trial(f"clean/{s}", (), args.steps, seed=100 + s) for s in range(10)
        ]
        print(f"{len(trials)} trials of {args.steps} steps, {WORLD} ranks (gloo, CPU)", flush=True)
        report(run(trials))
        return
    trials = grid(args.seeds, args.steps)
    print(f"{len(trials)} trials of {args.steps} steps, {WORLD} ranks (gloo, CPU)", flush=True)
    report(run(trials))
    if not args.no_overhead:
        overhead(60)


if __name__ == "__main__":
    main()
