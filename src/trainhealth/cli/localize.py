"""``trainhealth localize``, ``trainhealth sim`` and ``trainhealth analyze``.

Handlers raise :class:`trainhealth.errors.UsageError` (or ``TraceError``) for bad
input; the ``trainhealth`` entry point prints it in one line and exits 2.
"""

from __future__ import annotations

import argparse
import json
import logging
import signal
import sys
import threading
from pathlib import Path
from typing import TYPE_CHECKING

from trainhealth.errors import UsageError

if TYPE_CHECKING:
    from trainhealth.exporters.collectives.probe import ProbeResult
    from trainhealth.lab.simulator.simulate import InjectedFault
    from trainhealth.localize.localizer import Thresholds

__all__ = ["add_commands"]

#: Default port of ``trainhealth analyze``: below the node exporter (9449) and the ranks (9450+).
ANALYZER_PORT = 9448


def _thresholds(args: argparse.Namespace) -> Thresholds:
    from trainhealth.localize.localizer import Thresholds

    given = {name: getattr(args, name) for name in ("gpu_z", "collectives_z", "link_z", "straggler_z", "path_z")
             if getattr(args, name, None) is not None}
    try:
        return Thresholds(**given)
    except ValueError as exc:
        raise UsageError(str(exc)) from None


def _cmd_localize(args: argparse.Namespace) -> int:
    from trainhealth.localize.localizer import localize
    from trainhealth.traces.convert import load_any

    trace, notes = load_any(args.traces, args.input_format, args.topology)
    records = trace.records
    if args.last is not None:
        if args.last < 1:
            raise UsageError("--last must be at least 1")
        steps = sorted(records["step"].unique())[-args.last:]
        records = records[records["step"].isin(steps)].reset_index(drop=True)
    result = localize(records, trace.topology, _thresholds(args), _probe(args))
    if args.json:
        print(json.dumps(result.to_dict(), indent=2, sort_keys=True))
    else:
        print(result.render())
    for note in notes:
        print(f"note: {note}", file=sys.stderr)
    return 0


def _probe(args: argparse.Namespace) -> ProbeResult | None:
    """The link probe given with --probe, else probe.json in a trace directory, else None."""
    from trainhealth.localize.sources import PROBE_FILE, load_probe

    if args.probe is not None:
        path = Path(args.probe)
        if not path.is_file():
            raise UsageError(f"--probe {args.probe}: no such file")
        probe, problem = load_probe(path)
        if problem:
            raise UsageError(f"--probe {problem.removeprefix('ignored ')}")
        return probe
    for trace in args.traces:
        if Path(trace).is_dir():
            probe, problem = load_probe(Path(trace) / PROBE_FILE)
            if problem:
                print(f"note: {problem}", file=sys.stderr)
            if probe is not None:
                return probe
    return None


def _parse_fault(text: str) -> InjectedFault:
    """``kind:target:severity[:start[:end]]``, e.g. ``gpu:5:1.5`` or ``nic:9:2:4:8``."""
    from trainhealth.lab.simulator.simulate import ClusterFaultKind, InjectedFault

    parts = text.split(":")
    kinds = ", ".join(kind.value for kind in ClusterFaultKind)
    if not 3 <= len(parts) <= 5:
        raise UsageError(f"--fault {text!r}: expected kind:target:severity[:start[:end]] with kind one of {kinds}")
    try:
        kind = ClusterFaultKind(parts[0])
    except ValueError:
        raise UsageError(f"--fault {text!r}: unknown kind {parts[0]!r}; expected one of {kinds}") from None
    try:
        target, severity, steps = int(parts[1]), float(parts[2]), [int(p) for p in parts[3:]]
        return InjectedFault(kind, target, severity, *steps)
    except ValueError as exc:
        raise UsageError(f"--fault {text!r}: {exc}") from None


def _cmd_sim(args: argparse.Namespace) -> int:
    from trainhealth.lab.simulator.cluster import ClusterLayout
    from trainhealth.lab.simulator.simulate import Control, Scenario, simulate

    faults = tuple(_parse_fault(text) for text in args.fault or ())
    try:
        layout = ClusterLayout(dp=args.dp, pp=args.pp, tp=args.tp, cp=args.cp, ep=args.ep,
                        gpus_per_host=args.gpus_per_host, hosts_per_leaf=args.hosts_per_leaf)
        scenario = Scenario(layout, steps=args.steps, microbatches=args.microbatches, seed=args.seed, faults=faults,
                            control=Control(args.control))
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    if layout.world > 65536:
        raise UsageError(f"{layout.world} GPUs: the simulator goes up to 65536")
    trace = simulate(scenario)
    written = trace.write(args.output)
    print(f"SIMULATED trace: {layout.world} GPUs ({', '.join(f'{k}={v}' for k, v in layout.parallelism().items())}), "
          f"{args.steps} steps, {len(trace.records)} records, verdict to find: {trace.ground_truth['verdict']}")
    for path in written:
        print(f"  wrote {path}")
    return 0


