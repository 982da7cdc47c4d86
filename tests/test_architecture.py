"""docs/architecture.md names every module of the package and of the lab beside it, in its package, and no module
that is gone."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
#: the trees the document draws, each from its root line
TREES = ("src/trainhealth/", "lab/src/trainhealth_lab/")


def _listed(tree: str) -> dict[str, set[str]]:
    """Module names in backticks per package entry of the document's tree (``./`` is the package itself)."""
    text = (ROOT / "docs" / "architecture.md").read_text()
    block = text.split(f"```\n{tree}\n", 1)[1].split("```", 1)[0]
    entries: dict[str, set[str]] = {}
    current = None
    for line in block.splitlines():
        start = re.match(r"^  (\./|[a-z_]+(?:/[a-z_]+)*/)\s", line)
        if start:
            current = start.group(1)
            assert current not in entries, f"{current} listed twice"
            entries[current] = set()
        assert current is not None, line
        entries[current] |= set(re.findall(r"`([A-Za-z_][A-Za-z0-9_]*)`", line))
    return entries


def _modules(tree: str) -> dict[str, set[str]]:
    found: dict[str, set[str]] = {}
    package_root = ROOT / tree
    for path in package_root.rglob("*.py"):
        if path.name == "__init__.py":
            continue
        package = path.parent.relative_to(package_root).as_posix()
        found.setdefault("./" if package == "." else package + "/", set()).add(path.stem)
    return found


@pytest.mark.parametrize("tree", TREES)
def test_every_module_is_listed_in_its_package_and_every_listed_one_exists(tree):
    listed, modules = _listed(tree), _modules(tree)
    assert set(listed) == set(modules), "packages differ: " + str(set(listed) ^ set(modules))
    for package, names in modules.items():
        missing, gone = names - listed[package], listed[package] - names
        assert not missing and not gone, f"{package}: not listed {sorted(missing)}, listed but absent {sorted(gone)}"
