"""Installed size of trainhealth in a fresh virtual environment: the core (a training pod) and [all].

    python benchmarks/install_size.py            # core only
    python benchmarks/install_size.py --all      # and the same with every extra, for comparison

Creates a fresh virtual environment per install (no system site packages), runs
``pip install <repo>`` (torch is not installed: training images bring their own),
and prints the size of each installed distribution and the total, less what a bare
environment holds (pip). Then, inside the core environment, checks what a pod
relies on: ``import trainhealth`` loads none of the analysis packages, the Monitor
and the collective logger import, and a command that needs an extra says which in
one line (exit status 2). Target (issue 16): core <= 100 MB, from about 550 MB.
Needs the package registry (pip).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import venv
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
HEAVY = ("pandas", "pyarrow", "statsmodels", "scipy", "grafanalib", "matplotlib", "torch", "yaml")

_SIZES = """
import importlib.metadata as metadata, json, os, sys
sizes = {}
for dist in metadata.distributions():
    total = 0
    for file in dist.files or ():
        path = dist.locate_file(file)
        try:
            total += os.path.getsize(path)
        except OSError:
            pass
    sizes[dist.metadata["Name"]] = total
print(json.dumps(sizes))
"""

_POD_CHECK = """
import sys, json
import trainhealth, trainhealth.comm
from trainhealth import Monitor
from trainhealth._internal.exporters.collectives.logger import CollectiveLogger
print(json.dumps(sorted(name for name in sys.modules if name.split(".")[0] in %r)))
""" % (HEAVY,)


def _environment(directory: Path) -> Path:
    venv.EnvBuilder(with_pip=True, clear=True).create(directory)
    return directory / "bin" / "python"


def _sizes(python: Path) -> dict[str, int]:
    return json.loads(subprocess.run([str(python), "-c", _SIZES], check=True, capture_output=True, text=True).stdout)


def measure(requirement: str, keep: Path) -> tuple[dict[str, int], Path]:
    """Bytes per distribution that ``pip install requirement`` added to a fresh environment."""
    python = _environment(keep)
    before = _sizes(python)
    done = subprocess.run(
        [str(python), "-m", "pip", "install", "-q", "--disable-pip-version-check", requirement],
        capture_output=True,
        text=True,
    )
    if done.returncode:
        sys.exit(f"pip install {requirement} failed:\n{done.stderr[-4000:]}")
    after = _sizes(python)
    return {name: size for name, size in after.items() if name not in before}, python


def report(title: str, sizes: dict[str, int]) -> float:
    total = sum(sizes.values()) / 1e6
    print(f"\n{title}: {total:.1f} MB in {len(sizes)} distributions")
    for name, size in sorted(sizes.items(), key=lambda item: -item[1])[:12]:
        print(f"  {name:<44} {size / 1e6:7.1f} MB")
    return total


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--all", action="store_true", help="also measure pip install '.[all]'")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as scratch:
        core, python = measure(str(REPO), Path(scratch, "core"))
        core_mb = report("pip install . (core, no extras, no torch)", core)
        loaded = json.loads(
            subprocess.run([str(python), "-c", _POD_CHECK], check=True, capture_output=True, text=True).stdout
        )
        print(
            f"\nimport trainhealth, trainhealth.comm, Monitor, CollectiveLogger in the core environment: "
            f"heavy modules loaded: {loaded or 'none'}"
        )
        command = subprocess.run(
            [str(Path(python).parent / "trainhealth"), "trace", "info", str(REPO)], capture_output=True, text=True
        )
        print(
            f"trainhealth trace info without the analysis extra: exit {command.returncode}, {command.stderr.strip()!r}"
        )
        if args.all:
            everything, _ = measure(f"{REPO}[all]", Path(scratch, "all"))
            report("pip install '.[all]' (no torch)", everything)
        print(f"\ncore install: {core_mb:.1f} MB (target <= 100 MB)")
    sys.exit(0 if core_mb <= 100 and not loaded else 1)


if __name__ == "__main__":
    main()
