"""``trainhealth lab run``, ``lab score`` and ``lab corpus``: the real-run fault lab and the training-signal
corpus from the command line.

Bad options raise :class:`trainhealth.errors.UsageError` (one line, exit 2).
"""

from __future__ import annotations

import argparse
import shlex
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from trainhealth._files import output_directory
from trainhealth.cli.numbers import Bounded
from trainhealth.errors import UsageError

if TYPE_CHECKING:
    from trainhealth.lab.realrun.launcher import CaseOutcome

__all__ = ["add_commands", "parse_seeds"]


#: The largest seed and the most seeds one run takes.
MAX_SEED = 2**31 - 1
MAX_SEEDS = 1000
#: Steps per corpus run (enough for warm-up, a pre-event baseline and a window after the cause), worker processes.
CORPUS_STEPS = Bounded(int, 100, 100_000, unit="steps")
CORPUS_WORKERS = Bounded(int, 1, 64, unit="processes")
#: ``lab corpus`` defaults: every model and scenario (trainhealth.lab.corpus TASKS, SCENARIOS; no torch import here).
CORPUS_MODELS = ("tiny_gpt", "mlp", "convnet")
CORPUS_SCENARIOS = ("clean", "lr_divergence", "lr_blowup", "corrupted_batch", "bad_shard", "overflow",
                    "bit_flip_param", "bit_flip_grad", "optimizer_reset")


def parse_seeds(text: str) -> tuple[int, ...]:
    """``0,1,2`` or ``0-2`` -> (0, 1, 2); seeds from 0 to 2**31-1, at most 1000 of them.

    >>> parse_seeds("0-2,7")
    (0, 1, 2, 7)
    """
    problem = f"--seeds {text!r}: expected seeds from 0 to {MAX_SEED} like 0,1,2 or 0-2, at most {MAX_SEEDS}"
    seeds: list[int] = []
    for part in text.split(","):
        first, dash, last = part.strip().partition("-")
        try:
            low = int(first)
            high = int(last) if dash else low
        except ValueError:
            raise UsageError(problem) from None
        if not 0 <= low <= high <= MAX_SEED or len(seeds) + high - low + 1 > MAX_SEEDS:
            raise UsageError(problem)
        seeds.extend(range(low, high + 1))
    if len(set(seeds)) < len(seeds):
        raise UsageError(f"--seeds {text!r}: a seed is named twice")
    return tuple(seeds)


def _cmd_run(args: argparse.Namespace) -> int:
    from trainhealth.lab.realrun.cases import suite_cases
    from trainhealth.lab.realrun.suite import run_suite, shape_summary, shape_table, summary, table

    seeds = parse_seeds(args.seeds) if args.seeds else ((0,) if args.suite == "small" else (0, 1, 2))
    kinds = tuple(k.strip() for k in (args.cases or "").split(",") if k.strip())
    cases = suite_cases(args.suite, seeds, kinds)
    if not cases:
        raise UsageError(f"--cases {args.cases!r} matches no case of suite {args.suite}")
    if args.out:
        out = str(output_directory(Path(args.out), "--out", empty=True))  # each case's directory is made new
    else:
        out = tempfile.mkdtemp(prefix="trainhealth-lab-")

    def report(outcome: CaseOutcome) -> None:
        score = outcome.localize or {}
        print(f"{outcome.case:<48} {outcome.status:<7} {outcome.wall_s:5.1f}s  verdict {score.get('verdict', '-'):<13} "
              f"top {score.get('top') or '-':<16} live delay {outcome.live_detection_delay}"
              + (f"  ({outcome.reason[:100]})" if outcome.reason else ""), flush=True)

    rows = run_suite(cases, out, noise=args.noise, report=report)
    print()
    print(shape_table(rows) if args.suite == "shapes" else table(rows))
    print()
    print(shape_summary(rows) if args.suite == "shapes" else summary(rows))
    print(f"results: {out}/results.jsonl", file=sys.stderr)
    return 0


def _cmd_score(args: argparse.Namespace) -> int:
    from trainhealth.lab.realrun.suite import RESULTS_FILE, ResultsError, rescore, summary, table

    path = Path(args.results)
    if path.is_dir():
        path = path / RESULTS_FILE
    if not path.is_file():
        raise UsageError(f"{args.results}: no {RESULTS_FILE} of a lab run there")
    try:
        rows = rescore(path)
    except ResultsError as exc:
        raise UsageError(str(exc)) from None
    print(table(rows))
    print()
    print(summary(rows))
    print("(final answers from this code on the saved traces; the live columns are as recorded)")
    return 0


