"""The ``trainhealth`` command. Subcommands delegate to the package's modules.

Usage errors and bad input print one line to stderr and exit with status 2.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import os
import re
import signal
import sys
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import NoReturn

from trainhealth._internal._extras import missing_extra
from trainhealth._internal._files import check_output_directory, check_output_file, same_file
from trainhealth._internal.catalog import CATALOG
from trainhealth._internal.cli.demo import add_commands as add_demo_commands
from trainhealth._internal.cli.detect import add_commands as add_detection_commands
from trainhealth._internal.cli.docgen import render_configuration_markdown, render_metrics_markdown
from trainhealth._internal.cli.generate import add_commands as add_alerting_commands
from trainhealth._internal.cli.localize import add_commands as add_localization_commands
from trainhealth._internal.cli.numbers import PORT_OR_ZERO, Bounded
from trainhealth._internal.cli.probe import add_commands as add_probe_commands
from trainhealth._internal.cli.selftest import add_commands as add_selftest_commands
from trainhealth._internal.cli.stack import add_commands as add_stack_commands
from trainhealth._internal.config import ConfigError, SettingInfo, Settings, setting_infos
from trainhealth._internal.errors import UsageError
from trainhealth._internal.identity import Identity
from trainhealth._internal.traces.ops import TraceError
from trainhealth._version import __version__

__all__ = ["main"]

USAGE_ERROR = 2


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
    from trainhealth._internal.detectors.spec import parse_setting

    parse_setting(settings.detectors.spec)
    identity = Identity.from_env(settings=settings)
    if identity.pending:  # no run id in the environment: the ranks agree on one at start
        identity = dataclasses.replace(identity, job="(agreed by the ranks at start)")
    rows = []
    for info in setting_infos():
        value = settings.value(info.name)
        if info.secret and value is not None:
            value = "<hidden>"
        source = "environment" if os.environ.get(info.env) else "default"
        rows.append({"setting": info.name, "env": info.env, "value": value, "source": source})
    if args.json:
        print(json.dumps({"settings": rows, "identity": dataclasses.asdict(identity)}, indent=2, sort_keys=True))
        return 0
    sys.stdout.write(_render_config(setting_infos(), rows, dataclasses.asdict(identity)))
    return 0


#: The widest value column of ``trainhealth config``; a longer value wraps onto indented lines.
_CONFIG_VALUE_WIDTH = 36


def _config_text(value: object) -> str:
    """A value as ``trainhealth config`` shows it: ``unset`` for None, booleans as their variables spell them."""
    if value is None:
        return "unset"
    if isinstance(value, bool):
        return "true" if value else "false"
    if value == "":
        return '""'
    return str(value)


def _wrap_value(text: str, width: int) -> list[str]:
    """``text`` in lines of at most ``width``: a longer one breaks after each ; and, within a part, after , = ( or
    a space where it can (anywhere where it cannot), the part's further lines indented by two spaces."""
    if len(text) <= width:
        return [text]
    lines: list[str] = []
    for part in re.findall(r"[^;]+;?|;", text):
        pieces: list[str] = []
        for piece in filter(None, re.findall(r"[^,=( ]*[,=( ]?", part)):
            pieces.extend(piece[start : start + width - 2] for start in range(0, len(piece), width - 2))
        line = ""
        for piece in pieces:
            if line.strip() and len(line) + len(piece) > width:
                lines.append(line.rstrip())
                line = "  "
            line += piece
        lines.append(line.rstrip())
    return lines


def _render_config(infos: Sequence[SettingInfo], rows: Sequence[dict], identity: dict) -> str:
    """The settings under their groups' titles (name, value, source), then the resolved identity."""
    names = [info.name for info in infos] + list(identity)
    name_width = max(len(name) for name in names)
    values = {row["setting"]: _config_text(row["value"]) for row in rows}
    value_width = min(_CONFIG_VALUE_WIDTH, max(len(value) for value in values.values()))
    out: list[str] = []
    group = None
    for info, row in zip(infos, rows):
        if info.group != group:
            group = info.group
            out.extend(([""] if out else []) + [group])
        source = f"env {info.env}" if row["source"] == "environment" else "default"
        lines = _wrap_value(values[info.name], value_width)
        out.append(f"  {info.name:<{name_width}}  {lines[0]:<{value_width}}  {source}")
        out.extend(f"  {'':<{name_width}}  {line}" for line in lines[1:])
    out.extend(["", "Resolved identity"])
    for key, value in identity.items():
        out.append(f"  {key:<{name_width}}  {'unset' if value in (None, '') else _config_text(value)}")
    return "\n".join(out) + "\n"


#: Default port of ``trainhealth export``: just below the per-rank ports (9450 + local rank).
NODE_EXPORTER_PORT = 9449

#: ``trainhealth export`` options that are settings (dest -> setting name).
_EXPORT_SETTINGS = {
    "backend": "gpu_backend",
    "gpus": "gpus",
    "interval": "gpu_sample_interval",
    "addr": "prometheus_addr",
    "port": "prometheus_port",
    "simulated_gpus": "simulated_gpus",
    "dcgm": "dcgm",
    "dcgm_host": "dcgm_host",
    "tls_certfile": "tls_certfile",
    "tls_keyfile": "tls_keyfile",
    "tls_client_cafile": "tls_client_cafile",
    "basic_auth_username": "basic_auth_username",
    "basic_auth_password_file": "basic_auth_password_file",
}
#: The ranges of ``trainhealth export``'s numbers (the settings' own ranges: gpu_sample_interval, simulated_gpus).
EXPORT_INTERVAL = Bounded(float, 0.01, 86400, unit="seconds")
EXPORT_SIMULATED_GPUS = Bounded(int, 1, 256)
EXPORT_DURATION = Bounded(float, 0, 365 * 86400, unit="seconds")


def _cmd_export(args: argparse.Namespace) -> int:
    from trainhealth._internal.events import EventLog
    from trainhealth._internal.exporters.gpu.telemetry import GpuTelemetry
    from trainhealth._internal.sinks.service import Sinks
    from trainhealth._internal.store import MetricStore

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    try:
        settings = Settings.resolve(**{setting: getattr(args, dest) for dest, setting in _EXPORT_SETTINGS.items()})
        if settings.prometheus.port is None:
            settings = settings.replace(prometheus_port=NODE_EXPORTER_PORT)
        if settings.gpu.backend == "off":
            raise UsageError("gpu_backend is off: trainhealth export has nothing to serve")
        identity = Identity.node(settings=settings)
        store = MetricStore(settings.store.max_series_per_metric)
        sinks = Sinks.start(store, identity, settings)
    except ConfigError as exc:
        raise _export_error(args, exc) from None
    stop = threading.Event()
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, lambda *_: stop.set())
    try:
        telemetry = GpuTelemetry.start(store, EventLog(), settings, identity, role="node")
    except BaseException:
        sinks.close()
        raise
    try:
        where = sinks.metrics_url or "nowhere (TRAINHEALTH_PROMETHEUS=false; OTLP only)"
        count = len(telemetry.sampler.gpus) if telemetry else 0
        print(f"trainhealth export: {count} GPU(s) through {settings.gpu.backend}, metrics at {where}", flush=True)
        stop.wait(args.duration)
    finally:
        if telemetry is not None:
            telemetry.close()
        sinks.close()
    return 0


