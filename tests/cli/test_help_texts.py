"""Every subcommand, option and positional argument of ``trainhealth`` documents itself in ``--help``."""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from trainhealth._internal.cli import build_parser
from trainhealth_lab.cli import build_parser as build_lab_parser

BIN = Path(sys.executable).parent


def _subcommands(
    parser: argparse.ArgumentParser, words: tuple[str, ...] = ()
) -> Iterator[tuple[tuple[str, ...], argparse.ArgumentParser, str | None]]:
    """(command words, parser, help in the parent's listing) of every subcommand, nested ones included."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            listed = {choice.dest: choice.help for choice in action._choices_actions}
            for name, subparser in action.choices.items():
                yield (*words, name), subparser, listed.get(name)
                yield from _subcommands(subparser, (*words, name))


def _arguments(parser: argparse.ArgumentParser) -> Iterator[argparse.Action]:
    """Every option and positional argument but -h/--help (a COMMAND positional included)."""
    for action in parser._actions:
        if not isinstance(action, argparse._HelpAction):
            yield action


#: trainhealth's subcommands, and the lab's command (``trainhealth-lab``) with its own.
LAB = ("trainhealth-lab",)
SUBCOMMANDS = [*_subcommands(build_parser()), (LAB, build_lab_parser(), None), *_subcommands(build_lab_parser(), LAB)]
COMMAND_WORDS = [words for words, _, _ in SUBCOMMANDS]


def test_the_walk_reaches_the_nested_subcommands():
    for nested in (
        ("trace", "info"),
        ("trace", "convert"),
        ("stack", "up"),
        ("stack", "down"),
        ("trainhealth-lab", "run"),
        ("trainhealth-lab", "score"),
        ("trainhealth-lab", "nab"),
    ):
        assert nested in COMMAND_WORDS
    assert len(COMMAND_WORDS) == len(set(COMMAND_WORDS))


def test_every_top_level_option_has_help():
    missing = [
        action.option_strings or action.dest for action in _arguments(build_parser()) if not (action.help or "").strip()
    ]
    assert not missing


@pytest.mark.parametrize("words", COMMAND_WORDS, ids=" ".join)
def test_every_subcommand_is_described(words):
    _, parser, listed = SUBCOMMANDS[COMMAND_WORDS.index(words)]
    assert (listed or "").strip() or (parser.description or "").strip(), f"trainhealth {' '.join(words)}"


@pytest.mark.parametrize("words", COMMAND_WORDS, ids=" ".join)
def test_every_argument_has_help(words):
    _, parser, _ = SUBCOMMANDS[COMMAND_WORDS.index(words)]
    missing = [
        ", ".join(action.option_strings) or action.dest
        for action in _arguments(parser)
        if action.help is argparse.SUPPRESS or not (action.help or "").strip()
    ]
    assert not missing, f"trainhealth {' '.join(words)}: no help for {missing}"


@pytest.mark.parametrize("words", COMMAND_WORDS, ids=" ".join)
def test_a_default_is_stated(words):
    _, parser, _ = SUBCOMMANDS[COMMAND_WORDS.index(words)]
    unstated = [
        ", ".join(action.option_strings) or action.dest
        for action in _arguments(parser)
        if action.default not in (None, False, argparse.SUPPRESS)
        and not action.required
        and "default" not in (action.help or "")
    ]
    assert not unstated, f"trainhealth {' '.join(words)}: help does not give the default of {unstated}"


@pytest.mark.parametrize("words", [(), *COMMAND_WORDS], ids=lambda words: " ".join(words) or "trainhealth")
def test_help_runs(words):
    environment = {k: v for k, v in os.environ.items() if not k.startswith("TRAINHEALTH_")}
    program, *rest = words if words[:1] == LAB else ("trainhealth", *words)
    result = subprocess.run(
        [str(BIN / program), *rest, "--help"], capture_output=True, text=True, env=environment, timeout=60
    )
    assert result.returncode == 0, result.stderr
    assert "Traceback" not in result.stderr
    assert result.stdout.startswith(f"usage: {program} {' '.join(rest)}".rstrip())
