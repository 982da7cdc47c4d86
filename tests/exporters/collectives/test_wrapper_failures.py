"""Failures around a wrapped collective: the user's call runs once and raises once, and our own bookkeeping's
failure is counted and leaves no trace of a hang (nothing in flight, sequence numbers as the peers')."""

from __future__ import annotations

import inspect
from collections.abc import Iterator
from contextlib import contextmanager

import pytest
import torch
import torch.distributed as dist

from tests.helpers import scrape
from trainhealth import Monitor
from trainhealth._internal.exporters.collectives.recorder import CollectiveRecorder
from trainhealth._internal.exporters.collectives.wrappers import wrap
from trainhealth._internal.store import MetricStore


@contextmanager
def _failing_in_flight_marks(recorder: CollectiveRecorder, failures: int) -> Iterator[None]:
    """``recorder`` raising on its next ``failures`` in-flight marks (``_current = (op, group, seq, t0)``), which
    come right after a call is numbered: our own bookkeeping failing where the peers have numbered it too."""
    left, base = [failures], type(recorder)

    class Failing(base):  # type: ignore[valid-type,misc]
        @property
        def _current(self):
            return self.__dict__.get("_current")

        @_current.setter
        def _current(self, value):
            if value is not None and left[0] > 0:
                left[0] -= 1
                raise RuntimeError("the in-flight mark failed")
            self.__dict__["_current"] = value

    recorder.__class__ = Failing
    try:
        yield
    finally:
        recorder.__class__ = base
    assert left[0] == 0, "fewer calls than failures"


def test_a_receive_from_any_source_that_fails_is_called_once_and_recorded_as_failed(one_rank):
    calls = []

    def failing_recv(tensor, src=None, group=None, tag=0, group_src=None):  # torch's receive, timing out
        calls.append(src)
        raise RuntimeError("Timed out waiting 1000ms for recv operation to complete")

    assert list(inspect.signature(failing_recv).parameters) == list(inspect.signature(dist.recv).parameters)
    recorder = CollectiveRecorder(rank=0)
    recv = wrap(recorder, "recv", failing_recv)
    with pytest.raises(RuntimeError, match="Timed out"):
        recv(torch.zeros(4))
    assert calls == [None]  # not retried: a second wait, or a later message received in its place
    assert recorder._current is None
    assert recorder.failure is not None and recorder.failure.op == "recv" and "Timed out" in recorder.failure.error


def test_our_bookkeeping_failing_is_counted_and_leaves_nothing_in_flight(one_rank):
    with Monitor(
        env={},
        comm=True,
        gpu_backend="off",
        prometheus_addr="127.0.0.1",
        prometheus_port=0,
        otel=False,
        comm_flush_interval=0.1,
    ) as monitor:
        comm = monitor.comm
        t = torch.ones(4)
        dist.all_reduce(t)
        with _failing_in_flight_marks(comm, 2):  # our own code raising inside the wrapper, after numbering the call
            dist.all_reduce(t)  # runs, unrecorded
            dist.all_reduce(t)
        assert t.tolist() == [1.0] * 4  # each ran once (a sum over one rank)
        assert comm._current is None  # no false hang
        group = next(iter(comm._seq))
        assert comm._seq[group] == comm._completed[group] == 2  # numbered as on the peers, and completed
        dist.all_reduce(t)
        assert comm._completed[group] == 3
        comm.flush()
        got = scrape(monitor.metrics_url)
        assert got.value("trainhealth_exporter_errors_total", source="comm_bookkeeping") == 2
        assert not got.labels_of("trainhealth_comm_failures_total")  # our failure is not the job's


def test_a_send_whose_bookkeeping_fails_still_sends_once(one_rank):
    sent = []

    def send(tensor, dst=None, group=None, tag=0, group_dst=None):  # torch's send, delivering
        sent.append(dst)

    assert list(inspect.signature(send).parameters) == list(inspect.signature(dist.send).parameters)
    recorder = CollectiveRecorder(rank=0)
    recorder.store = MetricStore()
    with _failing_in_flight_marks(recorder, 1):
        wrap(recorder, "send", send)(torch.ones(2), 1)
    assert sent == [1] and recorder._current is None
    group = next(iter(recorder._seq))
    assert recorder._completed[group] == recorder._seq[group] == 0