def _export_error(args: argparse.Namespace, exc: ConfigError) -> UsageError:
    """The setting's error, led by the option the user typed when the setting came from one."""
    options = {
        setting: "--" + dest.replace("_", "-")
        for dest, setting in _EXPORT_SETTINGS.items()
        if getattr(args, dest) is not None
    }
    option = options.get(exc.setting)
    return UsageError(f"{option}: {exc}" if option else str(exc))


def _cmd_trace_info(args: argparse.Namespace) -> int:
    from trainhealth._internal.traces.convert import load_any
    from trainhealth._internal.traces.summary import summarize

    trace, notes = load_any(args.traces, args.input_format, args.topology)
    summary = summarize(trace.records)
    if args.json:
        print(json.dumps({"files": list(trace.sources), **summary.to_dict(), "notes": notes}, indent=2, sort_keys=True))
    else:
        print(f"files    {len(trace.sources)}")
        print(summary.render())
        for note in notes:
            print(f"note: {note}")
    return 0


def _cmd_trace_convert(args: argparse.Namespace) -> int:
    from trainhealth._internal.traces.convert import load_any, outputs_of, save
    from trainhealth._internal.traces.io import is_trace_file

    output = Path(args.output)
    if is_trace_file(output):
        check_output_file(output, "-o")
    else:
        check_output_directory(output, "-o")
    trace, notes = load_any(args.inputs, args.input_format, args.topology)
    inputs = [*trace.sources, *([args.topology] if args.topology else [])]
    for target in outputs_of(output):
        if any(same_file(target, Path(source)) for source in inputs):
            raise UsageError(f"-o {args.output}: would overwrite the input {target}")
    written = save(trace, output)
    for note in notes:
        print(f"note: {note}", file=sys.stderr)
    print(
        f"wrote {len(trace.records)} records from {len(trace.sources)} file(s) to "
        f"{', '.join(str(path) for path in written)}"
    )
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="trainhealth", description="Observability for large-model training.")
    parser.add_argument("--version", action="version", version=f"trainhealth {__version__}")
    commands = parser.add_subparsers(
        dest="command",
        metavar="COMMAND",
        parser_class=_Parser,
        help="the command to run (trainhealth COMMAND --help describes it)",
    )

    metrics = commands.add_parser("metrics", help="print the metric catalogue")
    metrics_format = metrics.add_mutually_exclusive_group()
    metrics_format.add_argument("--json", action="store_true", help="as JSON")
    metrics_format.add_argument("--markdown", action="store_true", help="as docs/metrics.md")
    metrics.set_defaults(handler=_cmd_metrics)

    config = commands.add_parser(
        "config",
        help="show the resolved settings and identity of this environment",
        description="List every setting under its group: its value here (unset when it has none; secrets "
        "<hidden>) and where it came from (default, or the TRAINHEALTH_* variable that set it), then "
        "the identity this process would report (job, host, rank, ...).",
    )
    config_format = config.add_mutually_exclusive_group()
    config_format.add_argument("--json", action="store_true", help="as JSON")
    config_format.add_argument("--markdown", action="store_true", help="document every setting (docs/configuration.md)")
    config.set_defaults(handler=_cmd_config)

    export = commands.add_parser(
        "export",
        help="serve this node's GPU metrics (NVML, XIDs, DCGM), like dcgm-exporter",
        description="Serve the GPU metrics of this node until stopped. Options override TRAINHEALTH_* variables.",
    )
    export.add_argument("--backend", choices=("nvml", "simulated"), help="GPU backend (default nvml)")
    export.add_argument("--gpus", help="all (default), or NVML indices like 0,2")
    export.add_argument(
        "--interval",
        type=EXPORT_INTERVAL,
        metavar="SECONDS",
        help=f"seconds between sampling passes, {EXPORT_INTERVAL.range_text} (default 5)",
    )
    export.add_argument("--addr", help="address to bind (default 0.0.0.0)")
    export.add_argument(
        "--port", type=PORT_OR_ZERO, help=f"port to serve on (default {NODE_EXPORTER_PORT}; 0 picks one)"
    )
    export.add_argument(
        "--simulated-gpus",
        type=EXPORT_SIMULATED_GPUS,
        metavar="N",
        help=f"GPUs of the simulated backend, {EXPORT_SIMULATED_GPUS.range_text} (default 8)",
    )
    export.add_argument(
        "--dcgm",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="read DCGM profiling fields (default: when DCGM is present)",
    )
    export.add_argument("--dcgm-host", help="nv-hostengine address (default localhost)")
    export.add_argument("--tls-certfile", help="serve HTTPS with this certificate")
    export.add_argument("--tls-keyfile", help="private key of --tls-certfile")
    export.add_argument("--tls-client-cafile", help="require client certificates signed by this CA")
    export.add_argument("--basic-auth-username", help="require HTTP basic auth with this user")
    export.add_argument("--basic-auth-password-file", help="file holding the basic-auth password")
    export.add_argument(
        "--duration",
        type=EXPORT_DURATION,
        metavar="SECONDS",
        help=f"stop after this long, {EXPORT_DURATION.range_text} (default: run until stopped)",
    )
    export.set_defaults(handler=_cmd_export)
    add_detection_commands(commands, _Parser)

    trace = commands.add_parser("trace", help="inspect and convert collective traces (trace format v1)")
    trace_commands = trace.add_subparsers(
        dest="trace_command", metavar="COMMAND", parser_class=_Parser, required=True, help="what to do with the traces"
    )
    kinds = ("auto", "v1", "flight-recorder", "straggler-analysis")
    info = trace_commands.add_parser("info", help="ranks, groups, steps, ops, time span and per-op durations")
    info.add_argument("traces", nargs="+", metavar="TRACE", help="trace files or directories")
    info.add_argument(
        "--from", dest="input_format", choices=kinds, default="auto", help="input format (default: detect)"
    )
    info.add_argument("--topology", help="topology sidecar (default: topology.json in a trace directory)")
    info.add_argument("--json", action="store_true", help="as JSON")
    info.set_defaults(handler=_cmd_trace_info)
    convert = trace_commands.add_parser(
        "convert",
        help="convert traces (v1, Flight Recorder dumps, StragglerAnalysis parquet) to trace format v1",
        description="Write the inputs as one trace: OUT with a trace extension (.parquet, .jsonl[.gz], .csv[.gz]) "
        "is one file; any other OUT is a directory receiving trace.parquet and topology.json.",
    )
    convert.add_argument("inputs", nargs="+", metavar="IN", help="input files or directories")
    convert.add_argument("-o", "--output", required=True, metavar="OUT", help="output file or directory")
    convert.add_argument(
        "--from", dest="input_format", choices=kinds, default="auto", help="input format (default: detect)"
    )
    convert.add_argument("--topology", help="topology sidecar for v1 inputs")
    convert.set_defaults(handler=_cmd_trace_convert)
    add_localization_commands(commands, _Parser)
    add_selftest_commands(commands, _Parser)
    add_alerting_commands(commands, _Parser)
    add_demo_commands(commands, _Parser)
    add_stack_commands(commands, _Parser)
    add_probe_commands(commands, _Parser)
    return parser


