"""``trainhealth probe``: the pairwise link probe, launched once per rank like any torch.distributed program.

    torchrun --nproc-per-node 4 -m trainhealth probe --out probe.json

Each rank reads ``RANK``, ``WORLD_SIZE``, ``MASTER_ADDR`` and ``MASTER_PORT``, joins a gloo
process group and runs :func:`trainhealth._internal.exporters.collectives.probe.probe_links`; rank 0 writes
the JSON and prints a table naming the slow link. Bad arguments or a missing variable raise
:class:`trainhealth._internal.errors.UsageError` (one line on stderr, exit status 2).
"""

from __future__ import annotations

import argparse
import os
from datetime import timedelta
from pathlib import Path

from trainhealth._internal._files import check_output_file
from trainhealth._internal.cli.numbers import Bounded
from trainhealth._internal.errors import UsageError

__all__ = ["add_commands"]

_ENVIRONMENT = ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")


#: The largest message a probe sends: 1 GiB.
MAX_SIZE = 1 << 30
_REPEATS = Bounded(int, 1, 10_000)
_TIMEOUT = Bounded(float, 0, 86400, unit="seconds", low_open=True)


def _sizes(text: str) -> tuple[int, ...]:
    try:
        sizes = tuple(int(part) for part in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected byte counts like 4096,1048576, got {text[:60]!r}") from None
    if len(set(sizes)) < 2 or min(sizes) < 1 or max(sizes) > MAX_SIZE:
        raise argparse.ArgumentTypeError(
            f"expected two or more distinct byte counts from 1 to {MAX_SIZE}, got {text[:60]!r}"
        )
    return sizes


def _cmd_probe(args: argparse.Namespace) -> int:
    out = Path(args.out)
    check_output_file(out, "--out")
    missing = [name for name in _ENVIRONMENT if not os.environ.get(name)]
    if missing:
        raise UsageError(f"trainhealth probe runs once per rank (torchrun sets them): {', '.join(missing)} not set")

    import torch.distributed as dist

    from trainhealth._internal.exporters.collectives.probe import probe_links

    dist.init_process_group("gloo", timeout=timedelta(seconds=args.timeout))
    try:
        result = probe_links(sizes=args.sizes, repeats=args.repeats, timeout_s=args.timeout)
        if dist.get_rank() == 0:
            result.to_json(out)
            print(result.render())
            print(f"wrote {out}")
    finally:
        dist.destroy_process_group()
    return 0


def add_commands(commands: argparse._SubParsersAction, parser_class: type[argparse.ArgumentParser]) -> None:
    probe = commands.add_parser(
        "probe",
        help="measure every pair of ranks (latency, bandwidth) and name the rank with slow links",
        description="Run once per rank (torchrun, or RANK/WORLD_SIZE/MASTER_ADDR/MASTER_PORT set by hand). "
        "Rank 0 writes the result (see docs/localization.md) and prints a table.",
    )
    probe.add_argument("--out", required=True, help="JSON file written by rank 0")
    probe.add_argument(
        "--sizes",
        type=_sizes,
        default=(4096, 1 << 20),
        metavar="BYTES,BYTES",
        help="message sizes: the smallest measures latency, the largest bandwidth (default 4096,1048576)",
    )
    probe.add_argument(
        "--repeats", type=_REPEATS, default=5, help=f"exchanges per size and pair, {_REPEATS.range_text} (default 5)"
    )
    probe.add_argument(
        "--timeout",
        type=_TIMEOUT,
        default=60.0,
        metavar="SECONDS",
        help=f"longest wait for a peer before its link is reported failed, {_TIMEOUT.range_text} (default 60)",
    )
    probe.set_defaults(handler=_cmd_probe)
