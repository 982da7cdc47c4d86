"""The Hugging Face Trainer integration on a real tiny training, compared step by step with the Trainer's logs.

What trainhealth served on /metrics (scraped over HTTP at each ``on_log``) must equal what the
Trainer logged at that step: loss, the pre-clip gradient norm, the learning rate and the step,
with clipping active, with and without gradient accumulation, on one rank and on two gloo ranks.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch

transformers = pytest.importorskip("transformers")

from tests.distributed import init_rank, run_ranks
from tests.helpers import scrape
from trainhealth._internal import catalog
from trainhealth.integrations.huggingface import TrainhealthCallback

SETTINGS = {"prometheus_addr": "127.0.0.1", "prometheus_port": 0, "otel": False, "gpu_backend": "off", "env": {}}
MAX_GRAD_NORM = 0.1  # below the norms of this model's steps: the Trainer clips most of them
STEPS, BATCH, SEQ, VOCAB = 8, 2, 16, 64
REL = 1e-5


def _model():
    config = transformers.GPT2Config(vocab_size=VOCAB, n_positions=SEQ, n_embd=16, n_layer=2, n_head=2)
    torch.manual_seed(0)
    return transformers.GPT2LMHeadModel(config)


def _data(n: int) -> list[dict]:
    generator = torch.Generator().manual_seed(1)
    rows = []
    for i in range(n):
        ids = torch.randint(0, VOCAB, (SEQ,), generator=generator)
        labels = ids.clone()
        labels[: i % 5] = -100  # micro-batches (and ranks) of different label counts
        rows.append({"input_ids": ids, "labels": labels})
    return rows


def _trainer(output_dir: Path, accumulation: int, world: int, callbacks: list, **overrides):
    settings = {
        "output_dir": str(output_dir),
        "per_device_train_batch_size": BATCH,
        "max_steps": STEPS,
        "gradient_accumulation_steps": accumulation,
        "logging_steps": 1,
        "max_grad_norm": MAX_GRAD_NORM,
        "learning_rate": 5e-3,
        "lr_scheduler_type": "linear",
        "save_strategy": "no",
        "report_to": [],
        "use_cpu": True,
        "disable_tqdm": True,
    }
    args = transformers.TrainingArguments(**{**settings, **overrides})
    data = _data(STEPS * accumulation * BATCH * world)
    return transformers.Trainer(model=_model(), args=args, train_dataset=data, callbacks=callbacks)


class Scraper(transformers.TrainerCallback):
    """At each ``on_log`` of a training step: what the Trainer logged and what /metrics serves now."""

    def __init__(self, callback: TrainhealthCallback) -> None:
        self.callback = callback
        self.rows: list[dict] = []

    def on_log(self, args, state, control, logs=None, **kwargs):
        if not logs or "loss" not in logs:
            return
        monitor = self.callback.monitor
        assert monitor.flush()
        served = scrape(monitor.metrics_url)
        assert served.status == 200
        self.rows.append(
            {
                "step": state.global_step,
                "logged": {key: logs[key] for key in ("loss", "grad_norm", "learning_rate")},
                "exported": {
                    "step": served.value("trainhealth_train_step"),
                    "loss": served.value("trainhealth_train_loss"),
                    "grad_norm": served.value("trainhealth_train_grad_norm"),
                    "learning_rate": served.value("trainhealth_train_learning_rate", param_group="0"),
                    "tokens": served.value("trainhealth_train_tokens_total"),
                },
                "rank": served.labels_of("trainhealth_train_loss")[0]["rank"],
                # on heavy-statistics steps: the layer groups' norms, taken as clipping began (gradients_ready)
                "layers": [layer.grad_norm for layer in monitor.latest.layers if layer.grad_norm is not None],
            }
        )


def _train(output_dir: Path, accumulation: int, world: int = 1) -> dict:
    callback = TrainhealthCallback(**SETTINGS)
    scraper = Scraper(callback)
    trainer = _trainer(output_dir, accumulation, world, [callback, scraper])
    trainer.train()
    history = [entry for entry in trainer.state.log_history if "loss" in entry]
    return {"rows": scraper.rows, "history": history}


def _check_rank(run: dict, accumulation: int, world: int) -> None:
    """Everything but the loss, which on several ranks is this rank's own (the Trainer logs their mean)."""
    rows, history = run["rows"], run["history"]
    assert [row["step"] for row in rows] == [entry["step"] for entry in history] == list(range(1, STEPS + 1))
    for row, entry in zip(rows, history):
        exported, logged = row["exported"], row["logged"]
        assert exported["step"] == entry["step"]
        assert math.isclose(exported["grad_norm"], logged["grad_norm"], rel_tol=REL), row
        assert math.isclose(exported["learning_rate"], logged["learning_rate"], rel_tol=REL), row
        assert exported["tokens"] == entry["step"] * accumulation * BATCH * SEQ  # this rank's tokens so far
        if world == 1:
            assert math.isclose(exported["loss"], logged["loss"], rel_tol=REL), row
    assert len({row["logged"]["learning_rate"] for row in rows}) == STEPS  # the scheduler moved it every step
    heavy = [row for row in rows if row["layers"]]
    assert heavy  # stats_every: step 1 at least
    for row in heavy:  # the per-layer norms add up to the pre-clip norm, not to MAX_GRAD_NORM
        total = math.sqrt(sum(norm**2 for norm in row["layers"]))
        assert math.isclose(total, row["logged"]["grad_norm"], rel_tol=1e-4), row
    clipped = [row for row in rows if row["logged"]["grad_norm"] > MAX_GRAD_NORM]
    assert len(clipped) >= STEPS // 2  # clipping was active: a clipped norm would sit at MAX_GRAD_NORM


