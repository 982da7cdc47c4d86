"""The corpus scorer: recall within 2 steps, divergence leads, shifts and false alarms per healthy step,
on a small corpus in the corpus layout written here."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from trainhealth._internal.detectors.spec import parse_spec
from trainhealth_lab.bench.training_corpus import detections, observable, score_corpus
from trainhealth_lab.corpus import CorpusRun, load_corpus
from trainhealth_lab.corpus.store import write_index, write_run

STEPS = 300


def run(
    run_id: str,
    scenario: str,
    kind: str,
    loss: np.ndarray,
    *,
    cause: int | None = None,
    window: tuple[int, int] | None = None,
    collapse: int | None = None,
    grad_norm: np.ndarray | None = None,
) -> tuple[str, pd.DataFrame, dict]:
    signals = pd.DataFrame(
        {
            "step": np.arange(STEPS),
            "loss": loss,
            "grad_norm": np.ones(STEPS) if grad_norm is None else grad_norm,
            "lr": 1e-3,
            "step_time": 0.01,
        }
    )
    labels = {
        "run": run_id,
        "model": "mlp",
        "seed": 0,
        "scenario": scenario,
        "kind": kind,
        "cause_step": cause,
        "window": list(window) if window else None,
        "collapse_step": collapse,
        "pre_event_loss": None,
        "warmup_steps": 20,
        "schedule_changes": [],
        "checkpoint_steps": [],
        "healthy_until": STEPS if cause is None else cause,
    }
    return run_id, signals, labels


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> list[CorpusRun]:
    rng = np.random.default_rng(0)

    def healthy() -> np.ndarray:
        return (1.0 + 2.0 * np.exp(-np.arange(STEPS) / 60)) * np.exp(rng.normal(0, 0.03, STEPS))

    clean = healthy()
    clean[250] *= 3.0  # a false alarm for a spike detector
    corrupted = healthy()
    corrupted[200] *= 4.0
    flip = healthy()  # a bit flip that shows in neither signal
    diverging = healthy()
    diverging[150:] *= np.exp(0.03 * np.arange(STEPS - 150))  # 10x at step 227
    collapse = 150 + int(np.argmax(diverging[150:] >= 10 * np.median(diverging[100:150])))
    shard = healthy()
    shard[180:230] *= 1.5
    runs = [
        run("clean", "clean", "none", clean),
        run("corrupted", "corrupted_batch", "sharp", corrupted, cause=200, window=(200, 220)),
        run("flip", "bit_flip_grad", "sharp", flip, cause=210, window=(210, 230)),
        run(
            "diverging", "lr_divergence", "divergence", diverging, cause=150, window=(150, collapse), collapse=collapse
        ),
        run("shard", "bad_shard", "shift", shard, cause=180, window=(180, 229)),
    ]
    root = tmp_path_factory.mktemp("corpus")
    for run_id, signals, labels in runs:
        write_run(root, run_id, signals, labels)
    write_index(root, [r[0] for r in runs], steps=STEPS, seeds=[0], command="test")
    return load_corpus(root)


def test_a_spike_detector_catches_the_sharp_event_and_counts_its_false_alarm(corpus):
    score = score_corpus(corpus, "zscore", "loss=zscore(direction=up,threshold=8)")
    assert (score.sharp.events, score.sharp.detected, score.sharp.delays) == (1, 1, (0,))  # the flip is unseen
    assert (score.corrupted_or_overflow.events, score.corrupted_or_overflow.detected) == (1, 1)
    assert score.false_alarms == 1  # the clean run's spike at step 250
    # healthy steps from step 20 on: the clean run's 280, and the steps before each other run's cause
    assert score.healthy_steps == 280 + (200 - 20) + (210 - 20) + (150 - 20) + (180 - 20)
    assert score.false_alarms_per_1000 == pytest.approx(1000 / score.healthy_steps)


def test_divergence_lead_is_collapse_minus_the_first_detection(corpus):
    score = score_corpus(corpus, "divergence", "loss=divergence")
    [diverging] = [r for r in corpus if r.run_id == "diverging"]
    steps = detections([diverging], parse_spec("loss=divergence"), skip=20)[0]
    first = int(steps[steps >= 150][0])
    collapse = diverging.labels["collapse_step"]
    assert first < collapse and score.divergence.leads == (collapse - first,)
    assert score.divergence.median_lead == collapse - first and score.divergence.share_before_collapse == 1.0
    assert score.false_alarms == 0


def test_a_blind_detector_scores_nothing_and_a_missed_divergence_leads_by_zero(corpus):
    score = score_corpus(corpus, "blind", "loss=zscore(threshold=1000)")
    assert score.sharp.detected == score.shift.detected == score.divergence.before_collapse == 0
    assert score.divergence.median_lead == 0.0 and score.false_alarms == 0
    assert np.isnan(score.sharp.median_delay)


def test_a_shift_counts_in_its_window(corpus):
    score = score_corpus(corpus, "bocpd", "loss=bocpd(direction=up,log=true)")
    assert score.shift.events == 1 and score.shift.detected == 1 and score.shift.delays[0] <= 5


def test_a_bit_flip_counts_only_where_it_shows(corpus):
    [flip] = [r for r in corpus if r.run_id == "flip"]
    assert not observable(flip, "loss")
    flip.signals.loc[211, "grad_norm"] = np.inf
    assert observable(flip, "grad_norm")
