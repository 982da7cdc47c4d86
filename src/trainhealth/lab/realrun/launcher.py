"""Run one real-run case: start the ranks, inject what the launcher injects, watch live, localize, score.

The rank processes (:mod:`trainhealth.lab.realrun.worker`) apply compute faults,
data-loader stalls and the controls themselves, from ``spec.json``. The launcher
applies what lives outside a rank: a slowed link (``tc`` through
:class:`trainhealth.lab.netns.NetLab`, each rank in its own network namespace) and
CPU contention (busy processes pinned to the target rank's CPU), from the start or
switched on mid-run when the ranks' progress files reach the onset step. The onset
written to ``truth.json`` is the step at which the switch actually happened.

The ranks rewrite their traces every ``TRACE_WRITE_INTERVAL_S`` (0.25 s, a few steps).
While the job runs the launcher polls the live analyzer every ``POLL_S``
(``Analyzer(TraceDirectory(run_dir), MetricStore()).run_once()``) and records, for the
first right answer, the step the ranks had reached when that poll read the traces: the
detection delay is that step minus the onset. After the job it runs ``localize`` on the
traces and scores both, beside the naive baselines.

CPU contention pins the target rank and the busy processes to one CPU and every other
rank to the other CPU: with 2 cores, an unpinned busy process would be spread by the
scheduler over both cores and slow every rank alike (that is the ``--noise``
condition, not a fault of one rank), whereas pinning confines it to one rank, as a
noisy neighbour on one node confines it to that node's ranks.
"""

from __future__ import annotations

import inspect
import json
import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from contextlib import ExitStack
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, cast

import numpy as np

from trainhealth.lab.realrun.scoring import (
    baseline_compute,
    baseline_wait,
    score_baseline,
    score_result,
)
from trainhealth.lab.realrun.spec import LINK_KINDS, CaseSpec, RealRunFaultKind, Truth, host_name, truth

__all__ = ["CaseOutcome", "LivePoll", "link_lab_unavailable", "run_case", "score_run"]

log = logging.getLogger(__name__)

#: The busy loop of a CPU-contention or noise process.
HOG_CODE = "while True:\n    pass\n"
#: Seconds between the ranks' trace rewrites (and the collective logger's flushes) while a case runs.
TRACE_WRITE_INTERVAL_S = "0.25"
#: Seconds between polls of the live analyzer.
POLL_S = 0.4
#: Niceness of the CPU-contention processes (negative needs root; without it they run at the default):
#: two at -3 leave the target about a fifth of its CPU. The hogs and the ranks stay in the launcher's session
#: (their own process groups, not sessions): with the kernel's autogroup scheduling every session is one
#: group of equal weight, and niceness would count only inside it.
HOG_NICE = -3
#: Popen arguments that make a started process lead a process group of its own, in the launcher's session
#: (see HOG_NICE), so that :func:`_stop` can kill it with its children. ``process_group`` is Python 3.11's.
if sys.version_info >= (3, 11):
    _OWN_GROUP: dict[str, Any] = {"process_group": 0}
else:
    _OWN_GROUP: dict[str, Any] = {"preexec_fn": lambda: os.setpgid(0, 0)}
#: Niceness of the live analyzer's thread: it reads the traces on idle CPU, not on the ranks' time.
ANALYZER_NICE = 19
#: A run whose slowest rank makes no progress this long is stopped and reported (before its first step: START_S).
STALL_S, START_S = 30.0, 120.0


@dataclass(frozen=True)
class LivePoll:
    """One run of the live analyzer: when, at which step the ranks were, and its answer."""

    wall_s: float
    step: int  # the last step the furthest rank had finished when the poll read the traces
    verdict: str | None
    top: str | None
    right: bool
    error: str | None = None
    analysis_s: float = 0.0  # seconds the analyzer took


