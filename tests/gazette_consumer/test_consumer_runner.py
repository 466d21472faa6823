"""``gazette-consumer serve`` argument handling: an ``--app`` that does not name a class, and
bad settings, are refused with one line naming the problem (exit 2) before anything starts.
(Serving itself is exercised as a process by tests/broker/cli/test_gazctl_shards.py.)"""

from __future__ import annotations

import json

import pytest

from gazette_consumer.runner import AppLoadError, load_app, main


def test_load_app_finds_nested_classes() -> None:
    assert load_app("json:JSONDecoder") is json.JSONDecoder
    assert load_app("collections:OrderedDict.__class__") is type


@pytest.mark.parametrize(
    ("app", "message"),
    [
        ("json", "expected module:Class"),
        (":Thing", "expected module:Class"),
        ("no_such_module_xyz:App", "cannot import module 'no_such_module_xyz'"),
        ("json:NoSuchClass", "module 'json' has no attribute 'NoSuchClass'"),
        ("json:dumps", "'dumps' is a function, not a class"),
    ],
)
def test_bad_apps_are_refused(app: str, message: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(AppLoadError, match=message):
        load_app(app)
    assert main(["serve", "--app", app, "--log-level", "error"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"gazette-consumer: --app {app!r}: ") and message in err


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--zone", "a#b"], "--zone: must"),
        (["--id", "c"], "--id: length must be in [4, 128]"),
        (["--shard-limit", "0"], "--shard-limit: must be >= 1 (got 0)"),
        (["--drain-timeout", "-1"], "--drain-timeout: must be >= 0"),
    ],
)
def test_bad_settings_are_refused(
    flags: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["serve", "--app", "json:JSONDecoder", *flags]) == 2
    assert capsys.readouterr().err.startswith(f"gazette-consumer: {message}")