#: The extra each command needs beyond the core install (see trainhealth._internal._extras).
COMMAND_EXTRAS = {
    "detect": "analysis",
    "trace": "analysis",
    "localize": "analysis",
    "sim": "analysis",
    "analyze": "analysis",
    "alerts": "dashboards",
    "dashboards": "dashboards",
    "stack": "demo",
    "demo": "demo",
}


def _command_of(argv: Sequence[str] | None) -> str:
    words = [word for word in (sys.argv[1:] if argv is None else argv) if not word.startswith("-")]
    return words[0] if words else ""


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
        if args.command is None:
            parser.print_help(sys.stderr)
            return USAGE_ERROR
        return int(args.handler(args))
    except (UsageError, ConfigError, TraceError) as exc:
        print(f"trainhealth: error: {exc}", file=sys.stderr)
        return USAGE_ERROR
    except ModuleNotFoundError as exc:  # an optional feature whose extra is not installed: one line, not a traceback
        command = _command_of(argv)
        problem = missing_extra(exc, f"trainhealth {command}", COMMAND_EXTRAS.get(command))
        if problem is None:
            raise
        print(f"trainhealth: error: {problem}", file=sys.stderr)
        return USAGE_ERROR
    except BrokenPipeError:  # output piped into head or similar
        sys.stderr.close()
        return 0
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