def _names(text: str, option: str, known: Sequence[str]) -> tuple[str, ...]:
    names = tuple(dict.fromkeys(name.strip() for name in text.split(",") if name.strip()))
    unknown = [name for name in names if name not in known]
    if unknown or not names:
        raise UsageError(f"{option} {text!r}: expected names from {', '.join(known)}, comma-separated")
    return names


def _cmd_corpus(args: argparse.Namespace) -> int:
    from trainhealth.lab.corpus.generate import generate
    from trainhealth.lab.corpus.plan import plan_runs
    from trainhealth.lab.corpus.scenarios import SCENARIOS
    from trainhealth.lab.corpus.store import load_corpus
    from trainhealth.lab.corpus.summary import effect_table, run_effects
    from trainhealth.lab.corpus.tasks import TASKS

    seeds = parse_seeds(args.seeds)
    models = _names(args.models, "--models", list(TASKS))
    scenarios = _names(args.scenarios, "--scenarios", list(SCENARIOS))
    out = output_directory(Path(args.out), "--out", empty=True)
    command = shlex.join(["trainhealth", "lab", "corpus", "--out", args.out, "--seeds", args.seeds,
                          "--steps", str(args.steps), "--models", ",".join(models),
                          "--scenarios", ",".join(scenarios), "--workers", str(args.workers)])
    plans = plan_runs(models, scenarios, seeds, steps=args.steps)
    started = time.perf_counter()

    def report(labels: dict[str, Any]) -> None:
        print(f"{labels['run']:<36} {labels['kind']:<10} cause {labels['cause_step']}  "
              f"collapse {labels['collapse_step']}", flush=True)

    generate(plans, out, workers=args.workers, command=command, report=report)
    print()
    print(effect_table(run_effects(load_corpus(out))))
    print(f"{len(plans)} runs in {time.perf_counter() - started:.0f} s with {args.workers} workers: {out}",
          file=sys.stderr)
    return 0


def add_commands(commands: argparse._SubParsersAction, parser_class: type) -> None:
    lab = commands.add_parser("lab", help="the real-run fault lab: real gloo ranks with injected faults, scored; "
                                          "and a corpus of real training signals")
    lab_commands = lab.add_subparsers(dest="lab_command", metavar="COMMAND", parser_class=parser_class, required=True,
                                      help="run a suite, or score a finished one again")
    run = lab_commands.add_parser("run", help="run a suite of cases and print the score table")
    run.add_argument("--suite", choices=("small", "full", "shapes"), default="small",
                     help="which cases (default small; shapes: the job shapes of issue 30 — explicit collectives, "
                          "FSDP-style, the Hugging Face Trainer and Accelerate, 2-rank jobs, faults from step 0)")
    run.add_argument("--out", help="directory for the runs and results.jsonl (default: a new temporary directory)")
    run.add_argument("--seeds", help="seeds, like 0,1,2 or 0-2 (default: 0 for small, 0-2 for full)")
    run.add_argument("--cases", help="only cases whose kind or name contains one of these (comma-separated)")
    run.add_argument("--noise", action="store_true", help="run a competing CPU-bound process beside the suite")
    run.set_defaults(handler=_cmd_run)
    score = lab_commands.add_parser("score", help="localize a finished suite's saved traces again with this code, "
                                                   "and print the score table")
    score.add_argument("results", help="the suite's --out directory, or its results.jsonl")
    score.set_defaults(handler=_cmd_score)
    corpus = lab_commands.add_parser("corpus", help="train small models on CPU with instabilities caused in the "
                                                    "runs, and write their signals and labels")
    corpus.add_argument("--out", required=True, help="a new or empty directory for the corpus")
    corpus.add_argument("--seeds", default="0-5", help="seeds, like 0,1,2 or 0-2 (default 0-5)")
    corpus.add_argument("--steps", type=CORPUS_STEPS, default=1000,
                        help=f"training steps per run, {CORPUS_STEPS.range_text} (default 1000)")
    corpus.add_argument("--models", default=",".join(CORPUS_MODELS), help="models, comma-separated (default all)")
    corpus.add_argument("--scenarios", default=",".join(CORPUS_SCENARIOS),
                        help="scenarios, comma-separated (default all; clean makes two runs per model and seed)")
    corpus.add_argument("--workers", type=CORPUS_WORKERS, default=2,
                        help=f"worker processes, one torch thread each, {CORPUS_WORKERS.range_text} (default 2)")
    corpus.set_defaults(handler=_cmd_corpus)
