"""The hang watcher: is this rank stuck, and where? Judged on the logger's flush thread, once a second.

A rank is stuck when a collective it launched has not completed, or it stayed outside
every collective without finishing a step, for longer than its **hang threshold**: three
times the longest step, collective or gap between them it took in the last ten
minutes (1.5 times its longest reported checkpoint save, if longer), and at least
the floor (``comm_hang_floor``, :data:`FLOOR_S` by default). Until the job's first step
(a Monitor's step marker; without markers, until collectives have completed for
:data:`STEADY_S`) it is at least :data:`STARTUP_S`: set-up barriers, a slow first step,
the first compilation; what start-up took stays in the history (a data loader's first shard
opening says how long the next ones take). A collective is in flight from its launch until its Work completes,
not until the call returned: on NCCL the call returns at enqueue and the host runs ahead
(:mod:`~trainhealth._internal.exporters.collectives.works`).

A pause the loop announces (:meth:`HangWatch.pause`, ``Monitor.pause``) is never stuck
and stays out of the history, up to its **bound**: three times the longest earlier pause
of the same reason, or ``comm_pause_limit`` (:data:`PAUSE_LIMIT_S`) before any ended. The watcher
remembers the :data:`MAX_PAUSE_REASONS` reasons used last (a reason made per step, ``f"save {step}"``, would
otherwise grow its memory and the ``reason`` series without end); an older one is forgotten, its series
removed and counted (``trainhealth_exporter_errors_total{source="comm_pause_reasons"}``). Past
it the rank is stuck ``in_pause`` (a save hung on a shared filesystem), and the pause no
longer holds the hang rules. When a pause ends, the time outside collectives counts from
its end.

When a rank is stuck, the watcher first exports ``trainhealth_comm_stuck_duration_seconds``
with the top frames of the training thread (``where``), then hands the Python stacks of
all its threads and its last records (``<trace_dir>/stacks/rank-<rank>.<time>.txt``, once per
episode) and, with Flight Recorder on, torch's dump (``flight-recorder/rank_<rank>``, with
the groups' members filled in where torch left them out) to the evidence writer thread
(:mod:`~trainhealth._internal.exporters.collectives.writer`): a stalled disk delays the
evidence, never the page. Stack files are bounded in count (:data:`MAX_STACK_FILES`) and size.
It issues no collective and needs nothing from the blocked thread: ``sys._current_frames``
reads any thread's stack.

A collective that raises (a peer that exited closes its connections; a timeout) is counted
(``trainhealth_comm_failures_total``) and written the same way, once, headed by the error
(``stacks/rank-<rank>.<time>.failed.txt``), with the Flight Recorder dump: where every
surviving rank was when a peer left, even when the error then ends the process (the last
flush, at exit, writes it).

>>> where_stuck([("/usr/lib/python3.11/threading.py", 320, "wait"),
...              ("/venv/lib/python3.11/site-packages/torch/utils/data/dataloader.py", 631, "__next__"),
...              ("/home/me/train.py", 88, "main")], stdlib="/usr/lib/python3.11")
'torch/utils/data/dataloader.py:__next__:631 < train.py:main:88'
"""

from __future__ import annotations

import json
import os
import pickle
import sys
import sysconfig
import threading
import time
import traceback
from collections import deque
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from trainhealth._internal import catalog
from trainhealth._internal.knowledge.limits import HANG_FLOOR_S, HUNG_COLLECTIVE_S

if TYPE_CHECKING:
    from trainhealth._internal.exporters.collectives.columns import RecordColumns
    from trainhealth._internal.exporters.collectives.recorder import CollectiveFailure
    from trainhealth._internal.exporters.collectives.writer import EvidenceWriter
    from trainhealth._internal.store import MetricStore


class _Watched(Protocol):
    """What the watcher reads of the collective logger (:class:`~.logger.CollectiveLogger`)."""

    store: MetricStore | None
    training_thread: int | None
    _current: tuple[str, str, int, float] | None
    _async: dict[tuple[str, int], tuple[str, float]]
    _ring: deque[tuple]
    failure: CollectiveFailure | None
    failures: int

    @property
    def rank(self) -> int: ...

    @property
    def members(self) -> dict[str, tuple[int, ...]]: ...

    def trace_rows(self, records: Iterable[tuple]) -> list[dict[str, Any]]: ...


