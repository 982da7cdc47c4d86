"""The Lightning callback on real Lightning training (CPU; 1 rank, and 2 ranks with ddp_spawn on gloo).

Every optimizer step, a test callback placed after the trainhealth one flushes the Monitor
and scrapes its /metrics over HTTP; the scraped values are compared step by step with what
the module logs with ``self.log`` (captured by an in-memory Lightning logger) and with what
``LearningRateMonitor`` logs. Lightning's loggers label the optimizer step that makes
``global_step`` k with step k - 1 (their ``_batches_that_stepped`` before it counts the step);
the module logs ``global_step_before`` so the test checks that pairing rather than assuming it.
The classes are at module level: ddp_spawn pickles the trainer into its processes.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch

lightning = pytest.importorskip("lightning")

from lightning.pytorch.callbacks import Callback, LearningRateMonitor  # noqa: E402
from lightning.pytorch.loggers import Logger  # noqa: E402
from lightning.pytorch.utilities import grad_norm  # noqa: E402

from tests.distributed import free_port  # noqa: E402
from tests.helpers import scrape  # noqa: E402
from trainhealth._internal import catalog  # noqa: E402
from trainhealth.integrations.lightning import TrainhealthCallback  # noqa: E402

BATCHES_PER_EPOCH = 10  # per rank; not a multiple of 4: Lightning also steps on each epoch's last batch
EPOCHS = 2
BATCH = 4
CLIP = 0.05  # small: the gradients are clipped, and the exported norm must be the one before
LR, GAMMA = 0.1, 0.9
SETTINGS = {"prometheus_addr": "127.0.0.1", "prometheus_port": 0, "otel": False, "gpu_backend": "off", "env": {}}
REL = 1e-5


def tokens_per_batch(batch) -> int:
    return len(batch[0])


def lr_factor(step: int) -> float:
    return GAMMA**step


class MemoryLogger(Logger):
    """What Lightning sends its loggers, by the step it gives."""

    def __init__(self) -> None:
        super().__init__()
        self.steps: dict[int, dict[str, float]] = {}

    @property
    def name(self) -> str:
        return "memory"

    @property
    def version(self) -> int:
        return 0

    def log_hyperparams(self, params, *args, **kwargs) -> None:
        pass

    def log_metrics(self, metrics, step=None) -> None:
        self.steps.setdefault(int(step), {}).update({k: float(v) for k, v in metrics.items()})


class Regressor(lightning.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.net = torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.Tanh(), torch.nn.Linear(32, 1))
        self.micro_losses: list[torch.Tensor] = []

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = torch.nn.functional.mse_loss(self.net(x), y)
        self.micro_losses.append(loss.detach())
        self.log("train_loss", loss, on_step=True, on_epoch=False)
        return loss

    def on_before_optimizer_step(self, optimizer) -> None:  # before Lightning clips
        self.log("train_loss_mean", torch.stack(self.micro_losses).mean())
        self.micro_losses = []
        self.log("grad_norm_total", grad_norm(self, norm_type=2)["grad_2.0_norm_total"])
        self.log("lr", optimizer.param_groups[0]["lr"])
        self.log("global_step_before", float(self.trainer.global_step))

    def configure_optimizers(self):
        optimizer = torch.optim.SGD(self.parameters(), lr=LR)
        scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lr_factor)
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}


class ScrapeEachStep(Callback):
    """After each optimizer step: flush the Monitor, scrape /metrics; at the end, write what it saw and was logged."""

    def __init__(self, out_dir: str) -> None:
        self.out_dir = out_dir
        self.rows: dict[int, dict] = {}
        self.post_clip_norms: dict[int, float] = {}
        self._last_step: int | None = None

    def on_train_start(self, trainer, pl_module) -> None:
        self._last_step = trainer.global_step

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        step = trainer.global_step
        if step == self._last_step:
            return
        self._last_step = step
        # the gradients after the optimizer step are still the clipped ones the step used
        grads = [p.grad for p in pl_module.parameters() if p.grad is not None]
        self.post_clip_norms[step] = float(torch.nn.utils.get_total_norm(grads))
        monitor = next(cb for cb in trainer.callbacks if isinstance(cb, TrainhealthCallback)).monitor
        assert monitor.flush()
        got = scrape(monitor.metrics_url)
        assert got.status == 200
        self.rows[step] = {
            "loss": got.value(catalog.TRAIN_LOSS.prometheus_name),
            "grad_norm": got.value(catalog.TRAIN_GRAD_NORM.prometheus_name),
            "lr": got.value(catalog.TRAIN_LEARNING_RATE.prometheus_name, param_group="0"),
            "step": got.value(catalog.TRAIN_STEP.prometheus_name),
            "steps": got.value(catalog.TRAIN_STEPS.prometheus_name),
            "tokens": got.value(catalog.TRAIN_TOKENS.prometheus_name),
            "ranks": sorted({labels.get("rank") for labels in got.labels_of(catalog.TRAIN_LOSS.prometheus_name)}),
        }

    def on_train_end(self, trainer, pl_module) -> None:
        logger = next(lg for lg in trainer.loggers if isinstance(lg, MemoryLogger))
        report = {
            "global_step": trainer.global_step,
            "rank": trainer.global_rank,
            "rows": self.rows,
            "post_clip_norms": self.post_clip_norms,
            "logged": logger.steps,
        }
        Path(self.out_dir, f"rank{trainer.global_rank}.json").write_text(json.dumps(report))


def _fit(tmp_path: Path, accumulate: int, devices: int) -> list[dict]:
    torch.manual_seed(0)
    samples = BATCHES_PER_EPOCH * BATCH * devices
    data = torch.utils.data.TensorDataset(torch.randn(samples, 8), 3 * torch.randn(samples, 1))
    loader = torch.utils.data.DataLoader(data, batch_size=BATCH)
    trainer = lightning.Trainer(
        max_epochs=EPOCHS,
        accumulate_grad_batches=accumulate,
        gradient_clip_val=CLIP,
        log_every_n_steps=1,
        accelerator="cpu",
        devices=devices,
        strategy="ddp_spawn" if devices > 1 else "auto",
        logger=MemoryLogger(),
        callbacks=[
            TrainhealthCallback(tokens_per_batch=tokens_per_batch, **SETTINGS),
            LearningRateMonitor(logging_interval="step"),
            ScrapeEachStep(str(tmp_path)),
        ],
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir=str(tmp_path),
    )
    trainer.fit(Regressor(), loader)
    return [json.loads((tmp_path / f"rank{rank}.json").read_text()) for rank in range(devices)]


def _micro_batches_per_step(accumulate: int) -> list[int]:
    """How many micro-batches each optimizer step takes: an epoch's last batch always ends a step."""
    per_epoch = [accumulate] * (BATCHES_PER_EPOCH // accumulate)
    if BATCHES_PER_EPOCH % accumulate:
        per_epoch.append(BATCHES_PER_EPOCH % accumulate)
    return per_epoch * EPOCHS


def _check_rank(report: dict, accumulate: int, rank: int) -> None:
    windows = _micro_batches_per_step(accumulate)
    rows = {int(step): row for step, row in report["rows"].items()}
    logged = {int(step): values for step, values in report["logged"].items()}
    post_clip = {int(step): norm for step, norm in report["post_clip_norms"].items()}
    assert report["global_step"] == len(windows)  # 6 with accumulation 4: the end-of-epoch steps are counted
    assert sorted(rows) == list(range(1, len(windows) + 1))
    tokens = 0
    for step, row in rows.items():
        mine = logged[step - 1]  # Lightning's loggers label the step that makes global_step k with k - 1
        assert mine["global_step_before"] == step - 1
        tokens += windows[step - 1] * BATCH
        assert row["step"] == step and row["steps"] == step and row["tokens"] == tokens
        assert row["ranks"] == [str(rank)]
        assert math.isclose(row["loss"], mine["train_loss_mean"], rel_tol=REL), (step, row, mine)
        if accumulate == 1:  # the very value self.log("train_loss", loss) sends
            assert math.isclose(row["loss"], mine["train_loss"], rel_tol=REL), (step, row, mine)
        assert math.isclose(row["grad_norm"], mine["grad_norm_total"], rel_tol=REL), (step, row, mine)
        assert math.isclose(row["lr"], mine["lr-SGD"], rel_tol=REL), (step, row, mine)
        assert math.isclose(row["lr"], mine["lr"], rel_tol=REL)
        assert math.isclose(row["lr"], LR * lr_factor(step - 1), rel_tol=REL)  # the rate that step applied
        assert post_clip[step] <= CLIP * (1 + 1e-4)
    clipped = [step for step, row in rows.items() if row["grad_norm"] > 2 * CLIP]
    assert len(clipped) >= len(rows) // 2  # the exported norm is the one before clipping


@pytest.mark.parametrize("accumulate", [1, 4])
def test_one_rank_exports_what_lightning_logs(tmp_path, accumulate):
    (report,) = _fit(tmp_path, accumulate, devices=1)
    _check_rank(report, accumulate, rank=0)


@pytest.mark.slow
def test_two_ranks_each_export_their_own_values(tmp_path, monkeypatch):
    # Lightning takes MASTER_PORT from the environment when set: an earlier test in this process
    # may have left a port there that is taken by now
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", str(free_port()))
    reports = _fit(tmp_path, accumulate=4, devices=2)
    for rank, report in enumerate(reports):
        assert report["rank"] == rank
        _check_rank(report, 4, rank)
    first, second = ({int(s): row for s, row in report["rows"].items()} for report in reports)
    assert any(first[step]["loss"] != second[step]["loss"] for step in first)  # each rank's own batches


class LatestEachStep(Callback):
    def __init__(self) -> None:
        self.latest: dict[int, object] = {}

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        monitor = next(cb for cb in trainer.callbacks if isinstance(cb, TrainhealthCallback)).monitor
        monitor.flush()
        if monitor.latest is not None:
            self.latest[monitor.latest.step] = monitor.latest


def test_layer_gradient_norms_are_this_steps_before_clipping(tmp_path):
    """Lightning calls optimizer.step(closure): the layer norms come from Monitor.gradients_ready(), before clipping."""
    torch.manual_seed(0)
    data = torch.utils.data.TensorDataset(torch.randn(6 * BATCH, 8), 3 * torch.randn(6 * BATCH, 1))
    spy = LatestEachStep()
    settings = dict(SETTINGS, prometheus=False, stats_every=1)
    trainer = lightning.Trainer(
        max_epochs=1,
        gradient_clip_val=CLIP,
        accelerator="cpu",
        logger=False,
        callbacks=[TrainhealthCallback(**settings), spy],
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir=str(tmp_path),
    )
    trainer.fit(Regressor(), torch.utils.data.DataLoader(data, batch_size=BATCH))
    assert sorted(spy.latest) == list(range(1, 7))
    for stats in spy.latest.values():
        assert all(layer.grad_norm is not None for layer in stats.layers), stats
        layers = math.sqrt(sum(layer.grad_norm**2 for layer in stats.layers))
        assert math.isclose(layers, stats.grad_norm, rel_tol=1e-4)