@dataclass(frozen=True)
class CaseOutcome:
    """Everything one case produced; one JSON line of the suite's results."""

    case: str
    status: str  # ok, error, skipped
    reason: str
    run_dir: str
    truth: dict[str, Any]
    wall_s: float = 0.0
    steps_done: int = 0
    median_step_s: float | None = None
    #: a compute or CPU-contention fault: the target's compute per step, faulty steps / its other steps;
    #: otherwise the job's step time, faulty steps / other steps
    measured_slowdown: float | None = None
    measured_step_slowdown: float | None = None  # the job's step time, faulty steps / other steps
    others_slowdown: float | None = None  # the other ranks' compute per step, the same steps
    localize: dict[str, Any] | None = None  # the final answer's score
    localize_probe: dict[str, Any] | None = None  # with the probe, when the localizer takes one
    baseline_compute: dict[str, Any] | None = None
    baseline_wait: dict[str, Any] | None = None
    live_detection_step: int | None = None
    live_detection_delay: int | None = None
    live_false_blame_polls: int = 0
    live_polls: tuple[LivePoll, ...] = ()
    noise: bool = False
    answer: dict[str, Any] | None = field(default=None, repr=False)

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["live_polls"] = [asdict(p) for p in self.live_polls]
        return out


def link_lab_unavailable(delay: bool = False) -> str | None:
    """Why link cases cannot run here (``None``: they can)."""
    try:
        from trainhealth.lab.netns import NetLab
    except ImportError as exc:
        return f"trainhealth.lab.netns is not importable: {exc}"
    reason = NetLab.available()
    if reason is None and delay:
        reason = NetLab.delay_supported()
    return reason


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _progress(run_dir: Path, ranks: int) -> tuple[int, int]:
    """(slowest, fastest) step finished over the ranks; -1 when a rank has not finished one."""
    steps = []
    for rank in range(ranks):
        try:
            steps.append(int(json.loads((run_dir / "progress" / f"rank-{rank}.json").read_text())["step"]))
        except (OSError, ValueError, KeyError):
            steps.append(-1)
    return min(steps), max(steps)


def _start_hogs(count: int, cpu: int | None) -> list[subprocess.Popen[bytes]]:
    hogs = []
    for _ in range(count):
        hog = subprocess.Popen([sys.executable, "-c", HOG_CODE], stdout=subprocess.DEVNULL,
                               stderr=subprocess.DEVNULL, **_OWN_GROUP)
        if cpu is not None:
            os.sched_setaffinity(hog.pid, {cpu})
        try:  # above the rank's priority: a rank that mostly sleeps would otherwise win every wake-up
            os.setpriority(os.PRIO_PROCESS, hog.pid, HOG_NICE)
        except PermissionError:
            pass
        hogs.append(hog)
    return hogs


