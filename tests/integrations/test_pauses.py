"""Each integration announces its trainer's checkpoint saves and evaluations as pauses, on real tiny runs.

A probe reads ``trainhealth_comm_paused{reason}`` (and the hang watcher's ``paused``) from inside the
trainer's own work: the write of a checkpoint (``save_pretrained``, Lightning's ``CheckpointIO``,
Accelerate's save hooks), each evaluation forward pass, each training forward pass, and the events
that come after a save or an evaluation. While a save runs, only the ``checkpoint`` pause is open;
while an evaluation runs, only the ``evaluation`` one; a training step runs with none, so a pause
never outlives what it announces. The Monitors run the collective logger (``comm=True``): without it
there is no hang watcher, and ``Monitor.pause`` does nothing.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from trainhealth._internal import catalog
from trainhealth._internal.store import MetricStore

REASONS = ("checkpoint", "evaluation")
SETTINGS = {
    "comm": True,
    "prometheus": False,
    "otel": False,
    "gpu_backend": "off",
    "model_signals": False,
    "sdc_interval": 0,
    "grad_check_every": 0,
    "detectors": "off",
    "env": {},
}
NONE = {"checkpoint": 0.0, "evaluation": 0.0, "watch": False}
SAVING = {"checkpoint": 1.0, "evaluation": 0.0, "watch": True}
EVALUATING = {"checkpoint": 0.0, "evaluation": 1.0, "watch": True}


class Probe:
    """What the pauses are at named points of the run: ``samples[where]`` is a list of readings."""

    def __init__(self) -> None:
        self.monitor: Any = None  # set once the integration made its Monitor
        self.samples: dict[str, list[dict]] = {}

    def sample(self, where: str) -> None:
        monitor = self.monitor
        if monitor is None or monitor.comm is None:
            return
        reading = {reason: monitor.store.value(catalog.COMM_PAUSED, (reason,)) or 0.0 for reason in REASONS}
        reading["watch"] = monitor.comm.watch.paused
        self.samples.setdefault(where, []).append(reading)

    def all(self, where: str) -> list[dict]:
        return self.samples.get(where, [])


def _assert_each(probe: Probe, where: str, expected: dict, at_least: int = 1) -> None:
    readings = probe.all(where)
    assert len(readings) >= at_least, (where, probe.samples)
    assert all(reading == expected for reading in readings), (where, readings)


# --- Hugging Face --------------------------------------------------------------------------------------


def _hf_run(tmp_path: Path, **overrides: Any) -> tuple[Probe, Any]:
    transformers = pytest.importorskip("transformers")
    from trainhealth.integrations.huggingface import TrainhealthCallback

    probe = Probe()

    class SavedModel(transformers.GPT2LMHeadModel):
        def save_pretrained(self, *args: Any, **kwargs: Any) -> Any:  # the Trainer's write of the weights
            probe.sample("save")
            return super().save_pretrained(*args, **kwargs)

    class After(transformers.TrainerCallback):
        """Placed after trainhealth's callback: the events as the callbacks after it see them."""

        def on_train_begin(self, args, state, control, **kwargs):
            probe.monitor = callback.monitor

        def on_step_begin(self, args, state, control, **kwargs):
            probe.sample("step_begin")

        def on_evaluate(self, args, state, control, **kwargs):
            probe.sample("after_evaluate_save_next" if control.should_save else "after_evaluate")

        def on_save(self, args, state, control, **kwargs):
            probe.sample("after_save")

    config = transformers.GPT2Config(vocab_size=64, n_positions=16, n_embd=16, n_layer=1, n_head=2)
    torch.manual_seed(0)
    model = SavedModel(config)
    model.register_forward_pre_hook(lambda module, args: probe.sample("train" if module.training else "eval"))
    ids = torch.randint(0, 64, (12, 16), generator=torch.Generator().manual_seed(1))
    rows = [{"input_ids": row, "labels": row} for row in ids]
    settings = {
        "output_dir": str(tmp_path),
        "per_device_train_batch_size": 4,
        "per_device_eval_batch_size": 2,
        "learning_rate": 1e-2,
        "logging_steps": 1,
        "report_to": [],
        "use_cpu": True,
        "disable_tqdm": True,
        "save_only_model": True,
    }
    args = transformers.TrainingArguments(**{**settings, **overrides})
    callback = TrainhealthCallback(**SETTINGS)
    trainer = transformers.Trainer(
        model=model, args=args, train_dataset=rows[:8], eval_dataset=rows[8:], callbacks=[callback, After()]
    )
    trainer.train()
    return probe, callback.monitor


