"""``trainhealth-lab``: the evaluation harness's command. ``run`` and ``score``: the real-run fault lab;
``corpus``: the training-signal corpus; ``nab``: the detectors scored on the Numenta Anomaly Benchmark.

Bad options and bad input are reported in one line with exit status 2, as ``trainhealth`` does.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shlex
import sys
import tempfile
import time
import warnings
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

from trainhealth._internal._files import check_output_directory, output_directory
from trainhealth._internal.cli.numbers import Bounded
from trainhealth._internal.errors import UsageError

if TYPE_CHECKING:
    from trainhealth_lab.realrun.launcher import CaseOutcome

__all__ = ["build_parser", "main", "parse_seeds"]

USAGE_ERROR = 2


#: The largest seed and the most seeds one run takes.
MAX_SEED = 2**31 - 1
MAX_SEEDS = 1000
#: Steps per corpus run (enough for warm-up, a pre-event baseline and a window after the cause), worker processes.
CORPUS_STEPS = Bounded(int, 100, 100_000, unit="steps")
CORPUS_WORKERS = Bounded(int, 1, 64, unit="processes")
#: ``corpus`` defaults: every model and scenario (trainhealth_lab.corpus TASKS, SCENARIOS; no torch import here).
CORPUS_MODELS = ("tiny_gpt", "mlp", "convnet")
CORPUS_SCENARIOS = (
    "clean",
    "lr_divergence",
    "lr_blowup",
    "corrupted_batch",
    "bad_shard",
    "overflow",
    "bit_flip_param",
    "bit_flip_grad",
    "optimizer_reset",
)


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
    from trainhealth_lab.realrun.cases import suite_cases
    from trainhealth_lab.realrun.suite import run_suite, shape_summary, shape_table, summary, table

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
        print(
            f"{outcome.case:<48} {outcome.status:<7} {outcome.wall_s:5.1f}s  verdict {score.get('verdict', '-'):<13} "
            f"top {score.get('top') or '-':<16} live delay {outcome.live_detection_delay}"
            + (f"  ({outcome.reason[:100]})" if outcome.reason else ""),
            flush=True,
        )

    rows = run_suite(cases, out, noise=args.noise, report=report)
    print()
    print(shape_table(rows) if args.suite == "shapes" else table(rows))
    print()
    print(shape_summary(rows) if args.suite == "shapes" else summary(rows))
    print(f"results: {out}/results.jsonl", file=sys.stderr)
    return 0


def _cmd_score(args: argparse.Namespace) -> int:
    from trainhealth_lab.realrun.suite import RESULTS_FILE, ResultsError, rescore, summary, table

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
    from trainhealth_lab.corpus.generate import generate
    from trainhealth_lab.corpus.plan import plan_runs
    from trainhealth_lab.corpus.scenarios import SCENARIOS
    from trainhealth_lab.corpus.store import load_corpus
    from trainhealth_lab.corpus.summary import effect_table, run_effects
    from trainhealth_lab.corpus.tasks import TASKS

    seeds = parse_seeds(args.seeds)
    models = _names(args.models, "--models", list(TASKS))
    scenarios = _names(args.scenarios, "--scenarios", list(SCENARIOS))
    out = output_directory(Path(args.out), "--out", empty=True)
    command = shlex.join(
        [
            "trainhealth-lab",
            "corpus",
            "--out",
            args.out,
            "--seeds",
            args.seeds,
            "--steps",
            str(args.steps),
            "--models",
            ",".join(models),
            "--scenarios",
            ",".join(scenarios),
            "--workers",
            str(args.workers),
        ]
    )
    plans = plan_runs(models, scenarios, seeds, steps=args.steps)
    started = time.perf_counter()

    def report(labels: dict[str, Any]) -> None:
        print(
            f"{labels['run']:<36} {labels['kind']:<10} cause {labels['cause_step']}  "
            f"collapse {labels['collapse_step']}",
            flush=True,
        )

    generate(plans, out, workers=args.workers, command=command, report=report)
    print()
    print(effect_table(run_effects(load_corpus(out))))
    print(
        f"{len(plans)} runs in {time.perf_counter() - started:.0f} s with {args.workers} workers: {out}",
        file=sys.stderr,
    )
    return 0


def _cmd_nab(args: argparse.Namespace) -> int:
    from trainhealth._internal.detectors.spec import parse_item
    from trainhealth_lab.bench.nab import NAB_DETECTORS, PROFILES, run_nab

    data = args.data or os.environ.get("TRAINHEALTH_NAB_DATA")
    if data is None:
        for candidate in ("data/nab", "../shared/data/nab"):
            if os.path.isdir(candidate):
                data = candidate
                break
    if data is None or not os.path.isdir(data):
        raise UsageError(
            f"NAB data not found{f' at {data}' if data else ''}: pass --data DIR (a NAB checkout: data/ "
            "and labels/combined_windows.json)"
        )
    check_output_directory(Path(args.out), "--out")
    detectors = args.detector or list(NAB_DETECTORS)
    try:
        for item in detectors:
            parse_item(item, "value")
    except ValueError as exc:
        raise UsageError(f"--detector: {exc}") from None
    _check_nab_data(Path(data))
    try:
        results = run_nab(data, args.out, detectors)
    except (FileNotFoundError, ValueError) as exc:
        raise UsageError(f"NAB data {data}: {exc}") from None
    names = list(PROFILES)
    print(f"NAB scores (0 = null detector, 100 = perfect), results in {args.out}")
    width = max(len(result.spec) for result in results) + 2
    split_header = f"{'even files (tuned)':>20}{'odd files (held out)':>22}" if args.split else ""
    print(
        f"{'detector':<{width}}"
        + "".join(f"{name:>20}" for name in names)
        + f"{'standard, per point':>22}"
        + split_header
    )
    for result in results:
        split = (
            f"{_split_figure(result.split.tuned):>20}{_split_figure(result.split.held_out):>22}" if args.split else ""
        )
        print(
            f"{result.spec:<{width}}"
            + "".join(f"{result.events[name]:>20.1f}" for name in names)
            + f"{result.points['standard']:>22.1f}"
            + split
        )
    if args.split:
        print(
            "split: the standard profile's event scores; the threshold is chosen on the files at even positions "
            "(sorted by name) and applied unchanged to those at odd positions"
        )
    return 0


def _split_figure(score: float) -> str:
    """A split score, or what stands for one where the half has no anomaly window to score."""
    return "insufficient data" if math.isnan(score) else f"{score:.1f}"


def _check_nab_data(root: Path) -> None:
    """What ``run_nab`` reads, read first: the labels (file -> windows of two timestamps) and each labelled
    file's timestamp and value columns, so that bad data is refused before anything is written."""
    import pandas as pd

    def bad(problem: str) -> UsageError:
        return UsageError(f"NAB data {root}: {problem}")

    labels = root / "labels" / "combined_windows.json"
    if not labels.is_file():
        raise bad(f"{labels} is missing (a NAB checkout has data/ and labels/combined_windows.json)")
    try:
        windows = json.loads(labels.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, RecursionError) as exc:
        raise bad(f"{labels}: not valid JSON ({type(exc).__name__})") from None
    if not isinstance(windows, dict) or not windows:
        raise bad(f"{labels}: expected an object mapping data files to their anomaly windows")
    data = (root / "data").resolve()
    for name, spans in windows.items():
        csv = (data / name).resolve()
        if not isinstance(spans, list) or not all(
            isinstance(span, list) and len(span) == 2 and all(isinstance(t, str) for t in span) for span in spans
        ):
            raise bad(f"{labels}: {name[:80]!r} must map to a list of [start, end] timestamps")
        if len(name.split("/")) != 2 or not csv.is_relative_to(data) or not csv.is_file():
            raise bad(f"{labels}: {name[:80]!r} is not a file category/name.csv under {data}")
        with warnings.catch_warnings():  # pandas warns before it fails on a timestamp it cannot read
            warnings.simplefilter("ignore", UserWarning)
            try:
                pd.to_datetime(pd.Series([t for span in spans for t in span], dtype=object))
            except (ValueError, TypeError, OverflowError) as exc:
                raise bad(f"{labels}: {name[:80]!r}: {_first_line(exc)}") from None
            try:
                frame = pd.read_csv(csv)
                pd.to_datetime(frame["timestamp"])
                values = pd.to_numeric(frame["value"])
            except KeyError as exc:
                raise bad(f"{csv}: no column {exc}") from None
            except (ValueError, TypeError, OverflowError, UnicodeDecodeError, pd.errors.ParserError) as exc:
                raise bad(f"{csv}: {_first_line(exc)}") from None
        if values.empty:
            raise bad(f"{csv}: no rows")