def _cmd_analyze(args: argparse.Namespace) -> int:
    from trainhealth.config import Settings
    from trainhealth.sinks.service import Sinks
    from trainhealth.identity import Identity
    from trainhealth.localize.analyzer import Analyzer
    from trainhealth.localize.sources import (
        PrometheusClient,
        PrometheusSource,
        SourceError,
        TraceDirectory,
    )
    from trainhealth.store import MetricStore

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    if args.interval <= 0:
        raise UsageError("--interval must be positive")
    source: PrometheusSource | TraceDirectory
    if args.prometheus:
        if args.step <= 0 or args.window < 2 * args.step:
            raise UsageError("--step must be positive and --window at least two steps")
        client = PrometheusClient(args.prometheus, ca_file=args.prometheus_ca_file,
                                  bearer_token_file=args.prometheus_bearer_token_file,
                                  basic_auth_username=args.prometheus_basic_auth_username,
                                  basic_auth_password_file=args.prometheus_basic_auth_password_file)
        source = PrometheusSource(client, job=args.job, window=args.window, step=args.step)
    else:
        if args.last < 1:
            raise UsageError("--last must be at least 1")
        source = TraceDirectory(Path(args.traces), args.last)
    analyzer_settings = {"addr": "prometheus_addr", "port": "prometheus_port", "tls_certfile": "tls_certfile",
                         "tls_keyfile": "tls_keyfile", "tls_client_cafile": "tls_client_cafile",
                         "basic_auth_username": "basic_auth_username",
                         "basic_auth_password_file": "basic_auth_password_file", "job": "job"}
    settings = Settings.resolve(**{setting: getattr(args, dest) for dest, setting in analyzer_settings.items()})
    if settings.prometheus.port is None:
        settings = settings.replace(prometheus_port=ANALYZER_PORT)
    store = MetricStore(settings.store.max_series_per_metric)
    analyzer = Analyzer(source, store, _thresholds(args))
    if args.once:
        try:
            result = analyzer.run_once(strict=True)
        except SourceError as exc:
            raise UsageError(str(exc)) from None
        assert result is not None
        print(json.dumps(result.to_dict(), indent=2, sort_keys=True) if args.json else result.render())
        return 0
    stop = threading.Event()
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, lambda *_: stop.set())
    sinks = Sinks.start(store, Identity.node(settings=settings), settings)
    try:
        print(f"trainhealth analyze: {source.describe()} every {args.interval:g}s, suspects at "
              f"{sinks.metrics_url or 'nowhere (TRAINHEALTH_PROMETHEUS=false)'}", flush=True)
        if args.duration is not None:
            threading.Timer(args.duration, stop.set).start()
        analyzer.run(args.interval, stop)
    finally:
        sinks.close()
    return 0


def _add_thresholds(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--gpu-z", type=float, default=None, metavar="Z",
                        help="z-score of compute evidence that blames a GPU (default: the benchmarked threshold)")
    parser.add_argument("--collectives-z", type=float, default=None, metavar="Z",
                        help="the same when compute is derived from collectives alone (no compute records)")
    parser.add_argument("--link-z", type=float, default=None, metavar="Z",
                        help="z-score that blames a NIC, host or switch (default: the benchmarked threshold)")
    parser.add_argument("--straggler-z", type=float, default=None, metavar="Z",
                        help="traces with step markers: z-value of a rank's busy time over its peers', against the "
                             "run's own noise, that blames its GPU (default 6, chosen on the real-run lab)")
    parser.add_argument("--path-z", type=float, default=None, metavar="Z",
                        help="traces with step markers: z-value of a communicator's slower transfers that blames "
                             "its path (default 6)")


