"""The two test tiers. The README's test command runs ``pytest -m "not slow"``: unit tests, doctests,
contract tests and one real case of each sweep and of each multi-process and real-binary path;
``pytest -m slow`` runs the rest, and ``bash .ci/run`` runs both (docs: README, Development)."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Any

import pytest

slow = pytest.mark.slow


def sweep(argnames: str | Sequence[str], cases: Iterable[Any], ids: Iterable[str] | Callable | None = None):
    """``pytest.mark.parametrize`` over a sweep of like cases: the first case runs in the fast tier, the others are
    marked slow.

    >>> marker = sweep("n", [1, 2, 3])
    >>> [bool(param.marks) for param in marker.args[1]]
    [False, True, True]
    """
    several = not isinstance(argnames, str) or "," in argnames
    named = None if ids is None or callable(ids) else list(ids)
    params = [
        pytest.param(
            *(case if several else (case,)),
            id=None if named is None else named[index],
            marks=() if index == 0 else (slow,),
        )
        for index, case in enumerate(cases)
    ]
    return pytest.mark.parametrize(argnames, params, ids=ids if callable(ids) else None)
