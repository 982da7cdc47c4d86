"""A torchtitan-style metric logger: ``log(metrics, step)`` and ``close()``, like torchtitan's TensorBoard and
W&B loggers, reading torchtitan's metric names.

torchtitan's MetricsProcessor hands every logger the same dictionary each
``log_freq`` steps: ``loss_metrics/global_avg_loss``, ``grad_norm``,
``throughput(tps)``, ``time_metrics/end_to_end(s)``, ``lr``... This logger turns
it into Monitor steps (loss, gradient norm, and tokens from throughput × the
time since the last call, so the exported tokens/s is torchtitan's),
so trainhealth's metrics, detectors and alerts work on a torchtitan job.
Register it next to torchtitan's own loggers, or call it from the training loop.
With the model and optimizer, the Monitor hooks the optimizer: the learning rate is the one
each step applies, and the cross-replica checks run at the optimizer step, which every rank
reaches, so a logger called on one rank only (as torchtitan's are) never blocks the others.

>>> logger = TrainhealthLogger(prometheus=False, otel=False, gpu_backend="off", env={})
>>> logger.log({"loss_metrics/global_avg_loss": 2.5, "grad_norm": 1.2, "throughput(tps)": 4000.0,
...             "time_metrics/end_to_end(s)": 0.5}, step=10)
>>> logger.monitor.flush()
True
>>> logger.monitor.latest.loss, logger.monitor.latest.grad_norm
(2.5, 1.2)
>>> logger.close()
"""

from __future__ import annotations

import time
from typing import Any

from trainhealth._internal.exporters.monitor import Monitor

__all__ = ["TORCHTITAN_KEYS", "TrainhealthLogger"]

#: torchtitan metric name -> what it is here.
TORCHTITAN_KEYS = {
    "loss": ("loss_metrics/global_avg_loss", "loss"),
    "grad_norm": ("grad_norm", "loss_metrics/grad_norm"),
    "throughput": ("throughput(tps)",),
}


class TrainhealthLogger:
    def __init__(self, model: Any = None, optimizer: Any = None, **monitor_settings: Any) -> None:
        self.monitor = Monitor(model, optimizer, **monitor_settings)
        self._last_call: float | None = None

    def log(self, metrics: dict[str, Any], step: int) -> None:
        now = time.perf_counter()
        loss, grad_norm, throughput = (
            _first(metrics, "loss"),
            _first(metrics, "grad_norm"),
            _first(metrics, "throughput"),
        )
        tokens = None
        if throughput is not None and self._last_call is not None:
            tokens = round(float(throughput) * (now - self._last_call))
        self._last_call = now
        self.monitor.step(loss=loss, tokens=tokens, grad_norm=grad_norm, step=step)

    def close(self) -> None:
        self.monitor.close()


def _first(metrics: dict[str, Any], what: str) -> Any:
    for key in TORCHTITAN_KEYS[what]:
        if metrics.get(key) is not None:
            return metrics[key]
    return None
