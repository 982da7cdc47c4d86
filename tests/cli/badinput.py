"""What every bad-input test asserts: the command refuses in one line, exit status 2, no traceback, no
hang, and the files it was given are unchanged."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

#: seconds a refusal may take; a command still running after it has hung
REFUSAL_TIMEOUT_S = 60.0

#: Variable naming a file to which :func:`run_cli` appends each invocation's arguments (a JSON list per
#: line), to count the corpus: ``TRAINHEALTH_BADINPUT_LOG=/tmp/cases pytest tests/cli``.
CASE_LOG = "TRAINHEALTH_BADINPUT_LOG"


def snapshot(*paths: Path) -> dict[str, str]:
    """A digest of every file under ``paths`` (contents and names), to show they were left as they were."""
    digests = {}
    for root in paths:
        files = [root] if root.is_file() else sorted(p for p in root.rglob("*") if p.is_file()) if root.is_dir() else []
        for file in files:
            try:
                digests[str(file)] = hashlib.sha256(file.read_bytes()).hexdigest()
            except OSError as exc:  # unreadable on purpose
                digests[str(file)] = f"unreadable: {exc.errno}"
    return digests


def run_cli(
    *args: str, cwd: Path | None = None, env: dict[str, str] | None = None, timeout_s: float = REFUSAL_TIMEOUT_S
) -> subprocess.CompletedProcess:
    """``trainhealth ARGS`` in a fresh interpreter (``trainhealth-lab ARGS`` when the first word is
    ``trainhealth-lab``); a hang fails the test through ``TimeoutExpired``."""
    environment = {**os.environ, **(env or {})}
    log = os.environ.get(CASE_LOG)
    if log:  # counting the corpus: one line per invocation
        with open(log, "a", encoding="utf-8") as handle:
            handle.write(json.dumps(list(args)) + "\n")
    program = (
        ["-m", "trainhealth_lab", *args[1:]]
        if args[:1] == ("trainhealth-lab",)
        else ["-m", "trainhealth._internal.cli", *args]
    )
    return subprocess.run(
        [sys.executable, *program],
        capture_output=True,
        text=True,
        cwd=cwd,
        env=environment,
        timeout=timeout_s,
        stdin=subprocess.DEVNULL,
    )


def assert_refused(result: subprocess.CompletedProcess, *, mentions: str | None = None) -> str:
    """The command exited 2 with one ``trainhealth: error:`` line on stderr and no traceback; the line."""
    stderr = result.stderr.strip()
    assert "Traceback" not in result.stderr, result.stderr
    assert result.returncode == 2, f"exit {result.returncode}: {result.stderr}{result.stdout}"
    lines = stderr.splitlines()
    assert len(lines) >= 1, "refused without saying why"
    last = lines[-1]
    assert last.startswith("trainhealth") and "error" in last, stderr
    if mentions is not None:
        assert mentions in last, last
    return last