@pytest.mark.parametrize(
    "strategy",
    [
        {"eval_strategy": "steps", "eval_steps": 2, "save_strategy": "steps", "save_steps": 2, "max_steps": 4},
        {"eval_strategy": "epoch", "save_strategy": "epoch", "num_train_epochs": 2},  # on_epoch_end's flags
    ],
    ids=["steps", "epoch"],
)
def test_hugging_face_trainer_pauses_its_saves_and_evaluations(tmp_path, strategy):
    probe, monitor = _hf_run(tmp_path, **strategy)
    _assert_each(probe, "save", SAVING, at_least=2)  # steps 2 and 4 / both epoch ends
    _assert_each(probe, "eval", EVALUATING, at_least=4)  # 2 evaluations of 2 batches
    # the save comes right after the evaluation: its pause is open from on_evaluate on
    _assert_each(probe, "after_evaluate_save_next", SAVING, at_least=2)
    _assert_each(probe, "after_save", NONE, at_least=2)  # closed when the Trainer reports the save
    _assert_each(probe, "step_begin", NONE, at_least=4)
    _assert_each(probe, "train", NONE, at_least=4)
    assert monitor.store.value(catalog.CHECKPOINT_SAVES) == len(probe.all("save"))


def test_hugging_face_best_save_is_paused_and_a_skipped_one_closes(tmp_path):
    """``save_strategy="best"``: the Trainer decides after ``on_evaluate`` whether it saves."""
    probe, monitor = _hf_run(
        tmp_path,
        eval_strategy="steps",
        eval_steps=1,
        save_strategy="best",
        metric_for_best_model="eval_loss",
        greater_is_better=True,  # "best" is the highest loss: as training lowers it, later evaluations save nothing
        max_steps=6,
    )
    saves = len(probe.all("save"))
    assert 1 <= saves < 6, probe.samples  # the first evaluation is always the best so far
    _assert_each(probe, "save", SAVING, at_least=1)
    _assert_each(probe, "eval", EVALUATING, at_least=12)
    # where no save followed, the pause opened for it closed when the next step began
    _assert_each(probe, "step_begin", NONE, at_least=6)
    _assert_each(probe, "train", NONE, at_least=6)
    assert monitor.store.value(catalog.CHECKPOINT_SAVES) == saves


def test_hugging_face_eval_on_start_is_paused(tmp_path):
    """``eval_on_start``: the Trainer evaluates right after ``on_train_begin``, no flag set."""
    probe, _ = _hf_run(
        tmp_path, eval_on_start=True, eval_strategy="steps", eval_steps=2, save_strategy="no", max_steps=2
    )
    _assert_each(probe, "eval", EVALUATING, at_least=4)  # at the start and at step 2, 2 batches each
    _assert_each(probe, "after_evaluate", NONE, at_least=2)  # no save follows: nothing stays open
    _assert_each(probe, "train", NONE, at_least=2)


def test_hugging_face_without_saves_or_evaluations_pauses_nothing(tmp_path):
    probe, _ = _hf_run(tmp_path, save_strategy="no", eval_strategy="no", max_steps=3)
    assert not probe.all("save") and not probe.all("eval")
    _assert_each(probe, "train", NONE, at_least=3)


# --- Lightning ---------------------------------------------------------------------------------------------


def _lightning_run(tmp_path: Path, weights_only: bool) -> tuple[Probe, Any, Any]:
    lightning = pytest.importorskip("lightning")
    from lightning.pytorch.callbacks import ModelCheckpoint
    from lightning.pytorch.plugins.io import TorchCheckpointIO

    from trainhealth.integrations.lightning import TrainhealthCallback

    probe = Probe()

    class SampledIO(TorchCheckpointIO):
        def save_checkpoint(self, checkpoint, path, storage_options=None):  # the strategy's write
            probe.sample("save")
            super().save_checkpoint(checkpoint, path, storage_options)

    class Module(lightning.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.net = torch.nn.Linear(8, 1)

        def on_train_start(self) -> None:  # after the callbacks' on_train_start: the Monitor exists
            probe.monitor = callback.monitor

        def training_step(self, batch, batch_idx):
            probe.sample("train")
            return torch.nn.functional.mse_loss(self.net(batch[0]), batch[1])

        def validation_step(self, batch, batch_idx):
            probe.sample("eval")
            self.log("val_loss", torch.nn.functional.mse_loss(self.net(batch[0]), batch[1]))

        def on_validation_end(self) -> None:  # after the callbacks' on_validation_end
            probe.sample("after_validation")

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.05)

    torch.manual_seed(0)
    data = torch.utils.data.TensorDataset(torch.randn(32, 8), torch.randn(32, 1))
    loader = torch.utils.data.DataLoader(data, batch_size=8)  # 4 batches an epoch
    callback = TrainhealthCallback(**SETTINGS)
    checkpoints = ModelCheckpoint(
        dirpath=str(tmp_path), every_n_train_steps=2, save_top_k=-1, save_weights_only=weights_only
    )
    trainer = lightning.Trainer(
        max_epochs=2,
        accelerator="cpu",
        logger=False,
        callbacks=[callback, checkpoints],
        plugins=[SampledIO()],
        num_sanity_val_steps=0,
        limit_val_batches=2,
        enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir=str(tmp_path),
    )
    trainer.fit(Module(), loader, loader)
    return probe, callback.monitor, trainer


