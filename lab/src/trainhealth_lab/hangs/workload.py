"""What every hang-lab rank shares, whatever trains in it: the data loader stand-in, the onset file, the Monitor's
settings."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

__all__ = ["load_batch", "monitor_settings", "onset"]


def load_batch(seconds: float) -> None:
    """The data loader: returns after ``seconds`` (forever, for a stall)."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        time.sleep(0.05)


def onset(out: Path, rank: int) -> None:
    """Write ``onset-<rank>.json``: the unix time the case's behaviour began."""
    (out / f"onset-{rank}.json").write_text(json.dumps({"rank": rank, "time": time.time()}))


def monitor_settings(case: dict[str, Any], rank: int) -> dict[str, Any]:
    """The Monitor's settings in every lab rank: collectives logged, /metrics on the rank's port, no GPU."""
    settings: dict[str, Any] = {
        "env": {**os.environ},
        "comm": True,
        "gpu_backend": "off",
        "otel": False,
        "prometheus_addr": "127.0.0.1",
        "prometheus_port": int(case["metrics_ports"][rank]),
        "trace_dir": str(Path(case["out"]) / "traces"),
        "detectors": "off",
    }
    if case.get("pause_limit_s") is not None:
        settings["comm_pause_limit"] = float(case["pause_limit_s"])
    return settings
