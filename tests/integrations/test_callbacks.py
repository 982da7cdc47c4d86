"""Each integration attached in a line or two to the real library, on a tiny model, exporting real metrics."""

from __future__ import annotations

import math
import time

import pytest
import torch

from trainhealth._internal import catalog

SETTINGS = {"prometheus": False, "otel": False, "gpu_backend": "off", "env": {}}


def _steps(store) -> float:
    return store.value(catalog.TRAIN_STEPS) or 0.0


def test_hugging_face_trainer(tmp_path):
    transformers = pytest.importorskip("transformers")
    from trainhealth.integrations.huggingface import TrainhealthCallback

    config = transformers.GPT2Config(vocab_size=64, n_positions=16, n_embd=16, n_layer=2, n_head=2)
    torch.manual_seed(0)
    model = transformers.GPT2LMHeadModel(config)
    data = [{"input_ids": torch.randint(0, 64, (16,)), "labels": torch.randint(0, 64, (16,))} for _ in range(32)]
    args = transformers.TrainingArguments(
        output_dir=str(tmp_path),
        per_device_train_batch_size=4,
        max_steps=6,
        gradient_accumulation_steps=2,
        logging_steps=1,
        save_steps=3,
        report_to=[],
        use_cpu=True,
        disable_tqdm=True,
    )
    callback = TrainhealthCallback(**SETTINGS)
    trainer = transformers.Trainer(model=model, args=args, train_dataset=data, callbacks=[callback])
    trainer.train()
    store = callback.monitor.store
    assert _steps(store) == 6
    assert store.value(catalog.TRAIN_TOKENS) == 6 * 2 * 4 * 16  # steps x accumulation x batch x tokens
    assert store.value(catalog.CHECKPOINT_LAST_STEP) == 6 and store.value(catalog.CHECKPOINT_SAVES) == 2
    logged = [entry["loss"] for entry in trainer.state.log_history if "loss" in entry]
    assert math.isclose(store.value(catalog.TRAIN_LOSS), logged[-1], rel_tol=1e-3)
    assert store.value(catalog.TRAIN_GRAD_NORM) > 0
    assert store.series(catalog.MODEL_ACTIVATION_RMS)  # transformer.h.0 and .1, the longest ModuleList


def test_lightning_trainer(tmp_path):
    lightning = pytest.importorskip("lightning")
    from trainhealth.integrations.lightning import TrainhealthCallback

    class Module(lightning.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.net = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))

        def training_step(self, batch, batch_idx):
            x, y = batch
            return torch.nn.functional.mse_loss(self.net(x), y)

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.05)

    torch.manual_seed(0)
    data = torch.utils.data.TensorDataset(torch.randn(64, 8), torch.randn(64, 1))
    loader = torch.utils.data.DataLoader(data, batch_size=8)
    callback = TrainhealthCallback(tokens_per_batch=lambda batch: len(batch[0]), **SETTINGS)
    trainer = lightning.Trainer(
        max_steps=4,
        accumulate_grad_batches=2,
        accelerator="cpu",
        logger=False,
        callbacks=[callback],
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir=str(tmp_path),
    )
    trainer.fit(Module(), loader)
    store = callback.monitor.store
    assert _steps(store) == 4 and store.value(catalog.TRAIN_STEP) == 4
    assert store.value(catalog.TRAIN_TOKENS) == 4 * 2 * 8
    assert store.value(catalog.TRAIN_LOSS) > 0 and store.value(catalog.TRAIN_GRAD_NORM) > 0
    assert store.series(catalog.TRAIN_LEARNING_RATE) == ((("0",), 0.05),)


def test_torchtitan_style_logger_keeps_torchtitans_throughput():
    from trainhealth.integrations.torchtitan import TrainhealthLogger

    logger = TrainhealthLogger(**SETTINGS)
    for step in (10, 20, 30):
        logger.log(
            {
                "loss_metrics/global_avg_loss": 3.0 - step / 100,
                "grad_norm": 0.5,
                "throughput(tps)": 10_000.0,
                "time_metrics/end_to_end(s)": 0.02,
            },
            step=step,
        )
        time.sleep(0.05)
    logger.monitor.flush()
    latest = logger.monitor.latest
    assert latest.step == 30 and latest.loss == pytest.approx(2.7) and latest.grad_norm == 0.5
    assert latest.tokens_per_second == pytest.approx(10_000.0, rel=0.05)
    logger.close()
