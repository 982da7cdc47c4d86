"""What ships: trainhealth's wheel holds the product and none of the evaluation harness; the lab's wheel holds only
the lab. Both are built for real from a copy of the sources (no stale build directory can add a file)."""

from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
#: the lab's packages and modules: none of them may be a package or module of trainhealth's wheel
LAB_NAMES = {
    path.stem if path.is_file() else path.name
    for path in (ROOT / "lab" / "src" / "trainhealth_lab").iterdir()
    if path.name not in ("__init__.py", "__main__.py", "__pycache__", "cli.py")
}


def _wheel(source: Path, copy_to: Path, names: tuple[str, ...]) -> list[str]:
    """The file names inside the wheel built from ``names`` of ``source``, copied to ``copy_to``."""
    for name in names:
        origin = source / name
        if origin.is_dir():
            shutil.copytree(origin, copy_to / name, ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
        else:
            shutil.copy2(origin, copy_to / name)
    built = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "-q",
            "--no-deps",
            "--no-build-isolation",
            "-w",
            str(copy_to / "dist"),
            str(copy_to),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert built.returncode == 0, built.stderr
    (wheel,) = (copy_to / "dist").glob("*.whl")
    with zipfile.ZipFile(wheel) as archive:
        return archive.namelist()


def test_trainhealths_wheel_holds_no_evaluation_module(tmp_path):
    files = _wheel(ROOT, tmp_path, ("pyproject.toml", "README.md", "src"))
    tops = {name.split("/")[0] for name in files}
    assert tops == {"trainhealth", next(top for top in tops if top.endswith(".dist-info"))}
    children = {name.split("/")[1].removesuffix(".py") for name in files if name.startswith("trainhealth/")}
    assert not children & (LAB_NAMES | {"lab"}), sorted(children & (LAB_NAMES | {"lab"}))
    # what users run stays: the demo, the simulator behind `trainhealth sim`, the injectors the demo needs
    for module in (
        "trainhealth/_internal/demo/runner.py",
        "trainhealth/_internal/simulator/simulate.py",
        "trainhealth/_internal/injectors/bits.py",
    ):
        assert module in files


def test_the_labs_wheel_holds_only_the_lab(tmp_path):
    files = _wheel(ROOT / "lab", tmp_path, ("pyproject.toml", "src"))
    assert {name.split("/")[0] for name in files if not name.split("/")[0].endswith(".dist-info")} == {
        "trainhealth_lab"
    }
    assert "trainhealth_lab/realrun/suite.py" in files
    assert "trainhealth_lab/bench/nab.py" in files
