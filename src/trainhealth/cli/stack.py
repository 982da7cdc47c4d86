"""``trainhealth stack up`` and ``trainhealth stack down``."""

from __future__ import annotations

import argparse
from pathlib import Path

__all__ = ["add_commands"]


def _cmd_up(args: argparse.Namespace) -> int:
    from trainhealth.errors import UsageError
    from trainhealth.stack.runner import StackOptions, stack_up

    if args.max_for < 0 or args.scrape_interval <= 0:
        raise UsageError("--max-for must be >= 0 and --scrape-interval positive")
    options = StackOptions(directory=Path(args.dir), prometheus_port=args.prometheus_port,
                           alertmanager_port=args.alertmanager_port, webhook_port=args.webhook_port,
                           scrape_interval_s=args.scrape_interval, max_for_s=args.max_for, demo=not args.no_demo,
                           demo_duration_s=args.demo_duration, demo_args=tuple(args.demo_arg or ()))
    started = stack_up(options)
    for entry in started:
        print(f"started {entry.name} (pid {entry.pid}), log {entry.log}")
    print(f"Prometheus http://127.0.0.1:{options.prometheus_port}  Alertmanager "
          f"http://127.0.0.1:{options.alertmanager_port}"
          + (f"  demo report {options.directory / 'demo' / 'report.html'} when it ends" if options.demo else ""))
    print(f"stop with: trainhealth stack down --dir {options.directory}")
    return 0


def _cmd_down(args: argparse.Namespace) -> int:
    from trainhealth.stack.runner import stack_down

    stopped = stack_down(Path(args.dir))
    print("stopped " + ", ".join(stopped) if stopped else f"nothing running from {args.dir}")
    return 0


def add_commands(commands: argparse._SubParsersAction, parser_class: type[argparse.ArgumentParser]) -> None:
    stack = commands.add_parser(
        "stack", help="run Prometheus, Alertmanager and the demo as local processes (no docker)",
        description="up starts the prometheus and alertmanager binaries found on PATH on 127.0.0.1 with "
                    "trainhealth's configs and rules, and the demo; down stops exactly what up started.",
    )
    actions = stack.add_subparsers(dest="stack_command", metavar="ACTION", required=True, parser_class=parser_class)
    up = actions.add_parser("up", help="start the stack")
    down = actions.add_parser("down", help="stop what up started")
    for parser in (up, down):
        parser.add_argument("--dir", default=".trainhealth-stack", help="state directory (default .trainhealth-stack)")
    up.add_argument("--prometheus-port", type=int, default=9090)
    up.add_argument("--alertmanager-port", type=int, default=9093)
    up.add_argument("--webhook-port", type=int, default=9096, help="where the demo receives Alertmanager's pages")
    up.add_argument("--scrape-interval", type=float, default=5.0, metavar="SECONDS",
                    help="scrape and rule-evaluation interval (default 5)")
    up.add_argument("--max-for", type=float, default=30.0, metavar="SECONDS",
                    help="cap every alert's 'for' so a short demo shows them (default 30; production rules: "
                         "deploy/prometheus/trainhealth.rules.yml)")
    up.add_argument("--no-demo", action="store_true", help="only Prometheus and Alertmanager")
    up.add_argument("--demo-duration", type=float, default=600.0, metavar="SECONDS", help="default 600")
    up.add_argument("--demo-arg", action="append", metavar="ARG",
                    help="extra argument for trainhealth demo (repeatable), e.g. --demo-arg=--no-faults")
    up.set_defaults(handler=_cmd_up)
    down.set_defaults(handler=_cmd_down)
