"""What trainhealth's wheel holds: its size, modules and lines of Python, built from a source tree.

    python benchmarks/wheel_contents.py                        # this checkout
    python benchmarks/wheel_contents.py --source /tmp/base34   # another checkout (a git worktree)

Copies the tree's ``pyproject.toml``, ``README.md`` and ``src/`` into a temporary directory (so no stale build
directory adds a file), builds the wheel there with pip (no dependencies, no build isolation: setuptools comes
with the test extra) and prints one line: bytes, modules, lines, and what of ``trainhealth/lab/`` (the evaluation
code, before it moved to ``lab/``) the wheel holds.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def wheel_contents(source: Path) -> str:
    with tempfile.TemporaryDirectory(prefix="trainhealth-wheel-") as scratch:
        copy = Path(scratch) / "tree"
        copy.mkdir()
        for name in ("pyproject.toml", "README.md"):
            shutil.copy2(source / name, copy / name)
        shutil.copytree(source / "src", copy / "src", ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
        subprocess.run(
            [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w", scratch, str(copy)],
            check=True,
            capture_output=True,
        )
        (wheel,) = Path(scratch).glob("*.whl")
        with zipfile.ZipFile(wheel) as archive:
            modules = [name for name in archive.namelist() if name.endswith(".py")]
            lines = sum(archive.read(name).count(b"\n") for name in modules)
            lab = sorted(
                {name.split("/")[2].removesuffix(".py") for name in modules if name.startswith("trainhealth/lab/")}
            )
        return (
            f"{source}: {wheel.stat().st_size:,} bytes, {len(modules)} modules, {lines:,} lines; "
            f"evaluation code inside: {', '.join(f'trainhealth/lab/{part}' for part in lab) or 'none'}"
        )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--source", type=Path, default=REPO, help="the checkout to build (default: this one)")
    print(wheel_contents(parser.parse_args().source))
