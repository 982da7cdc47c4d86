"""``trainhealth localize``, ``trainhealth sim`` and ``trainhealth analyze``.

Handlers raise :class:`trainhealth._internal.errors.UsageError` (or ``TraceError``) for bad
input; the ``trainhealth`` entry point prints it in one line and exits 2.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import signal
import sys
import threading
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple
from urllib.parse import urlparse

from trainhealth._internal._files import check_output_directory
from trainhealth._internal._memory import release_freed_memory
from trainhealth._internal.cli.numbers import PORT_OR_ZERO, Bounded
from trainhealth._internal.errors import UsageError

if TYPE_CHECKING:
    from trainhealth._internal.exporters.collectives.probe import ProbeResult
    from trainhealth._internal.localize.localizer import Thresholds
    from trainhealth._internal.localize.result import LocalizationResult

__all__ = ["add_commands"]

#: Default port of ``trainhealth analyze``: below the node exporter (9449) and the ranks (9450+).
ANALYZER_PORT = 9448
#: Prometheus answers a range query with at most this many points per series.
MAX_POINTS = 11000
#: Stack files of failed collectives read beside Flight Recorder dumps, at most (the watcher writes one per rank).
MAX_FAILURE_FILES = 32

_INTERVAL = Bounded(float, 0.1, 86400, unit="seconds")  # a run reads a window: a tenth of a second at the least
_WINDOW = Bounded(float, 0, 7 * 86400, unit="seconds", low_open=True)
_REFERENCE = Bounded(float, 0, 30 * 86400, unit="seconds")
_STEP = Bounded(float, 0.001, 86400, unit="seconds")  # Prometheus resolves milliseconds
_LAST = Bounded(int, 1, 1_000_000, unit="steps")
_DURATION = Bounded(float, 0, 7 * 86400, unit="seconds", low_open=True)
_TIMEOUT = Bounded(float, 0.1, 600, unit="seconds")
#: localize's and analyze's z thresholds
_Z = Bounded(float, 0, 1000, low_open=True)
#: ``trainhealth sim``: GPUs, and GPU micro-batches in all (world x steps x micro-batches), at most
_MAX_WORLD = 65536
_MAX_WORK = 65536 * 20 * 16
_SIZE = Bounded(int, 1, _MAX_WORLD)
_STEPS = Bounded(int, 1, 100_000, unit="steps")
_MICROBATCHES = Bounded(int, 1, 1024)
_SEED = Bounded(int, 0, 2**63 - 1)
_GPUS_PER_HOST = Bounded(int, 1, 1024)
_HOSTS_PER_LEAF = Bounded(int, 1, 65536)
#: trace columns the localizer never reads: left unread in Parquet traces (about 190 MB at 16,384 GPUs)
_UNUSED = frozenset({"gpu", "peer"})


def _thresholds(args: argparse.Namespace) -> Thresholds:
    from trainhealth._internal.localize.localizer import Thresholds

    given = {
        name: getattr(args, name)
        for name in ("gpu_z", "collectives_z", "link_z", "straggler_z", "path_z")
        if getattr(args, name, None) is not None
    }
    try:
        return Thresholds(**given)
    except ValueError as exc:
        raise UsageError(str(exc)) from None


def _cmd_localize(args: argparse.Namespace) -> int:
    from trainhealth._internal.localize.history import live_steps, usual_before
    from trainhealth._internal.localize.localizer import localize
    from trainhealth._internal.traces.convert import load_any

    thresholds = _thresholds(args)
    trace, notes = load_any(args.traces, args.input_format, args.topology, categorical=True, unread=_UNUSED)
    release_freed_memory()  # what decoding the trace freed
    records = trace.records
    usual = None
    if args.last is not None:
        steps = live_steps(records["step"].to_numpy(), args.last, args.history or 0)
        records = records[records["step"].isin(steps)].reset_index(drop=True)
        usual = usual_before(steps, args.last, args.history or 0)
    judge_last = args.last if args.last is not None and args.history and args.history > args.last else None
    result = _flight_recorder_hang(records, trace)
    if result is None:
        result = localize(records, trace.topology, thresholds, _probe(args), judge_last, usual)
    if args.json:
        print(json.dumps(result.to_dict(), indent=2, sort_keys=True))
    else:
        print(result.render())
    for note in notes:
        print(f"note: {note}", file=sys.stderr)
    return 0


def _flight_recorder_hang(records: Any, trace: Any) -> LocalizationResult | None:
    """Flight Recorder dumps of a job that hung: the ``hang`` verdict from every rank's last collectives (who
    never entered the one the others wait in, or entered another); None for dumps of a job that did not."""
    if "state" not in records.columns or records.empty:
        return None
    from trainhealth._internal.localize.hangs import hang_result, judge_hangs, positions_from_records

    files = [Path(source) for source in trace.sources]
    dumped_at = max((p.stat().st_mtime for p in files if p.is_file()), default=0.0)
    positions = positions_from_records(records, trace.topology.groups, dumped_at)
    report = judge_hangs(positions, min_wait_s=0.0)
    if not report.hangs:
        return None
    result = hang_result(report)
    failed = _failures_beside({p.parent for p in files})
    if failed:  # the dumps were written as the collective failed: the errors say how the job ended
        result.details["reasons"] = failed + list(result.details.get("reasons", []))
    return result


def _failures_beside(directories: set[Path]) -> list[str]:
    """The first line of each ``stacks/*.failed.txt`` the hang watchers wrote beside these Flight Recorder
    dumps (``<trace_dir>/flight-recorder``): each rank's failed collective and its error; at most
    :data:`MAX_FAILURE_FILES` of them, and a line counting the files left unread."""
    lines: list[str] = []
    unread = 0
    for directory in sorted(directories):
        for path in sorted((directory.parent / "stacks").glob("*.failed.txt")):
            if len(lines) >= MAX_FAILURE_FILES:
                unread += 1
                continue
            if not path.is_file():  # a pipe would block the reader
                continue
            try:
                with open(path, encoding="utf-8", errors="replace") as handle:
                    first = handle.readline(1000).strip()
            except OSError:
                continue
            lines.append(first.split(". This is typically")[0][:300])  # gloo's advice is in every one of them
    if unread:
        lines.append(f"and {unread} more stacks/*.failed.txt files, not read (at most {MAX_FAILURE_FILES} are)")
    return lines


def _probe(args: argparse.Namespace) -> ProbeResult | None:
    """The link probe given with --probe, else probe.json in a trace directory, else None."""
    from trainhealth._internal.localize.sources import PROBE_FILE, load_probe

    if args.probe is not None:
        path = Path(args.probe)
        if not path.is_file():
            raise UsageError(
                f"--probe {args.probe}: no such file"
                if not path.exists()
                else f"--probe {args.probe}: not a regular file"
            )
        try:
            probe, problem = load_probe(path)
        except RecursionError:
            raise UsageError(f"--probe {args.probe}: not a link probe result (JSON nested too deeply)") from None
        if problem:
            raise UsageError(f"--probe {problem.removeprefix('ignored ')}")
        return probe
    for trace in args.traces:
        if Path(trace).is_dir():
            try:
                probe, problem = load_probe(Path(trace) / PROBE_FILE)
            except RecursionError:
                probe, problem = None, f"ignored {Path(trace) / PROBE_FILE}: JSON nested too deeply"
            if problem:
                print(f"note: {problem}", file=sys.stderr)
            if probe is not None:
                return probe
    return None


class _FaultOption(NamedTuple):
    """One ``--fault kind:index:severity[:start[:end]]`` (``end`` exclusive), before the layout is known."""

    text: str
    kind: str
    target: int  # a rank, host or leaf switch
    severity: float
    start: int
    end: int | None


def _parse_fault(text: str) -> _FaultOption:
    """``kind:target:severity[:start[:end]]``, e.g. ``gpu:5:1.5`` or ``nic:9:2:4:8``."""
    from trainhealth._internal.simulator.scenario import CLUSTER_FAULTS

    parts = text.split(":")
    kinds = ", ".join(CLUSTER_FAULTS)
    if not 3 <= len(parts) <= 5:
        raise UsageError(f"--fault {text[:60]!r}: expected kind:target:severity[:start[:end]] with kind one of {kinds}")
    if parts[0] not in CLUSTER_FAULTS:
        raise UsageError(f"--fault {text!r}: unknown kind {parts[0]!r}; expected one of {kinds}")
    try:
        target, severity, steps = int(parts[1]), float(parts[2]), [int(p) for p in parts[3:]]
        if not math.isfinite(severity) or not 1.0 < severity <= 10.0:
            raise ValueError("severity must be above 1 up to 10")
        if target < 0 or target > _MAX_WORLD:
            raise ValueError(f"target {target} is outside the cluster")
        if any(not 0 <= step <= _STEPS.high for step in steps):
            raise ValueError(f"start and end must be steps from 0 to {_STEPS.high:g}")
        if len(steps) == 2 and steps[1] <= steps[0]:
            raise ValueError(f"the fault ends (step {steps[1]}) before it starts (step {steps[0]})")
    except ValueError as exc:
        raise UsageError(f"--fault {text!r}: {exc}") from None
    return _FaultOption(
        text, parts[0], target, severity, steps[0] if steps else 0, steps[1] if len(steps) == 2 else None
    )


def _cmd_sim(args: argparse.Namespace) -> int:
    from trainhealth._internal.simulator.cluster import ClusterLayout
    from trainhealth._internal.simulator.scenario import Control, Scenario, cluster_fault
    from trainhealth._internal.simulator.simulate import simulate

    output = Path(args.output)
    check_output_directory(output, "-o")
    options = tuple(_parse_fault(text) for text in args.fault or ())
    world = args.dp * args.pp * args.tp * args.cp
    if world > _MAX_WORLD:
        raise UsageError(f"sim: {world} GPUs (--dp x --pp x --tp x --cp): the simulator goes up to {_MAX_WORLD}")
    if world * args.steps * args.microbatches > _MAX_WORK:
        raise UsageError(
            f"sim: {world} GPUs x {args.steps} --steps x {args.microbatches} --microbatches is more "
            f"than the simulator runs ({_MAX_WORK} GPU micro-batches; fewer steps or GPUs)"
        )
    for option in options:
        if option.start >= args.steps:
            raise UsageError(
                f"--fault {option.kind}:{option.target}: starts at step {option.start}, after "
                f"the last of {args.steps} --steps"
            )
    try:
        layout = ClusterLayout(
            dp=args.dp,
            pp=args.pp,
            tp=args.tp,
            cp=args.cp,
            ep=args.ep,
            gpus_per_host=args.gpus_per_host,
            hosts_per_leaf=args.hosts_per_leaf,
        )
    except ValueError as exc:
        raise UsageError(f"sim: {exc}") from None
    faults = []
    for option in options:
        until = None if option.end is None else option.end - 1
        try:
            faults.append(cluster_fault(layout, option.kind, option.target, option.severity, option.start, until))
        except ValueError as exc:
            raise UsageError(f"--fault {option.text!r}: {exc}") from None
    try:
        scenario = Scenario(
            layout,
            steps=args.steps,
            microbatches=args.microbatches,
            seed=args.seed,
            faults=tuple(faults),
            control=Control(args.control),
        )
    except ValueError as exc:
        raise UsageError(f"sim: {exc}") from None
    trace = simulate(scenario)
    written = trace.write(output)
    print(
        f"SIMULATED trace: {layout.world} GPUs ({', '.join(f'{k}={v}' for k, v in layout.parallelism().items())}), "
        f"{args.steps} steps, {len(trace.records)} records, verdict to find: {trace.ground_truth['verdict']}"
    )
    for path in written:
        print(f"  wrote {path}")
    return 0


def _cmd_analyze(args: argparse.Namespace) -> int:
    from trainhealth._internal.config import Settings
    from trainhealth._internal.identity import Identity
    from trainhealth._internal.localize.analyzer import Analyzer
    from trainhealth._internal.localize.sources import (
        PrometheusClient,
        PrometheusSource,
        SourceError,
        TraceDirectory,
    )
    from trainhealth._internal.sinks.service import Sinks
    from trainhealth._internal.store import MetricStore

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    source: PrometheusSource | TraceDirectory
    if args.prometheus is not None:  # "" too: a URL that is not one is refused, not read as --traces
        url = urlparse(args.prometheus)
        if url.scheme not in ("http", "https") or not url.netloc:
            raise UsageError(
                f"--prometheus {args.prometheus!r}: expected an http or https URL such as http://127.0.0.1:9090"
            )
        if args.window < 2 * args.step or args.window / args.step > MAX_POINTS - 1:
            raise UsageError(
                f"--window must be from 2 to {MAX_POINTS - 1} --step intervals (Prometheus answers "
                f"at most {MAX_POINTS} points per series), got {args.window:g}s in {args.step:g}s steps"
            )
        client = PrometheusClient(
            args.prometheus,
            timeout=args.prometheus_timeout,
            ca_file=args.prometheus_ca_file,
            bearer_token_file=args.prometheus_bearer_token_file,
            basic_auth_username=args.prometheus_basic_auth_username,
            basic_auth_password_file=args.prometheus_basic_auth_password_file,
        )
        history = args.history * args.step  # the same number of steps as from traces, in --step intervals
        if history / args.step > MAX_POINTS - 1:
            raise UsageError(
                f"--history must be at most {MAX_POINTS - 1} --step intervals with --prometheus (Prometheus answers "
                f"at most {MAX_POINTS} points per series), got {args.history}"
            )
        source = PrometheusSource(
            client,
            job=args.job,
            window=args.window,
            step=args.step,
            job_name=args.job_name,
            history=history,
            reference=args.reference,
        )
    else:
        if args.job_name is not None:
            raise UsageError("--job-name selects jobs in Prometheus: trace files name none (use --prometheus)")
        source = TraceDirectory(Path(args.traces), args.last, args.history)
    analyzer_settings = {
        "addr": "prometheus_addr",
        "port": "prometheus_port",
        "tls_certfile": "tls_certfile",
        "tls_keyfile": "tls_keyfile",
        "tls_client_cafile": "tls_client_cafile",
        "basic_auth_username": "basic_auth_username",
        "basic_auth_password_file": "basic_auth_password_file",
        "job": "run_id",  # the analyzer's own series (when it ran, whether stale) carry the job it reads
    }
    settings = Settings.resolve(**{setting: getattr(args, dest) for dest, setting in analyzer_settings.items()})
    if settings.prometheus.port is None:
        settings = settings.replace(prometheus_port=ANALYZER_PORT)
    store = MetricStore(settings.store.max_series_per_metric)
    identity = Identity.node(settings=settings)
    analyzer = Analyzer(source, store, _thresholds(args), job=identity.job)
    if args.once:
        try:
            run = analyzer.run_once(strict=True)
        except SourceError as exc:
            raise UsageError(str(exc)) from None
        if run is None:  # strict: a failed run raises
            raise UsageError(f"{source.describe()}: no result")
        print(json.dumps(run.to_dict(), indent=2, sort_keys=True) if args.json else run.render())
        return 0
    stop = threading.Event()
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, lambda *_: stop.set())
    sinks = Sinks.start(store, identity, settings)
    # a daemon timer, cancelled on the way out: a signal before --duration ends the process now, not then
    deadline = threading.Timer(args.duration if args.duration is not None else 0.0, stop.set)
    deadline.daemon = True
    try:
        print(
            f"trainhealth analyze: {source.describe()} every {args.interval:g}s, suspects at "
            f"{sinks.metrics_url or 'nowhere (TRAINHEALTH_PROMETHEUS=false)'}",
            flush=True,
        )
        if args.duration is not None:
            deadline.start()
        analyzer.run(args.interval, stop)
    finally:
        deadline.cancel()
        sinks.close()
    return 0


def _add_thresholds(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--gpu-z",
        type=_Z,
        default=None,
        metavar="Z",
        help=f"z-score of compute evidence that blames a GPU, {_Z.range_text} (default: the benchmarked threshold)",
    )
    parser.add_argument(
        "--collectives-z",
        type=_Z,
        default=None,
        metavar="Z",
        help="the same when compute is derived from collectives alone (no compute records)",
    )
    parser.add_argument(
        "--link-z",
        type=_Z,
        default=None,
        metavar="Z",
        help="z-score that blames a NIC, host or switch (default: the benchmarked threshold)",
    )
    parser.add_argument(
        "--straggler-z",
        type=_Z,
        default=None,
        metavar="Z",
        help="traces with step markers: z-value of a rank's busy time over its peers', against the "
        "run's own noise, that blames its GPU (default 6, chosen on the real-run lab)",
    )
    parser.add_argument(
        "--path-z",
        type=_Z,
        default=None,
        metavar="Z",
        help="traces with step markers: z-value of a communicator's slower transfers that blames its path (default 6)",
    )


def add_commands(commands: argparse._SubParsersAction, parser_class: type[argparse.ArgumentParser]) -> None:
    """Register the three subcommands on the ``trainhealth`` parser."""
    kinds = ("auto", "v1", "flight-recorder", "straggler-analysis")
    localize = commands.add_parser(
        "localize",
        help="find the GPU, link or imbalance behind irregular steps in collective traces",
        description="Localize the root cause of iteration-time irregularities from collective timings (Holmes's "
        "rules). Prints the verdict, ranked suspects and advice; --json prints the localization "
        "result of docs/trace-format.md.",
    )
    localize.add_argument("traces", nargs="+", metavar="TRACE", help="trace files or directories")
    localize.add_argument("--topology", help="topology sidecar (default: topology.json in a trace directory)")
    localize.add_argument(
        "--from", dest="input_format", choices=kinds, default="auto", help="input format (default: detect)"
    )
    localize.add_argument(
        "--last", type=_LAST, metavar="STEPS", help=f"only the last STEPS steps, {_LAST.range_text} (default: all)"
    )
    localize.add_argument(
        "--history",
        type=_LAST,
        metavar="STEPS",
        help="with --last: judge the last STEPS steps against this many steps of the run before "
        "their end and the run's first steps (each rank's usual level, how far healthy members go, "
        "recurrence); default: the window alone",
    )
    localize.add_argument("--json", action="store_true", help="the localization result as JSON")
    localize.add_argument(
        "--probe",
        metavar="FILE",
        help="a link probe result (trainhealth probe --out) that names the slow link where "
        "timings alone cannot (default: probe.json in a trace directory)",
    )
    _add_thresholds(localize)
    localize.set_defaults(handler=_cmd_localize)

    sim = commands.add_parser(
        "sim",
        help="simulate a cluster's collective traces, with injected faults and ground truth",
        description="Write trace.parquet, topology.json and ground_truth.json (all marked simulated) for a "
        "DP x PP x TP (x CP x EP) job on a 1F1B schedule. --fault is kind:target:severity[:start[:end]] "
        "with kind gpu, nic (a rank's NIC), host (every NIC of a host) or switch (a leaf switch).",
    )
    for name, default in (("dp", 4), ("pp", 2), ("tp", 8), ("cp", 1), ("ep", 1)):
        sim.add_argument(
            f"--{name}", type=_SIZE, default=default, help=f"{name} size, {_SIZE.range_text} (default {default})"
        )
    sim.add_argument("--steps", type=_STEPS, default=20, help=f"training steps, {_STEPS.range_text} (default 20)")
    sim.add_argument(
        "--microbatches",
        type=_MICROBATCHES,
        default=4,
        help=f"micro-batches per step, {_MICROBATCHES.range_text} (default 4)",
    )
    sim.add_argument("--seed", type=_SEED, default=0, help=f"random seed, {_SEED.range_text} (default 0)")
    sim.add_argument("--fault", action="append", metavar="SPEC", help="inject a fault (repeatable)")
    sim.add_argument(
        "--control",
        default="none",
        choices=("none", "stage_imbalance", "seqlen_imbalance"),
        help="a negative control: uneven work and no fault (default none)",
    )
    sim.add_argument(
        "--gpus-per-host",
        type=_GPUS_PER_HOST,
        default=8,
        help=f"GPUs per host, {_GPUS_PER_HOST.range_text} (default 8)",
    )
    sim.add_argument(
        "--hosts-per-leaf",
        type=_HOSTS_PER_LEAF,
        default=16,
        help=f"hosts per leaf switch, {_HOSTS_PER_LEAF.range_text} (default 16)",
    )
    sim.add_argument("-o", "--output", required=True, metavar="DIR", help="directory to write")
    sim.set_defaults(handler=_cmd_sim)

    analyze = commands.add_parser(
        "analyze",
        help="localize periodically from Prometheus or trace files and serve the suspects as metrics",
        description="Every --interval seconds read a window (per-rank collective and step metrics from "
        "Prometheus's HTTP API, or the trace files ranks write into a directory), localize it and "
        "serve trainhealth_suspect_score and trainhealth_analysis_verdict. Every job Prometheus holds is judged on "
        "its own (the job label, each run's own id), and every verdict and suspect names its job. A failed run "
        "(a bad answer, no input yet) is logged in one line and counted; the last verdict stays served, marked "
        "trainhealth_analysis_stale. Stateless: restart it any time.",
    )
    source = analyze.add_mutually_exclusive_group(required=True)
    source.add_argument("--prometheus", metavar="URL", help="Prometheus base URL, e.g. http://127.0.0.1:9090")
    source.add_argument("--traces", metavar="DIR", help="directory the ranks write trace files into")
    analyze.add_argument(
        "--job",
        help="only this job: its job label, the run's own id, matched exactly (default: every job Prometheus "
        "has, each judged on its own)",
    )
    analyze.add_argument(
        "--job-name",
        metavar="NAME",
        help="Prometheus: only the runs of this logical name (the job_name label of trainhealth_rank_info, "
        "TRAINHEALTH_JOB), each judged on its own",
    )
    analyze.add_argument(
        "--window",
        type=_WINDOW,
        default=600.0,
        metavar="SECONDS",
        help=f"Prometheus: seconds of history per run, {_WINDOW.range_text} (default 600)",
    )
    analyze.add_argument(
        "--step",
        type=_STEP,
        default=30.0,
        metavar="SECONDS",
        help=f"Prometheus: seconds per interval, at least two scrape intervals, {_STEP.range_text} (default 30)",
    )
    analyze.add_argument(
        "--last",
        type=_LAST,
        default=20,
        metavar="STEPS",
        help=f"traces: steps per run, {_LAST.range_text} (default 20)",
    )
    analyze.add_argument(
        "--history",
        type=_LAST,
        default=200,
        metavar="STEPS",
        help="judge the last --last steps (Prometheus: the --window) against this many steps (Prometheus: "
        "--step intervals) of the run before their end, so that excursions healthy ranks and links of this "
        f"run show too, and single transient ones, page nobody, {_LAST.range_text} (default 200)",
    )
    analyze.add_argument(
        "--reference",
        type=_REFERENCE,
        default=86400.0,
        metavar="SECONDS",
        help="Prometheus: also read each rank's usual level over this many seconds before the history, in "
        "20 coarse intervals, so that a fault older than the history is still named (traces: the run's "
        f"first steps are read); 0 reads none, {_REFERENCE.range_text} (default 86400)",
    )
    analyze.add_argument(
        "--interval",
        type=_INTERVAL,
        default=30.0,
        metavar="SECONDS",
        help=f"seconds between runs, {_INTERVAL.range_text}; after a failed run twice as long (default 30)",
    )
    analyze.add_argument(
        "--once", action="store_true", help="run once, print each job's result and exit (serves nothing)"
    )
    analyze.add_argument(
        "--json",
        action="store_true",
        help='with --once: print {"jobs": [...]}, a localization result per job, the most urgent first',
    )
    analyze.add_argument(
        "--duration",
        type=_DURATION,
        metavar="SECONDS",
        help=f"stop after this long, {_DURATION.range_text} (default: until stopped)",
    )
    analyze.add_argument(
        "--prometheus-timeout",
        type=_TIMEOUT,
        default=10.0,
        metavar="SECONDS",
        help=f"the longest Prometheus may take to answer a query, {_TIMEOUT.range_text} "
        "(default 10); a slower answer is a failed run",
    )
    analyze.add_argument("--prometheus-ca-file", help="CA bundle to verify an https Prometheus")
    analyze.add_argument("--prometheus-bearer-token-file", help="file holding a bearer token for Prometheus")
    analyze.add_argument("--prometheus-basic-auth-username", help="basic-auth user for Prometheus")
    analyze.add_argument("--prometheus-basic-auth-password-file", help="file holding that user's password")
    analyze.add_argument("--addr", help="address to serve on (default 0.0.0.0)")
    analyze.add_argument("--port", type=PORT_OR_ZERO, help=f"port to serve on (default {ANALYZER_PORT}; 0 picks one)")
    analyze.add_argument("--tls-certfile", help="serve HTTPS with this certificate")
    analyze.add_argument("--tls-keyfile", help="private key of --tls-certfile")
    analyze.add_argument("--tls-client-cafile", help="require client certificates signed by this CA")
    analyze.add_argument("--basic-auth-username", help="require HTTP basic auth with this user")
    analyze.add_argument("--basic-auth-password-file", help="file holding the basic-auth password")
    _add_thresholds(analyze)
    analyze.set_defaults(handler=_cmd_analyze)