def add_commands(commands: argparse._SubParsersAction, parser_class: type[argparse.ArgumentParser]) -> None:
    """Register the three subcommands on the ``trainhealth`` parser."""
    kinds = ("auto", "v1", "flight-recorder", "straggler-analysis")
    localize = commands.add_parser(
        "localize", help="find the GPU, link or imbalance behind irregular steps in collective traces",
        description="Localize the root cause of iteration-time irregularities from collective timings (Holmes's "
                    "rules). Prints the verdict, ranked suspects and advice; --json prints the localization "
                    "result of docs/trace-format.md.",
    )
    localize.add_argument("traces", nargs="+", metavar="TRACE", help="trace files or directories")
    localize.add_argument("--topology", help="topology sidecar (default: topology.json in a trace directory)")
    localize.add_argument("--from", dest="input_format", choices=kinds, default="auto", help="input format (default: detect)")
    localize.add_argument("--last", type=int, metavar="STEPS", help="only the last STEPS steps (default: all)")
    localize.add_argument("--json", action="store_true", help="the localization result as JSON")
    localize.add_argument("--probe", metavar="FILE",
                          help="a link probe result (trainhealth probe --out) that names the slow link where "
                               "timings alone cannot (default: probe.json in a trace directory)")
    _add_thresholds(localize)
    localize.set_defaults(handler=_cmd_localize)

    sim = commands.add_parser(
        "sim", help="simulate a cluster's collective traces, with injected faults and ground truth",
        description="Write trace.parquet, topology.json and ground_truth.json (all marked simulated) for a "
                    "DP x PP x TP (x CP x EP) job on a 1F1B schedule. --fault is kind:target:severity[:start[:end]] "
                    "with kind gpu, nic (a rank's NIC), host (every NIC of a host) or switch (a leaf switch).",
    )
    for name, default in (("dp", 4), ("pp", 2), ("tp", 8), ("cp", 1), ("ep", 1)):
        sim.add_argument(f"--{name}", type=int, default=default, help=f"{name} size (default {default})")
    sim.add_argument("--steps", type=int, default=20, help="training steps (default 20)")
    sim.add_argument("--microbatches", type=int, default=4, help="micro-batches per step (default 4)")
    sim.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    sim.add_argument("--fault", action="append", metavar="SPEC", help="inject a fault (repeatable)")
    sim.add_argument("--control", default="none", choices=("none", "stage_imbalance", "seqlen_imbalance"),
                     help="a negative control: uneven work and no fault (default none)")
    sim.add_argument("--gpus-per-host", type=int, default=8, help="GPUs per host (default 8)")
    sim.add_argument("--hosts-per-leaf", type=int, default=16, help="hosts per leaf switch (default 16)")
    sim.add_argument("-o", "--output", required=True, metavar="DIR", help="directory to write")
    sim.set_defaults(handler=_cmd_sim)

    analyze = commands.add_parser(
        "analyze", help="localize periodically from Prometheus or trace files and serve the suspects as metrics",
        description="Every --interval seconds read a window (per-rank collective and step metrics from "
                    "Prometheus's HTTP API, or the trace files ranks write into a directory), localize it and "
                    "serve trainhealth_suspect_score and trainhealth_analysis_verdict. Stateless: restart it any time.",
    )
    source = analyze.add_mutually_exclusive_group(required=True)
    source.add_argument("--prometheus", metavar="URL", help="Prometheus base URL, e.g. http://127.0.0.1:9090")
    source.add_argument("--traces", metavar="DIR", help="directory the ranks write trace files into")
    analyze.add_argument("--job", help="only this job (the job label; default: every job Prometheus has)")
    analyze.add_argument("--window", type=float, default=600.0, metavar="SECONDS",
                         help="Prometheus: seconds of history per run (default 600)")
    analyze.add_argument("--step", type=float, default=30.0, metavar="SECONDS",
                         help="Prometheus: seconds per interval, at least two scrape intervals (default 30)")
    analyze.add_argument("--last", type=int, default=20, metavar="STEPS", help="traces: steps per run (default 20)")
    analyze.add_argument("--interval", type=float, default=30.0, metavar="SECONDS", help="seconds between runs (default 30)")
    analyze.add_argument("--once", action="store_true", help="run once, print the result and exit (serves nothing)")
    analyze.add_argument("--json", action="store_true", help="with --once: print the result as JSON")
    analyze.add_argument("--duration", type=float, metavar="SECONDS", help="stop after this long (default: until stopped)")
    analyze.add_argument("--prometheus-ca-file", help="CA bundle to verify an https Prometheus")
    analyze.add_argument("--prometheus-bearer-token-file", help="file holding a bearer token for Prometheus")
    analyze.add_argument("--prometheus-basic-auth-username", help="basic-auth user for Prometheus")
    analyze.add_argument("--prometheus-basic-auth-password-file", help="file holding that user's password")
    analyze.add_argument("--addr", help="address to serve on (default 0.0.0.0)")
    analyze.add_argument("--port", type=int, help=f"port to serve on (default {ANALYZER_PORT}; 0 picks one)")
    analyze.add_argument("--tls-certfile", help="serve HTTPS with this certificate")
    analyze.add_argument("--tls-keyfile", help="private key of --tls-certfile")
    analyze.add_argument("--tls-client-cafile", help="require client certificates signed by this CA")
    analyze.add_argument("--basic-auth-username", help="require HTTP basic auth with this user")
    analyze.add_argument("--basic-auth-password-file", help="file holding the basic-auth password")
    _add_thresholds(analyze)
    analyze.set_defaults(handler=_cmd_analyze)