@pytest.mark.parametrize("accumulation", [1, 4])
def test_one_rank_exports_what_the_trainer_logs(tmp_path, accumulation):
    run = _train(tmp_path, accumulation)
    _check_rank(run, accumulation, world=1)
    assert {row["rank"] for row in run["rows"]} == {"0"}


def _rank_main(rank: int, world: int, port: int, out: str) -> None:
    init_rank(rank, world, port)
    results = {
        accumulation: _train(Path(out) / f"run{accumulation}-{rank}", accumulation, world) for accumulation in (1, 4)
    }
    (Path(out) / f"rank{rank}.json").write_text(json.dumps(results))


@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory) -> list[dict]:
    out = tmp_path_factory.mktemp("hf-ddp")
    run_ranks(_rank_main, 2, str(out), timeout_s=300)  # the step loop is the Trainer's: not read
    return [json.loads((out / f"rank{rank}.json").read_text()) for rank in range(2)]


@pytest.mark.parametrize("accumulation", [1, 4])
@pytest.mark.slow
def test_two_ranks_each_export_their_own_values(two_ranks, accumulation):
    runs = [results[str(accumulation)] for results in two_ranks]
    for rank, run in enumerate(runs):
        _check_rank(run, accumulation, world=2)
        assert {row["rank"] for row in run["rows"]} == {str(rank)}
    first, second = runs
    assert first["history"] == second["history"] or all(  # every rank logs the same (gathered) values
        math.isclose(a["loss"], b["loss"], rel_tol=REL) for a, b in zip(first["history"], second["history"])
    )
    for row0, row1 in zip(first["rows"], second["rows"]):
        mean = (row0["exported"]["loss"] + row1["exported"]["loss"]) / 2
        assert math.isclose(mean, row0["logged"]["loss"], rel_tol=REL), (row0, row1)
    # the ranks' own losses differ (different shards): the export is not the gathered mean
    assert any(
        not math.isclose(r0["exported"]["loss"], r1["exported"]["loss"], rel_tol=1e-3)
        for r0, r1 in zip(first["rows"], second["rows"])
    )


def test_reused_callback_exports_again(tmp_path):
    callback = TrainhealthCallback(**SETTINGS)
    scraper = Scraper(callback)
    for run in range(2):
        scraper.rows.clear()
        trainer = _trainer(tmp_path / str(run), 1, 1, [callback, scraper], save_strategy="steps", save_steps=4)
        trainer.train()
        store = callback.monitor.store
        assert store.value(catalog.TRAIN_STEPS) == STEPS
        assert store.value(catalog.CHECKPOINT_LAST_STEP) == STEPS
        assert [row["exported"]["step"] for row in scraper.rows] == list(range(1, STEPS + 1))
        history = [entry for entry in trainer.state.log_history if "loss" in entry]
        assert all(
            math.isclose(row["exported"]["loss"], entry["loss"], rel_tol=REL)
            for row, entry in zip(scraper.rows, history)
        )
    # the Trainer's methods are its own again once training ended
    assert "training_step" not in vars(trainer) and "_get_grad_norm" not in vars(trainer)


def test_attach_names_the_trainer(tmp_path):
    trainer = _trainer(tmp_path, 2, 1, [])
    callback = TrainhealthCallback.attach(trainer, **SETTINGS)
    scraper = Scraper(callback)
    trainer.add_callback(scraper)
    trainer.train()
    _check_rank({"rows": scraper.rows, "history": [e for e in trainer.state.log_history if "loss" in e]}, 2, 1)


def test_without_a_trainer_the_logged_values_are_taken(tmp_path):
    """Events sent by a loop of one's own: loss and tokens from the model's outputs, grad_norm from the logs."""
    model = _model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    args = transformers.TrainingArguments(output_dir=str(tmp_path), use_cpu=True, report_to=[])
    state, control = transformers.TrainerState(), transformers.TrainerControl()
    callback = TrainhealthCallback(**SETTINGS)
    callback.on_train_begin(args, state, control, model=model, optimizer=optimizer)
    data = _data(3 * BATCH)
    for step in range(1, 4):
        rows = data[(step - 1) * BATCH : step * BATCH]
        output = model(**{key: torch.stack([row[key] for row in rows]) for key in ("input_ids", "labels")})
        output.loss.backward()
        norm = torch.nn.utils.clip_grad_norm_(model.parameters(), MAX_GRAD_NORM)
        optimizer.step()
        optimizer.zero_grad()
        state.global_step, control.should_log = step, True
        callback.on_step_end(args, state, control)
        callback.on_log(args, state, control, logs={"loss": output.loss.item(), "grad_norm": norm.item()})
        assert callback.monitor.flush()
        served = scrape(callback.monitor.metrics_url)
        assert norm.item() > MAX_GRAD_NORM
        assert math.isclose(served.value("trainhealth_train_grad_norm"), norm.item(), rel_tol=REL)
        assert math.isclose(served.value("trainhealth_train_loss"), output.loss.item(), rel_tol=REL)
        assert served.value("trainhealth_train_step") == step
        assert served.value("trainhealth_train_tokens_total") == step * BATCH * SEQ
    callback.on_train_end(args, state, control)
