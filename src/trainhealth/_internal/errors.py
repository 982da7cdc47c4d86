"""Errors the ``trainhealth`` command reports in one line with exit status 2."""

from __future__ import annotations

__all__ = ["UsageError"]


class UsageError(Exception):
    """Bad input from the command line: reported in one line, exit status 2."""
