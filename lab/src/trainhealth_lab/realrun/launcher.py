"""Run one real-run case: start the ranks, inject what the launcher injects, watch live, localize, score.

The rank processes (:mod:`trainhealth_lab.realrun.worker`) apply compute faults,
data-loader stalls and the controls themselves, from ``spec.json``. The launcher
applies what lives outside a rank: a slowed link (``tc`` through
:class:`trainhealth_lab.netns.NetLab`, each rank in its own network namespace) and
CPU contention (busy processes pinned to the target rank's CPU), from the start or
switched on mid-run when the ranks' progress files reach the onset step. The onset
written to ``truth.json`` is the step at which the switch actually happened.

The ranks rewrite their traces every ``TRACE_WRITE_INTERVAL_S`` (0.25 s, a few steps).
While the job runs the live analyzer (:mod:`trainhealth_lab.realrun.live`) polls them; after
the job the launcher runs ``localize`` on the traces and scores both, beside the naive
baselines (:mod:`trainhealth_lab.realrun.outcome`).

CPU contention pins the target rank and the busy processes to one CPU and every other
rank to the other CPU: with 2 cores, an unpinned busy process would be spread by the
scheduler over both cores and slow every rank alike (that is the ``--noise``
condition, not a fault of one rank), whereas pinning confines it to one rank, as a
noisy neighbour on one node confines it to that node's ranks.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import time
from contextlib import ExitStack
from dataclasses import replace
from pathlib import Path
from typing import Any, cast

from trainhealth._internal._files import write_json
from trainhealth._internal._ports import free_port
from trainhealth_lab.realrun.live import POLL_S, LivePoll, LiveWatcher, progress
from trainhealth_lab.realrun.outcome import CaseOutcome, finish, score_run
from trainhealth_lab.realrun.spec import CaseSpec, LabFault, Truth, host_name, truth

__all__ = ["CaseOutcome", "LivePoll", "link_lab_unavailable", "run_case", "score_run"]

log = logging.getLogger(__name__)

#: The busy loop of a CPU-contention or noise process.
HOG_CODE = "while True:\n    pass\n"
#: Seconds between the ranks' trace rewrites (and the collective logger's flushes) while a case runs.
TRACE_WRITE_INTERVAL_S = "0.25"
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
#: A run whose slowest rank makes no progress this long is stopped and reported (before its first step: START_S).
STALL_S, START_S = 30.0, 120.0


def link_lab_unavailable(delay: bool = False) -> str | None:
    """Why link cases cannot run here (``None``: they can)."""
    try:
        from trainhealth_lab.netns import NetLab
    except ImportError as exc:
        return f"trainhealth_lab.netns is not importable: {exc}"
    reason = NetLab.available()
    if reason is None and delay:
        reason = NetLab.delay_supported()
    return reason


def _start_hogs(count: int, cpu: int | None) -> list[subprocess.Popen[bytes]]:
    hogs = []
    for _ in range(count):
        hog = subprocess.Popen(
            [sys.executable, "-c", HOG_CODE], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, **_OWN_GROUP
        )
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


def run_case(
    spec: CaseSpec,
    out: str | os.PathLike[str],
    *,
    live: bool = True,
    poll_s: float = POLL_S,
    timeout_s: float = 240.0,
    noise: bool = False,
) -> CaseOutcome:
    """Run ``spec`` in ``out/<spec.name>``, a new directory, and score it. Never raises for a failed run: the
    outcome says; a ``run_dir`` that already exists is a FileExistsError (nothing there is removed)."""
    run_dir = Path(out) / spec.name
    run_dir.mkdir(parents=True)
    (run_dir / "logs").mkdir()
    kind = spec.kind
    hosts = {rank: host_name(rank) for rank in range(spec.ranks)}
    if kind.link:
        reason = link_lab_unavailable(delay=kind is LabFault.LINK_DELAY)
        if reason is not None:
            plan = _truth_for(spec, hosts)
            write_json(run_dir / "truth.json", plan.to_dict())
            return CaseOutcome(spec.name, "skipped", reason, str(run_dir), plan.to_dict(), noise=noise)
        spec = replace(spec, netns=True)
    if kind is LabFault.CPU_CONTENTION and not spec.pin and (os.cpu_count() or 1) >= 2:
        target = spec.fault.target
        spec = replace(spec, pin=tuple(1 if rank == target else 0 for rank in range(spec.ranks)))
    began = time.monotonic()
    with ExitStack() as stack:
        netlab = None
        if spec.netns:
            from trainhealth_lab.netns import NetLab

            # a prefix of our own: a lab entered with another run's prefix removes that run's namespaces
            netlab = stack.enter_context(NetLab(spec.ranks, prefix=f"rr{os.getpid()}"[:10]))
            hosts = {rank: host.name for rank, host in enumerate(netlab.hosts)}
        plan = _truth_for(spec, hosts)
        write_json(run_dir / "spec.json", spec.to_dict())
        write_json(run_dir / "truth.json", plan.to_dict())
        master = netlab.hosts[0].address if netlab is not None else "127.0.0.1"
        port = free_port()
        processes: list[subprocess.Popen[bytes]] = []
        hogs: list[subprocess.Popen[bytes]] = []
        stack.callback(_stop, hogs)
        stack.callback(_stop, processes)
        by_launcher = kind.link or kind is LabFault.CPU_CONTENTION
        onset_done = not by_launcher or spec.fault.step <= 0
        actual_onset: int | None = 0 if by_launcher and onset_done else None
        if kind.link and onset_done:
            _slow(netlab, spec)
        if kind is LabFault.CPU_CONTENTION and onset_done:  # a fault, not a control: it has a target
            hogs += _start_hogs(spec.fault.params["hogs"], spec.pin[cast(int, spec.fault.target)] if spec.pin else None)
        env = dict(
            os.environ,
            MASTER_ADDR=master,
            MASTER_PORT=str(port),
            WORLD_SIZE=str(spec.ranks),
            LOCAL_RANK="0",
            LOCAL_WORLD_SIZE="1",
            TRAINHEALTH_TRACE_DIR=str(run_dir),
            TRAINHEALTH_JOB=spec.name,
            TRAINHEALTH_TRACE_WRITE_INTERVAL=TRACE_WRITE_INTERVAL_S,
            TRAINHEALTH_COMM_FLUSH_INTERVAL=TRACE_WRITE_INTERVAL_S,
            OMP_NUM_THREADS="1",
            TRAINHEALTH_LAB_HOSTS=json.dumps({str(r): h for r, h in hosts.items()}),
        )
        worker = [sys.executable, "-m", "trainhealth_lab.realrun.worker", "--spec", str(run_dir / "spec.json")]
        namespaces = _namespaces(netlab, spec.ranks) if netlab is not None else {}
        if netlab is None or namespaces:  # one process imports torch once and forks the ranks
            if namespaces and netlab is not None:  # namespaces: only with a lab
                env.update(TRAINHEALTH_LAB_NETNS=json.dumps(namespaces), GLOO_SOCKET_IFNAME=netlab.hosts[0].interface)
            with open(run_dir / "logs" / "launcher.log", "wb") as log_file:
                processes.append(
                    subprocess.Popen(
                        worker + ["--ranks", ",".join(map(str, range(spec.ranks)))],
                        env=env,
                        stdout=log_file,
                        stderr=subprocess.STDOUT,
                        **_OWN_GROUP,
                    )
                )
        else:  # each rank started inside its own namespace
            for rank in range(spec.ranks):
                rank_env = dict(
                    env, RANK=str(rank), TRAINHEALTH_HOST=hosts[rank], GLOO_SOCKET_IFNAME=netlab.hosts[rank].interface
                )
                argv = list(netlab.command(rank, worker + ["--rank", str(rank)]))
                with open(run_dir / "logs" / f"rank-{rank}.log", "wb") as log_file:
                    processes.append(
                        subprocess.Popen(argv, env=rank_env, stdout=log_file, stderr=subprocess.STDOUT, **_OWN_GROUP)
                    )

        polls: list[LivePoll] = []
        watcher = LiveWatcher(run_dir, spec.ranks, poll_s, began) if live else None
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
            slowest, fastest = progress(run_dir, spec.ranks)
            if slowest != last_progress:
                last_progress, moved_at = slowest, time.monotonic()
            elif time.monotonic() - moved_at > (STALL_S if slowest >= 0 else START_S) and slowest < spec.steps - 1:
                failed = f"no progress for {time.monotonic() - moved_at:.0f}s at step {slowest}"
                break
            if not onset_done and fastest + 1 >= spec.fault.step:
                if kind.link:
                    _slow(netlab, spec)
                else:
                    hogs += _start_hogs(
                        spec.fault.params["hogs"], spec.pin[cast(int, spec.fault.target)] if spec.pin else None
                    )
                onset_done = True
                actual_onset = fastest + 1
                if actual_onset != spec.fault.step:
                    plan = _truth_for(
                        spec,
                        hosts,
                        onset=actual_onset,
                        notes=(f"planned onset {spec.fault.step}, switched on at step {actual_onset}",),
                    )
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
    if actual_onset is not None and actual_onset != spec.fault.step:
        write_json(run_dir / "truth.json", plan.to_dict())
    if failed is not None:
        tail = _log_tail(run_dir)
        return CaseOutcome(
            spec.name,
            "error",
            f"{failed}: {tail}",
            str(run_dir),
            plan.to_dict(),
            wall_s=wall,
            live_polls=tuple(polls),
            noise=noise,
        )
    return finish(spec, plan, run_dir, wall, polls, noise)


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
    if spec.kind is LabFault.LINK_RATE:
        netlab.slow_link(fault.target, rate_mbit=fault.params["rate_mbit"])
    else:
        netlab.slow_link(fault.target, delay_ms=fault.params["delay_ms"])


def _log_tail(run_dir: Path) -> str:
    for path in sorted((run_dir / "logs").glob("*.log")):
        text = path.read_text(errors="replace").strip()
        if "Error" in text or "Traceback" in text:
            return f"{path.name}: " + " | ".join(text.splitlines()[-3:])
    return "no error in the rank logs"
