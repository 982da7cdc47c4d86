"""The pairwise link probe: real gloo ranks on loopback, and in network namespaces with one link rate-limited."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.distributed import init_rank, run_ranks
from trainhealth._internal.exporters.collectives.probe import (
    PROBE_FORMAT,
    LinkMeasurement,
    LinkMetric,
    ProbeResult,
    SlowRank,
    probe_links,
    round_robin,
)
from trainhealth_lab.netns import NetLab

WORLD = 4
PAIRS = {(a, b) for a in range(WORLD) for b in range(a + 1, WORLD)}


def _probe_three_times(rank: int, world: int, port: int, out: str) -> None:
    import torch.distributed as dist

    init_rank(rank, world, port)
    try:
        for run in range(3):
            result = probe_links(sizes=(4096, 256 * 1024), repeats=5, timeout_s=30)
            result.to_json(Path(out) / f"run{run}-rank{rank}.json")
    finally:
        dist.destroy_process_group()


def test_healthy_loopback_run_has_every_pair_and_blames_no_rank(tmp_path):
    run_ranks(_probe_three_times, WORLD, str(tmp_path), timeout_s=180)
    for run in range(3):
        texts = {(tmp_path / f"run{run}-rank{rank}.json").read_text() for rank in range(WORLD)}
        assert len(texts) == 1  # the same result on every rank
        result = ProbeResult.load(tmp_path / f"run{run}-rank0.json")
        assert result.ranks == (0, 1, 2, 3) and result.complete and result.sizes == (4096, 256 * 1024)
        assert {(m.source, m.target) for m in result.measurements} == PAIRS
        for m in result.measurements:
            assert m.failed is None and 0 < m.latency_s < 1 and m.bandwidth_bytes_per_s > 1e6
        assert result.slow_ranks() is None, result.render()
        assert "no rank stands out" in result.render()


def test_round_robin_puts_each_rank_in_one_pair_per_round():
    for n in range(2, 9):
        rounds = round_robin(list(range(n)))
        pairs = [pair for pairs in rounds for pair in pairs]
        assert sorted(pairs) == sorted((a, b) for a in range(n) for b in range(a + 1, n))
        for pairs in rounds:
            members = [rank for pair in pairs for rank in pair]
            assert len(members) == len(set(members))


def _synthetic(slow: int | None, *, failed: bool = False) -> ProbeResult:
    links = []
    for index, (a, b) in enumerate(sorted(PAIRS)):
        wobble = 1 + 0.05 * ((index * 7) % 3 - 1)
        factor = 4.0 if slow in (a, b) else 1.0
        links.append(
            LinkMeasurement(
                a,
                b,
                2e-5 * wobble,
                1e9 * wobble / factor,
                0.1,
                0.03,
                "RuntimeError: timed out" if failed and slow in (a, b) else None,
            )
        )
    return ProbeResult(tuple(links), tuple(range(WORLD)), {r: f"node-{r}" for r in range(WORLD)}, (4096, 1 << 20), 5)


def test_slow_ranks_names_the_rank_with_all_links_slow():
    slow = _synthetic(2).slow_ranks()
    assert isinstance(slow, SlowRank)
    assert (slow.rank, slow.host, slow.metric) == (2, "node-2", LinkMetric.BANDWIDTH)
    assert slow.factor == pytest.approx(4.0, rel=0.1) and slow.threshold >= 1.5
    assert _synthetic(None).slow_ranks() is None
    assert _synthetic(1, failed=True).slow_ranks().factor == math.inf
    two_ranks = ProbeResult((LinkMeasurement(0, 1, 1e-3, 1e3),), (0, 1), {0: "a", 1: "b"})
    assert two_ranks.slow_ranks() is None and "fewer than 3" in two_ranks.render()


def test_json_round_trips_and_is_documented_format(tmp_path):
    result = _synthetic(3, failed=True)
    path = tmp_path / "probe.json"
    result.to_json(path)
    text = path.read_text()
    assert text.endswith("\n") and json.loads(text)["format"] == PROBE_FORMAT
    assert "Infinity" not in text  # strict JSON: a failed link's latency is null
    assert ProbeResult.load(path) == result
    with pytest.raises(ValueError, match="format"):
        ProbeResult.from_dict({"measurements": []})


def test_probe_needs_torch_distributed_initialised():
    with pytest.raises(RuntimeError, match="init_process_group"):
        probe_links()
    with pytest.raises(ValueError, match="sizes"):
        probe_links(sizes=(4096,))


def _cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    environment = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")}
    environment.update(env or {})
    return subprocess.run(
        [sys.executable, "-m", "trainhealth._internal.cli", "probe", *args],
        capture_output=True,
        text=True,
        env=environment,
        timeout=60,
    )


@pytest.mark.parametrize(
    "args",
    [["--out", "p.json", "--sizes", "4096"], ["--out", "p.json", "--repeats", "x"], ["--bogus"], ["--out", "p.json"]],
)
def test_cli_bad_arguments_exit_2_with_one_line(args):
    result = _cli(*args)
    assert result.returncode == 2
    assert len(result.stderr.strip().splitlines()) == 1 and result.stderr.startswith("trainhealth: error:")


REASON = NetLab.available()


@pytest.mark.skipif(REASON is not None, reason=f"NetLab unavailable: {REASON}")
@pytest.mark.slow
def test_probe_command_names_the_rate_limited_rank_in_network_namespaces(tmp_path):
    slow, port = 2, 29611
    with NetLab(WORLD, prefix="thprobe") as lab:
        lab.slow_link(slow, rate_mbit=50)
        processes = []
        for rank, host in enumerate(lab.hosts):
            env = dict(
                os.environ,
                RANK=str(rank),
                WORLD_SIZE=str(WORLD),
                MASTER_ADDR=lab.hosts[0].address,
                MASTER_PORT=str(port),
                GLOO_SOCKET_IFNAME=host.interface,
                NODE_NAME=host.name,
            )
            argv = [
                sys.executable,
                "-m",
                "trainhealth._internal.cli",
                "probe",
                "--out",
                str(tmp_path / "probe.json"),
                "--sizes",
                "4096,262144",
                "--repeats",
                "4",
                "--timeout",
                "60",
            ]
            processes.append(
                subprocess.Popen(
                    lab.command(rank, argv), env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
                )
            )
        deadline = time.monotonic() + 150
        outputs = []
        try:
            for process in processes:
                outputs.append(process.communicate(timeout=max(1.0, deadline - time.monotonic()))[0])
        finally:
            for process in processes:
                process.kill()
                process.wait()
        assert [p.returncode for p in processes] == [0] * WORLD, "\n".join(outputs)
    result = ProbeResult.load(tmp_path / "probe.json")
    found = result.slow_ranks()
    assert found is not None, result.render()
    assert (found.rank, found.host, found.metric) == (slow, f"thprobe-h{slow}", LinkMetric.BANDWIDTH)
    slow_links = [m.bandwidth_bytes_per_s for m in result.links_of(slow)]
    assert max(slow_links) < 50e6 / 8 * 1.3  # the 50 Mbit/s limit, measured through gloo
    assert f"slow link: rank {slow} (thprobe-h{slow})" in outputs[0]
