"""Imbalance: uneven work that no device causes (a longer stage, uneven batches)."""

from __future__ import annotations

import warnings

import numpy as np
import pandas as pd

from trainhealth._internal.localize.candidates import Thresholds
from trainhealth._internal.localize.timings import Timings
from trainhealth._internal.localize.wording import ranks_text

__all__ = ["imbalance_reasons"]


def imbalance_reasons(timings: Timings, thresholds: Thresholds) -> list[str]:
    """Reasons to call the window's irregularity uneven work: stages whose peer groups compute
    longer in every replica, or replicas whose compute moves together from step to step.

    Both are robust to one member's slow stretch: the stage test takes each peer group's median, the
    batch test the median absolute spread of every replica's steps, which a few slow cells (one GPU
    that came and went) leave where the run's uneven work puts it.
    """
    reasons = []
    n_peer_groups = int(timings.peer_of.max()) + 1
    if n_peer_groups >= 2:
        per_group = _per_group_median(timings.compute_seconds, timings.peer_of, n_peer_groups)
        median = float(np.median(per_group))
        excess = per_group / median - 1.0 if median > 0 else np.zeros_like(per_group)
        uneven = np.flatnonzero(excess > thresholds.stage_imbalance)
        if len(uneven):
            ranks = timings.ranks[np.isin(timings.peer_of, uneven)]
            reasons.append(
                f"uneven stages: ranks {ranks_text(ranks)} compute {excess[uneven].max() + 1:.2f}x as long "
                f"per step as the median peer group, in every replica alike (no single device)"
            )
    if int(timings.replica_of.max()) >= 1:
        per_replica = pd.DataFrame(timings.compute).groupby(timings.replica_of).median().to_numpy()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            varying = per_replica - np.nanmedian(per_replica, axis=1, keepdims=True)
            spread = 1.4826 * float(np.nanmedian(np.abs(varying))) if np.isfinite(varying).any() else 0.0
        if spread > thresholds.replica_imbalance:
            reasons.append(
                f"uneven batches: whole replicas compute {np.exp(spread) - 1:.1%} longer or shorter from "
                f"step to step (sequence lengths vary), every GPU of a replica alike"
            )
    return reasons


def _per_group_median(values: np.ndarray, groups: np.ndarray, n_groups: int) -> np.ndarray:
    out = np.zeros(n_groups)
    for group in range(n_groups):
        block = values[groups == group]
        out[group] = float(np.nanmedian(block)) if np.isfinite(block).any() else 0.0
    return out
