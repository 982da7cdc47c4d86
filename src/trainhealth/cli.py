"""The ``trainhealth`` command. Subcommands delegate to the package's modules.

Usage errors and bad input print one line to stderr and exit with status 2.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
from collections.abc import Sequence
from typing import NoReturn

from trainhealth import __version__
from trainhealth.catalog import CATALOG
from trainhealth.config import ConfigError, Settings, setting_infos
from trainhealth.docgen import render_configuration_markdown, render_metrics_markdown
from trainhealth.identity import Identity

__all__ = ["main"]

USAGE_ERROR = 2


class UsageError(Exception):
    """Bad input from the command line: reported in one line, exit status 2."""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        raise UsageError(f"{message} (see '{self.prog} --help')")


def _cmd_metrics(args: argparse.Namespace) -> int:
    if args.json:
        print(json.dumps([spec.to_dict() for spec in CATALOG], indent=2, sort_keys=True))
    elif args.markdown:
        sys.stdout.write(render_metrics_markdown())
    else:
        width = max(len(spec.prometheus_name) for spec in CATALOG)
        for spec in CATALOG:
            labels = ",".join(spec.labels)
            print(f"{spec.prometheus_name:<{width}}  {spec.prometheus_type:<9}  {labels:<24}  {spec.help}")
    return 0


def _cmd_config(args: argparse.Namespace) -> int:
    if args.markdown:
        sys.stdout.write(render_configuration_markdown())
        return 0
    settings = Settings.resolve()
    identity = Identity.from_env(settings=settings)
    rows = []
    for info in setting_infos():
        value = getattr(settings, info.name)
        if info.secret and value is not None:
            value = "<hidden>"
        source = "environment" if os.environ.get(info.env) else "default"
        rows.append({"setting": info.name, "env": info.env, "value": value, "source": source})
    if args.json:
        print(json.dumps({"settings": rows, "identity": dataclasses.asdict(identity)}, indent=2, sort_keys=True))
        return 0
    width = max(len(row["setting"]) for row in rows)
    for row in rows:
        print(f"{row['setting']:<{width}}  {row['value']!s:<24}  ({row['source']}: {row['env']})")
    print()
    for key, value in dataclasses.asdict(identity).items():
        print(f"{key:<{width}}  {value}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="trainhealth", description="Observability for large-model training.")
    parser.add_argument("--version", action="version", version=f"trainhealth {__version__}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)

    metrics = commands.add_parser("metrics", help="print the metric catalogue")
    metrics_format = metrics.add_mutually_exclusive_group()
    metrics_format.add_argument("--json", action="store_true", help="as JSON")
    metrics_format.add_argument("--markdown", action="store_true", help="as docs/metrics.md")
    metrics.set_defaults(handler=_cmd_metrics)

    config = commands.add_parser("config", help="show the resolved settings and identity of this environment")
    config_format = config.add_mutually_exclusive_group()
    config_format.add_argument("--json", action="store_true", help="as JSON")
    config_format.add_argument("--markdown", action="store_true", help="document every setting (docs/configuration.md)")
    config.set_defaults(handler=_cmd_config)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
        if args.command is None:
            parser.print_help(sys.stderr)
            return USAGE_ERROR
        return int(args.handler(args))
    except (UsageError, ConfigError) as exc:
        print(f"trainhealth: error: {exc}", file=sys.stderr)
        return USAGE_ERROR
    except BrokenPipeError:  # output piped into head or similar
        sys.stderr.close()
        return 0
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
