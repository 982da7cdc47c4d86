"""benchmarks/gpu_truth.py, the GPU run of issue 36: refused in one line where there is no GPU, and every
section's code path rehearsed on CPU (simulated GPUs, gloo) so the device's minutes go to figures."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "gpu_truth.py"


def _run(*args: str, timeout: float = 600) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=timeout)


def _has_gpu() -> bool:
    sys.path.insert(0, str(SCRIPT.parent))
    try:
        from gpu_truth import missing_gpu
    finally:
        sys.path.pop(0)
    return missing_gpu() is None


def test_without_a_gpu_it_exits_2_with_one_line_naming_what_is_missing():
    if _has_gpu():
        pytest.skip("a GPU is here: the script runs for real")
    done = _run()
    assert done.returncode == 2, done.stdout + done.stderr
    assert done.stdout == ""
    (line,) = done.stderr.splitlines()
    assert line.startswith("gpu_truth: needs an NVIDIA GPU; missing here: ") and "CUDA" in line, line


def test_an_unknown_section_is_refused_with_status_2():
    done = _run("--sections", "nvml,warp")
    assert done.returncode == 2 and "unknown warp" in done.stderr and "Traceback" not in done.stderr


@pytest.mark.slow
def test_every_section_runs_its_code_path_on_cpu():
    done = _run("--rehearse")
    out = done.stdout
    assert done.returncode == 0 and "FAILED" not in out, out + done.stderr
    assert "CPU rehearsal (simulated GPUs, gloo): no figure below is a GPU figure" in out
    for section in ("nvml", "export", "monitor", "exporter", "nccl", "sdc"):
        assert f"== {section}\n" in out and f"({section}: " in out, section
    assert "sampling pass, all GPUs (median of 20)" in out and "XID events:" in out
    assert "trainhealth export exit status after SIGTERM: 0" in out
    assert "overhead (median over block pairs)" in out and "the step against itself (noise)" in out
    assert "records: 40 all_reduce (20 async) of 40 calls" in out
    assert "NaN provenance, clean: nothing named (rank 0); anomalies: none" in out
    assert (
        "NaN provenance, bit 30 of a gradient of layers.0: nothing named (rank 0); anomalies: nonfinite on grad_norm"
        in out
    )
    assert "NaN provenance, bit 30 of layers.1's output: [{'block': 'layers.1'" in out
    assert (
        "bit 30 flipped in copy 2's layers.0.mlp.0.weight: [Mismatch(rank=2, tensors=('layers.0.mlp.0.weight',))]"
        in out
    )
