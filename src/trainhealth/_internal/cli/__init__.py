"""The ``trainhealth`` command, one module per command group (entry point ``trainhealth._internal.cli:main``)."""

from trainhealth._internal.cli.main import build_parser, main

__all__ = ["build_parser", "main"]