def _stop(processes: list[subprocess.Popen[bytes]]) -> None:
    """Kill the processes this launcher started, with their children (each leads its own process group)."""
    for process in processes:
        if process.poll() is None:
            try:
                os.killpg(process.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
    for process in processes:
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            log.warning("process %d did not exit", process.pid)


def _truth_for(spec: CaseSpec, hosts: dict[int, str], onset: int | None = None, notes: tuple[str, ...] = ()) -> Truth:
    return truth(spec, hosts, onset=onset, notes=notes)


def _write(path: Path, data: Any) -> None:
    path.write_text(json.dumps(data, sort_keys=True, indent=2) + "\n", encoding="utf-8")


def run_case(spec: CaseSpec, out: str | os.PathLike[str], *, live: bool = True, poll_s: float = POLL_S,
             timeout_s: float = 240.0, noise: bool = False) -> CaseOutcome:
    """Run ``spec`` in ``out/<spec.name>`` and score it. Never raises for a failed run: the outcome says."""
    run_dir = Path(out) / spec.name
    if run_dir.exists():
        shutil.rmtree(run_dir)
    (run_dir / "logs").mkdir(parents=True)
    kind = spec.fault.kind
    hosts = {rank: host_name(rank) for rank in range(spec.ranks)}
    if kind in LINK_KINDS:
        reason = link_lab_unavailable(delay=kind is RealRunFaultKind.LINK_DELAY)
        if reason is not None:
            plan = _truth_for(spec, hosts)
            _write(run_dir / "truth.json", plan.to_dict())
            return CaseOutcome(spec.name, "skipped", reason, str(run_dir), plan.to_dict(), noise=noise)
        spec = replace(spec, netns=True)
    if kind is RealRunFaultKind.CPU_CONTENTION and not spec.pin and (os.cpu_count() or 1) >= 2:
        target = spec.fault.target
        spec = replace(spec, pin=tuple(1 if rank == target else 0 for rank in range(spec.ranks)))
    began = time.monotonic()
    with ExitStack() as stack:
        netlab = None
        if spec.netns:
            from trainhealth.lab.netns import NetLab

            # a prefix of our own: a lab entered with another run's prefix removes that run's namespaces
            netlab = stack.enter_context(NetLab(spec.ranks, prefix=f"rr{os.getpid()}"[:10]))
            hosts = {rank: host.name for rank, host in enumerate(netlab.hosts)}
        plan = _truth_for(spec, hosts)
        _write(run_dir / "spec.json", spec.to_dict())
        _write(run_dir / "truth.json", plan.to_dict())
        master = netlab.hosts[0].address if netlab is not None else "127.0.0.1"
        port = _free_port()
        processes: list[subprocess.Popen[bytes]] = []
        hogs: list[subprocess.Popen[bytes]] = []
        stack.callback(_stop, hogs)
        stack.callback(_stop, processes)
        by_launcher = kind in LINK_KINDS or kind is RealRunFaultKind.CPU_CONTENTION
        onset_done = not by_launcher or spec.fault.onset <= 0
        actual_onset: int | None = 0 if by_launcher and onset_done else None
        if kind in LINK_KINDS and onset_done:
            _slow(netlab, spec)
        if kind is RealRunFaultKind.CPU_CONTENTION and onset_done:  # a fault, not a control: it has a target
            hogs += _start_hogs(spec.fault.hogs, spec.pin[cast(int, spec.fault.target)] if spec.pin else None)
        env = dict(os.environ, MASTER_ADDR=master, MASTER_PORT=str(port), WORLD_SIZE=str(spec.ranks),
                   LOCAL_RANK="0", LOCAL_WORLD_SIZE="1", TRAINHEALTH_TRACE_DIR=str(run_dir),
                   TRAINHEALTH_JOB=spec.name, TRAINHEALTH_TRACE_WRITE_INTERVAL=TRACE_WRITE_INTERVAL_S,
                   TRAINHEALTH_COMM_FLUSH_INTERVAL=TRACE_WRITE_INTERVAL_S,
                   OMP_NUM_THREADS="1", TRAINHEALTH_LAB_HOSTS=json.dumps({str(r): h for r, h in hosts.items()}))
        worker = [sys.executable, "-m", "trainhealth.lab.realrun.worker", "--spec", str(run_dir / "spec.json")]
        namespaces = _namespaces(netlab, spec.ranks) if netlab is not None else {}
        if netlab is None or namespaces:  # one process imports torch once and forks the ranks
            if namespaces and netlab is not None:  # namespaces: only with a lab
                env.update(TRAINHEALTH_LAB_NETNS=json.dumps(namespaces), GLOO_SOCKET_IFNAME=netlab.hosts[0].interface)
            with open(run_dir / "logs" / "launcher.log", "wb") as log_file:
                processes.append(subprocess.Popen(worker + ["--ranks", ",".join(map(str, range(spec.ranks)))],
                                                  env=env, stdout=log_file, stderr=subprocess.STDOUT,
                                                  **_OWN_GROUP))
        else:  # each rank started inside its own namespace
            for rank in range(spec.ranks):
                rank_env = dict(env, RANK=str(rank), TRAINHEALTH_HOST=hosts[rank],
                                GLOO_SOCKET_IFNAME=netlab.hosts[rank].interface)
                argv = list(netlab.command(rank, worker + ["--rank", str(rank)]))
                with open(run_dir / "logs" / f"rank-{rank}.log", "wb") as log_file:
                    processes.append(subprocess.Popen(argv, env=rank_env, stdout=log_file, stderr=subprocess.STDOUT,
                                                      **_OWN_GROUP))

        polls: list[LivePoll] = []
        watcher = _LiveWatcher(run_dir, spec.ranks, poll_s, began) if live else None
        if watcher is not None:
            stack.callback(watcher.stop)
        deadline = time.monotonic() + timeout_s
        failed = None
        last_progress, moved_at = -2, time.monotonic()
        while time.monotonic() < deadline:
            codes = [p.poll() for p in processes]
            if any(code not in (None, 0) for code in codes):
                failed = "a rank exited with an error"
                break
            if all(code == 0 for code in codes):
                break
            slowest, fastest = _progress(run_dir, spec.ranks)
            if slowest != last_progress:
                last_progress, moved_at = slowest, time.monotonic()
            elif time.monotonic() - moved_at > (STALL_S if slowest >= 0 else START_S) and slowest < spec.steps - 1:
                failed = f"no progress for {time.monotonic() - moved_at:.0f}s at step {slowest}"
                break
            if not onset_done and fastest + 1 >= spec.fault.onset:
                if kind in LINK_KINDS:
                    _slow(netlab, spec)
                else:
                    hogs += _start_hogs(spec.fault.hogs, spec.pin[cast(int, spec.fault.target)] if spec.pin else None)
                onset_done = True
                actual_onset = fastest + 1
                if actual_onset != spec.fault.onset:
                    plan = _truth_for(spec, hosts, onset=actual_onset,
                                      notes=(f"planned onset {spec.fault.onset}, switched on at step {actual_onset}",))
            if watcher is not None and slowest >= 0:
                watcher.update(plan)
            time.sleep(0.1)
        else:
            failed = f"timed out after {timeout_s:g}s"
        _stop(hogs)
        if failed is not None:
            _stop(processes)
        wall = time.monotonic() - began
        if watcher is not None:
            polls = watcher.stop()
    if actual_onset is not None and actual_onset != spec.fault.onset:
        _write(run_dir / "truth.json", plan.to_dict())
    if failed is not None:
        tail = _log_tail(run_dir)
        return CaseOutcome(spec.name, "error", f"{failed}: {tail}", str(run_dir), plan.to_dict(), wall_s=wall,
                           live_polls=tuple(polls), noise=noise)
    return _finish(spec, plan, run_dir, wall, polls, noise)


def _namespaces(netlab: Any, ranks: int) -> dict[str, str]:
    """rank -> network namespace name when ``netlab.command`` is ``ip netns exec NAME`` (the forked ranks enter
    it themselves); empty otherwise, and the ranks are started through ``netlab.command``."""
    names = {}
    for rank in range(ranks):
        prefix = list(netlab.command(rank, []))
        if len(prefix) != 4 or prefix[1:3] != ["netns", "exec"] or not Path(f"/run/netns/{prefix[3]}").exists():
            return {}
        names[str(rank)] = prefix[3]
    return names


def _slow(netlab: Any, spec: CaseSpec) -> None:
    fault = spec.fault
    if fault.kind is RealRunFaultKind.LINK_RATE:
        netlab.slow_link(fault.target, rate_mbit=fault.rate_mbit)
    else:
        netlab.slow_link(fault.target, delay_ms=fault.delay_ms)


def _log_tail(run_dir: Path) -> str:
    for path in sorted((run_dir / "logs").glob("*.log")):
        text = path.read_text(errors="replace").strip()
        if "Error" in text or "Traceback" in text:
            return f"{path.name}: " + " | ".join(text.splitlines()[-3:])
    return "no error in the rank logs"


def _analyzer(run_dir: Path) -> Any:
    from trainhealth.localize.analyzer import Analyzer
    from trainhealth.localize.sources import TraceDirectory
    from trainhealth.store import MetricStore

    return Analyzer(TraceDirectory(run_dir), MetricStore())


class _LiveWatcher:
    """Polls the live analyzer on its own thread, so a slow analysis never delays a mid-run fault switch."""

    def __init__(self, run_dir: Path, ranks: int, poll_s: float, began: float) -> None:
        self._analyzer = _analyzer(run_dir)
        self._run_dir, self._ranks = run_dir, ranks
        self._poll_s = poll_s
        self._began = began
        self._plan: Truth | None = None
        self._polls: list[LivePoll] = []
        self._lock = threading.Lock()
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._run, name="lab-live-analyzer", daemon=True)
        self._thread.start()

    def update(self, plan: Truth) -> None:
        """The truth so far (a mid-run switch moves the onset); polls begin with the first update."""
        with self._lock:
            self._plan = plan

    def _run(self) -> None:
        try:  # Linux: a thread's niceness is its own
            os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), ANALYZER_NICE)
        except (OSError, AttributeError):
            pass
        while not self._done.wait(self._poll_s):
            with self._lock:
                plan = self._plan
            if plan is None:
                continue
            # the step reached when the analyzer reads the traces: what it sees is at most that recent
            step = _progress(self._run_dir, self._ranks)[1]
            poll = _poll(self._analyzer, plan, time.monotonic() - self._began, step)
            with self._lock:
                self._polls.append(poll)

    def stop(self) -> list[LivePoll]:
        self._done.set()
        self._thread.join(timeout=60)
        with self._lock:
            return list(self._polls)


