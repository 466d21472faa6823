"""Every flag of every command has help text (`--help` is how a user learns a flag)."""

from __future__ import annotations

import argparse
from collections.abc import Callable, Iterator

import pytest

from broker import serve_cli
from broker.cli import gazctl
from gazette_consumer import runner


def _undocumented(parser: argparse.ArgumentParser, path: str) -> Iterator[str]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from _undocumented(sub, f"{path} {name}")
        elif action.option_strings and action.dest != "help" and not action.help:
            yield f"{path} {'/'.join(action.option_strings)}"


@pytest.mark.parametrize(
    ("command", "parser"),
    [
        ("gazette", serve_cli._parser),
        ("gazette-consumer", runner._parser),
        ("gazctl", gazctl._parser),
    ],
)
def test_every_flag_has_help(command: str, parser: Callable[[], argparse.ArgumentParser]) -> None:
    assert list(_undocumented(parser(), command)) == []