__all__ = [
    "FACTOR",
    "FLOOR_S",
    "MAX_PAUSE_REASONS",
    "PAUSE_LIMIT_S",
    "STARTUP_S",
    "HangWatch",
    "Stuck",
    "flight_recorder_enabled",
    "where_stuck",
]

#: the shortest hang threshold (``comm_hang_floor``'s default, the alert rules' floor): pauses of a few seconds
#: (a GC, a slow batch) are never stuck
FLOOR_S = float(HANG_FLOOR_S)
#: the hang threshold over the longest step, collective or gap of the recent history
FACTOR = 3.0
#: the hang threshold until the job's first step (set-up barriers, a slow first step, the first compilation); the
#: rules' and the analyzer's for ranks that export none
STARTUP_S = float(HUNG_COLLECTIVE_S)
#: without step markers, start-up ends after this many seconds of completed collectives
STEADY_S = 120.0
#: the hang threshold over the longest checkpoint save reported (Monitor.checkpoint_saved)
SAVE_FACTOR = 1.5
#: an announced pause's bound before any pause of its reason ended (``comm_pause_limit``)
PAUSE_LIMIT_S = 1800.0
#: an announced pause's bound over the longest earlier pause of the same reason
PAUSE_FACTOR = 3.0
#: pause reasons remembered at most (their longest pause, their ``trainhealth_comm_paused`` series); past it the
#: one used longest ago that is not open is forgotten
MAX_PAUSE_REASONS = 32
#: how many flushes (about seconds) of history the threshold remembers
HISTORY_FLUSHES = 600
#: records written beside the stacks
RECORDS_KEPT = 50
#: stack files one process writes at most (episodes after that are exported, not written)
MAX_STACK_FILES = 32
#: threads and frames per thread a stack file holds at most
MAX_THREADS, MAX_FRAMES = 256, 64

_OWN = str(Path(__file__).resolve().parents[1])  # trainhealth._internal.exporters: the monitoring, never "where"
_SKIPPED = ("torch/distributed/", "torch/_", "contextlib.py")


@dataclass(frozen=True)
class Stuck:
    """A stuck episode: ``state`` in_collective (``op`` in ``group`` at ``seq``), outside_collectives, or
    in_pause (``op`` the pause's reason, past its bound)."""

    state: str
    seconds: float
    op: str
    group: str
    seq: int | None
    where: str

    def labels(self) -> tuple[str, ...]:
        return (self.state, self.op, self.group, "" if self.seq is None else str(self.seq), self.where)