def _poll(analyzer: Any, plan: Truth, wall_s: float, step: int) -> LivePoll:
    began = time.perf_counter()
    try:
        result = analyzer.run_once()
    except Exception as exc:  # the localizer is judged here, not trusted: an exception is a recorded answer
        return LivePoll(wall_s, step, None, None, False, f"{type(exc).__name__}: {exc}",
                        round(time.perf_counter() - began, 4))
    took = round(time.perf_counter() - began, 4)
    if result is None:
        return LivePoll(wall_s, step, None, None, False, "no readable traces yet", took)
    score = score_result(plan, result)
    if plan.target is None:
        right = score.verdict_right and not score.false_blame
    else:  # the right verdict and top suspect, once the fault is on (a blame before the onset is false)
        right = score.verdict_right and bool(score.top1_right) and step >= plan.onset
    return LivePoll(wall_s, step, score.verdict, score.top, right, None, took)


@dataclass(frozen=True)
class _Slowdowns:
    steps_done: int = 0
    median_step_s: float | None = None
    measured: float | None = None
    step: float | None = None
    others: float | None = None


def _ratio(active: list[float], calm: list[float]) -> float | None:
    if not active or not calm or float(np.median(calm)) <= 0:
        return None
    return round(float(np.median(active)) / float(np.median(calm)), 3)


