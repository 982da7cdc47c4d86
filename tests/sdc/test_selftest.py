"""``trainhealth selftest``: passes on a sound device, catches an injected corruption, exits 2 on bad input."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from trainhealth._internal.injectors.bits import flip_bits
from trainhealth._internal.sdc.selftest import CHECKS, run_selftest

TRAINHEALTH = str(Path(sys.executable).parent / "trainhealth")


def _run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([TRAINHEALTH, "selftest", *args], capture_output=True, text=True, timeout=120, check=False)


def test_a_sound_cpu_passes_and_writes_textfile_metrics(tmp_path):
    done = _run("--device", "cpu", "--size", "128", "--json", "--metrics-file", str(tmp_path / "selftest.prom"))
    assert done.returncode == 0, done.stderr
    results = json.loads(done.stdout)
    assert {r["check"] for r in results} == set(CHECKS) and all(r["passed"] for r in results)
    assert all(r["max_error"] <= r["tolerance"] for r in results)
    families = {f.name: f for f in text_string_to_metric_families((tmp_path / "selftest.prom").read_text())}
    passed = families["trainhealth_selftest_passed"].samples
    assert {s.labels["check"] for s in passed} == set(CHECKS) and all(s.value == 1.0 for s in passed)
    assert families["trainhealth_selftest_timestamp_seconds"].samples[0].value > 1.7e9


@pytest.mark.parametrize("check, bit", [("gemm", 22), ("reduction", 20), ("elementwise", 18)])
def test_one_corrupted_element_fails_its_check(check, bit):
    def corrupt(device, name, result):
        if name == check:
            flip_bits(result.view(-1), [7], bit)

    results = {r.check: r for r in run_selftest(["cpu"], size=128, inject=corrupt)}
    assert not results[check].passed and results[check].max_error > results[check].tolerance
    assert all(r.passed for name, r in results.items() if name not in (check, "repeat"))


def test_a_gemm_that_is_not_repeatable_fails():
    def second_run_differs(device, name, result):
        if name == "repeat":
            flip_bits(result.view(-1), [0], 0)  # the last mantissa bit: within tolerance, not bit-identical

    results = {r.check: r for r in run_selftest(["cpu"], size=64, inject=second_run_differs)}
    assert results["gemm"].passed and not results["repeat"].passed


@pytest.mark.parametrize(
    "args, message",
    [
        (("--device", "cuda:7"), "unknown device 'cuda:7'"),
        (("--size", "4"), "--size: expected an integer from 16 to 8192"),
        (("--frobnicate",), "unrecognized arguments"),
    ],
)
def test_bad_input_is_one_line_and_status_2(args, message):
    done = _run(*args)
    assert done.returncode == 2 and message in done.stderr
    assert "Traceback" not in done.stderr


def test_the_failing_exit_status_is_1(tmp_path):
    # the CLI's own failure path, on a real run whose GEMM is corrupted through the documented inject hook
    script = tmp_path / "corrupt.py"
    script.write_text(
        "import sys\n"
        "from trainhealth._internal.injectors.bits import flip_bits\n"
        "import trainhealth._internal.sdc.selftest as s\n"
        "real = s.run_selftest\n"
        "s.run_selftest = lambda devices, size, seed: real(devices, size, seed, inject=lambda d, c, r: "
        "flip_bits(r.view(-1), [3], 29) if c == 'gemm' else None)\n"
        "from trainhealth._internal.cli import main\n"
        "sys.exit(main(['selftest', '--device', 'cpu', '--size', '64']))\n"
    )
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 1
    assert "FAIL" in done.stdout and "selftest: FAILED on cpu" in done.stdout
