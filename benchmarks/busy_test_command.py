"""The README's test command on a busy machine: run twice in a fresh clone beside a CPU-bound process.

    python benchmarks/busy_test_command.py            # two runs, one core kept busy
    python benchmarks/busy_test_command.py --runs 1 --idle

The repository is cloned into an empty temporary directory (nothing beside it, as CI does) and the
README's second command (its second ```bash block) runs there ``--runs`` times in a row, without
``TRAINHEALTH_DATA``, while a process spinning in a loop holds one core (pinned to the last one).
For each run it prints the wall time, pytest's summary line and every failing test; the logs stay
in ``--logs``. Exit status 1 when a run failed.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
_SUMMARY = re.compile(r"^=*\s*((?:\d+ [\w ]+, )*\d+ [\w ]+ in [\d.]+s[^=]*?)\s*=*$")


def readme_command(readme: Path, block: int = 2) -> str:
    """The first line of the README's ``block``-th ```bash block (as .ci/run reads it)."""
    lines, seen = readme.read_text().splitlines(), 0
    for index, line in enumerate(lines):
        if line.strip() == "```bash":
            seen += 1
            if seen == block:
                return lines[index + 1]
    raise SystemExit(f"busy_test_command: {readme} has no ```bash block number {block}")


def _spin() -> subprocess.Popen:
    """A process that keeps one core busy (the last one), as another user's job would."""
    core = max(os.sched_getaffinity(0))
    return subprocess.Popen(
        [sys.executable, "-c", "while True: pass"], preexec_fn=lambda: os.sched_setaffinity(0, {core})
    )


def run_once(command: str, clone: Path, log: Path) -> tuple[float, int, str, list[str]]:
    """Wall seconds, exit status, pytest's summary line and the failing tests of one run of ``command``."""
    env = {key: value for key, value in os.environ.items() if key != "TRAINHEALTH_DATA"}
    shutil.rmtree(clone / ".venv", ignore_errors=True)  # each run installs into a fresh environment, as a newcomer's
    began = time.monotonic()
    with log.open("w") as out:
        status = subprocess.run(["bash", "-c", command], cwd=clone, env=env, stdout=out, stderr=subprocess.STDOUT)
    wall = time.monotonic() - began
    text = log.read_text(errors="replace").splitlines()
    summary = next((m.group(1) for line in reversed(text) if (m := _SUMMARY.match(line))), "no pytest summary")
    failures = [line for line in text if line.startswith(("FAILED ", "ERROR "))]
    return wall, status.returncode, summary, failures


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=2, help="runs in a row (default 2)")
    parser.add_argument("--idle", action="store_true", help="no busy process beside the runs")
    parser.add_argument("--logs", type=Path, default=None, help="where each run's log is kept (default: a temp dir)")
    options = parser.parse_args()
    if options.runs < 1:
        parser.error("--runs must be at least 1")
    command = readme_command(ROOT / "README.md")
    logs = options.logs or Path(tempfile.mkdtemp(prefix="busy-test-logs-"))
    logs.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="busy-test-") as scratch:
        clone = Path(scratch, "trainhealth")
        subprocess.run(["git", "clone", "-q", str(ROOT), str(clone)], check=True)
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=clone, capture_output=True, text=True)
        print(f"fresh clone of {head.stdout.strip()} in {clone}; {os.cpu_count()} cores", flush=True)
        print(f"command: {command}", flush=True)
        spinner = None if options.idle else _spin()
        print("beside: nothing" if spinner is None else f"beside: a busy loop on one core (pid {spinner.pid})")
        failed = False
        try:
            for run in range(1, options.runs + 1):
                log = logs / f"run-{run}.log"
                wall, status, summary, failures = run_once(command, clone, log)
                failed |= status != 0
                print(
                    f"run {run}: {wall:.0f} s wall ({wall / 60:.1f} min), exit {status}; pytest: {summary}; "
                    f"failures: {len(failures)} (log: {log})",
                    flush=True,
                )
                for failure in failures:
                    print(f"  {failure}", flush=True)
        finally:
            if spinner is not None:
                spinner.kill()
                spinner.wait()
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