def _measured_slowdown(spec: CaseSpec, plan: Truth, run_dir: Path) -> _Slowdowns:
    """Step and compute slowdowns (median over faulty steps / median over the others) from the ranks' timings."""
    step_s: dict[int, float] = {}
    busy: dict[int, dict[int, float]] = {}
    for rank in range(spec.ranks):
        try:
            rows = json.loads((run_dir / "progress" / f"steps-rank-{rank}.json").read_text())
        except (OSError, ValueError):
            continue
        for step, _, seconds, compute, *_ in rows:
            step_s[int(step)] = max(step_s.get(int(step), 0.0), float(seconds))
            busy.setdefault(rank, {})[int(step)] = float(compute)
    if not step_s:
        return _Slowdowns()
    steps = sorted(step_s)[1:]  # step 0 holds the warm-up
    median = float(np.median([step_s[s] for s in steps])) if steps else None
    if plan.target is None or not steps:
        return _Slowdowns(len(step_s), median)
    fault = replace(spec.fault, onset=plan.onset)
    active = [s for s in steps if fault.active(s)]
    calm = [s for s in steps if not fault.active(s)]
    step_ratio = _ratio([step_s[s] for s in active], [step_s[s] for s in calm])
    others = [r for r in busy if r != plan.target]
    other_ratio = _ratio([busy[r][s] for r in others for s in active if s in busy[r]],
                         [busy[r][s] for r in others for s in calm if s in busy[r]])
    measured = step_ratio
    if spec.fault.kind in (RealRunFaultKind.COMPUTE, RealRunFaultKind.CPU_CONTENTION) and plan.target in busy:
        mine = busy[plan.target]
        measured = _ratio([mine[s] for s in active if s in mine], [mine[s] for s in calm if s in mine])
    return _Slowdowns(len(step_s), median, measured, step_ratio, other_ratio)


