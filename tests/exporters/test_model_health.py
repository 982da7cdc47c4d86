"""Checkpoints, goodput and the loss spike that does not recover, through the Monitor."""

from __future__ import annotations

import random

import pytest
import torch

from trainhealth._internal import catalog
from trainhealth._internal.config import ConfigError, Settings
from trainhealth._internal.exporters.monitor import Monitor


def _monitor(**settings):
    model = torch.nn.Linear(4, 1)
    return Monitor(model, prometheus=False, otel=False, gpu_backend="off", env={}, **settings)


@pytest.mark.parametrize("recovers", [False, True])
def test_a_spike_that_stays_names_the_checkpoint_to_rewind_to(recovers):
    noise = random.Random(0)
    with _monitor() as mon:
        for step in range(300):
            if step in (100, 200, 250):
                mon.checkpoint_saved(step, duration_s=1.5)
            loss = 2.0 - step * 0.001 + noise.gauss(0, 0.01)
            if step >= 260 and not (recovers and step >= 264):
                loss += 3.0
            mon.step(loss=loss, step=step)
        for step in range(300, 320):
            mon.step(loss=2.0 + noise.gauss(0, 0.01) + (0 if recovers else 3.0), step=step)
        mon.flush()
        store = mon.store
        assert store.value(catalog.CHECKPOINT_LAST_STEP) == 250.0
        assert store.value(catalog.CHECKPOINT_SAVES) == 3.0
        assert store.value(catalog.CHECKPOINT_LAST_DURATION) == 1.5
        assert store.value(catalog.TRAIN_LOSS_SPIKE_ONSET_STEP) == 260.0
        assert store.value(catalog.TRAIN_LOSS_SPIKE_UNRECOVERED) == (0.0 if recovers else 1.0)
        events = mon.events.recent("loss_spike_unrecovered")
        if recovers:
            assert events == [] and store.value(catalog.TRAIN_LOSS_SPIKE_REWIND_STEP) is None
        else:
            assert store.value(catalog.TRAIN_LOSS_SPIKE_REWIND_STEP) == 250.0
            assert "Restore the checkpoint of step 250" in events[0].summary
            assert events[0].attributes["checkpoint_step"] == 250


def test_goodput_counts_a_stall_and_redone_steps():
    with _monitor() as mon:
        for step in range(20):
            mon.step(loss=1.0, step=step)
        import time

        time.sleep(0.3)  # a stall: far longer than the steps around it
        mon.step(loss=1.0, step=20)
        for step in range(15, 18):  # rolled back: steps 15-17 again
            mon.step(loss=1.0, step=step)
        mon.flush()
        lost = {labels[0]: value for labels, value in mon.store.series(catalog.TRAIN_LOST_TIME)}
        assert lost["stall"] >= 0.25 and lost["redone"] > 0
        goodput = mon.store.value(catalog.TRAIN_GOODPUT)
        assert 0 < goodput < 0.9


def test_restarts_come_from_torchelastic():
    model = torch.nn.Linear(2, 1)
    with Monitor(
        model, prometheus=False, otel=False, gpu_backend="off", env={"TORCHELASTIC_RESTART_COUNT": "3"}
    ) as mon:
        assert mon.store.value(catalog.TRAIN_RESTARTS) == 3.0


@pytest.mark.parametrize(
    "name, value, problem",
    [
        ("sdc_interval", -1, "must be from 0 to 1000000"),
        ("grad_check_every", -5, "must be from 0 to 1000000"),
        ("signal_tokens", 0, "must be from 1 to 1024"),
        ("sdc_group", "dp", "must be world or off"),
    ],
)
def test_bad_sdc_settings_name_the_setting(name, value, problem):
    with pytest.raises(ConfigError, match=f"^{name} .*{problem}"):
        Settings.resolve(env={}, **{name: value})