class HangWatch:
    """Judges one rank's collective logger for hangs; :meth:`check` runs on its flush thread.

    ``writer`` runs the disk writes (stacks, Flight Recorder dumps) off that thread; without
    one they are written in place.
    """

    def __init__(
        self,
        logger: _Watched,
        floor_s: float = FLOOR_S,
        *,
        pause_limit_s: float = PAUSE_LIMIT_S,
        writer: EvidenceWriter | None = None,
    ) -> None:
        if not floor_s > 0:
            raise ValueError("the hang floor must be positive")
        if not pause_limit_s > 0:
            raise ValueError("the pause limit must be positive")
        self._logger = logger
        self.floor_s = float(floor_s)
        self.pause_limit_s = float(pause_limit_s)
        self._writer = writer
        self._longest: deque[float] = deque(maxlen=HISTORY_FLUSHES)  # per flush: its longest step/collective/gap
        self._last_end: float | None = None  # perf_counter end of the last record seen (a collective or a step)
        self._first_end: float | None = None  # perf_counter end of the first collective seen
        self._stepped = False  # a step marker arrived: start-up is over
        self._saves = 0.0
        self._lock = threading.Lock()
        self._paused: dict[str, int] = {}
        self._pause_began: dict[str, tuple[float, float]] = {}  # reason -> (perf_counter, unix time) it began
        self._pause_longest: dict[str, float] = {}  # reason -> its longest pause that ended
        self._paused_since_check = False
        self._known_reasons: dict[str, None] = {}  # the reasons remembered, the one used longest ago first
        self._groups_published: dict[str, tuple[str, ...]] = {}
        self._stuck: Stuck | None = None
        self._episode: tuple | None = None
        self._failure_seen: CollectiveFailure | None = None
        self._failures_published = 0
        self._stack_files = 0
        self.dumps: list[Path] = []

    # --- what the loop tells ------------------------------------------------------------
    @contextmanager
    def pause(self, reason: str = "pause") -> Iterator[None]:
        """A pause the loop announces (a checkpoint save, an evaluation): never stuck up to its bound, not in the
        history; the time outside collectives counts from its end."""
        with self._lock:
            self._paused[reason] = self._paused.get(reason, 0) + 1
            if reason not in self._pause_began:
                self._pause_began[reason] = (time.perf_counter(), time.time())
            self._paused_since_check = True
            self._known_reasons.pop(reason, None)
            self._known_reasons[reason] = None
            forgotten = self._forget_reasons()
        self._publish_paused(forgotten=forgotten)
        try:
            yield
        finally:
            with self._lock:
                self._paused[reason] -= 1
                if not self._paused[reason]:
                    del self._paused[reason]
                    now = time.perf_counter()
                    began = self._pause_began.pop(reason, (now, 0.0))[0]
                    self._pause_longest[reason] = max(self._pause_longest.get(reason, 0.0), now - began)
                    if self._last_end is not None:
                        self._last_end = max(self._last_end, now)  # away from collectives since the pause ended
                self._paused_since_check = True
            self._publish_paused()

    def _forget_reasons(self) -> list[str]:
        """The reasons, used longest ago and not open, forgotten to keep :data:`MAX_PAUSE_REASONS` (the lock held)."""
        forgotten = []
        for reason in list(self._known_reasons):
            if len(self._known_reasons) <= MAX_PAUSE_REASONS:
                break
            if reason not in self._paused:
                del self._known_reasons[reason]
                self._pause_longest.pop(reason, None)
                forgotten.append(reason)
        return forgotten

    def checkpoint_saved(self, duration_s: float) -> None:
        """A save of ``duration_s`` seconds: later saves as long are not stuck."""
        if duration_s > 0:
            self._saves = max(self._saves, float(duration_s))

    def stepped(self) -> None:
        """A step marker arrived (flush thread): the job is past its start-up."""
        self._stepped = True

    @property
    def paused(self) -> bool:
        return bool(self._paused)

    def pause_bound(self, reason: str) -> float:
        """Seconds a pause of ``reason`` may last before the rank is stuck in it."""
        longest = self._pause_longest.get(reason)
        if longest is None:
            return self.pause_limit_s
        return max(PAUSE_FACTOR * longest, self.threshold())

    def _overrun(self, now: float) -> tuple[str, float, float] | None:
        """The open pause past its bound, longest first: (reason, seconds in it, unix time it began)."""
        with self._lock:
            began = dict(self._pause_began)
        over = [(now - at, reason, unix) for reason, (at, unix) in began.items() if now - at > self.pause_bound(reason)]
        if not over:
            return None
        seconds, reason, unix = max(over)
        return reason, seconds, unix

    # --- the flush thread ---------------------------------------------------------------
    def observe(self, columns: RecordColumns) -> None:
        """Take the longest step, collective or gap of a flush's new records into the history."""
        order = np.argsort(columns.starts, kind="stable")
        starts, durations = columns.starts[order], columns.durations[order]
        # a group's first collective (start-up barrier, rendezvous) sets no norm, but what it covers counts
        judged = columns.seqs[order] != 0
        reach = np.maximum.accumulate(starts + durations)
        with self._lock:
            last_end = self._last_end
        if last_end is not None:
            reach = np.maximum(reach, last_end)
        before = np.concatenate(([-np.inf if last_end is None else last_end], reach[:-1]))
        gaps = np.where(np.isfinite(before), starts - before, 0.0)
        longest = float(np.max(np.maximum(durations, gaps)[judged], initial=0.0))
        with self._lock:
            self._last_end = max(float(reach[-1]), self._last_end or -np.inf)
            if self._first_end is None:
                self._first_end = float(reach[0])
            skip = self._paused_since_check or bool(self._paused)
            self._paused_since_check = False
        if not skip and longest > 0:
            self._longest.append(longest)

    def threshold(self, now: float | None = None) -> float:
        """Seconds of waiting (or of absence from collectives) that make this rank stuck."""
        learnt = max(self.floor_s, SAVE_FACTOR * self._saves, FACTOR * max(self._longest, default=0.0))
        if self._starting(time.perf_counter() if now is None else now):
            return max(STARTUP_S, learnt)
        return learnt

    def _starting(self, now: float) -> bool:
        if self._stepped:
            return False
        return self._first_end is None or now - self._first_end < STEADY_S

    def check(self, store: MetricStore | None, trace_dir: Path | None) -> Stuck | None:
        """Is the rank stuck now? Publishes the watcher's series, then has the stacks of a new episode written."""
        now = time.perf_counter()
        threshold = self.threshold(now)
        overrun = self._overrun(now)
        if overrun is not None:
            reason, seconds, _ = overrun
            stuck: Stuck | None = Stuck("in_pause", seconds, reason, "", None, _where(self._logger.training_thread))
        else:
            stuck = None if self.paused else self._stuck_now(now, threshold)
        if store is not None:
            self._publish(store, threshold, stuck)
            if self._known_reasons:
                self._publish_paused(None if overrun is None else overrun[0])
        if stuck is not None and trace_dir is not None:
            episode = (stuck.state, stuck.op if stuck.state == "in_pause" else stuck.group, stuck.seq, self._last_end)
            if episode != self._episode:
                self._episode = episode
                headline = self._headline(stuck, threshold, overrun)
                self._evidence(trace_dir, headline, "")
        self._stuck = stuck
        self._failed(store, trace_dir)
        return stuck

    def _headline(self, stuck: Stuck, threshold: float, overrun: tuple[str, float, float] | None) -> list[str]:
        rank = self._logger.rank
        if overrun is not None:
            reason, seconds, unix = overrun
            first = (
                f"rank {rank}: in a pause ({reason}) since {time.strftime('%H:%M:%S', time.gmtime(unix))} UTC, "
                f"{seconds:.1f} s (its bound {self.pause_bound(reason):.1f} s)"
            )
        else:
            first = f"rank {rank}: {stuck.state} for {stuck.seconds:.1f} s (hang threshold {threshold:.1f} s)" + (
                f" in {stuck.op} #{stuck.seq} of {stuck.group}" if stuck.state == "in_collective" else ""
            )
        return [first, f"where: {stuck.where}", ""]

    def _failed(self, store: MetricStore | None, trace_dir: Path | None) -> None:
        """A collective that raised (a peer gone, a timeout): counted, and its error, the stacks and the Flight
        Recorder dump written once. It often ends the process: this also runs at exit (the last flush), so the
        peers of a rank that left record where they were when it did."""
        logger = self._logger
        failure = logger.failure
        if store is not None and logger.failures > self._failures_published and failure is not None:
            store.inc(catalog.COMM_FAILURES, logger.failures - self._failures_published, (failure.op, failure.group))
            self._failures_published = logger.failures
        if failure is None or failure is self._failure_seen or trace_dir is None:
            return
        self._failure_seen = failure
        headline = (
            f"rank {logger.rank}: {failure.op} #{failure.seq} of {failure.group} failed at "
            f"{time.strftime('%H:%M:%S', time.gmtime(failure.time))} UTC: {failure.error}"
        )
        self._evidence(trace_dir, [headline, ""], ".failed")

    def _evidence(self, trace_dir: Path, headline: list[str], kind: str) -> None:
        """The stacks as they are now, and the Flight Recorder dump, written by the writer thread (in place without
        one); at most :data:`MAX_STACK_FILES` stack files."""
        if self._stack_files >= MAX_STACK_FILES:
            return
        self._stack_files += 1
        lines = headline + self._stack_lines()

        def write() -> None:
            path = self._write_stacks(trace_dir, lines, kind)
            if path is not None:
                self.dumps.append(path)
            self._dump_flight_recorder(trace_dir)

        if self._writer is None or not self._writer.submit(write):
            if self._writer is None:
                write()

    def _stuck_now(self, now: float, threshold: float) -> Stuck | None:
        logger = self._logger
        thread = logger.training_thread
        launched = [(t0, op, group, seq) for (group, seq), (op, t0) in list(logger._async.items())]
        current = logger._current
        if current is not None:
            op, group, seq, t0 = current
            launched.append((t0, op, group, seq))
        if launched:  # the oldest collective launched and not completed
            t0, op, group, seq = min(launched)
            if now - t0 > threshold:
                return Stuck("in_collective", now - t0, op, group, seq, _where(thread))
        if current is not None:
            return None
        with self._lock:
            last_end = self._last_end
        if last_end is None:
            return None  # no collective completed yet: nothing to be absent from
        away = now - last_end
        if away > threshold:
            return Stuck("outside_collectives", away, "", "", None, _where(thread))
        return None

    def _publish(self, store: MetricStore, threshold: float, stuck: Stuck | None) -> None:
        writes: list[tuple[catalog.MetricSpec, tuple[str, ...], float]] = [
            (catalog.COMM_WATCH_TIMESTAMP, (), time.time()),
            (catalog.COMM_HANG_THRESHOLD, (), threshold),
        ]
        if self._stuck is not None and (stuck is None or stuck.labels() != self._stuck.labels()):
            store.remove(catalog.COMM_STUCK_DURATION, self._stuck.labels())
        if stuck is not None:
            writes.append((catalog.COMM_STUCK_DURATION, stuck.labels(), stuck.seconds))
        store.write(writes)
        groups = self._logger.members
        rank = self._logger.rank if groups else -1
        for group, members in groups.items():
            # this rank's place in the group (torch lists a group's ranks in group-rank order), a few bytes whatever
            # the group's size; none where torch cannot say who is in it
            labels = (group, str(members.index(rank)), str(len(members))) if rank in members else None
            published = self._groups_published.get(group)
            if published == labels:
                continue
            if published is not None:
                store.remove(catalog.COMM_GROUP_MEMBER, published)
            if labels is None:
                self._groups_published.pop(group, None)
            else:
                store.set(catalog.COMM_GROUP_MEMBER, 1.0, labels)
                self._groups_published[group] = labels

    def forget(self, store: MetricStore | None, groups: Iterable[str]) -> None:
        """Groups torch destroyed: this rank's membership series of them go."""
        for group in groups:
            labels = self._groups_published.pop(group, None)
            if labels is not None and store is not None:
                store.remove(catalog.COMM_GROUP_MEMBER, labels)

    def _publish_paused(self, overrun: str | None = None, forgotten: Sequence[str] = ()) -> None:
        """1 per reason while a pause of it is open and within its bound (``overrun``: the one past it); the series
        of ``forgotten`` reasons removed, and counted."""
        store = self._logger.store
        if store is None:
            return
        # under the watcher's lock: a snapshot written after a reason's series was removed would bring it back
        with self._lock:
            for reason in forgotten:
                store.remove(catalog.COMM_PAUSED, (reason,))
                store.record_error(
                    "comm_pause_reasons",
                    ValueError(f"more than {MAX_PAUSE_REASONS} pause reasons: {reason!r} forgotten"),
                )
            store.write(
                (catalog.COMM_PAUSED, (reason,), 1.0 if reason in self._paused and reason != overrun else 0.0)
                for reason in sorted(self._known_reasons)
            )

    def _dump_flight_recorder(self, trace_dir: Path) -> None:
        """With Flight Recorder on, its dump beside the stacks (``flight-recorder/rank_<rank>``, the name torch's
        ``fr_trace`` analyzer reads): the same hang through torch's own records (``trainhealth localize DIR``)."""
        torch = sys.modules.get("torch")
        if torch is None or not flight_recorder_enabled():
            return
        logger = self._logger
        try:
            blob = _with_members(torch._C._distributed_c10d._dump_fr_trace(), logger.members)
            directory = trace_dir / "flight-recorder"
            directory.mkdir(parents=True, exist_ok=True)
            partial = directory / f".rank_{logger.rank}.partial"
            partial.write_bytes(blob)
            os.replace(partial, directory / f"rank_{logger.rank}")
        except Exception as exc:  # torch without the call, a full disk: counted, the stacks are written anyway
            if logger.store is not None:
                logger.store.record_error("comm_stacks", exc)

    def _stack_lines(self) -> list[str]:
        """Every thread's stack (at most :data:`MAX_THREADS`, their innermost :data:`MAX_FRAMES` frames) and the
        last records."""
        logger = self._logger
        lines: list[str] = []
        names = {thread.ident: thread.name for thread in threading.enumerate()}
        for ident, frame in list(sys._current_frames().items())[:MAX_THREADS]:
            marker = "  <- training thread" if ident == logger.training_thread else ""
            lines.append(f"Thread {names.get(ident, '?')} ({ident}){marker}:")
            lines += [line.rstrip("\n") for line in traceback.format_stack(frame, limit=MAX_FRAMES)]
            lines.append("")
        lines.append(f"last {RECORDS_KEPT} records:")
        lines += [json.dumps(row) for row in logger.trace_rows(list(logger._ring)[-RECORDS_KEPT:])]
        return lines

    def _write_stacks(self, trace_dir: Path, lines: list[str], kind: str = "") -> Path | None:
        """``lines`` to a new file under ``stacks/``; the file, or None when it could not be written."""
        logger = self._logger
        directory = trace_dir / "stacks"
        path = directory / f"rank-{logger.rank}.{time.strftime('%Y%m%dT%H%M%S', time.gmtime())}{kind}.txt"
        try:
            directory.mkdir(parents=True, exist_ok=True)
            partial = path.with_suffix(".partial")
            with open(partial, "w", encoding="utf-8") as out:
                out.write("\n".join(lines) + "\n")
                out.flush()
                os.fsync(out.fileno())
            os.replace(partial, path)
        except OSError as exc:
            if logger.store is not None:
                logger.store.record_error("comm_stacks", exc)
            return None
        return path


