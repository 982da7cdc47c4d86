"""Optional features and the extras that install them; a missing extra is one clear line.

``pip install trainhealth`` is what a training pod needs (the Monitor, the collective
logger, the sinks). Analysis, dashboards and the demo come as extras; their
packages load only when the feature runs, and a missing one is reported as a
:class:`MissingExtra` naming the ``pip install`` to run.

>>> str(missing_extra(ModuleNotFoundError("No module named 'pandas'", name="pandas"), "trainhealth trace"))
"trainhealth trace needs the 'analysis' extra (no module named 'pandas'): pip install 'trainhealth[analysis]'"
>>> missing_extra(ModuleNotFoundError("No module named 'torch'", name="torch"), "x") is None  # not an extra's
True
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from typing import Any

__all__ = ["EXTRA_OF_MODULE", "MissingExtra", "lazy_attributes", "missing_extra"]

#: The extra that installs each optional top-level module (PyYAML comes with analysis and dashboards alike).
EXTRA_OF_MODULE = {
    "pandas": "analysis",
    "pyarrow": "analysis",
    "statsmodels": "analysis",
    "scipy": "analysis",
    "patsy": "analysis",
    "yaml": "analysis",
    "grafanalib": "dashboards",
    "rich": "demo",
    "matplotlib": "demo",
}


class MissingExtra(ImportError):
    """A feature's optional packages are not installed; the message names the extra to install."""


def missing_extra(exc: ModuleNotFoundError, feature: str, extra: str | None = None) -> MissingExtra | None:
    """The :class:`MissingExtra` behind ``exc`` when an extra's module is missing, else None.

    ``extra`` names the feature's extra when the caller knows it (a dashboards command missing
    PyYAML needs ``[dashboards]``); otherwise the module's own extra is named.
    """
    module = (exc.name or "").split(".")[0]
    if module not in EXTRA_OF_MODULE:
        return None
    extra = extra or EXTRA_OF_MODULE[module]
    return MissingExtra(
        f"{feature} needs the '{extra}' extra (no module named '{module}'): pip install 'trainhealth[{extra}]'",
        name=module,
    )


def lazy_attributes(package: str, homes: Mapping[str, str], extra: str | None = None) -> Callable[[str], Any]:
    """A module ``__getattr__`` (PEP 562) that imports each name from its home module on first use.

    ``homes`` maps a public name to the dotted module holding it; importing the package itself
    stays light, and a missing extra surfaces as :class:`MissingExtra`.
    """

    def __getattr__(name: str) -> Any:
        home = homes.get(name)
        if home is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        try:
            module = importlib.import_module(home)
        except ModuleNotFoundError as exc:
            problem = missing_extra(exc, f"{package}.{name}", extra)
            if problem is None:
                raise
            raise problem from exc
        return getattr(module, name)

    return __getattr__
