"""The framing registry, keyed by a journal's content-type label, and framing configuration."""

from __future__ import annotations

import pickle

import pytest

import gazette_consumer.message  # noqa: F401 - registers the built-in framings.
from gazette_consumer.message.csv_framing import CSVFraming
from gazette_consumer.message.framing import (
    MESSAGE_BYTES_MAX_DEFAULT,
    MESSAGE_BYTES_MAX_LIMIT,
    FeedOffsetError,
    FrameDesyncError,
    FramingConfigError,
    UnknownContentTypeError,
    framing_for_content_type,
    register_framing,
    registered_content_types,
)
from gazette_consumer.message.json_framing import JSONFraming
from gazette_consumer.message.protobuf_framing import FixedFraming


@pytest.mark.parametrize(
    ("content_type", "framing_type"),
    [
        ("application/x-ndjson", JSONFraming),
        ("application/x-protobuf-fixed", FixedFraming),
        ("text/csv", CSVFraming),
    ],
)
def test_builtin_framings_are_registered_under_gazettes_content_types(
    content_type: str, framing_type: type
) -> None:
    framing = framing_for_content_type(content_type)
    assert type(framing) is framing_type
    assert framing.content_type == content_type
    assert framing.message_bytes_max == MESSAGE_BYTES_MAX_DEFAULT
    assert framing_for_content_type(content_type, message_bytes_max=5).message_bytes_max == 5


def test_unknown_content_type_is_a_clear_error() -> None:
    with pytest.raises(UnknownContentTypeError) as caught:
        framing_for_content_type("application/x-gazette-recoverylog")
    message = str(caught.value)
    assert "content-type: no message framing is registered for" in message
    assert "'application/x-gazette-recoverylog'" in message
    assert "application/x-ndjson, application/x-protobuf-fixed, text/csv" in message


def test_register_a_custom_framing() -> None:
    class TSVFraming(CSVFraming):
        content_type = "text/x-test-tsv"

    assert "text/x-test-tsv" not in registered_content_types()
    register_framing(TSVFraming)
    try:
        assert type(framing_for_content_type("text/x-test-tsv")) is TSVFraming
    finally:
        from gazette_consumer.message import framing as framing_module

        del framing_module._REGISTRY["text/x-test-tsv"]


@pytest.mark.parametrize("bad", [0, -1, MESSAGE_BYTES_MAX_LIMIT + 1])
def test_message_bytes_max_is_bounded(bad: int) -> None:
    for framing_type in (JSONFraming, FixedFraming, CSVFraming):
        with pytest.raises(FramingConfigError, match=f"message_bytes_max: {bad} must be in"):
            framing_type(message_bytes_max=bad)
    assert (
        FixedFraming(message_bytes_max=MESSAGE_BYTES_MAX_LIMIT).message_bytes_max == (1 << 32) - 1
    )


def test_unpacker_rejects_a_negative_start_offset() -> None:
    with pytest.raises(FeedOffsetError, match="journal j: offset -1 must be >= 0"):
        JSONFraming().new_unpacker("j", -1)


def test_framing_errors_pickle_with_their_fields() -> None:
    error = FrameDesyncError("a/journal", 3, 9, "skipped")
    copy = pickle.loads(pickle.dumps(error))
    assert type(copy) is FrameDesyncError
    assert (copy.journal, copy.begin, copy.end, copy.reason) == ("a/journal", 3, 9, "skipped")
    assert str(copy) == "journal a/journal offsets [3, 9): skipped"