def _first_line(exc: BaseException) -> str:
    """An exception in one short line (its type when it has no message)."""
    return str(exc).splitlines()[0][:120] if str(exc) else type(exc).__name__


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        raise UsageError(f"{message} (see '{self.prog} --help')")


def build_parser() -> argparse.ArgumentParser:
    """The ``trainhealth-lab`` command line."""
    parser = _Parser(
        prog="trainhealth-lab",
        description="trainhealth's evaluation harness: real gloo ranks with "
        "injected faults, a corpus of real training signals, NAB.",
    )
    lab_commands = parser.add_subparsers(
        dest="command",
        metavar="COMMAND",
        parser_class=_Parser,
        required=True,
        help="the command to run (trainhealth-lab COMMAND --help describes it)",
    )
    run = lab_commands.add_parser("run", help="run a suite of cases and print the score table")
    run.add_argument(
        "--suite",
        choices=("small", "full", "shapes"),
        default="small",
        help="which cases (default small; shapes: the job shapes of issue 30 — explicit collectives, "
        "FSDP-style, the Hugging Face Trainer and Accelerate, 2-rank jobs, faults from step 0)",
    )
    run.add_argument("--out", help="directory for the runs and results.jsonl (default: a new temporary directory)")
    run.add_argument("--seeds", help="seeds, like 0,1,2 or 0-2 (default: 0 for small, 0-2 for full)")
    run.add_argument("--cases", help="only cases whose kind or name contains one of these (comma-separated)")
    run.add_argument("--noise", action="store_true", help="run a competing CPU-bound process beside the suite")
    run.set_defaults(handler=_cmd_run)
    score = lab_commands.add_parser(
        "score", help="localize a finished suite's saved traces again with this code, and print the score table"
    )
    score.add_argument("results", help="the suite's --out directory, or its results.jsonl")
    score.set_defaults(handler=_cmd_score)
    corpus = lab_commands.add_parser(
        "corpus",
        help="train small models on CPU with instabilities caused in the runs, and write their signals and labels",
    )
    corpus.add_argument("--out", required=True, help="a new or empty directory for the corpus")
    corpus.add_argument("--seeds", default="0-5", help="seeds, like 0,1,2 or 0-2 (default 0-5)")
    corpus.add_argument(
        "--steps",
        type=CORPUS_STEPS,
        default=1000,
        help=f"training steps per run, {CORPUS_STEPS.range_text} (default 1000)",
    )
    corpus.add_argument("--models", default=",".join(CORPUS_MODELS), help="models, comma-separated (default all)")
    corpus.add_argument(
        "--scenarios",
        default=",".join(CORPUS_SCENARIOS),
        help="scenarios, comma-separated (default all; clean makes two runs per model and seed)",
    )
    corpus.add_argument(
        "--workers",
        type=CORPUS_WORKERS,
        default=2,
        help=f"worker processes, one torch thread each, {CORPUS_WORKERS.range_text} (default 2)",
    )
    corpus.set_defaults(handler=_cmd_corpus)
    nab = lab_commands.add_parser(
        "nab",
        help="run the detectors over the Numenta Anomaly Benchmark and score them as NAB does",
        description="Writes NAB's results layout (OUT/<detector>/<category>/<detector>_<file>.csv) and prints "
        "the normalised score per profile, from trainhealth's own implementation of NAB's scoring.",
    )
    nab.add_argument("--out", required=True, help="directory for the per-record results")
    nab.add_argument(
        "--data", help="NAB data directory (default $TRAINHEALTH_NAB_DATA, ./data/nab or ../shared/data/nab)"
    )
    nab.add_argument(
        "--detector", action="append", metavar="SPEC", help="a detector (repeatable; default: a set of six)"
    )
    nab.add_argument(
        "--split",
        action="store_true",
        help="also print the standard score on the even-position files (threshold chosen there) "
        "and on the odd-position files (that threshold, held out)",
    )
    nab.set_defaults(handler=_cmd_nab)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``trainhealth-lab`` with these arguments; the exit status (2: bad input, told in one line)."""
    try:
        args = build_parser().parse_args(argv)
        return int(args.handler(args))
    except UsageError as exc:
        print(f"trainhealth-lab: error: {exc}", file=sys.stderr)
        return USAGE_ERROR
    except BrokenPipeError:  # output piped into head or similar
        sys.stderr.close()
        return 0
    except KeyboardInterrupt:
        return 130


def seed_words(words: list[str], calibration: Iterable[int], held_out: Iterable[int]) -> list[int]:
    """Seeds named by ``calibration``, ``held-out``, ``A-B`` (inclusive) or single numbers, each once, in order;
    at most :data:`MAX_SEEDS`. A word that names no seeds, or too many, is a :class:`UsageError` (a range's size is
    checked before it is built, as :func:`parse_seeds` does).

    >>> seed_words(["calibration", "7", "3-4", "7"], range(2), range(100, 102))
    [0, 1, 7, 3, 4]
    """
    out: list[int] = []
    for word in words:
        if word == "calibration":
            out += list(calibration)
        elif word in ("held-out", "heldout"):
            out += list(held_out)
        else:
            out += parse_seeds(word)
        out = list(dict.fromkeys(out))
        if len(out) > MAX_SEEDS:
            raise UsageError(f"--seeds {' '.join(words)[:200]!r}: more than {MAX_SEEDS} seeds")
    return out
