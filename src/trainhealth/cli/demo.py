"""``trainhealth demo``: the README's main job."""

from __future__ import annotations

import argparse
from pathlib import Path

from trainhealth.errors import UsageError

__all__ = ["add_commands"]


def _cmd_demo(args: argparse.Namespace) -> int:
    from trainhealth.lab.demo.runner import DemoOptions, run_demo
    from trainhealth.lab.injectors.schedule import ScheduleError, load_schedule

    if not 2 <= args.ranks <= 16:
        raise UsageError("--ranks must be between 2 and 16")
    if args.duration < 20:
        raise UsageError("--duration must be at least 20 seconds")
    faults = None
    if args.no_faults:
        faults = []
    elif args.faults:
        try:
            specs = load_schedule(args.faults)
        except (ScheduleError, OSError) as exc:
            raise UsageError(f"--faults {args.faults}: {exc}") from None
        faults = [_as_dict(spec) for spec in specs]
    try:
        import matplotlib  # noqa: F401
        import rich  # noqa: F401
    except ImportError:
        raise UsageError("the demo needs rich and matplotlib: pip install 'trainhealth[demo]'") from None
    options = DemoOptions(ranks=args.ranks, duration_s=args.duration, out=Path(args.out), addr=args.addr,
                          port_base=args.port_base, analyzer_port=None if args.no_analyzer else args.analyzer_port,
                          webhook_port=args.webhook_port or None, faults=faults)
    return run_demo(options)


def _as_dict(spec: object) -> dict:
    from dataclasses import asdict

    return {key: value for key, value in asdict(spec).items() if value is not None}  # type: ignore[call-overload]


def add_commands(commands: argparse._SubParsersAction, parser_class: type[argparse.ArgumentParser]) -> None:
    demo = commands.add_parser(
        "demo", help="run a small multi-rank training job on CPU that goes wrong on schedule, and watch it caught",
        description="Trains a small GPT-style model on 4 CPU ranks (torch, gloo) with the Monitor, the collective "
                    "logger and simulated GPUs; injects a thermally throttled GPU, a straggler, a loss spike and an "
                    "XID 79; serves /metrics per rank (ports 9450+) and the analyzer (9448); writes an HTML "
                    "incident report. Ctrl-C stops early and still writes the report.",
    )
    demo.add_argument("--duration", type=float, default=150.0, metavar="SECONDS",
                      help="how long to train (default 150)")
    demo.add_argument("--ranks", type=int, default=4, help="training processes (default 4)")
    demo.add_argument("--faults", metavar="FILE", help="fault schedule (YAML or JSON, see docs/sdc.md) instead of "
                                                       "the built-in one")
    demo.add_argument("--no-faults", action="store_true", help="a fault-free run")
    demo.add_argument("--out", default="trainhealth-demo", metavar="DIR",
                      help="report and traces directory (default ./trainhealth-demo)")
    demo.add_argument("--addr", default="127.0.0.1", help="address the endpoints bind to (default 127.0.0.1)")
    demo.add_argument("--port-base", type=int, default=9450, help="rank r serves /metrics on PORT_BASE + r")
    demo.add_argument("--analyzer-port", type=int, default=9448, help="analyzer /metrics port (default 9448)")
    demo.add_argument("--no-analyzer", action="store_true", help="do not run the analyzer")
    demo.add_argument("--webhook-port", type=int, default=9096,
                      help="port receiving Alertmanager webhooks (default 9096; 0 turns it off)")
    demo.set_defaults(handler=_cmd_demo)
