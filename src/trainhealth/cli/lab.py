"""``trainhealth lab run``: the real-run fault lab from the command line.

Bad options raise :class:`trainhealth.errors.UsageError` (one line, exit 2).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

from trainhealth._files import output_directory
from trainhealth.errors import UsageError

if TYPE_CHECKING:
    from trainhealth.lab.realrun.launcher import CaseOutcome

__all__ = ["add_commands", "parse_seeds"]


#: The largest seed and the most seeds one run takes.
MAX_SEED = 2**31 - 1
MAX_SEEDS = 1000


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
    from trainhealth.lab.realrun.suite import run_suite, summary, table

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
    print(table(rows))
    print()
    print(summary(rows))
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


def add_commands(commands: argparse._SubParsersAction, parser_class: type) -> None:
    lab = commands.add_parser("lab", help="the real-run fault lab: real gloo ranks with injected faults, scored")
    lab_commands = lab.add_subparsers(dest="lab_command", metavar="COMMAND", parser_class=parser_class, required=True,
                                      help="run a suite, or score a finished one again")
    run = lab_commands.add_parser("run", help="run a suite of cases and print the score table")
    run.add_argument("--suite", choices=("small", "full"), default="small", help="which cases (default small)")
    run.add_argument("--out", help="directory for the runs and results.jsonl (default: a new temporary directory)")
    run.add_argument("--seeds", help="seeds, like 0,1,2 or 0-2 (default: 0 for small, 0-2 for full)")
    run.add_argument("--cases", help="only cases whose kind or name contains one of these (comma-separated)")
    run.add_argument("--noise", action="store_true", help="run a competing CPU-bound process beside the suite")
    run.set_defaults(handler=_cmd_run)
    score = lab_commands.add_parser("score", help="localize a finished suite's saved traces again with this code, "
                                                   "and print the score table")
    score.add_argument("results", help="the suite's --out directory, or its results.jsonl")
    score.set_defaults(handler=_cmd_score)