def _with_members(blob: bytes, members: dict[str, tuple[int, ...]]) -> bytes:
    """This rank's Flight Recorder dump with each group's members filled in: torch 2.13's gloo dumps leave
    ``pg_config`` empty (one entry named "" without ranks), so neither torch's ``fr_trace`` nor anyone else
    could tell who should have been in a collective. The entries are left as torch wrote them."""
    dump = pickle.loads(blob)  # this process's own dump, just made by torch
    config = {name: entry for name, entry in (dump.get("pg_config") or {}).items() if name}
    for group, ranks in members.items():
        desc, _, name = group.rpartition(":")
        if ranks and name not in config:
            config[name] = {"name": name, "desc": desc or "undefined", "ranks": str(list(ranks))}
    dump["pg_config"] = config
    return pickle.dumps(dump)


def flight_recorder_enabled(env: dict[str, str] | os._Environ[str] = os.environ) -> bool:
    """Whether torch's Flight Recorder records (``TORCH_FR_BUFFER_SIZE``, formerly
    ``TORCH_NCCL_TRACE_BUFFER_SIZE``, above 0)."""
    for name in ("TORCH_FR_BUFFER_SIZE", "TORCH_NCCL_TRACE_BUFFER_SIZE"):
        value = env.get(name, "")
        if value.strip().isdigit() and int(value) > 0:
            return True
    return False


