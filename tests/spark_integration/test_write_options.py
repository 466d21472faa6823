"""Write options, checked on the driver before anything is written: what file sinks take
(a path, maxRecordsPerFile, compression) is refused with what to give instead and the list of
valid options."""

from __future__ import annotations

import re

import pytest

from spark_integration.options import GazetteOptionError, parse_write_options

BASE = {"broker": "h:1", "journal": "aa/b"}


@pytest.mark.parametrize("streaming", [False, True])
def test_a_path_is_refused_with_how_to_name_the_journal(streaming: bool) -> None:
    what = "a streaming write" if streaming else "a batch write"
    with pytest.raises(
        GazetteOptionError,
        match=re.escape("option 'path': a write to journals takes no path: name the journal")
        + f".* the options of {what} are: broker, ",
    ):
        parse_write_options({"broker": "h:1", "path": "aa/b"}, streaming=streaming)


@pytest.mark.parametrize("name", ["maxRecordsPerFile", "compression", "partitionOverwriteMode"])
def test_file_sink_options_are_refused(name: str) -> None:
    with pytest.raises(
        GazetteOptionError,
        match=re.escape(f"option {name!r}: unknown option")
        + ".*; the options of a batch write are: broker, contentType, journal, keyColumn,"
        " mapping, protobufClass, selector",
    ):
        parse_write_options({**BASE, name: "10"})
