"""Every detector honours the API: warm-up, score before learning, vectors = per-series scalars,
bounded state, protection through the mask, cloning and pickling, parameters as dataclass fields."""

from __future__ import annotations

import dataclasses
import inspect
import pickle
import tracemalloc

import numpy as np
import pytest

from trainhealth._internal.detectors.spec import DETECTORS

FAST = {"stl": {"window": 48, "refit_every": 16, "period": 8}, "spike": {"window": 60}}


def make(name: str):
    return DETECTORS[name](**FAST.get(name, {}))


def series(n_series: int, length: int, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    t = np.arange(length)[:, None]
    return 5.0 + np.sin(2 * np.pi * t / 8) * 0.1 + rng.normal(0, 0.05, (length, n_series)) * (1 + np.arange(n_series))


TEMPORAL = sorted(set(DETECTORS) - {"nonfinite", "peer"})


@pytest.mark.parametrize("name", TEMPORAL)
def test_no_verdict_during_warm_up(name):
    detector = make(name)
    data = series(2, detector.warmup + 5)
    for row in data[: detector.warmup]:
        assert np.isnan(detector.score(row)).all(), name
        detector.learn(row)
    assert not np.isnan(detector.score(data[detector.warmup])).any()


@pytest.mark.parametrize("name", TEMPORAL)
def test_scoring_does_not_learn(name):
    detector = make(name)
    data = series(3, detector.warmup + 40)
    for row in data:
        detector.learn(row)
    first = detector.score(data[-1] + 3.0)
    second = detector.score(data[-1] + 3.0)
    np.testing.assert_array_equal(first, second)


@pytest.mark.parametrize("name", sorted(DETECTORS))
def test_one_vector_call_equals_per_series_scalar_calls(name):
    if name == "peer":  # compares series with each other: no per-series equivalent
        return
    data = series(4, make(name).warmup + 60, seed=3)
    data[-5, 2] = 50.0  # an outlier in one series
    data[-3, 1] = np.nan
    vector = make(name)
    scalars = [make(name) for _ in range(4)]
    for row in data:
        got = vector.update(row)
        expected = np.array([scalars[i].update([row[i]])[0] for i in range(4)])
        np.testing.assert_allclose(got, expected, rtol=1e-9, atol=1e-12, equal_nan=True)


# level_shift keeps adding evidence to its CUSUM for protected points (only its reference window
# is protected), stl feeds protected points in as their expectation (to keep the seasonal phase),
# and spike takes every value (OLMo's definition): each has its own test below.
MASKABLE = sorted(set(TEMPORAL) - {"level_shift", "stl", "spike"})


@pytest.mark.parametrize("name", MASKABLE)
def test_masked_series_keep_their_state(name):
    detector = make(name)
    data = series(2, detector.warmup + 30)
    for row in data:
        detector.learn(row)
    probe = data[-1] * 1.5  # far enough out that the score depends on the whole baseline
    before = detector.score(probe)
    detector.learn(np.array([1e6, 1e6]), mask=np.array([False, True]))
    after = detector.score(probe)
    assert after[0] == pytest.approx(before[0], rel=1e-12)
    assert after[1] != pytest.approx(before[1], rel=1e-6)


def test_level_shift_protects_its_reference_but_accumulates_evidence():
    detector = make("level_shift")
    data = series(1, 120)
    for row in data:
        detector.learn(row)
    reference = detector.expected().copy()
    assert detector.score(data[-1] + 0.5)[0] > 0
    for _ in range(3):
        detector.learn(data[-1] + 0.5, mask=np.array([False]))
    np.testing.assert_array_equal(detector.expected(), reference)
    assert detector.score(data[-1] + 0.5)[0] > detector.default_threshold


def test_level_shift_min_relative_ignores_small_shifts_of_a_quiet_series():
    # a step time of 130 ms with 1% noise that moves 8% for a while (a shared host), then a +50% straggler
    rng = np.random.default_rng(3)
    quiet = 0.130 * (1 + 0.01 * rng.normal(size=200))
    level = np.concatenate([quiet[:100], quiet[100:160] * 1.08, quiet[160:]])
    straggling = np.concatenate([level, 0.195 * (1 + 0.01 * rng.normal(size=20))])

    def alarms(detector, values):
        return [i for i, x in enumerate(values) if detector.update([x])[0] > detector.default_threshold]

    assert alarms(DETECTORS["level_shift"](direction="up"), level)  # 8 sigma: the noise alone flags it
    floored = DETECTORS["level_shift"](direction="up", min_relative=0.2)
    found = alarms(floored, straggling)
    assert found and min(found) >= 200 and min(found) - 200 <= 5  # only the straggler, within 5 steps
    with pytest.raises(ValueError, match="min_relative"):
        DETECTORS["level_shift"](min_relative=-1)


def test_stl_takes_a_protected_point_in_as_its_expectation():
    detector = make("stl")
    data = series(1, 100)
    for row in data:
        detector.learn(row)
    protected, plain = detector.clone(), detector.clone()
    for copy in (protected, plain):
        for row in data:
            copy.learn(row)
    protected.learn(data[-1] + 100.0, mask=np.array([False]))
    plain.learn(data[-1] + 100.0)
    assert np.nanmax(protected._values.values()) < 10 < np.nanmax(plain._values.values())


@pytest.mark.parametrize("name", TEMPORAL)
def test_state_is_bounded(name):
    detector = make(name)
    rng = np.random.default_rng(1)
    for _ in range(3 * detector.warmup + 200):
        detector.update(rng.normal(size=8))
    tracemalloc.start()
    base = tracemalloc.get_traced_memory()[0]
    for _ in range(2000):
        detector.update(rng.normal(size=8))
    grown = tracemalloc.get_traced_memory()[0] - base
    tracemalloc.stop()
    assert grown < 64_000, f"{name} grew {grown} bytes over 2,000 updates"


@pytest.mark.parametrize("name", sorted(DETECTORS))
def test_clone_and_pickle(name):
    detector = make(name)
    data = series(2, detector.warmup + 20)
    for row in data:
        detector.update(row)
    restored = pickle.loads(pickle.dumps(detector))
    np.testing.assert_array_equal(restored.score(data[-1]), detector.score(data[-1]))
    fresh = detector.clone()
    assert fresh.params() == detector.params() and fresh.n_series is None


# The constructors' keywords and defaults, in order: the detector spec (``name(key=value)``) and any
# caller passing them by position depend on them.
SIGNATURES = {
    "bocpd": {
        "expected_run": 250.0,
        "max_run": 200,
        "recent": 5,
        "warmup": 30,
        "direction": "both",
        "log": False,
        "min_scale": 1e-12,
    },
    "delta": {"delta": 1.5, "window": 50, "warmup": 10, "rate_window": 100},
    "divergence": {"window": 50, "warmup": 50, "k": 0.5, "clip": 4.0, "log": True, "min_scale": 1e-3},
    "iqr": {"window": 100, "warmup": 20, "direction": "both", "min_iqr": 1e-12, "refresh": None},
    "level_shift": {
        "window": 100,
        "warmup": 50,
        "k": 0.5,
        "clip": 4.0,
        "direction": "both",
        "adapt_after": None,
        "min_relative": 0.0,
        "min_scale": 1e-12,
        "refresh": None,
    },
    "nonfinite": {},
    "peer": {"direction": "both", "min_relative": 0.03, "min_peers": 3},
    "rarity": {"history": 4096, "warmup": 100, "tail": 0.1, "direction": "both", "refit_every": 32, "min_scale": 1e-12},
    "robust_z": {"window": 100, "warmup": 20, "direction": "both", "min_scale": 1e-12, "refresh": None},
    "spike": {"window": 1000, "sigmas": 7.0, "min_periods": None},
    "stl": {"period": None, "window": None, "refit_every": 64, "direction": "both", "min_scale": 1e-12},
    "zscore": {"window": 100, "warmup": 20, "direction": "both", "min_std": 1e-12},
}


def test_constructor_keywords_and_defaults():
    assert set(SIGNATURES) == set(DETECTORS)
    for name, cls in DETECTORS.items():
        parameters = inspect.signature(cls).parameters.values()
        assert [(p.name, p.default) for p in parameters] == list(SIGNATURES[name].items()), name


@pytest.mark.parametrize("name", sorted(DETECTORS))
def test_parameters_are_the_dataclass_fields_and_state_is_not(name):
    detector = make(name)
    assert dataclasses.is_dataclass(detector)
    assert list(detector.params()) == [f.name for f in dataclasses.fields(detector) if f.init]
    assert list(detector.params()) == list(SIGNATURES[name])
    before = detector.params()
    for row in series(2, detector.warmup + 5):
        detector.update(row)
    assert detector.params() == before
    cls = type(detector)
    assert eval(repr(detector), {cls.__name__: cls}).params() == before  # repr shows the constructor call
    assert detector != detector.clone() and len({detector, detector.clone()}) == 2  # identity, as any stateful object


def test_resolved_defaults_are_the_parameters():
    assert DETECTORS["spike"](window=30).params()["min_periods"] == 30
    assert DETECTORS["level_shift"](window=60, warmup=10).params()["adapt_after"] == 60
    assert DETECTORS["stl"](period=12).params()["window"] == 96
    assert DETECTORS["stl"]().warmup == 256


def test_the_series_count_is_fixed_by_the_first_update():
    detector = make("zscore")
    detector.update([1.0, 2.0])
    with pytest.raises(ValueError, match="expected 2 values"):
        detector.update([1.0, 2.0, 3.0])


def test_invalid_parameters_fail_at_construction():
    with pytest.raises(ValueError):
        DETECTORS["zscore"](window=5, warmup=10)
    with pytest.raises(ValueError):
        DETECTORS["delta"](delta=0.9)
    with pytest.raises(ValueError):
        DETECTORS["stl"](period=100, window=150)
    with pytest.raises(ValueError):
        DETECTORS["peer"](min_peers=2)
    with pytest.raises(ValueError):
        DETECTORS["spike"](window=10, min_periods=20)
    with pytest.raises(ValueError):
        DETECTORS["level_shift"](k=1.0, clip=1.0)
    with pytest.raises(ValueError):
        DETECTORS["iqr"](warmup=0)
