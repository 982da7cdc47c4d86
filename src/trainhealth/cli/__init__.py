"""The ``trainhealth`` command, one module per command group (entry point ``trainhealth.cli:main``)."""

from trainhealth.cli.main import build_parser, main

__all__ = ["build_parser", "main"]
