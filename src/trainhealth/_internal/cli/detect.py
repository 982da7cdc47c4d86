"""``trainhealth detect``: the detectors over a recorded series (CSV or Parquet).

Bad options and bad input raise :class:`trainhealth._internal.errors.UsageError` (one line, exit 2).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from trainhealth._internal._files import check_output_file, same_file, write_json, write_text
from trainhealth._internal.errors import UsageError

__all__ = ["add_commands"]


def _cmd_detect(args: argparse.Namespace) -> int:
    from trainhealth._internal.detectors.offline import SeriesError, default_detectors, detect, load_series
    from trainhealth._internal.detectors.spec import parse_item

    out = Path(args.out) if args.out else None
    if out is not None:
        check_output_file(out, "--out")
        if same_file(out, Path(args.file)):
            raise UsageError(f"--out {args.out}: is the input file; name a new file")
    try:
        specs = (
            [parse_item(item, args.column) for item in args.detector]
            if args.detector
            else default_detectors(args.column)
        )
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
            write_json(out, rows)
        else:
            import pandas as pd

            write_text(out, pd.DataFrame(rows, columns=list(rows[0]) if rows else ["detector"]).to_csv(index=False))
    if args.json:
        print(json.dumps(rows, indent=2))
    else:
        for anomaly in anomalies:
            end = "ongoing" if anomaly.end_step is None else f"to {anomaly.end_step}"
            print(
                f"{anomaly.severity.value:<9}{anomaly.detector:<12}{anomaly.series or '-':<12}"
                f"step {anomaly.start_step} {end:<12} peak {anomaly.value:.6g} (expected "
                f"{'?' if anomaly.expected is None else f'{anomaly.expected:.6g}'}, score {anomaly.score:.3g})"
            )
        print(f"{len(anomalies)} anomal{'y' if len(anomalies) == 1 else 'ies'} in {args.file} [{args.column}]")
    return 0


def add_commands(commands: argparse._SubParsersAction, parser_class: type) -> None:
    detect_parser = commands.add_parser(
        "detect",
        help="run detectors over a recorded series (CSV or Parquet) and list the anomalies",
        description="Each --detector is name or name(key=value,...), with the detector's parameters and the "
        "decision step's threshold, cooldown, min_consecutive and protect (see docs/detectors.md).",
    )
    detect_parser.add_argument("file", help="a .csv, .csv.gz or .parquet file")
    detect_parser.add_argument("--column", required=True, help="the column to watch")
    detect_parser.add_argument(
        "--detector",
        action="append",
        metavar="SPEC",
        help="a detector (repeatable; default: the Monitor's detectors for a column named "
        "loss, grad_norm, step_time, throughput or comm_duration, else "
        "zscore(threshold=12), iqr(threshold=8) and nonfinite)",
    )
    detect_parser.add_argument("--series-column", help="column naming the series (rank, GPU): watched side by side")
    detect_parser.add_argument("--time-column", help="column with the time or step of each row")
    detect_parser.add_argument("--out", help="also write the anomalies to this .csv or .json file")
    detect_parser.add_argument("--json", action="store_true", help="print the anomalies as JSON")
    detect_parser.set_defaults(handler=_cmd_detect)
