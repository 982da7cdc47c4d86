"""The real-run fault lab's table: localization on real gloo ranks with real injected faults.

    python benchmarks/real_runs.py                          # the full suite, seeds 0-2 (72 runs, ~15 min on 2 cores)
    python benchmarks/real_runs.py --noise                  # the same, then again beside a competing CPU-bound process
    python benchmarks/real_runs.py --seeds 0 --cases compute,clean --out /tmp/lab
    python benchmarks/real_runs.py --suite shapes --seeds 0-1 --no-live --out /tmp/shapes-runs  # issue 30's shapes
    python benchmarks/real_runs.py --suite shapes --score /tmp/shapes-runs/quiet  # saved runs, localized again

Every run starts 4 or 8 ranks (gloo on CPU) that train a small model in one of three
layouts (DDP; DP x 2 pipeline stages; DP x tensor-parallel pairs) under the Monitor and
the collective logger, with a fault injected into real execution and its ground truth
written beside the traces (see trainhealth_lab.realrun). The live analyzer is polled
every 0.4 s while the job runs; ``localize`` judges the traces at the end. Printed:
the table by fault kind x layout x severity band with two naive baselines, and the
acceptance figures of issue 15. One JSON line per run in OUT/results.jsonl.

``--suite shapes`` runs the shapes users run (issue 30; trainhealth_lab.realrun.shapes): explicit
collectives with the collective logger alone, FSDP-style per-layer gathers and reduce-scatters,
the Hugging Face Trainer and Accelerate with trainhealth's integrations, 2-rank jobs; each with a
compute straggler (>= 1.5x) from mid-run, the same from step 0 and a clean control, plus issue
30's reproduction. Printed: the per-shape table and issue 30's acceptance lines.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

from trainhealth._internal.errors import UsageError
from trainhealth_lab.cli import parse_seeds
from trainhealth_lab.realrun.cases import SUITES, suite_cases
from trainhealth_lab.realrun.suite import (
    RESULTS_FILE,
    ResultsError,
    rescore,
    run_suite,
    shape_summary,
    shape_table,
    summary,
    table,
)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", help="directory for the runs (default: a new temporary directory)")
    parser.add_argument("--seeds", default="0-2", help="seeds, like 0,1,2 or 0-2 (default 0-2)")
    parser.add_argument("--cases", help="only cases whose kind or name contains one of these (comma-separated)")
    parser.add_argument("--noise", action="store_true", help="after the quiet suite, repeat it beside a busy process")
    parser.add_argument("--suite", choices=tuple(SUITES), default="full", help="which cases (default full)")
    parser.add_argument(
        "--no-live",
        dest="live",
        action="store_false",
        help="no live analyzer while the jobs run (less CPU beside the ranks; no live columns)",
    )
    parser.add_argument(
        "--score",
        metavar="RESULTS",
        help="run nothing: localize the saved runs of RESULTS (a results.jsonl or its directory) "
        "again with this code and print the suite's tables",
    )
    args = parser.parse_args(argv)
    if args.score:
        return _score(Path(args.score), args.suite)
    try:
        seeds = parse_seeds(args.seeds)
    except UsageError as exc:
        print(f"real_runs.py: {exc}", file=sys.stderr)
        return 2
    kinds = tuple(k.strip() for k in (args.cases or "").split(",") if k.strip())
    cases = suite_cases(args.suite, seeds, kinds)
    if not cases:
        print(f"real_runs.py: --cases {args.cases!r} matches no case", file=sys.stderr)
        return 2
    out = Path(args.out or tempfile.mkdtemp(prefix="trainhealth-real-runs-"))
    for noise in (False, True) if args.noise else (False,):
        began = time.monotonic()
        rows = run_suite(
            cases,
            out / ("noise" if noise else "quiet"),
            noise=noise,
            live=args.live,
            report=lambda o: print(f"  {o.case:<48} {o.status:<7} {o.wall_s:5.1f}s", flush=True),
        )
        title = "beside a competing CPU-bound process" if noise else "quiet machine"
        print(f"\n== real-run lab, {len(cases)} runs, seeds {args.seeds}, {title} ({time.monotonic() - began:.0f}s) ==")
        if args.suite == "shapes":
            print(shape_table(rows))
            print()
            print(shape_summary(rows))
        else:
            print(table(rows))
            print()
            print(summary(rows))
        print(f"results: {out / ('noise' if noise else 'quiet') / 'results.jsonl'}\n")
    return 0


def _score(results: Path, suite: str) -> int:
    path = results / RESULTS_FILE if results.is_dir() else results
    try:
        rows = rescore(path)
    except ResultsError as exc:
        print(f"real_runs.py: {exc}", file=sys.stderr)
        return 2
    print(shape_table(rows) if suite == "shapes" else table(rows))
    print()
    print(shape_summary(rows) if suite == "shapes" else summary(rows))
    print(f"(final answers from this code on the saved traces of {path})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
