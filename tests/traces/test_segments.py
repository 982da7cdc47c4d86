"""Append-only trace segments: whole gzip members, a cut last member dropped, restarts kept apart."""

from __future__ import annotations

import gzip
import logging

import pytest

from trainhealth._internal.traces.segments import SegmentWriter
from trainhealth.traces import TraceError, read_trace, read_trace_file


def _rows(steps: range) -> list[dict]:
    return [{"rank": 0, "step": step, "op": "step", "start": float(step), "duration": 1.0} for step in steps]


def test_a_member_cut_mid_write_is_dropped_and_the_whole_ones_are_read(tmp_path, caplog):
    writer = SegmentWriter(tmp_path, "rank-0", durable=False)
    path = writer.append(_rows(range(0, 5)))
    writer.append(_rows(range(5, 9)))
    data = path.read_bytes()
    second = gzip.compress(
        b"".join(b'{"rank":0,"step":%d,"op":"step","start":1.0,"duration":1.0}\n' % s for s in range(9, 12))
    )
    path.write_bytes(data + second[: len(second) // 2])  # what SIGKILL during the third append leaves
    with caplog.at_level(logging.WARNING):
        records = read_trace_file(path)
    assert list(records["step"]) == list(range(9))
    assert "cut off mid-write" in caplog.text


def test_a_file_without_one_whole_member_is_an_error(tmp_path):
    path = SegmentWriter(tmp_path, "rank-0", durable=False).append(_rows(range(3)))
    path.write_bytes(path.read_bytes()[:-12])
    with pytest.raises(TraceError, match="not a readable JSONL.GZ file"):
        read_trace_file(path)


def test_segments_roll_over_at_their_size(tmp_path):
    writer = SegmentWriter(tmp_path, "rank-1", segment_bytes=1, durable=False)
    names = [writer.append(_rows(range(step, step + 1))).name for step in range(3)]
    assert names == ["rank-1.0000.jsonl.gz", "rank-1.0001.jsonl.gz", "rank-1.0002.jsonl.gz"]
    assert list(read_trace([tmp_path]).records["step"]) == [0, 1, 2]


def test_a_restarted_writer_moves_the_earlier_run_aside(tmp_path):
    SegmentWriter(tmp_path, "rank-0", durable=False).append(_rows(range(0, 4)))
    SegmentWriter(tmp_path, "rank-1", durable=False).append(_rows(range(0, 4)))
    SegmentWriter(tmp_path, "rank-0", durable=False).append(_rows(range(0, 2)))  # the job restarted
    SegmentWriter(tmp_path, "rank-0", durable=False).append(_rows(range(0, 1)))  # and again
    assert list(read_trace([tmp_path / "previous-1"]).records["step"]) == [0, 1, 2, 3]
    assert list(read_trace([tmp_path / "previous-2"]).records["step"]) == [0, 1]
    assert sorted(p.name for p in tmp_path.iterdir() if p.is_file()) == ["rank-0.0000.jsonl.gz", "rank-1.0000.jsonl.gz"]
    assert list(read_trace([tmp_path / "rank-0.0000.jsonl.gz"]).records["step"]) == [0]
    assert list(read_trace([tmp_path / "rank-1.0000.jsonl.gz"]).records["step"]) == [0, 1, 2, 3]


def test_a_fifo_at_the_segment_name_is_skipped(tmp_path):
    import os

    os.mkfifo(tmp_path / "rank-0.0000.jsonl.gz")
    path = SegmentWriter(tmp_path, "rank-0", durable=False).append(_rows(range(2)))
    assert path.name == "rank-0.0001.jsonl.gz"
