"""``trainhealth selftest``: the proactive validation, before a job or between jobs.

Exit status 0 when every check passed, 1 when one failed (so an init container
or a prolog script can keep a bad node out), 2 for bad input.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import TYPE_CHECKING

from trainhealth._internal._files import check_output_file
from trainhealth._internal.cli.numbers import Bounded
from trainhealth._internal.errors import UsageError

if TYPE_CHECKING:
    from trainhealth._internal.sdc.selftest import SelftestResult

__all__ = ["add_commands"]

#: The GEMM is size x size in float64 on the CPU as well: 8192 takes half a GiB per matrix and a minute.
_SIZE = Bounded(int, 16, 8192)
#: torch.Generator.manual_seed takes up to 2**64 - 1.
_SEED = Bounded(int, 0, 2**64 - 1)


def _cmd_selftest(args: argparse.Namespace) -> int:
    from trainhealth._internal.sdc.selftest import available_devices, run_selftest

    if args.metrics_file:
        check_output_file(Path(args.metrics_file), "--metrics-file")
    known = available_devices()
    devices = known if args.device in (None, ["all"]) else args.device
    unknown = [d for d in devices if d not in known]
    if unknown:
        raise UsageError(f"--device: unknown device {unknown[0][:60]!r}; this machine has {', '.join(known)}")
    results = run_selftest(devices, size=args.size, seed=args.seed)
    if args.metrics_file:
        _write_metrics(Path(args.metrics_file), results)
    if args.json:
        print(json.dumps([r.to_dict() for r in results], indent=2))
    else:
        for r in results:
            status = "pass" if r.passed else "FAIL"
            print(
                f"{r.device:<8} {r.check:<12} {status}  error {r.max_error:.3g} (tolerance {r.tolerance:.3g}), "
                f"{r.seconds * 1000:.1f} ms{'  ' + r.detail if r.detail else ''}"
            )
        failed = sorted({r.device for r in results if not r.passed})
        print(
            f"selftest: {'FAILED on ' + ', '.join(failed) if failed else 'every check passed'} "
            f"({len(devices)} device{'s' if len(devices) > 1 else ''})"
        )
    return 1 if any(not r.passed for r in results) else 0


def _write_metrics(path: Path, results: list[SelftestResult]) -> None:
    """The results in Prometheus text format, for node_exporter's textfile collector (written atomically)."""
    from prometheus_client import CollectorRegistry, write_to_textfile

    from trainhealth._internal.identity import Identity
    from trainhealth._internal.sdc.selftest import publish_results
    from trainhealth._internal.sinks.prometheus import StoreCollector
    from trainhealth._internal.store import MetricStore

    store = MetricStore()
    publish_results(store, None, results)
    registry = CollectorRegistry()
    registry.register(StoreCollector(store, Identity.node()))
    try:
        write_to_textfile(str(path), registry)
    except OSError as exc:
        raise UsageError(f"cannot write {path}: {exc.strerror or exc}") from None


def add_commands(commands: argparse._SubParsersAction, parser_class: type[argparse.ArgumentParser]) -> None:
    selftest = commands.add_parser(
        "selftest",
        help="run deterministic GEMM, reduction and elementwise checks against a golden reference",
        description="Checks each device against float64 references computed on the CPU, runs the GEMM twice "
        "(bit-identical or broken) and compares devices with each other. Exit status 1 if a check "
        "fails: usable before a job to keep a bad GPU out.",
    )
    selftest.add_argument(
        "--device", action="append", metavar="DEVICE", help="cpu, cuda:N or all (repeatable; default all)"
    )
    selftest.add_argument(
        "--size", type=_SIZE, default=1024, help=f"matrix size of the GEMM, {_SIZE.range_text} (default 1024)"
    )
    selftest.add_argument("--seed", type=_SEED, default=0, help=f"seed of the inputs, {_SEED.range_text} (default 0)")
    selftest.add_argument("--json", action="store_true", help="print the results as JSON")
    selftest.add_argument(
        "--metrics-file", metavar="PATH", help="also write the results for node_exporter's textfile collector"
    )
    selftest.set_defaults(handler=_cmd_selftest)