@pytest.mark.parametrize("weights_only", [False, True], ids=["full", "weights-only"])
def test_lightning_pauses_its_saves_and_validations(tmp_path, weights_only):
    """A weights-only save calls no ``on_save_checkpoint``: the pause comes from ``Trainer.save_checkpoint``."""
    probe, monitor, trainer = _lightning_run(tmp_path, weights_only)
    assert len(list(tmp_path.glob("*.ckpt"))) >= 4  # every 2 of the 8 steps
    _assert_each(probe, "save", SAVING, at_least=4)
    _assert_each(probe, "eval", EVALUATING, at_least=4)  # 2 validations of 2 batches
    _assert_each(probe, "after_validation", NONE, at_least=2)
    _assert_each(probe, "train", NONE, at_least=8)
    assert "save_checkpoint" not in vars(trainer)  # the Trainer's own method again once training ended
    if not weights_only:  # reported from on_save_checkpoint, which a weights-only save does not call
        assert monitor.store.value(catalog.CHECKPOINT_SAVES) == len(probe.all("save"))


# --- Accelerate -----------------------------------------------------------------------------------------


@pytest.fixture
def fresh_accelerate_state():
    accelerate = pytest.importorskip("accelerate")
    accelerate.state.AcceleratorState._reset_state(reset_partial_state=True)
    yield accelerate
    accelerate.state.AcceleratorState._reset_state(reset_partial_state=True)


class _Counter:
    """An object registered for checkpointing: ``save_state`` reads it last, after the weights are written."""

    def __init__(self, probe: Probe) -> None:
        self.probe = probe

    def state_dict(self) -> dict:
        self.probe.sample("save_end")
        return {}

    def load_state_dict(self, state: dict) -> None:
        pass


def test_accelerate_pauses_save_state_on_the_main_process(tmp_path, fresh_accelerate_state):
    accelerate = fresh_accelerate_state
    from trainhealth.integrations.accelerate import TrainhealthTracker

    torch.manual_seed(0)
    model = torch.nn.Linear(8, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    tracker = TrainhealthTracker(model, optimizer, **SETTINGS)
    probe = Probe()
    probe.monitor = tracker.monitor
    accelerator = accelerate.Accelerator(cpu=True, log_with=[tracker])
    model, optimizer = accelerator.prepare(model, optimizer)
    accelerator.init_trackers("pauses")
    accelerator.register_save_state_pre_hook(lambda models, weights, output_dir: probe.sample("save"))
    accelerator.register_for_checkpointing(_Counter(probe))
    model.register_state_dict_pre_hook(lambda module, prefix, keep_vars: probe.sample("state_dict"))
    for step in range(3):
        probe.sample("train")
        loss = model(torch.randn(4, 8)).pow(2).mean()
        accelerator.backward(loss)
        optimizer.step()
        optimizer.zero_grad()
        accelerator.log({"loss": loss.item()}, step=10 + step)
        if step == 1:
            accelerator.save_state(str(tmp_path / "state"))
            probe.sample("after_save")
    accelerator.save_model(model, str(tmp_path / "model"))
    _assert_each(probe, "save", SAVING, at_least=1)
    _assert_each(probe, "save_end", SAVING, at_least=1)
    _assert_each(probe, "state_dict", SAVING, at_least=2)  # save_state's and save_model's
    _assert_each(probe, "after_save", NONE, at_least=1)
    _assert_each(probe, "train", NONE, at_least=3)
    store = tracker.monitor.store
    assert store.value(catalog.CHECKPOINT_LAST_STEP) == 11  # numbered like the logged step it follows
    assert store.value(catalog.CHECKPOINT_SAVES) == 1  # save_model exports weights: no checkpoint
    accelerator.end_training()
    assert "save_state" not in vars(accelerator) and "save_model" not in vars(accelerator)


# --- never into the trainer ---------------------------------------------------------------------------------


class _BrokenPauseMonitor:
    """A Monitor whose pause fails: the integrations count it and go on."""

    def __init__(self) -> None:
        self.store = MetricStore()

    def pause(self, reason: str) -> Any:
        raise RuntimeError("no pause")


def test_a_failing_pause_is_counted_never_raised():
    from trainhealth._internal.integrations._pauses import Pauses

    monitor = _BrokenPauseMonitor()
    pauses = Pauses(monitor)  # type: ignore[arg-type]
    pauses.open("checkpoint")
    pauses.close()

    class Saver:
        def save(self, value: int) -> int:
            return value + 1

    saver = Saver()
    assert pauses.around(saver, "save", "checkpoint")
    assert saver.save(1) == 2  # passed through, pause or not
    pauses.end()
    assert "save" not in vars(saver)
    assert monitor.store.value(catalog.EXPORTER_ERRORS, ("monitor",)) == 2
