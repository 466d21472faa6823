"""``gazctl print-config``: the configuration gazctl runs with, and where each value came from.

    gazctl [--broker ADDR] [--log-level L] [--log-format F] print-config

Printed in INI form, as Gazette's print-config prints its combined configuration, one section
per group, each value commented with its source: a flag, an environment variable, or the
default. gazctl reads no configuration file (Gazette's reads gazctl.ini): flags and the
environment are all there is. The consumer address is the one ``gazctl shards`` commands use
unless given ``--consumer``.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Mapping, Sequence
from typing import TextIO

from broker.cli.editor import DEFAULT_EDITOR, EDITOR_VARS

BROKER_DEFAULT = "127.0.0.1:8080"
CONSUMER_DEFAULT = "127.0.0.1:9000"


def _from_env(names: Sequence[str], default: str, env: Mapping[str, str]) -> tuple[str, str]:
    for name in names:
        if env.get(name, "").strip():
            return env[name], f"${name}"
    return default, "default"


def settings(
    args: argparse.Namespace, argv: Sequence[str], env: Mapping[str, str]
) -> list[tuple[str, list[tuple[str, str, str]]]]:
    """Sections of (key, value, source)."""

    def flagged(flag: str, value: str, env_names: Sequence[str], default: str) -> tuple[str, str]:
        if any(a == flag or a.startswith(flag + "=") for a in argv):
            return value, f"flag {flag}"
        return _from_env(env_names, default, env)

    broker = flagged("--broker", args.broker, ("BROKER_ADDRESS",), BROKER_DEFAULT)
    consumer = _from_env(("CONSUMER_ADDRESS",), CONSUMER_DEFAULT, env)
    level = flagged("--log-level", args.log_level, (), "warning")
    fmt = flagged("--log-format", args.log_format, (), "console")
    debug_source = flagged("--debug", "", ("GAZCTL_DEBUG",), "")[1]
    debug = ("true" if args.debug else "false", debug_source)
    editor = _from_env(EDITOR_VARS, DEFAULT_EDITOR, env)
    return [
        ("broker", [("address", *broker)]),
        ("consumer", [("address", *consumer)]),
        ("log", [("level", *level), ("format", *fmt)]),
        ("gazctl", [("debug", *debug), ("editor", *editor)]),
    ]


def write(
    out: TextIO,
    args: argparse.Namespace,
    argv: Sequence[str],
    env: Mapping[str, str] = os.environ,
) -> None:
    blocks = []
    for section, entries in settings(args, argv, env):
        lines = [f"[{section}]"]
        for key, value, source in entries:
            lines.append(f"; from {source}")
            lines.append(f"{key} = {value}")
        blocks.append("\n".join(lines))
    out.write("\n\n".join(blocks) + "\n")
