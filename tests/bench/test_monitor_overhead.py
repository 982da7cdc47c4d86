"""benchmarks/monitor_overhead.py's arithmetic: what an arm adds, and when a repeat cannot resolve the target."""

from __future__ import annotations

import sys
import threading
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

from monitor_overhead import Arm, _added, _gil_held, summary  # noqa: E402

from trainhealth._internal import _gil  # noqa: E402
from trainhealth._internal.detectors import runner  # noqa: E402
from trainhealth._internal.exporters import steps  # noqa: E402
from trainhealth._internal.sinks import prometheus  # noqa: E402


def _arm(name: str, steps: list[float]) -> Arm:
    return Arm(name, None, None, None, steps, threading.Event())  # type: ignore[arg-type]


def test_an_arm_adds_its_trimmed_mean_ratio_to_the_baselines_block_in_the_same_round():
    base = [1.0, 1.0, 2.0, 2.0, 1.0, 1.0, 3.0, 3.0, 1.0, 1.0]  # the machine drifts between rounds
    slow = [1.01, 1.01, 2.02, 2.02, 1.01, 1.01, 3.03, 3.03, 1.01, 1.01]  # 1% in every round
    assert _added(_arm("slow", slow), _arm("baseline", base), counted=2) == pytest.approx(0.01)
    # one round in five far off (a scrape, the collector) is left out, not averaged in
    spiky = [1.01, 1.01, 2.02, 2.02, 1.5, 1.5, 3.03, 3.03, 1.01, 1.01]
    assert _added(_arm("spiky", spiky), _arm("baseline", base), counted=2) == pytest.approx(0.01)


def test_a_repeat_whose_noise_floor_is_outside_its_bound_cannot_say_the_target_is_met():
    quiet = [{"baseline again": 0.001, "defaults": 0.003}] * 3
    assert (
        summary("transformer", quiet, 0.0025)[-1].endswith("met")
        and "NOT" not in summary("transformer", quiet, 0.0025)[-1]
    )
    noisy = quiet[:2] + [{"baseline again": -0.004, "defaults": 0.003}]
    assert summary("transformer", noisy, 0.0025)[-1].endswith("unresolved (a noise floor is outside its bound)")
    over = [{"baseline again": 0.0, "defaults": 0.006}] * 3
    assert "NOT met" in summary("transformer", over, 0.0025)[-1]
    assert summary("long", over, 0.0025)[-1].endswith(": met")  # the long-sequence model's target is 1%


def test_the_gil_held_arm_turns_off_every_hand_back_while_it_trains_and_restores_them():
    users = (runner, steps, prometheus)
    with _gil_held(True):
        assert all(module.yield_gil is not _gil.yield_gil for module in users)
    assert all(module.yield_gil is _gil.yield_gil for module in users)
    with _gil_held(False):
        assert all(module.yield_gil is _gil.yield_gil for module in users)
