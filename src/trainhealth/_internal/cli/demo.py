"""``trainhealth demo``: the README's main job.

Every option is checked before anything starts; the output directory is new or empty (the demo
removes and overwrites nothing it did not create in this run), and without ``--out`` the first
free one of ``trainhealth-demo``, ``trainhealth-demo-2``, ... is used.
"""

from __future__ import annotations

import argparse
import socket
from pathlib import Path

from trainhealth._internal._files import check_output_directory, output_directory
from trainhealth._internal.cli.numbers import PORT, PORT_OR_ZERO, Bounded
from trainhealth._internal.errors import UsageError

__all__ = ["add_commands"]

DEFAULT_OUT = "trainhealth-demo"
DURATION = Bounded(float, 20, 86400, unit="seconds")
RANKS = Bounded(int, 2, 16)
SEED = Bounded(int, 0, 2**31 - 1)


def _cmd_demo(args: argparse.Namespace) -> int:
    from trainhealth._internal.injectors.schedule_file import ScheduleError, load_schedule

    if args.port_base + args.ranks - 1 > PORT.high:
        raise UsageError(
            f"--port-base {args.port_base}: ranks serve on ports up to {args.port_base + args.ranks - 1}, "
            f"above {PORT.high:g}; use a port base of at most {int(PORT.high) - args.ranks + 1}"
        )
    rank_ports = range(args.port_base, args.port_base + args.ranks)
    for option, port in (
        ("--analyzer-port", None if args.no_analyzer else args.analyzer_port),
        ("--webhook-port", args.webhook_port or None),
    ):
        if port is not None and port in rank_ports:
            raise UsageError(f"{option} {port}: taken by a rank (ports {rank_ports.start}-{rank_ports.stop - 1})")
    try:
        socket.getaddrinfo(args.addr, None)
    except (OSError, UnicodeError):
        raise UsageError(f"--addr {args.addr!r}: not an address of this machine's resolver") from None
    faults = None
    if args.no_faults:
        faults = []
    elif args.faults:
        try:
            specs = load_schedule(args.faults)
        except ScheduleError as exc:
            raise UsageError(f"--faults {exc}") from None
        for number, spec in enumerate(specs, 1):
            if spec.ranks and max(spec.ranks) >= args.ranks:
                raise UsageError(
                    f"--faults {args.faults}: fault #{number}: ranks must be below --ranks "
                    f"{args.ranks}, got {max(spec.ranks)}"
                )
            if spec.kind == "simulated_gpu" and spec.params["gpu"] >= args.ranks:
                raise UsageError(
                    f"--faults {args.faults}: fault #{number}: gpu must be below --ranks {args.ranks} "
                    f"(one simulated GPU per rank), got {spec.params['gpu']}"
                )
            if spec.kind in ("bitflip", "nan", "inf"):
                _check_tensor(args.faults, number, spec.params["target"], spec.params["tensor"])
        faults = specs
    if args.out is not None:
        check_output_directory(Path(args.out), "--out", empty=True)
    try:
        import matplotlib  # noqa: F401
        import rich  # noqa: F401
    except ImportError:
        raise UsageError("the demo needs rich and matplotlib: pip install 'trainhealth[demo]'") from None
    from trainhealth._internal.demo.runner import DemoOptions, run_demo

    out = output_directory(Path(args.out), "--out", empty=True) if args.out is not None else _fresh_default()
    options = DemoOptions(
        ranks=args.ranks,
        duration_s=args.duration,
        out=out,
        addr=args.addr,
        port_base=args.port_base,
        analyzer_port=None if args.no_analyzer else args.analyzer_port,
        webhook_port=args.webhook_port or None,
        faults=faults,
        seed=args.seed,
    )
    return run_demo(options)


def _check_tensor(path: str, number: int, target: str, glob: str) -> None:
    """Refuse a tensor fault whose glob matches nothing in the demo's model (the rank would fail at that step)."""
    from fnmatch import fnmatchcase

    from trainhealth._internal.demo.worker import tensor_names

    names = tensor_names(target)
    if not any(fnmatchcase(name, glob) for name in names):
        raise UsageError(
            f"--faults {path}: fault #{number}: tensor {glob!r} matches no {target} of the demo's "
            f"model (one of {', '.join(names[:4])}, ...)"
        )


def _fresh_default() -> Path:
    """``trainhealth-demo``, or the first of ``trainhealth-demo-2``, ``-3``, ... that does not exist yet."""
    for number in range(1, 1000):
        candidate = Path(DEFAULT_OUT if number == 1 else f"{DEFAULT_OUT}-{number}")
        try:
            candidate.mkdir()
        except FileExistsError:
            if candidate.is_dir() and not candidate.is_symlink() and not any(candidate.iterdir()):
                return candidate
            continue
        except OSError as exc:
            raise UsageError(f"cannot create {candidate} here: {exc.strerror or exc}; pass --out DIR") from None
        return candidate
    raise UsageError(f"{DEFAULT_OUT}-2 ... -999 all exist: pass --out DIR")


def add_commands(commands: argparse._SubParsersAction, parser_class: type[argparse.ArgumentParser]) -> None:
    demo = commands.add_parser(
        "demo",
        help="run a small multi-rank training job on CPU that goes wrong on schedule, and watch it caught",
        description="Trains a small GPT-style model on 4 CPU ranks (torch, gloo) with the Monitor, the collective "
        "logger and simulated GPUs; injects a thermally throttled GPU, a straggler, a loss spike and an "
        "XID 79; serves /metrics per rank (ports 9450+) and the analyzer (9448); writes an HTML "
        "incident report. Ctrl-C stops early and still writes the report.",
    )
    demo.add_argument(
        "--duration",
        type=DURATION,
        default=150.0,
        metavar="SECONDS",
        help=f"how long to train, {DURATION.range_text} (default 150)",
    )
    demo.add_argument("--ranks", type=RANKS, default=4, help=f"training processes, {RANKS.range_text} (default 4)")
    demo.add_argument(
        "--faults", metavar="FILE", help="fault schedule (YAML or JSON, see docs/sdc.md) instead of the built-in one"
    )
    demo.add_argument("--no-faults", action="store_true", help="a fault-free run")
    demo.add_argument(
        "--seed",
        type=SEED,
        default=0,
        help=f"seed of the model's initialisation and the batches, {SEED.range_text} (default 0)",
    )
    demo.add_argument(
        "--out",
        metavar="DIR",
        help=f"report and traces directory, new or empty (default ./{DEFAULT_OUT}, or "
        f"./{DEFAULT_OUT}-2 and so on when that one holds an earlier run)",
    )
    demo.add_argument("--addr", default="127.0.0.1", help="address the endpoints bind to (default 127.0.0.1)")
    demo.add_argument(
        "--port-base", type=PORT, default=9450, help="rank r serves /metrics on PORT_BASE + r (default 9450)"
    )
    demo.add_argument("--analyzer-port", type=PORT, default=9448, help="analyzer /metrics port (default 9448)")
    demo.add_argument("--no-analyzer", action="store_true", help="do not run the analyzer")
    demo.add_argument(
        "--webhook-port",
        type=PORT_OR_ZERO,
        default=9096,
        help="port receiving Alertmanager webhooks (default 9096; 0 turns it off)",
    )
    demo.set_defaults(handler=_cmd_demo)
