"""``trainhealth-lab corpus``: a tiny real corpus made through the command, its layout, labels and causes."""

from __future__ import annotations

import json
import math

import pytest

from trainhealth_lab.cli import CORPUS_MODELS, CORPUS_SCENARIOS, main
from trainhealth_lab.corpus import CorpusError, CorpusRun, load_corpus
from trainhealth_lab.corpus.scenarios import SCENARIOS
from trainhealth_lab.corpus.tasks import TASKS

STEPS = 150
SCENARIOS_RUN = ("clean", "lr_divergence", "overflow", "bad_shard")


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    out = tmp_path_factory.mktemp("corpus") / "out"
    status = main(
        [
            "corpus",
            "--out",
            str(out),
            "--seeds",
            "0",
            "--steps",
            str(STEPS),
            "--models",
            "mlp",
            "--scenarios",
            ",".join(SCENARIOS_RUN),
            "--workers",
            "1",
        ]
    )
    assert status == 0
    return out, {run.run_id: run for run in load_corpus(out)}


def test_the_index_lists_every_run_with_its_signals(corpus):
    out, runs = corpus
    index = json.loads((out / "index.json").read_text())
    assert index["version"] == 1 and index["steps"] == STEPS and index["seeds"] == [0]
    assert index["command"].startswith("trainhealth-lab corpus --out ")
    assert index["runs"] == [
        "mlp-clean_cosine-s0",
        "mlp-clean_step-s0",
        "mlp-lr_divergence-s0",
        "mlp-overflow-s0",
        "mlp-bad_shard-s0",
    ]
    for run in runs.values():
        assert list(run.signals.columns) == ["step", "loss", "grad_norm", "lr", "step_time"]
        assert run.signals["step"].tolist() == list(range(STEPS))
        assert (run.signals["step_time"] > 0).all()


def test_training_is_real_and_clean_runs_stay_healthy(corpus):
    _, runs = corpus
    for variant in ("clean_cosine", "clean_step"):
        run = runs[f"mlp-{variant}-s0"]
        labels, loss = run.labels, run.signals["loss"]
        assert labels["kind"] == "none" and labels["cause_step"] is None and labels["window"] is None
        assert labels["healthy_until"] == STEPS
        assert loss.notna().all() and loss.iloc[-20:].mean() < 0.8 * loss.iloc[:10].mean()
        lr = run.signals["lr"]
        assert lr.iloc[0] < lr.iloc[labels["warmup_steps"]]  # warm-up
        assert labels["schedule_changes"] and all(lr[step] != lr[step - 1] for step in labels["schedule_changes"])
        assert len(labels["checkpoint_steps"]) == 10


def test_causes_fall_after_warm_up_and_the_run_is_the_clean_run_until_then(corpus):
    _, runs = corpus
    clean = runs["mlp-clean_cosine-s0"].signals  # seed 0 runs take the cosine schedule
    for scenario in SCENARIOS_RUN[1:]:
        run = runs[f"mlp-{scenario}-s0"]
        cause = run.labels["cause_step"]
        assert 0.4 * STEPS <= cause <= 0.7 * STEPS and run.labels["healthy_until"] == cause
        assert run.labels["window"][0] == cause and run.labels["kind"] == SCENARIOS[scenario].kind.value
        before = run.signals.iloc[:cause]
        assert before["loss"].tolist() == clean["loss"].iloc[:cause].tolist()
        assert run.labels["pre_event_loss"] == pytest.approx(before["loss"].iloc[-50:].median())


def test_the_learning_rate_grows_from_the_divergence_cause(corpus):
    _, runs = corpus
    run = runs["mlp-lr_divergence-s0"]
    cause, collapse = run.labels["cause_step"], run.labels["collapse_step"]
    ratio = (run.signals["lr"] / runs["mlp-clean_cosine-s0"].signals["lr"]).tolist()
    assert ratio[:cause] == [1.0] * cause
    assert all(later > earlier for earlier, later in zip(ratio[cause:], ratio[cause + 1 :]))
    if collapse is not None:
        loss = run.signals["loss"][collapse]
        assert collapse > cause and (not math.isfinite(loss) or loss >= 10 * run.labels["pre_event_loss"])
    assert run.labels["window"] == [cause, STEPS - 1 if collapse is None else collapse]


def test_overflow_makes_the_cause_step_non_finite_and_only_it(corpus):
    _, runs = corpus
    run = runs["mlp-overflow-s0"]
    cause = run.labels["cause_step"]
    at_cause = run.signals.iloc[cause]
    assert not math.isfinite(at_cause["loss"]) or not math.isfinite(at_cause["grad_norm"])
    others = run.signals.drop(index=cause)
    assert others["loss"].notna().all() and others["grad_norm"].notna().all()  # the step was skipped: no damage
    assert run.labels["window"] == [cause, cause + 20]


def test_a_bad_shard_raises_the_loss_while_it_lasts(corpus):
    _, runs = corpus
    run = runs["mlp-bad_shard-s0"]
    first, last = run.labels["window"]
    assert last - first + 1 == round(0.15 * STEPS)
    assert run.signals["loss"].iloc[first : last + 1].median() > 1.2 * run.labels["pre_event_loss"]


def test_a_bad_corpus_is_an_error_naming_the_file(corpus, tmp_path):
    out, _ = corpus
    with pytest.raises(CorpusError, match="index.json"):
        load_corpus(tmp_path)
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "index.json").write_text(json.dumps({"version": 1, "runs": ["mlp-clean_step-s0"]}))
    (broken / "mlp-clean_step-s0").mkdir()
    (broken / "mlp-clean_step-s0" / "labels.json").write_text((out / "mlp-clean_step-s0" / "labels.json").read_text())
    (broken / "mlp-clean_step-s0" / "signals.csv").write_text("step,loss\n0,1.0\n")
    with pytest.raises(CorpusError, match="signals.csv: missing columns grad_norm, lr, step_time"):
        load_corpus(broken)
    assert isinstance(load_corpus(out)[0], CorpusRun)


@pytest.mark.parametrize(
    "option",
    [["--models", "resnet"], ["--scenarios", "clean,meteor"], ["--steps", "5"], ["--workers", "0"], ["--seeds", "3-1"]],
)
def test_a_bad_option_is_one_line_and_status_2(option, tmp_path, capsys):
    assert main(["corpus", "--out", str(tmp_path / "out"), *option]) == 2
    error = capsys.readouterr().err
    assert error.count("\n") == 1 and option[0] in error
    assert not (tmp_path / "out").exists()


def test_a_used_output_directory_is_refused(corpus, capsys):
    out, _ = corpus
    assert main(["corpus", "--out", str(out), "--steps", "100"]) == 2
    assert "already holds files" in capsys.readouterr().err


def test_the_command_offers_every_model_and_scenario():
    assert CORPUS_MODELS == tuple(TASKS) and CORPUS_SCENARIOS == tuple(SCENARIOS)
