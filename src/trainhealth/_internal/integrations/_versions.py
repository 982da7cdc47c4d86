"""The trainer versions each integration is tested with, checked when the integration is imported.

An integration reads values where its trainer computes them (hook order, argument
names, private call sites differ between major releases), so it refuses a version
outside the tested range with one line naming what is installed and what to install.

:data:`TESTED` is where the ranges are declared. The ``[integrations]`` extra of pyproject.toml (a static file the
build reads) and docs/integrations.md quote them as :func:`requirement` writes them;
tests/integrations/test_versions.py holds the three, and the installed distribution's metadata, equal.

>>> TESTED["lightning"]
('2.5', '3')
>>> requirement("lightning")
'lightning>=2.5,<3'
>>> problem = unsupported("lightning", "1.9.5")
>>> print(problem)
trainhealth.integrations needs lightning >=2.5,<3 (tested); 1.9.5 is installed: pip install 'lightning>=2.5,<3'
>>> unsupported("lightning", "2.6.6") is None
True
"""

from __future__ import annotations

from importlib import metadata

__all__ = ["TESTED", "UnsupportedVersion", "require", "requirement", "unsupported"]

#: distribution -> (lowest tested release, first untested major); the ``[integrations]`` extra is
#: ``[requirement(d) for d in TESTED]``.
TESTED = {
    "transformers": ("5.0", "6"),
    "accelerate": ("1.10", "2"),
    "lightning": ("2.5", "3"),
}


class UnsupportedVersion(ImportError):
    """An installed trainer outside the range its integration is tested with."""


def _release(version: str) -> tuple[int, ...]:
    numbers = []
    for part in version.split("+")[0].split("."):
        digits = "".join(ch for ch in part if ch.isdigit()) if part[:1].isdigit() else ""
        if not digits:
            break
        numbers.append(int(digits))
        if not part.isdigit():  # 2.6.0rc1: the release is 2.6.0
            break
    return tuple(numbers)


def _specifier(distribution: str) -> str:
    low, high = TESTED[distribution]
    return f">={low},<{high}"


def requirement(distribution: str) -> str:
    """``distribution``'s tested range as a requirement (PEP 508), as the ``[integrations]`` extra lists it."""
    return distribution + _specifier(distribution)


def unsupported(distribution: str, installed: str) -> UnsupportedVersion | None:
    """The error for ``installed`` when it is outside ``distribution``'s tested range, else ``None``."""
    low, high = TESTED[distribution]
    if _release(low) <= _release(installed) < _release(high):
        return None
    spec = _specifier(distribution)
    return UnsupportedVersion(
        f"trainhealth.integrations needs {distribution} {spec} (tested); {installed} is "
        f"installed: pip install '{requirement(distribution)}'"
    )


def require(distribution: str) -> None:
    """Raise :class:`UnsupportedVersion` (one line) unless the installed ``distribution`` is in its tested range."""
    try:
        installed = metadata.version(distribution)
    except metadata.PackageNotFoundError:
        return  # the import that follows names the missing package
    problem = unsupported(distribution, installed)
    if problem is not None:
        raise problem