def _finish(spec: CaseSpec, plan: Truth, run_dir: Path, wall: float, polls: list[LivePoll],
            noise: bool) -> CaseOutcome:
    slow = _measured_slowdown(spec, plan, run_dir)
    detection = next((p.step for p in polls if p.right), None)
    delay = None if detection is None or plan.target is None else max(0, detection - plan.onset)
    false_polls = sum(1 for p in polls if p.verdict in ("compute", "communication") and not p.right
                      and (plan.target is None or p.step < plan.onset or p.top not in plan.components))
    common = dict(case=spec.name, run_dir=str(run_dir), truth=plan.to_dict(), wall_s=round(wall, 2),
                  steps_done=slow.steps_done, median_step_s=slow.median_step_s, measured_slowdown=slow.measured,
                  measured_step_slowdown=slow.step, others_slowdown=slow.others,
                  live_detection_step=detection, live_detection_delay=delay, live_false_blame_polls=false_polls,
                  live_polls=tuple(polls), noise=noise)
    try:
        scores = score_run(plan, run_dir)
    except _RunError as exc:
        return CaseOutcome(status="error", reason=str(exc), **exc.partial, **common)  # type: ignore[arg-type]
    return CaseOutcome(status="ok", reason="", **scores, **common)  # type: ignore[arg-type]


class _RunError(Exception):
    def __init__(self, message: str, partial: dict[str, Any] | None = None) -> None:
        super().__init__(message)
        self.partial = partial or {}


def score_run(plan: Truth, run_dir: str | os.PathLike[str]) -> dict[str, Any]:
    """Localize one finished run's traces with this code and score the answers (``localize``, ``localize_probe``,
    ``baseline_compute``, ``baseline_wait``, ``answer``); ``answer.json`` is written beside the traces."""
    from trainhealth.localize.localizer import localize
    from trainhealth.traces.io import read_trace

    run_dir = Path(run_dir)
    try:
        trace = read_trace([run_dir])
    except Exception as exc:
        raise _RunError(f"reading the traces: {exc}") from None
    records = trace.records
    baselines = dict(baseline_compute=score_baseline(plan, baseline_compute(records)).to_dict(),
                     baseline_wait=score_baseline(plan, baseline_wait(records)).to_dict())
    try:
        result = localize(records, trace.topology)
    except Exception as exc:
        raise _RunError(f"localize raised {type(exc).__name__}: {exc}", baselines) from None
    probe_score = _with_probe(localize, records, trace.topology, run_dir, plan)
    _write(run_dir / "answer.json", result.to_dict())
    return dict(localize=score_result(plan, result).to_dict(), localize_probe=probe_score, answer=result.to_dict(),
                **baselines)


def _with_probe(localize: Any, records: Any, topology: Any, run_dir: Path, plan: Truth) -> dict[str, Any] | None:
    """The answer with the link probe's result, when there is one and ``localize`` takes ``probe=``."""
    path = run_dir / "probe.json"
    if not path.is_file() or "probe" not in inspect.signature(localize).parameters:
        return None
    if "unavailable" in json.loads(path.read_text()):
        return None
    try:
        from trainhealth.exporters.collectives.probe import ProbeResult

        result = localize(records, topology, probe=ProbeResult.load(path))
    except Exception as exc:
        return {"error": f"{type(exc).__name__}: {exc}"}
    _write(run_dir / "answer-probe.json", result.to_dict())
    return score_result(plan, result).to_dict()
