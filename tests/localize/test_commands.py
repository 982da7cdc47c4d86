"""``trainhealth sim`` and ``trainhealth localize`` as a user runs them, and their errors."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.data import data_dir, needs

TRAINHEALTH = str(Path(sys.executable).parent / "trainhealth")
DATA = data_dir("straggler-analysis")


def _run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([TRAINHEALTH, *args], capture_output=True, text=True, timeout=300, check=False)


def test_simulate_then_localize(tmp_path):
    made = _run(
        "sim",
        "--dp",
        "4",
        "--pp",
        "2",
        "--tp",
        "8",
        "--fault",
        "nic:19:1.6:5",
        "--seed",
        "3",
        "-o",
        str(tmp_path / "sim"),
    )
    assert made.returncode == 0, made.stderr
    assert made.stdout.startswith("SIMULATED trace: 64 GPUs (dp=4, pp=2, tp=8)")
    truth = json.loads((tmp_path / "sim" / "ground_truth.json").read_text())
    assert truth["faults"][0]["component"] == "nic:rank-19" and truth["verdict"] == "communication"

    found = _run("localize", str(tmp_path / "sim"), "--json")
    assert found.returncode == 0, found.stderr
    result = json.loads(found.stdout)
    assert result["verdict"] == "communication" and result["simulated"] is True
    assert result["suspects"][0]["component"] == "nic:rank-19" and result["suspects"][0]["kind"] == "link"
    assert {"verdict", "suspects", "irregular_steps", "advice"} <= set(result)

    text = _run(
        "localize", str(tmp_path / "sim" / "trace.parquet"), "--topology", str(tmp_path / "sim" / "topology.json")
    )
    assert text.returncode == 0 and "1. nic:rank-19" in text.stdout and "(input is SIMULATED)" in text.stdout


@needs("straggler-analysis")
def test_localize_reads_the_importers_formats_and_windows():
    result = _run("localize", str(DATA / "trace-AR.parquet"), "--last", "10", "--json")
    assert result.returncode == 0, result.stderr
    parsed = json.loads(result.stdout)
    assert parsed["verdict"] == "compute" and parsed["suspects"][0]["ranks"] == [0]
    assert parsed["window"]["ranks"] == 16


@pytest.mark.parametrize(
    "args, message",
    [
        (["sim", "--fault", "gpu:x:2", "-o", "{tmp}/s"], "--fault 'gpu:x:2'"),
        (["sim", "--fault", "cable:1:2", "-o", "{tmp}/s"], "unknown kind 'cable'"),
        (["sim", "--fault", "gpu:999:2", "-o", "{tmp}/s"], "outside the cluster"),
        (["sim", "--dp", "3", "--ep", "2", "-o", "{tmp}/s"], "ep must divide dp"),
        (["sim", "--bogus", "-o", "{tmp}/s"], "unrecognized arguments: --bogus"),
        (["localize", "{tmp}/missing.parquet"], "no such file or directory"),
        (["localize", "{tmp}/bad.jsonl"], "bad.jsonl"),
        (["localize", "{tmp}/ok.jsonl", "--last", "0"], "argument --last: expected a whole number of steps from 1"),
        (["localize", "{tmp}/ok.jsonl", "--gpu-z", "-1"], "argument --gpu-z: expected a number above 0"),
        (["localize", "{tmp}/ok.jsonl", "--topology", "{tmp}/bad-topology.json"], "not valid JSON"),
    ],
)
def test_bad_input_is_one_line_and_exit_status_2(tmp_path, args, message):
    (tmp_path / "bad.jsonl").write_text('{"rank": 0, "step": 0, "op": "all_reduce", "start": 0.0}\n')
    (tmp_path / "ok.jsonl").write_text(
        '{"rank": 0, "step": 0, "op": "all_reduce", "group": "dp0", "seq": 0, "start": 0.0, "duration": 0.1}\n'
        '{"rank": 1, "step": 0, "op": "all_reduce", "group": "dp0", "seq": 0, "start": 0.0, "duration": 0.2}\n'
    )
    (tmp_path / "bad-topology.json").write_text("{not json")
    result = _run(*[arg.format(tmp=tmp_path) for arg in args])
    assert result.returncode == 2, result.stdout + result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("trainhealth: error:") and message in lines[0], result.stderr
    assert "Traceback" not in result.stderr


TINY_TRACES = {
    # two ranks in one collective: nothing repeats, so no steps can be told apart
    "one collective": (
        '{"rank": 0, "step": 0, "op": "all_reduce", "group": "dp0", "seq": 0, "start": 0.0, "duration": 0.1}\n'
        '{"rank": 1, "step": 0, "op": "all_reduce", "group": "dp0", "seq": 0, "start": 0.0, "duration": 0.2}\n',
        "repeating pattern",
    ),
    # three compute records of two ranks: the recorded path once called this "imbalance" (uneven batches)
    "three compute records": (
        '{"rank": 0, "step": 0, "op": "compute", "start": 0.0, "duration": 0.1}\n'
        '{"rank": 1, "step": 0, "op": "compute", "start": 0.0, "duration": 0.3}\n'
        '{"rank": 0, "step": 1, "op": "compute", "start": 0.2, "duration": 0.1}\n',
        "2 steps in the trace",
    ),
}


@pytest.mark.parametrize("name", sorted(TINY_TRACES))
def test_a_tiny_trace_is_insufficient_data_not_a_verdict(tmp_path, name):
    text, reason = TINY_TRACES[name]
    (tmp_path / "tiny.jsonl").write_text(text)
    result = _run("localize", str(tmp_path / "tiny.jsonl"), "--json")
    assert result.returncode == 0, result.stderr
    answer = json.loads(result.stdout)
    assert answer["verdict"] == "insufficient_data" and answer["suspects"] == []
    assert reason in answer["reasons"][0]


def test_localize_leaves_the_columns_it_does_not_use_unread(tmp_path):
    """A bad value in a column the localizer never reads (gpu, peer) does not stop it; trace info still names it."""
    import pandas as pd

    pd.DataFrame(
        {
            "rank": [0, 1, 0],
            "step": [0, 0, 1],
            "op": ["compute"] * 3,
            "start": [0.0, 0.0, 0.2],
            "duration": [0.1, 0.3, 0.1],
            "gpu": [0, -1, 0],
        }
    ).to_parquet(tmp_path / "trace.parquet")
    result = _run("localize", str(tmp_path / "trace.parquet"), "--json")
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["verdict"] == "insufficient_data"
    info = _run("trace", "info", str(tmp_path / "trace.parquet"))
    assert info.returncode == 2 and "column 'gpu': negative value -1" in info.stderr, info.stderr
