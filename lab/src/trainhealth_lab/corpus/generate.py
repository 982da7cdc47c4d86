"""Generate a corpus: every planned run trained in a worker process (one torch thread each), its
signals and labels written as it finishes, then ``index.json``.

>>> import tempfile
>>> from trainhealth_lab.corpus.plan import plan_runs
>>> from trainhealth_lab.corpus.store import load_corpus
>>> out = Path(tempfile.mkdtemp())
>>> done = generate(plan_runs(["mlp"], ["overflow"], [0], steps=100), out, workers=1, command="example")
>>> [run.run_id for run in load_corpus(out)], done[0]["kind"], done[0]["window"][1] - done[0]["cause_step"]
(['mlp-overflow-s0'], 'sharp', 20)
"""

from __future__ import annotations

import multiprocessing
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

from trainhealth_lab.corpus.labels import run_labels
from trainhealth_lab.corpus.plan import RunPlan
from trainhealth_lab.corpus.store import write_index, write_run

__all__ = ["generate"]


def _start_worker() -> None:
    import torch

    torch.set_num_threads(1)


def _train_and_write(plan: RunPlan, out: Path) -> dict[str, Any]:
    from trainhealth_lab.corpus.train import train

    result = train(plan)
    labels = run_labels(plan, result.signals["loss"].tolist(), result.injection)
    write_run(out, plan.run_id, result.signals, labels)
    return labels


def generate(
    plans: Sequence[RunPlan],
    out: Path,
    *,
    workers: int,
    command: str,
    report: Callable[[dict[str, Any]], None] | None = None,
) -> list[dict[str, Any]]:
    """Train and write every run of ``plans`` under ``out`` with at most ``workers`` processes, then the
    index; ``report`` sees each run's labels as it finishes. Returns the labels in the order of ``plans``."""
    spawn = multiprocessing.get_context("spawn")  # no fork of a process that may hold torch threads
    with ProcessPoolExecutor(max_workers=workers, mp_context=spawn, initializer=_start_worker) as pool:
        futures = [pool.submit(_train_and_write, plan, out) for plan in plans]
        labels = []
        for future in futures:
            labels.append(future.result())
            if report is not None:
                report(labels[-1])
    write_index(
        out,
        [plan.run_id for plan in plans],
        steps=plans[0].steps if plans else 0,
        seeds=sorted({plan.seed for plan in plans}),
        command=command,
    )
    return labels
