"""The divergence detector: a healthy descent with warm-up and an LR step decay (real training of a small
model) raises nothing; a slowly rising loss is flagged long before it has risen 10x."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from trainhealth._internal.detectors.divergence import Divergence
from trainhealth._internal.detectors.spec import parse_item
from trainhealth._internal.detectors.watch import Watch


def train(steps: int, *, seed: int) -> np.ndarray:
    """The minibatch losses of a small MLP regressing a fixed random teacher: AdamW, gradients clipped at 1, 30
    warm-up steps, the learning rate divided by 10 at step 200."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # a tiny model: more threads only contend
    try:
        return _train(steps, seed=seed)
    finally:
        torch.set_num_threads(threads)


def _train(steps: int, *, seed: int) -> np.ndarray:
    torch.manual_seed(seed)
    generator = torch.Generator().manual_seed(seed)
    teacher = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))
    model = torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.Tanh(), torch.nn.Linear(32, 1))
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.01)
    losses = []
    for step in range(steps):
        lr = 0.01 * min(1.0, (step + 1) / 30) * (0.1 if step >= 200 else 1.0)
        for group in optimizer.param_groups:
            group["lr"] = lr
        inputs = torch.randn(16, 8, generator=generator)
        with torch.no_grad():
            targets = teacher(inputs) + 0.05 * torch.randn(16, 1, generator=generator)
        loss = torch.nn.functional.mse_loss(model(inputs), targets)
        optimizer.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        losses.append(loss.item())
    return np.array(losses)


def openings(item: str, values: np.ndarray, skip: int = 20) -> list[int]:
    """Steps where an event opens, with the decision step of the spec, fed from ``skip`` on as the Monitor does."""
    spec = parse_item(item, "loss")
    watch = Watch("loss", spec.detector, decision=spec.decision())
    return [step for step in range(skip, len(values)) if watch.update([values[step]], step=step).opened]


@pytest.fixture(scope="module")
def healthy() -> list[np.ndarray]:
    return [train(400, seed=seed) for seed in range(3)]


def test_a_healthy_descent_with_warm_up_and_a_step_decay_raises_nothing(healthy):
    for losses in healthy:
        assert losses[-50:].mean() < 0.5 * losses[20:50].mean()  # it did learn
        assert openings("divergence", losses) == []


def test_a_slowly_rising_loss_is_flagged_long_before_it_rises_tenfold(healthy):
    # real minibatch noise (about 0.38 in log units) on a real descent, then +2% a step from step 250
    for losses in healthy:
        rising = losses * np.exp(0.02 * np.maximum(np.arange(len(losses)) - 250, 0))  # 10x at step 365
        found = openings("divergence", rising)
        assert found and 250 < found[0] < 250 + np.log(4) / 0.02, found  # before it has risen 4x: 46+ steps early


def test_one_spike_adds_at_most_clip_minus_k():
    detector = Divergence(warmup=20)
    rng = np.random.default_rng(0)
    for x in np.exp(rng.normal(0, 0.01, 60)):
        detector.update([x])
    assert detector.score([1e6])[0] == pytest.approx(detector.clip - detector.k, abs=1e-9)
    assert detector.score([0.5])[0] == 0.0  # a drop is no evidence


def test_vectorised_equals_per_series_and_warm_up_is_nan():
    rng = np.random.default_rng(1)
    data = np.exp(np.cumsum(rng.normal(0.001, 0.02, (120, 3)), axis=0))
    data[70, 1] = np.nan
    data[80, 2] = -1.0  # no logarithm: no verdict, not learnt
    vector = Divergence(window=20, warmup=15)
    scalars = [Divergence(window=20, warmup=15) for _ in range(3)]
    for step, row in enumerate(data):
        got = vector.update(row)
        expected = [scalars[i].update([row[i]])[0] for i in range(3)]
        np.testing.assert_allclose(got, expected, equal_nan=True)
        assert np.isnan(got).all() == (step < 15)
    assert np.isnan(got[1]) is np.False_ and np.isnan(vector.score(data[80])[2])


def test_linear_scale_and_clone_keep_the_parameters():
    detector = Divergence(window=30, warmup=10, k=0.5, log=False)
    for x in [-1.0, 1.0] * 10:  # negative values are fine without the logarithm
        detector.update([x])
    assert np.isfinite(detector.score([0.0])[0])
    assert detector.clone().params() == detector.params()
    assert detector.clone().n_series is None


@pytest.mark.parametrize(
    "arguments, name",
    [
        ({"window": 1}, "window"),
        ({"warmup": 1}, "warmup"),
        ({"k": 5.0, "clip": 4.0}, "k"),
        ({"min_scale": 0.0}, "min_scale"),
    ],
)
def test_bad_parameters_raise_naming_them(arguments, name):
    with pytest.raises(ValueError, match=name):
        Divergence(**arguments)
