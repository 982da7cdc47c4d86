"""``trainhealth stack up`` and ``trainhealth stack down``."""

from __future__ import annotations

import argparse
from pathlib import Path

from trainhealth._internal.cli.numbers import PORT, Bounded

__all__ = ["add_commands"]


SCRAPE_INTERVAL = Bounded(int, 1, 3600, unit="seconds")
SHARDS = Bounded(int, 1, 8, unit="shards")
MAX_FOR = Bounded(int, 0, 86400, unit="seconds")
DEMO_DURATION = Bounded(float, 20, 86400, unit="seconds")


def _cmd_up(args: argparse.Namespace) -> int:
    from trainhealth._internal.errors import UsageError
    from trainhealth._internal.stack.runner import StackOptions, check_directory, demo_directory, stack_up
    from trainhealth._internal.stack.topology import query_url

    scale_out = args.store == "victoriametrics"
    if args.agent != "prometheus" and not scale_out:
        raise UsageError(f"--agent {args.agent}: only with --store victoriametrics (one Prometheus scrapes alone)")
    ports = {
        **(
            {
                f"--prometheus-port {args.prometheus_port} + {n} (shard {n})": args.prometheus_port + n
                for n in range(args.shards)
            }
            if scale_out
            else {"--prometheus-port": args.prometheus_port}
        ),
        "--alertmanager-port": args.alertmanager_port,
        "--webhook-port": args.webhook_port,
        **({"--store-port": args.store_port, "--vmalert-port": args.vmalert_port} if scale_out else {}),
    }
    too_high = [option for option, port in ports.items() if port > 65535]
    if too_high:
        raise UsageError(f"{too_high[0]}: above 65535")
    if len(set(ports.values())) < len(ports):
        raise UsageError(f"{', '.join(f'{k} {v}' for k, v in ports.items())}: each needs a port of its own")
    options = StackOptions(
        directory=Path(args.dir),
        prometheus_port=args.prometheus_port,
        alertmanager_port=args.alertmanager_port,
        webhook_port=args.webhook_port,
        scrape_interval_s=args.scrape_interval,
        max_for_s=args.max_for,
        demo=not args.no_demo,
        demo_duration_s=args.demo_duration,
        demo_args=tuple(args.demo_arg or ()),
        store=args.store,
        shards=args.shards,
        agent=args.agent,
        store_port=args.store_port,
        vmalert_port=args.vmalert_port,
    )
    if options.demo:
        ranks = range(options.port_base, options.port_base + options.ranks)
        clash = [f"{option} {port}" for option, port in ports.items() if port == options.analyzer_port or port in ranks]
        if clash:
            raise UsageError(
                f"{', '.join(clash)}: used by the demo (analyzer {options.analyzer_port}, ranks "
                f"{ranks.start}-{ranks.stop - 1})"
            )
    check_directory(options.directory, options)
    demo_out = demo_directory(options.directory)
    started = stack_up(options)
    for entry in started:
        print(f"started {entry.name} (pid {entry.pid}), log {entry.log}")
    queries = (
        f"VictoriaMetrics {query_url(options)} (Prometheus API)" if scale_out else f"Prometheus {query_url(options)}"
    )
    print(
        f"{queries}  Alertmanager http://127.0.0.1:{options.alertmanager_port}"
        + (f"  demo report {demo_out / 'report.html'} when it ends" if options.demo else "")
    )
    print(f"stop with: trainhealth stack down --dir {options.directory}")
    return 0


def _cmd_down(args: argparse.Namespace) -> int:
    from trainhealth._internal.errors import UsageError
    from trainhealth._internal.stack.runner import stack_down

    directory = Path(args.dir)
    if (directory.exists() or directory.is_symlink()) and not directory.is_dir():
        raise UsageError(f"--dir {directory}: not a directory")
    stopped = stack_down(directory)
    print("stopped " + ", ".join(stopped) if stopped else f"nothing running from {args.dir}")
    return 0


def add_commands(commands: argparse._SubParsersAction, parser_class: type[argparse.ArgumentParser]) -> None:
    stack = commands.add_parser(
        "stack",
        help="run Prometheus (or Prometheus shards into VictoriaMetrics), Alertmanager and the demo as local "
        "processes (no docker)",
        description="up starts the binaries found on PATH on 127.0.0.1 with trainhealth's configs and rules, "
        "and the demo; down stops exactly what up started.",
    )
    actions = stack.add_subparsers(
        dest="stack_command", metavar="ACTION", required=True, parser_class=parser_class, help="start or stop the stack"
    )
    up = actions.add_parser("up", help="start the stack")
    down = actions.add_parser("down", help="stop what up started")
    for parser in (up, down):
        parser.add_argument("--dir", default=".trainhealth-stack", help="state directory (default .trainhealth-stack)")
    up.add_argument(
        "--store",
        choices=("prometheus", "victoriametrics"),
        default="prometheus",
        help="prometheus: one Prometheus scrapes, stores and evaluates the rules (default); victoriametrics: "
        "--shards Prometheus agents split the targets and remote_write into VictoriaMetrics, vmalert "
        "evaluates the rules against it (docs/scale.md)",
    )
    up.add_argument(
        "--agent",
        choices=("prometheus", "vmagent"),
        default="prometheus",
        help="with --store victoriametrics: what the shards are, Prometheus agents (default) or vmagents "
        "(a fraction of the memory per series)",
    )
    up.add_argument(
        "--shards",
        type=SHARDS,
        default=2,
        metavar="N",
        help=f"with --store victoriametrics: scraping shards, {SHARDS.range_text} (default 2)",
    )
    up.add_argument(
        "--prometheus-port",
        type=PORT,
        default=9090,
        help="Prometheus's port; with --store victoriametrics the shards' ports start here (default 9090)",
    )
    up.add_argument("--store-port", type=PORT, default=8428, help="VictoriaMetrics's port (default 8428)")
    up.add_argument("--vmalert-port", type=PORT, default=8880, help="vmalert's port (default 8880)")
    up.add_argument("--alertmanager-port", type=PORT, default=9093, help="Alertmanager's port (default 9093)")
    up.add_argument(
        "--webhook-port",
        type=PORT,
        default=9096,
        help="port where the demo receives Alertmanager's pages (default 9096)",
    )
    up.add_argument(
        "--scrape-interval",
        type=SCRAPE_INTERVAL,
        default=5,
        metavar="SECONDS",
        help=f"scrape and rule-evaluation interval, whole seconds {SCRAPE_INTERVAL.range_text} (default 5)",
    )
    up.add_argument(
        "--max-for",
        type=MAX_FOR,
        default=30,
        metavar="SECONDS",
        help=f"cap every alert's 'for', and Alertmanager's group_wait and group_interval, so a short demo "
        f"shows them, whole seconds {MAX_FOR.range_text} (default 30; production rules: "
        "deploy/prometheus/trainhealth.rules.yml, deploy/alertmanager/alertmanager.yml)",
    )
    up.add_argument("--no-demo", action="store_true", help="only Prometheus and Alertmanager")
    up.add_argument(
        "--demo-duration",
        type=DEMO_DURATION,
        default=600.0,
        metavar="SECONDS",
        help=f"how long the demo trains, {DEMO_DURATION.range_text} (default 600)",
    )
    up.add_argument(
        "--demo-arg",
        action="append",
        metavar="ARG",
        help="extra argument for trainhealth demo (repeatable), e.g. --demo-arg=--no-faults",
    )
    up.set_defaults(handler=_cmd_up)
    down.set_defaults(handler=_cmd_down)
