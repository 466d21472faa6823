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


def _flags(parser: argparse.ArgumentParser, path: str) -> Iterator[tuple[str, argparse.Action]]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from _flags(sub, f"{path} {name}")
        elif action.option_strings:
            yield f"{path} {action.option_strings[0]}", action


PARSERS = [
    ("gazette", serve_cli._parser),
    ("gazette-consumer", runner._parser),
    ("gazctl", gazctl._parser),
]


def _checked(parse: Callable[[str], object], text: str) -> str:
    try:
        parse(text)
    except argparse.ArgumentTypeError as err:
        return str(err)
    return ""


@pytest.mark.parametrize(("command", "parser"), PARSERS[:2])  # gazctl has no port flag.
def test_every_port_flag_is_a_port(
    command: str, parser: Callable[[], argparse.ArgumentParser]
) -> None:
    """A port out of [0, 65535] is a usage error while parsing (it wrapped modulo 65536, or
    failed in gRPC's bind with a traceback)."""
    ports = [(f, a) for f, a in _flags(parser(), command) if f.endswith("port")]
    assert ports, command
    for flag, action in ports:
        assert callable(action.type), flag
        assert _checked(action.type, "65535") == "", flag
        assert _checked(action.type, "0") == "", flag
        assert _checked(action.type, "65536") == "must be in [0, 65535] (got 65536)", flag
        assert _checked(action.type, "-1") == "must be in [0, 65535] (got -1)", flag


@pytest.mark.parametrize(("command", "parser"), PARSERS[1:])  # gazette serve has none.
def test_every_log_level_flag_is_a_level(
    command: str, parser: Callable[[], argparse.ArgumentParser]
) -> None:
    """An unknown --log-level is a usage error while parsing (it was a traceback from
    logging's configuration, before the commands' error handling)."""
    [(flag, action)] = [(f, a) for f, a in _flags(parser(), command) if f.endswith("--log-level")]
    assert callable(action.type), flag
    for level in ("debug", "INFO", "warning", "error", "critical"):
        assert _checked(action.type, level) == "", (flag, level)
    assert _checked(action.type, "loud") == (
        "must be one of debug, info, warning, error, critical (got 'loud')"
    )
