"""What the Monitor needs to assemble itself: the optimizer under wrappers (and whether it can be
hooked), the parameters to watch, the GPU's UUID, and closing at interpreter exit."""

from __future__ import annotations

import atexit
import logging
import weakref
from typing import Any, Protocol

from trainhealth._internal.exporters.training.layer_groups import group_parameters
from trainhealth._internal.exporters.training.param_stats import ParameterStats
from trainhealth._internal.store import MetricStore

__all__ = ["base_optimizer", "close_at_exit", "cuda_uuid", "hookable_optimizer", "parameter_stats"]

log = logging.getLogger(__name__)


def base_optimizer(optimizer: Any) -> Any:
    """The torch optimizer inside wrappers such as Accelerate's AcceleratedOptimizer (they forward ``step``)."""
    while (
        optimizer is not None
        and not hasattr(optimizer, "_optimizer_step_pre_hooks")
        and hasattr(optimizer, "optimizer")
    ):
        optimizer = optimizer.optimizer
    return optimizer


def hookable_optimizer(optimizer: Any, store: MetricStore) -> Any:
    """``optimizer`` when the Monitor can hook it as a ``torch.optim.Optimizer``, else ``None``.

    It needs ``param_groups`` (each with ``params``) and the step hooks. Any other optimizer
    is counted once in ``trainhealth_exporter_errors_total{source="optimizer"}``; the Monitor
    then takes the gradient statistics from the model's parameters in ``Monitor.step``.

    >>> from trainhealth._internal import catalog
    >>> class Custom:
    ...     def step(self): ...
    >>> store = MetricStore()
    >>> hookable_optimizer(Custom(), store) is None, store.value(catalog.EXPORTER_ERRORS, ("optimizer",))
    (True, 1.0)
    """
    if optimizer is None:
        return None
    try:
        for group in optimizer.param_groups:
            list(group["params"])
        missing = [
            name
            for name in ("register_step_pre_hook", "register_step_post_hook")
            if not callable(getattr(optimizer, name, None))
        ]
        if missing:
            raise TypeError(f"no {' or '.join(missing)}")
    except Exception as exc:
        store.record_error(
            "optimizer",
            TypeError(
                f"cannot hook {type(optimizer).__name__} as a torch optimizer "
                f"({type(exc).__name__}: {exc}); its statistics come from the "
                f"model's parameters"
            ),
        )
        return None
    return optimizer


def parameter_stats(torch: Any, model: Any, optimizer: Any, max_groups: int) -> tuple[ParameterStats, tuple[str, ...]]:
    """The parameters to watch (the optimizer's, else the model's) and their layer groups."""
    names: dict[int, str] = {}
    if model is not None:
        names = {id(p): name for name, p in model.named_parameters()}
    if optimizer is not None:
        params, labels = [], []
        for position, group in enumerate(optimizer.param_groups):
            for p in group["params"]:
                params.append(p)
                labels.append(names.get(id(p), f"param_group_{position}"))
    elif model is not None:
        params = [p for p in model.parameters() if p.requires_grad]
        labels = [names[id(p)] for p in params]
    else:
        params, labels = [], []
    grouping = group_parameters(labels, max_groups)
    return ParameterStats(torch, params, grouping.index, len(grouping.labels)), grouping.labels


def cuda_uuid(torch: Any, model: Any) -> str:
    """The UUID of the GPU holding the model's first parameter, as dcgm-exporter writes it."""
    try:
        if model is None or not torch.cuda.is_available():
            return ""
        device = next(model.parameters()).device
        if device.type != "cuda":
            return ""
        uuid = str(torch.cuda.get_device_properties(device).uuid)
        return uuid if uuid.startswith("GPU-") else f"GPU-{uuid}"
    except Exception:
        log.debug("trainhealth: could not read the GPU UUID", exc_info=True)
        return ""


class _Closeable(Protocol):
    def close(self) -> None: ...


def close_at_exit(closeable: _Closeable) -> Any:
    """Close ``closeable`` at interpreter exit unless it was closed; holds it weakly.

    Returns the registered function, for ``atexit.unregister`` when it is closed first.
    """
    reference = weakref.ref(closeable)

    def close() -> None:
        alive = reference()
        if alive is not None:
            alive.close()

    atexit.register(close)
    return close
