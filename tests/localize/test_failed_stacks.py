"""``trainhealth localize`` on Flight Recorder dumps of a hang reads the ``stacks/*.failed.txt`` the hang watchers
wrote beside them, at most ``MAX_FAILURE_FILES`` of them, and says how many it left unread."""

from __future__ import annotations

import os
import pickle
import subprocess
import sys
from pathlib import Path

from trainhealth._internal.cli.localize import MAX_FAILURE_FILES

WORLD = 3
ABSENT = 2


def _entry(index: int, rank: int) -> dict:
    created = 1_700_000_000_000_000_000 + index * 2_000_000 + rank * 1_000
    return {
        "process_group": ("0", "default_pg"),
        "collective_seq_id": index + 1,
        "profiling_name": "gloo:all_reduce",
        "time_created_ns": created,
        "input_sizes": [[256]],
        "input_dtypes": ["Float"],
        "state": "completed" if index < 3 else "scheduled",
        "is_p2p": False,
    }


def _hang(root: Path, failed_files: int) -> Path:
    """Dumps of a job whose rank 2 never entered the fourth all-reduce, and ``failed_files`` stack files."""
    dumps = root / "flight-recorder"
    dumps.mkdir()
    for rank in range(WORLD):
        entries = [_entry(index, rank) for index in range(3 if rank == ABSENT else 4)]
        dump = {"pg_config": {"0": {"ranks": str(list(range(WORLD)))}}, "entries": entries}
        (dumps / f"rank_{rank}").write_bytes(pickle.dumps(dump, protocol=4))
    (root / "stacks").mkdir()
    for number in range(failed_files):
        (root / "stacks" / f"rank-{number}.{number}.failed.txt").write_text(
            f"rank {number}: all_reduce failed: Connection closed by peer. This is typically ...\n"
        )
    os.mkfifo(root / "stacks" / "rank-0.0.failed.txt.pipe.failed.txt")  # never opened: a pipe blocks its reader
    return dumps


def _localize(dumps: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "trainhealth._internal.cli", "localize", str(dumps)],
        capture_output=True,
        text=True,
        timeout=120,
        stdin=subprocess.DEVNULL,
    )


def test_failed_collectives_beside_the_dumps_are_read_up_to_a_count_and_the_rest_counted(tmp_path):
    done = _localize(_hang(tmp_path, MAX_FAILURE_FILES + 200))
    assert done.returncode == 0 and "Traceback" not in done.stderr, done.stderr
    said = done.stdout + done.stderr
    assert f"rank {ABSENT} never entered" in said
    failures = [line for line in said.splitlines() if "Connection closed by peer" in line]
    assert len(failures) == MAX_FAILURE_FILES, len(failures)  # was one line per file: 232 here
    assert "This is typically" not in said
    assert "and 200 more stacks/*.failed.txt files, not read" in said  # the pipe is skipped, never opened


def test_a_few_failed_collectives_are_all_read(tmp_path):
    done = _localize(_hang(tmp_path, 3))
    assert done.returncode == 0, done.stderr
    said = done.stdout + done.stderr
    assert [f"rank {n}: all_reduce failed" in said for n in range(3)] == [True] * 3
    assert "more stacks" not in said
