"""``trainhealth detect`` and ``trainhealth bench``: the detectors over a recorded series, and scored on
public benchmarks (NAB).

Bad options and bad input raise :class:`trainhealth.errors.UsageError` (one line, exit 2).
"""

from __future__ import annotations

import argparse
import json
import math
import os
from pathlib import Path

from trainhealth._files import check_output_directory, check_output_file, same_file, write_text
from trainhealth.errors import UsageError

__all__ = ["add_commands"]


def _cmd_detect(args: argparse.Namespace) -> int:
    from trainhealth.detectors.offline import SeriesError, default_detectors, detect, load_series
    from trainhealth.detectors.spec import parse_item

    out = Path(args.out) if args.out else None
    if out is not None:
        check_output_file(out, "--out")
        if same_file(out, Path(args.file)):
            raise UsageError(f"--out {args.out}: is the input file; name a new file")
    try:
        specs = ([parse_item(item, args.column) for item in args.detector] if args.detector
                 else default_detectors(args.column))
    except ValueError as exc:
        raise UsageError(f"--detector: {exc}") from None
    try:
        frame = load_series(args.file)
        anomalies = detect(frame, args.column, specs, series_column=args.series_column, time_column=args.time_column)
    except (SeriesError, ValueError) as exc:
        raise UsageError(str(exc)) from None
    rows = [anomaly.to_dict() for anomaly in anomalies]
    if out is not None:
        if out.suffix.lower() == ".json":
            write_text(out, json.dumps(rows, indent=2) + "\n")
        else:
            import pandas as pd

            write_text(out, pd.DataFrame(rows, columns=list(rows[0]) if rows else ["detector"]).to_csv(index=False))
    if args.json:
        print(json.dumps(rows, indent=2))
    else:
        for anomaly in anomalies:
            end = "ongoing" if anomaly.end_step is None else f"to {anomaly.end_step}"
            print(f"{anomaly.severity.value:<9}{anomaly.detector:<12}{anomaly.series or '-':<12}"
                  f"step {anomaly.start_step} {end:<12} peak {anomaly.value:.6g} (expected "
                  f"{'?' if anomaly.expected is None else f'{anomaly.expected:.6g}'}, score {anomaly.score:.3g})")
        print(f"{len(anomalies)} anomal{'y' if len(anomalies) == 1 else 'ies'} in {args.file} [{args.column}]")
    return 0


def _cmd_bench_nab(args: argparse.Namespace) -> int:
    from trainhealth.detectors.spec import parse_item
    from trainhealth.lab.bench.nab import NAB_DETECTORS, PROFILES, run_nab

    data = args.data or os.environ.get("TRAINHEALTH_NAB_DATA")
    if data is None:
        for candidate in ("data/nab", "../shared/data/nab"):
            if os.path.isdir(candidate):
                data = candidate
                break
    if data is None or not os.path.isdir(data):
        raise UsageError(f"NAB data not found{f' at {data}' if data else ''}: pass --data DIR (a NAB checkout: data/ "
                         "and labels/combined_windows.json)")
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
    print(f"{'detector':<{width}}" + "".join(f"{name:>20}" for name in names) + f"{'standard, per point':>22}"
          + split_header)
    for result in results:
        split = (f"{_split_figure(result.split.tuned):>20}{_split_figure(result.split.held_out):>22}"
                 if args.split else "")
        print(f"{result.spec:<{width}}" + "".join(f"{result.events[name]:>20.1f}" for name in names)
              + f"{result.points['standard']:>22.1f}" + split)
    if args.split:
        print("split: the standard profile's event scores; the threshold is chosen on the files at even positions "
              "(sorted by name) and applied unchanged to those at odd positions")
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
        if not isinstance(spans, list) or not all(isinstance(span, list) and len(span) == 2
                                                 and all(isinstance(t, str) for t in span) for span in spans):
            raise bad(f"{labels}: {name[:80]!r} must map to a list of [start, end] timestamps")
        if len(name.split("/")) != 2 or not csv.is_relative_to(data) or not csv.is_file():
            raise bad(f"{labels}: {name[:80]!r} is not a file category/name.csv under {data}")
        try:
            frame = pd.read_csv(csv)
            pd.to_datetime(pd.Series([t for span in spans for t in span], dtype=object))
            pd.to_datetime(frame["timestamp"])
            values = pd.to_numeric(frame["value"])
        except KeyError as exc:
            raise bad(f"{csv}: no column {exc}") from None
        except (ValueError, TypeError, OverflowError, UnicodeDecodeError, pd.errors.ParserError) as exc:
            raise bad(f"{csv}: {str(exc).splitlines()[0][:120] if str(exc) else type(exc).__name__}") from None
        if values.empty:
            raise bad(f"{csv}: no rows")


def add_commands(commands: argparse._SubParsersAction, parser_class: type) -> None:
    detect_parser = commands.add_parser(
        "detect", help="run detectors over a recorded series (CSV or Parquet) and list the anomalies",
        description="Each --detector is name or name(key=value,...), with the detector's parameters and the "
                    "decision step's threshold, cooldown, min_consecutive and protect (see docs/detectors.md).",
    )
    detect_parser.add_argument("file", help="a .csv, .csv.gz or .parquet file")
    detect_parser.add_argument("--column", required=True, help="the column to watch")
    detect_parser.add_argument("--detector", action="append", metavar="SPEC",
                               help="a detector (repeatable; default: the Monitor's detectors for a column named "
                                    "loss, grad_norm, step_time, throughput or comm_duration, else "
                                    "zscore(threshold=12), iqr(threshold=8) and nonfinite)")
    detect_parser.add_argument("--series-column", help="column naming the series (rank, GPU): watched side by side")
    detect_parser.add_argument("--time-column", help="column with the time or step of each row")
    detect_parser.add_argument("--out", help="also write the anomalies to this .csv or .json file")
    detect_parser.add_argument("--json", action="store_true", help="print the anomalies as JSON")
    detect_parser.set_defaults(handler=_cmd_detect)

    bench = commands.add_parser("bench", help="evaluate the detectors on public benchmarks")
    bench_commands = bench.add_subparsers(dest="bench_command", metavar="COMMAND", parser_class=parser_class,
                                          required=True, help="the benchmark to run")
    nab = bench_commands.add_parser(
        "nab", help="run the detectors over the Numenta Anomaly Benchmark and score them as NAB does",
        description="Writes NAB's results layout (OUT/<detector>/<category>/<detector>_<file>.csv) and prints "
                    "the normalised score per profile, from trainhealth's own implementation of NAB's scoring.",
    )
    nab.add_argument("--out", required=True, help="directory for the per-record results")
    nab.add_argument("--data", help="NAB data directory (default $TRAINHEALTH_NAB_DATA, ./data/nab or ../shared/data/nab)")
    nab.add_argument("--detector", action="append", metavar="SPEC", help="a detector (repeatable; default: a set of six)")
    nab.add_argument("--split", action="store_true",
                     help="also print the standard score on the even-position files (threshold chosen there) "
                          "and on the odd-position files (that threshold, held out)")
    nab.set_defaults(handler=_cmd_bench_nab)