def _where(thread: int | None) -> str:
    """The top frames of ``thread`` (the training thread; the main thread when none entered a collective)."""
    ident = thread if thread is not None else threading.main_thread().ident
    frame = sys._current_frames().get(ident) if ident is not None else None
    if frame is None:
        return "unknown (the training thread is gone)"
    stack = [(f.filename, f.lineno or 0, f.name) for f in reversed(traceback.extract_stack(frame))]
    return where_stuck(stack)


def where_stuck(stack: Sequence[tuple[str, int, str]], stdlib: str | None = None, keep: int = 2) -> str:
    """A one-line summary of a stack (innermost first): its ``keep`` innermost frames outside Python's
    library, torch.distributed and trainhealth, as ``path:function:line``, innermost first."""
    stdlib = stdlib or sysconfig.get_paths()["stdlib"]
    chosen = []
    for filename, line, function in stack:
        normal = filename.replace(os.sep, "/")
        packaged = "site-packages/" in normal or "dist-packages/" in normal
        if normal.startswith(stdlib) and not packaged or normal.startswith(_OWN):
            continue
        short = _short(normal)
        if any(part in short for part in _SKIPPED) or short.startswith("<"):
            continue
        chosen.append(f"{short}:{function}:{line}")
        if len(chosen) == keep:
            break
    return " < ".join(chosen) if chosen else "python internals (no frame of the job's own code)"


def _short(path: str) -> str:
    """A path from its package root (``torch/utils/data/dataloader.py``), else the file name."""
    for marker in ("site-packages/", "dist-packages/"):
        if marker in path:
            return path.split(marker, 1)[1]
    return path.rsplit("/", 1)[-1]
