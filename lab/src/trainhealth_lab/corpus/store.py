"""The corpus on disk: ``index.json``, and per run ``signals.csv`` and ``labels.json``.

:func:`load_corpus` reads a corpus back; a missing or malformed file raises
:class:`CorpusError` naming the file.

>>> import tempfile
>>> import pandas as pd
>>> root = Path(tempfile.mkdtemp())
>>> signals = pd.DataFrame({"step": [0, 1], "loss": [2.0, float("nan")], "grad_norm": [1.0, 1.5],
...                         "lr": [1e-3, 1e-3], "step_time": [0.01, 0.02]})
>>> write_run(root, "mlp-clean-s0", signals, {"run": "mlp-clean-s0", "scenario": "clean"})
>>> write_index(root, ["mlp-clean-s0"], steps=2, seeds=[0], command="trainhealth-lab corpus")
>>> [run] = load_corpus(root)
>>> run.run_id, run.labels["scenario"], run.signals["loss"].isna().tolist()
('mlp-clean-s0', 'clean', [False, True])
>>> load_corpus(root / "missing")
Traceback (most recent call last):
...
trainhealth_lab.corpus.store.CorpusError: .../missing/index.json: no corpus index there
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trainhealth._internal._files import write_text

__all__ = [
    "INDEX_FILE",
    "LABELS_FILE",
    "SIGNALS_COLUMNS",
    "SIGNALS_FILE",
    "CorpusError",
    "CorpusRun",
    "load_corpus",
    "write_index",
    "write_run",
]

INDEX_FILE = "index.json"
SIGNALS_FILE = "signals.csv"
LABELS_FILE = "labels.json"
SIGNALS_COLUMNS = ("step", "loss", "grad_norm", "lr", "step_time")
VERSION = 1


class CorpusError(ValueError):
    """A corpus file is missing or malformed; the message names the file."""


@dataclass(frozen=True)
class CorpusRun:
    """One training run of the corpus: its id, its labels (the ``labels.json`` object) and its signals,
    one row per step with the columns of :data:`SIGNALS_COLUMNS`."""

    run_id: str
    labels: dict[str, Any]
    signals: Any  # pandas.DataFrame


def _dump(data: Any) -> str:
    return json.dumps(data, sort_keys=True, indent=2, allow_nan=False) + "\n"


def write_run(root: Path, run_id: str, signals: Any, labels: dict[str, Any]) -> None:
    """Write one run's ``signals.csv`` and ``labels.json`` under ``root/run_id``."""
    directory = root / run_id
    directory.mkdir(exist_ok=True)
    write_text(
        directory / SIGNALS_FILE,
        signals.to_csv(columns=list(SIGNALS_COLUMNS), index=False, float_format="%.9g", na_rep="nan"),
    )
    write_text(directory / LABELS_FILE, _dump(labels))


def write_index(root: Path, run_ids: Sequence[str], *, steps: int, seeds: Sequence[int], command: str) -> None:
    """Write ``index.json``: the runs, the steps per run, the seeds and the command that made the corpus."""
    index = {"version": VERSION, "runs": list(run_ids), "steps": steps, "seeds": list(seeds), "command": command}
    write_text(root / INDEX_FILE, _dump(index))


def _read_json(path: Path) -> Any:
    if not path.is_file():
        raise CorpusError(f"{path}: no {'corpus index' if path.name == INDEX_FILE else 'run labels'} there")
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise CorpusError(f"{path}: not readable JSON ({exc})") from None


def _read_signals(path: Path) -> Any:
    import pandas as pd

    if not path.is_file():
        raise CorpusError(f"{path}: no signals there")
    try:
        frame = pd.read_csv(path)
    except (OSError, ValueError) as exc:
        raise CorpusError(f"{path}: not a readable CSV ({exc})") from None
    missing = [column for column in SIGNALS_COLUMNS if column not in frame.columns]
    if missing:
        raise CorpusError(f"{path}: missing columns {', '.join(missing)}")
    if frame["step"].isna().any() or list(frame["step"]) != list(range(len(frame))):
        raise CorpusError(f"{path}: steps are not 0, 1, 2, ... one row each")
    try:
        return frame.astype({column: float for column in SIGNALS_COLUMNS[1:]})
    except ValueError as exc:
        raise CorpusError(f"{path}: a value is not a number ({exc})") from None


def load_corpus(path: str | Path) -> list[CorpusRun]:
    """The runs of the corpus at ``path``, in the order of its index."""
    root = Path(path)
    index = _read_json(root / INDEX_FILE)
    if not isinstance(index, dict) or index.get("version") != VERSION:
        raise CorpusError(f"{root / INDEX_FILE}: not a version {VERSION} corpus index")
    runs = index.get("runs")
    if not isinstance(runs, list) or not all(isinstance(run, str) and run and "/" not in run for run in runs):
        raise CorpusError(f"{root / INDEX_FILE}: 'runs' is not a list of run ids")
    loaded = []
    for run_id in runs:
        labels = _read_json(root / run_id / LABELS_FILE)
        if not isinstance(labels, dict) or labels.get("run") != run_id:
            raise CorpusError(f"{root / run_id / LABELS_FILE}: not the labels of run {run_id}")
        loaded.append(CorpusRun(run_id, labels, _read_signals(root / run_id / SIGNALS_FILE)))
    return loaded
