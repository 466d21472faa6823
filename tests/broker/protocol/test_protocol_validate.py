"""Validation rules of names, labels and specs: accepted and rejected inputs, exact messages."""

from __future__ import annotations

import pickle
from collections.abc import Callable

import pytest
from google.protobuf.duration_pb2 import Duration

from broker.protocol import consumer_pb2 as cpb
from broker.protocol import protocol_pb2 as pb
from broker.protocol.labels import label_set
from broker.protocol.validate import (
    ValidationError,
    at,
    go_path_clean,
    validate_broker_spec,
    validate_consumer_spec,
    validate_duration,
    validate_endpoint,
    validate_fragment,
    validate_fragment_store,
    validate_journal_name,
    validate_journal_spec,
    validate_label,
    validate_label_selector,
    validate_label_set,
    validate_media_type,
    validate_offsets,
    validate_path_component,
    validate_path_postfix_template,
    validate_shard_spec,
    validate_single_value_labels,
    validate_token,
)


def _raises(call: Callable[[], object], message: str) -> None:
    with pytest.raises(ValidationError) as info:
        call()
    assert str(info.value) == message


# --- ValidationError ------------------------------------------------------------------------------


def test_error_renders_path_and_rule() -> None:
    err = ValidationError("must be >= 1024 (got 12)", "fragment", "length")
    assert isinstance(err, ValueError)
    assert str(err) == "fragment.length: must be >= 1024 (got 12)"
    assert err.path == "fragment.length"
    assert err.rule == "must be >= 1024 (got 12)"
    assert str(ValidationError("bare rule")) == "bare rule"


def test_at_prefixes_context_as_errors_bubble_out() -> None:
    with pytest.raises(ValidationError) as info:
        with at("spec"), at("labels[3]"):
            raise ValidationError("bad", "name")
    assert str(info.value) == "spec.labels[3].name: bad"
    assert info.value.context == ("spec", "labels[3]", "name")
    assert info.value.args == ("spec.labels[3].name: bad",)


def test_at_leaves_other_exceptions_alone() -> None:
    with pytest.raises(KeyError), at("spec"):
        raise KeyError("x")


def test_index_segments_attach_without_a_dot() -> None:
    assert str(ValidationError("bad", "offsets", "[a/journal]")) == "offsets[a/journal]: bad"


def test_error_survives_pickling_with_its_context() -> None:
    err = ValidationError("bad", "a", "b")
    copy = pickle.loads(pickle.dumps(err))
    assert type(copy) is ValidationError
    assert copy.context == ("a", "b")
    assert str(copy) == "a.b: bad"


# --- Tokens and paths -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "value",
    ["abc", "a-b_c+d/e.f", "ÄÖÜ", "日本語", "٣٤٥", "x" * 8],
)
def test_token_accepted(value: str) -> None:
    validate_token(value, 1, 32)


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("", 'length must be in [1, 8] bytes (got 0: "")'),
        ("abcdefghi", 'length must be in [1, 8] bytes (got 9: "abcdefghi")'),
        # Length is in UTF-8 bytes: three characters, nine bytes.
        ("日本語", 'length must be in [1, 8] bytes (got 9: "日本語")'),
        ("a b", 'must be only letters, numbers and "-_+/." (got "a b": \' \' at index 1)'),
        ("a#b", 'must be only letters, numbers and "-_+/." (got "a#b": \'#\' at index 1)'),
        ("a=b", 'must be only letters, numbers and "-_+/." (got "a=b": \'=\' at index 1)'),
        ("a%b", 'must be only letters, numbers and "-_+/." (got "a%b": \'%\' at index 1)'),
    ],
)
def test_token_rejected(value: str, message: str) -> None:
    _raises(lambda: validate_token(value, 1, 8), message)


@pytest.mark.parametrize(
    ("path", "cleaned"),
    [
        ("", "."),
        (".", "."),
        ("/", "/"),
        ("//", "/"),
        ("a/b", "a/b"),
        ("a//b", "a/b"),
        ("a/b/", "a/b"),
        ("./a", "a"),
        ("a/./b", "a/b"),
        ("a/../b", "b"),
        ("a/../..", ".."),
        ("../a", "../a"),
        ("/../a", "/a"),
        ("/a/b/../../..", "/"),
    ],
)
def test_go_path_clean(path: str, cleaned: str) -> None:
    assert go_path_clean(path) == cleaned


@pytest.mark.parametrize("value", ["a/b", "a=1/b=2", "a%20b", "../ab", ""])
def test_path_component_accepted(value: str) -> None:
    validate_path_component(value, 0, 64)


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("a//b", 'must be a clean path, equal to its normalized form "a/b" (got "a//b")'),
        ("a/b/", 'must be a clean path, equal to its normalized form "a/b" (got "a/b/")'),
        ("a/./b", 'must be a clean path, equal to its normalized form "a/b" (got "a/./b")'),
        ("a/../b", 'must be a clean path, equal to its normalized form "b" (got "a/../b")'),
        ("/a/b", "must not begin with '/' (got \"/a/b\")"),
        ("a;b", 'must be only letters, numbers and "-_+/.=%" (got "a;b": \';\' at index 1)'),
    ],
)
def test_path_component_rejected(value: str, message: str) -> None:
    _raises(lambda: validate_path_component(value, 0, 64), message)


@pytest.mark.parametrize(
    "name", ["a/journal", "abcd", "a/b=c/d%20e", "a/journal;meta/data", "a" * 512]
)
def test_journal_name_accepted(name: str) -> None:
    validate_journal_name(name)


@pytest.mark.parametrize(
    ("name", "message"),
    [
        ("abc", 'length must be in [4, 512] bytes (got 3: "abc")'),
        ("a" * 513, "length must be in [4, 512] bytes (got 513: \"" + "a" * 80 + '...")'),
        ("/a/journal", "must not begin with '/' (got \"/a/journal\")"),
        ("a/journal/", 'must be a clean path, equal to its normalized form "a/journal" (got "a/journal/")'),
        ("a journal", "must be only letters, numbers and \"-_+/.=%\" (got \"a journal\": ' ' at index 1)"),
        ("a/journal;", 'metadata: length must be in [1, 512] bytes (got 0: "")'),
        ("a/journal;m;n", 'metadata: must be only letters, numbers and "-_+/.=%" (got "m;n": \';\' at index 1)'),
    ],
)  # fmt: skip
def test_journal_name_rejected(name: str, message: str) -> None:
    _raises(lambda: validate_journal_name(name), message)


# --- Labels -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "value"),
    [("a-label", "a-value"), ("a/label", "a%20value"), ("a-label", ""), ("ab", "x=y//z")],
)
def test_label_accepted(name: str, value: str) -> None:
    validate_label(pb.Label(name=name, value=value))


@pytest.mark.parametrize(
    ("label", "message"),
    [
        (pb.Label(name="a|label", value="v"), "name: must be only letters, numbers and \"-_+/.\" (got \"a|label\": '|' at index 1)"),
        (pb.Label(name="a-label", value="a|value"), "value: must be only letters, numbers and \"-_+/.=%\" (got \"a|value\": '|' at index 1)"),
        (pb.Label(name="a", value="v"), 'name: length must be in [2, 64] bytes (got 1: "a")'),
        (pb.Label(name="n" * 65, value="v"), 'name: length must be in [2, 64] bytes (got 65: "' + "n" * 65 + '")'),
        (pb.Label(name="a=b", value="v"), "name: must be only letters, numbers and \"-_+/.\" (got \"a=b\": '=' at index 1)"),
        (pb.Label(name="ab", value="v" * 1025), "value: length must be in [0, 1024] bytes (got 1025: \"" + "v" * 80 + '...")'),
        (pb.Label(name="ab", value="v", prefix=True), "prefix: may be set only within a LabelSelector (got true)"),
    ],
)  # fmt: skip
def test_label_rejected(label: pb.Label, message: str) -> None:
    _raises(lambda: validate_label(label), message)


def test_label_prefix_allowed_in_selector() -> None:
    validate_label(pb.Label(name="ab", value="v", prefix=True), in_selector=True)


def _raw_set(*pairs: tuple[str, str]) -> pb.LabelSet:
    return pb.LabelSet(labels=[pb.Label(name=n, value=v) for n, v in pairs])


def test_label_set_order_rules_in_sequence() -> None:
    # Fix one violation at a time, as Gazette's own test walks the same set.
    labels = _raw_set(
        ("bad label", "111"),
        ("aaa", "444"),
        ("aaa", "333"),
        ("aaa", "222"),
        ("ccc", ""),
        ("ccc", ""),
        ("ccc", "555"),
    )
    _raises(
        lambda: validate_label_set(labels),
        'labels[0].name: must be only letters, numbers and "-_+/." (got "bad label": \' \' at index 3)',
    )
    labels.labels[0].name = "bbb"
    _raises(
        lambda: validate_label_set(labels),
        'labels[1]: must be in unique, sorted order over (name, value) (got "aaa"="444" after "bbb"="111")',
    )
    labels.labels[0].CopyFrom(pb.Label(name="aaa", value="222"))
    labels.labels[3].CopyFrom(pb.Label(name="bbb", value="111"))
    _raises(
        lambda: validate_label_set(labels),
        'labels[2]: must be in unique, sorted order over (name, value) (got "aaa"="333" after "aaa"="444")',
    )
    labels.labels[1].value, labels.labels[2].value = "333", "444"
    _raises(
        lambda: validate_label_set(labels),
        'labels[5]: must be in unique, sorted order over (name, value) (got "ccc"="" after "ccc"="")',
    )
    labels.labels[5].value = "444"
    _raises(
        lambda: validate_label_set(labels),
        'labels[5]: must not mix the empty value with non-empty values of one name (got "ccc"="444" after "ccc"="")',
    )
    labels.labels[4].value = "44"
    validate_label_set(labels)


def test_single_value_labels() -> None:
    validate_single_value_labels(
        label_set([("aaa", "bar"), ("aaa", "baz"), ("content-type", "a/type")])
    )
    _raises(
        lambda: validate_single_value_labels(
            label_set([("aaa", "bar"), ("content-type", "a/type"), ("content-type", "other/type")])
        ),
        'labels[2]: label "content-type" may have only one value (got "other/type" after "a/type")',
    )
    _raises(
        lambda: validate_single_value_labels(
            label_set([("app.gazette.dev/instance", "a"), ("app.gazette.dev/instance", "b")])
        ),
        'labels[1]: label "app.gazette.dev/instance" may have only one value (got "b" after "a")',
    )


def test_label_selector_paths() -> None:
    selector = pb.LabelSelector(
        include=_raw_set(("include", "a-value")), exclude=_raw_set(("exclude", "other"))
    )
    validate_label_selector(selector)
    selector.include.labels[0].prefix = True
    validate_label_selector(selector)  # Prefix matching is a selector's business.

    selector.include.labels[0].name = "bad label"
    _raises(
        lambda: validate_label_selector(selector),
        'include.labels[0].name: must be only letters, numbers and "-_+/." (got "bad label": \' \' at index 3)',
    )
    selector.include.labels[0].name = "include"
    selector.exclude.labels[0].name = "bad label"
    _raises(
        lambda: validate_label_selector(selector),
        'exclude.labels[0].name: must be only letters, numbers and "-_+/." (got "bad label": \' \' at index 3)',
    )


# --- URLs and media types -----------------------------------------------------------------------


@pytest.mark.parametrize(
    "url",
    [
        "s3://bucket/",
        "s3://bucket/a/prefix/?profile=p&endpoint=http%3A%2F%2Flocalhost%3A9000",
        "gs://bucket/a/",
        "azure://container/a/",
        "azure-ad://tenant-id/account/container/a/",
        "file:///var/data/",
        "FILE:///var/data/",
    ],
)
def test_fragment_store_accepted(url: str) -> None:
    validate_fragment_store(url)


@pytest.mark.parametrize(
    ("url", "message"),
    [
        ("bucket/path/", 'must be an absolute URL with a scheme (got "bucket/path/")'),
        ("s3:///path/", 'must name a bucket as the URL host (got "s3:///path/")'),
        ("s3://bucket/path", 'path must end in \'/\' (got "/path")'),
        ("s3://bucket", "path must end in '/' (got \"\")"),
        ("http://host/path/", 'scheme must be one of s3, gs, azure, azure-ad, file (got "http")'),
        ("file://host/path/", 'must not have a host with the file scheme (got "file://host/path/")'),
        ("azure-ad:///account/container/", 'must name a tenant ID as the URL host (got "azure-ad:///account/container/")'),
        ("azure-ad://tenant//container/", 'must name a storage account as the first path segment (got "azure-ad://tenant//container/")'),
        ("azure-ad://tenant/account", 'must name a storage container as the second path segment (got "azure-ad://tenant/account")'),
        ("azure-ad://tenant/account/", 'must name a storage container as the second path segment (got "azure-ad://tenant/account/")'),
        ("s3://bucket/a%zz/", 'has an invalid %-escape (got "s3://bucket/a%zz/")'),
        ("s3://bucket/a\n/", 'must not contain control characters (got "s3://bucket/a\n/")'),
        ("s3://bucket:port/", 'must have a numeric port in [0, 65535] (got "s3://bucket:port/")'),
        ("s3://bucket:70000/", 'must have a numeric port in [0, 65535] (got "s3://bucket:70000/")'),
        ("s3://[bucket/", 'must be a valid URL: Invalid IPv6 URL (got "s3://[bucket/")'),
    ],
)  # fmt: skip
def test_fragment_store_rejected(url: str, message: str) -> None:
    _raises(lambda: validate_fragment_store(url), message)


@pytest.mark.parametrize(
    "url", ["http://host:8080", "http://host:8080/path?q=1", "unix://host/tmp/socket"]
)
def test_endpoint_accepted(url: str) -> None:
    validate_endpoint(url)


@pytest.mark.parametrize(
    ("url", "message"),
    [
        ("host:8080/x", 'must have a host (got "host:8080/x")'),
        ("/just/a/path", 'must be an absolute URL with a scheme (got "/just/a/path")'),
        ("http:///path", 'must have a host (got "http:///path")'),
        ("", 'must be an absolute URL with a scheme (got "")'),
    ],
)
def test_endpoint_rejected(url: str, message: str) -> None:
    _raises(lambda: validate_endpoint(url), message)


@pytest.mark.parametrize(
    "text",
    [
        "application/x-ndjson",
        "text/csv; charset=utf-8",
        'text/plain; charset="utf-8"; format=flowed',
        "text/plain;",
        "TEXT/Plain",
        "multipart",
    ],
)
def test_media_type_accepted(text: str) -> None:
    validate_media_type(text)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("", 'must have a media type (got "")'),
        ("text plain", "expected '/' after the media type (got \"text plain\")"),
        ("text/", "expected a subtype after '/' (got \"text/\")"),
        ("text/plain/x", 'unexpected text after the media subtype (got "text/plain/x")'),
        ("text/plain; charset", 'has an invalid media parameter (got "text/plain; charset")'),
        ('text/plain; a="open', 'has an invalid media parameter (got "text/plain; a=\\"open")'),
        ("text/plain; a=1; A=2", 'has a duplicate parameter "A" (got "text/plain; a=1; A=2")'),
    ],
)
def test_media_type_rejected(text: str, message: str) -> None:
    _raises(lambda: validate_media_type(text), message)


# --- Journal specs --------------------------------------------------------------------------------


def _journal_spec() -> pb.JournalSpec:
    return pb.JournalSpec(
        name="a/journal",
        replication=3,
        labels=label_set(
            [
                ("content-type", "application/x-ndjson"),
                ("app.gazette.dev/message-type", "Msg"),
                ("app.gazette.dev/message-subtype", "Sub"),
                ("app.gazette.dev/tag", "one"),
                ("app.gazette.dev/tag", "two"),
            ]
        ),
        fragment=pb.JournalSpec.Fragment(
            length=1 << 20,
            compression_codec=pb.SNAPPY,
            stores=["s3://bucket/path/", "file:///var/data/"],
            refresh_interval=Duration(seconds=300),
            retention=Duration(seconds=-1),
            flush_interval=Duration(seconds=3600),
            path_postfix_template='date={{ .Spool.FirstAppendTime.Format "2006-01-02" }}',
        ),
        flags=pb.JournalSpec.O_RDWR,
        max_append_rate=1 << 20,
    )


def test_journal_spec_accepted() -> None:
    validate_journal_spec(_journal_spec())


def _set_labels(spec: pb.JournalSpec, *pairs: tuple[str, str]) -> None:
    spec.labels.CopyFrom(label_set(pairs))


def _offload_to_file(spec: pb.JournalSpec) -> None:
    spec.fragment.compression_codec = pb.GZIP_OFFLOAD_DECOMPRESSION
    spec.fragment.stores[:] = ["file:///var/data/", "s3://bucket/"]


JOURNAL_SPEC_CASES: list[tuple[str, Callable[[pb.JournalSpec], object], str]] = [
    ("bad name", lambda s: setattr(s, "name", "/a/journal"), "name: must not begin with '/' (got \"/a/journal\")"),
    ("metadata", lambda s: setattr(s, "name", "a/journal;meta"), 'name: must not have a metadata segment (got ";meta")'),
    ("replication 0", lambda s: setattr(s, "replication", 0), "replication: must be in [1, 5] (got 0)"),
    ("replication 6", lambda s: setattr(s, "replication", 6), "replication: must be in [1, 5] (got 6)"),
    ("bad label", lambda s: _set_labels(s, ("a b", "c")), "labels.labels[0].name: must be only letters, numbers and \"-_+/.\" (got \"a b\": ' ' at index 1)"),
    ("reserved name", lambda s: _set_labels(s, ("name", "x")), 'labels.labels[0].name: must not use reserved label name "name"'),
    ("reserved prefix", lambda s: _set_labels(s, ("aa", "x"), ("prefix", "x")), 'labels.labels[1].name: must not use reserved label name "prefix"'),
    ("prefix flag", lambda s: setattr(s.labels.labels[0], "prefix", True), "labels.labels[0].prefix: may be set only within a LabelSelector (got true)"),
    ("two content types", lambda s: _set_labels(s, ("content-type", "a/b"), ("content-type", "c/d")), 'labels.labels[1]: label "content-type" may have only one value (got "c/d" after "a/b")'),
    ("bad content type", lambda s: _set_labels(s, ("content-type", "text/plain/x")), 'labels.labels[0].value: unexpected text after the media subtype (got "text/plain/x")'),
    ("type without content type", lambda s: _set_labels(s, ("app.gazette.dev/message-type", "M")), 'labels.labels[0]: label "app.gazette.dev/message-type" requires label "content-type"'),
    ("subtype without type", lambda s: _set_labels(s, ("app.gazette.dev/message-subtype", "S"), ("content-type", "a/b")), 'labels.labels[0]: label "app.gazette.dev/message-subtype" requires label "app.gazette.dev/message-type"'),
    ("fragment too short", lambda s: setattr(s.fragment, "length", 1023), "fragment.length: must be in [1024, 17179869184] (got 1023)"),
    ("fragment too long", lambda s: setattr(s.fragment, "length", (1 << 34) + 1), "fragment.length: must be in [1024, 17179869184] (got 17179869185)"),
    ("no codec", lambda s: setattr(s.fragment, "compression_codec", pb.INVALID), "fragment.compression_codec: must be one of NONE, GZIP, ZSTANDARD, SNAPPY, GZIP_OFFLOAD_DECOMPRESSION (got INVALID)"),
    ("unknown codec", lambda s: setattr(s.fragment, "compression_codec", 9), "fragment.compression_codec: must be one of NONE, GZIP, ZSTANDARD, SNAPPY, GZIP_OFFLOAD_DECOMPRESSION (got 9)"),
    ("bad store", lambda s: s.fragment.stores.append("s3://bucket/no-slash"), "fragment.stores[2]: path must end in '/' (got \"/no-slash\")"),
    ("offload to file", _offload_to_file, 'fragment.stores[0]: a file:// store cannot be used with GZIP_OFFLOAD_DECOMPRESSION (got "file:///var/data/")'),
    ("refresh too fast", lambda s: s.fragment.refresh_interval.CopyFrom(Duration(nanos=500_000_000)), "fragment.refresh_interval: must be in [1s, 86400s] (got 0.5s)"),
    ("refresh unset", lambda s: s.fragment.ClearField("refresh_interval"), "fragment.refresh_interval: must be in [1s, 86400s] (got 0s)"),
    ("refresh too slow", lambda s: s.fragment.refresh_interval.CopyFrom(Duration(seconds=86401)), "fragment.refresh_interval: must be in [1s, 86400s] (got 86401s)"),
    ("flush too fast", lambda s: s.fragment.flush_interval.CopyFrom(Duration(seconds=59)), "fragment.flush_interval: must be zero (disabled) or >= 60s (got 59s)"),
    ("flush negative", lambda s: s.fragment.flush_interval.CopyFrom(Duration(seconds=-1)), "fragment.flush_interval: must be zero (disabled) or >= 60s (got -1s)"),
    ("refresh mixed signs", lambda s: s.fragment.refresh_interval.CopyFrom(Duration(seconds=10, nanos=-5)), "fragment.refresh_interval: seconds and nanos must have the same sign (got seconds=10, nanos=-5)"),
    ("refresh nanos overflow", lambda s: s.fragment.refresh_interval.CopyFrom(Duration(nanos=2_000_000_000)), "fragment.refresh_interval: nanos must be in [-999999999, 999999999] (got seconds=0, nanos=2000000000)"),
    ("retention mixed signs", lambda s: s.fragment.retention.CopyFrom(Duration(seconds=1, nanos=-1)), "fragment.retention: seconds and nanos must have the same sign (got seconds=1, nanos=-1)"),
    ("retention beyond Duration", lambda s: s.fragment.retention.CopyFrom(Duration(seconds=10**15)), "fragment.retention: seconds must be in [-315576000000, 315576000000] (got seconds=1000000000000000, nanos=0)"),
    ("retention beyond Go", lambda s: s.fragment.retention.CopyFrom(Duration(seconds=315576000000)), "fragment.retention: must be in [-9223372036.854775808s, 9223372036.854775807s] (Go's time.Duration) (got 315576000000s)"),
    ("flush mixed signs", lambda s: s.fragment.flush_interval.CopyFrom(Duration(seconds=-3600, nanos=1)), "fragment.flush_interval: seconds and nanos must have the same sign (got seconds=-3600, nanos=1)"),
    ("bad template", lambda s: setattr(s.fragment, "path_postfix_template", "{{ .Nope }}"), 'fragment.path_postfix_template: refers to unknown field ".Nope" (got "{{ .Nope }}")'),
    ("bad flags", lambda s: setattr(s, "flags", 3), "flags: must be one of NOT_SPECIFIED (0), O_RDONLY (1), O_WRONLY (2), O_RDWR (4) (got 3)"),
    ("negative rate", lambda s: setattr(s, "max_append_rate", -1), "max_append_rate: must be >= 0 (got -1)"),
    ("suspend level", lambda s: setattr(s.suspend, "level", 7), "suspend.level: must be one of NONE, PARTIAL, FULL (got 7)"),
    ("suspend offset", lambda s: setattr(s.suspend, "offset", -1), "suspend.offset: must be >= 0 (got -1)"),
]  # fmt: skip


@pytest.mark.parametrize(
    ("mutate", "message"),
    [(m, msg) for _, m, msg in JOURNAL_SPEC_CASES],
    ids=[name for name, _, _ in JOURNAL_SPEC_CASES],
)
def test_journal_spec_rejected(mutate: Callable[[pb.JournalSpec], object], message: str) -> None:
    spec = _journal_spec()
    mutate(spec)
    _raises(lambda: validate_journal_spec(spec), message)


@pytest.mark.parametrize(
    ("seconds", "nanos"),
    [
        (0, 0),
        (0, -999_999_999),  # Nanos alone may carry either sign.
        (0, 999_999_999),
        (-5, 0),
        (-5, -1),
        (5, 1),
        (9_223_372_036, 854_775_807),  # Go's time.Duration, both ends.
        (-9_223_372_036, -854_775_808),
    ],
)
def test_duration_accepted(seconds: int, nanos: int) -> None:
    validate_duration(Duration(seconds=seconds, nanos=nanos))


@pytest.mark.parametrize(
    ("seconds", "nanos", "message"),
    [
        (1, -1, "seconds and nanos must have the same sign (got seconds=1, nanos=-1)"),
        (-1, 1, "seconds and nanos must have the same sign (got seconds=-1, nanos=1)"),
        (0, 1_000_000_000, "nanos must be in [-999999999, 999999999] (got seconds=0, nanos=1000000000)"),
        (0, -1_000_000_000, "nanos must be in [-999999999, 999999999] (got seconds=0, nanos=-1000000000)"),
        (315_576_000_001, 0, "seconds must be in [-315576000000, 315576000000] (got seconds=315576000001, nanos=0)"),
        (-315_576_000_001, 0, "seconds must be in [-315576000000, 315576000000] (got seconds=-315576000001, nanos=0)"),
        (9_223_372_036, 854_775_808, "must be in [-9223372036.854775808s, 9223372036.854775807s] (Go's time.Duration) (got 9223372036.854775808s)"),
        (-9_223_372_036, -854_775_809, "must be in [-9223372036.854775808s, 9223372036.854775807s] (Go's time.Duration) (got -9223372036.854775809s)"),
    ],
)  # fmt: skip
def test_duration_rejected(seconds: int, nanos: int, message: str) -> None:
    _raises(lambda: validate_duration(Duration(seconds=seconds, nanos=nanos)), message)


@pytest.mark.parametrize(
    "mutate",
    [
        lambda s: s.fragment.ClearField("stores"),  # No store: streaming only.
        lambda s: s.fragment.ClearField("flush_interval"),  # Zero disables flushing.
        lambda s: s.fragment.ClearField("path_postfix_template"),
        lambda s: setattr(s, "flags", pb.JournalSpec.NOT_SPECIFIED),
        lambda s: setattr(s.fragment, "length", 1 << 34),
        lambda s: setattr(s.fragment, "compression_codec", pb.GZIP_OFFLOAD_DECOMPRESSION),
        lambda s: s.fragment.refresh_interval.CopyFrom(Duration(seconds=86400)),
        lambda s: setattr(s, "replication", 5),
        lambda s: setattr(s.suspend, "level", pb.JournalSpec.Suspend.FULL),
        lambda s: s.fragment.retention.CopyFrom(Duration(seconds=9_223_372_036, nanos=854_775_807)),
        lambda s: s.fragment.retention.CopyFrom(
            Duration(seconds=-9_223_372_036, nanos=-854_775_808)
        ),
    ],
)
def test_journal_spec_boundaries_accepted(mutate: Callable[[pb.JournalSpec], object]) -> None:
    spec = _journal_spec()
    mutate(spec)
    validate_journal_spec(spec)


@pytest.mark.parametrize(
    "template",
    [
        "",
        "plain/text",
        'date={{ .Spool.FirstAppendTime.Format "2006-01-02" }}/hour={{ .Spool.FirstAppendTime.Format "15" }}',
        "{{- .Name -}}/{{ .Spool.Begin }}",
        "{{/* a comment }} */}}x",
        '{{ "date=" }}{{ .Spool.Begin }}',
    ],
)
def test_path_postfix_template_accepted(template: str) -> None:
    validate_path_postfix_template(template)


@pytest.mark.parametrize(
    ("template", "message"),
    [
        ("a/{{ .Name", 'has an unclosed action at offset 2 (got "a/{{ .Name")'),
        ("a/{{ }}", 'has an empty action (got "a/{{ }}")'),
        ("{{ .Spool.Nope }}", 'refers to unknown field ".Spool.Nope" (got "{{ .Spool.Nope }}")'),
        ("{{ .Nope.Format }}", 'refers to unknown field ".Nope.Format" (got "{{ .Nope.Format }}")'),
        # Outside the subset brokers evaluate (broker/protocol/path_postfix.py): refused at apply.
        (
            '{{ printf "%s" .Name }}',
            'uses unsupported construct "printf" (supported: text, "strings", fields such as .Spool.Begin, .Spool.FirstAppendTime.Format "2006") (got "{{ printf \\"%s\\" .Name }}")',
        ),
        (
            "{{ with .Spool }}{{ .Begin }}{{ end }}",
            'uses unsupported construct "with" (supported: text, "strings", fields such as .Spool.Begin, .Spool.FirstAppendTime.Format "2006") (got "{{ with .Spool }}{{ .Begin }}{{ end }}")',
        ),
        (
            "{{ .Labels }}",
            'refers to field ".Labels", which has no value usable in a path (supported: text, "strings", fields such as .Spool.Begin, .Spool.FirstAppendTime.Format "2006") (got "{{ .Labels }}")',
        ),
        (
            '{{ "a}}b" }}',
            'renders text that cannot be part of a path: must be only letters, numbers and "-_+/.=%" (got "a}}b": \'}\' at index 1) (got "{{ \\"a}}b\\" }}")',
        ),
    ],
)
def test_path_postfix_template_rejected(template: str, message: str) -> None:
    _raises(lambda: validate_path_postfix_template(template), message)


def test_fragment_message() -> None:
    fragment = pb.Fragment(journal="a/journal", begin=10, end=10, compression_codec=pb.GZIP)
    validate_fragment(fragment)
    fragment.end = 9
    _raises(lambda: validate_fragment(fragment), "end: must be >= begin (got begin=10, end=9)")
    fragment.end, fragment.journal = 11, "a//journal"
    _raises(
        lambda: validate_fragment(fragment),
        'journal: must be a clean path, equal to its normalized form "a/journal" (got "a//journal")',
    )
    fragment.journal, fragment.compression_codec = "a/journal", pb.INVALID
    _raises(
        lambda: validate_fragment(fragment),
        "compression_codec: must be one of NONE, GZIP, ZSTANDARD, SNAPPY,"
        " GZIP_OFFLOAD_DECOMPRESSION (got INVALID)",
    )
    fragment.compression_codec, fragment.path_postfix = pb.GZIP, "date=2024-01-01/hour=03"
    validate_fragment(fragment)
    fragment.path_postfix = "date=2024-01-01//hour=03"
    _raises(
        lambda: validate_fragment(fragment),
        'path_postfix: must be a clean path, equal to its normalized form "date=2024-01-01/hour=03"'
        ' (got "date=2024-01-01//hour=03")',
    )


def test_offsets() -> None:
    validate_offsets({"a/journal": 0, "b/journal": 123})
    _raises(lambda: validate_offsets({"a/journal": -1}), "[a/journal]: must be >= 0 (got -1)")
    _raises(
        lambda: validate_offsets({"a/journal/": 1}),
        '[a/journal/]: must be a clean path, equal to its normalized form "a/journal" (got "a/journal/")',
    )


# --- Process, broker, consumer and shard specs -----------------------------------------------------


def _process_spec() -> pb.ProcessSpec:
    return pb.ProcessSpec(
        id=pb.ProcessSpec.ID(zone="us-east-1", suffix="broker-1"),
        endpoint="http://broker-1:8080",
    )


PROCESS_SPEC_CASES: list[tuple[Callable[[pb.ProcessSpec], object], str]] = [
    (lambda s: setattr(s.id, "zone", ""), 'id.zone: length must be in [1, 32] bytes (got 0: "")'),
    (lambda s: setattr(s.id, "zone", "z" * 33), 'id.zone: length must be in [1, 32] bytes (got 33: "' + "z" * 33 + '")'),
    (lambda s: setattr(s.id, "zone", "a#b"), "id.zone: must be only letters, numbers and \"-_+/.\" (got \"a#b\": '#' at index 1)"),
    (lambda s: setattr(s.id, "suffix", "abc"), 'id.suffix: length must be in [4, 128] bytes (got 3: "abc")'),
    (lambda s: setattr(s, "endpoint", "broker-1:8080"), 'endpoint: must have a host (got "broker-1:8080")'),
]  # fmt: skip


@pytest.mark.parametrize(("mutate", "message"), PROCESS_SPEC_CASES)
def test_broker_spec_rejected(mutate: Callable[[pb.ProcessSpec], object], message: str) -> None:
    spec = pb.BrokerSpec(process_spec=_process_spec(), journal_limit=1024)
    validate_broker_spec(spec)
    mutate(spec.process_spec)
    _raises(lambda: validate_broker_spec(spec), "process_spec." + message)


def test_broker_journal_limit() -> None:
    spec = pb.BrokerSpec(process_spec=_process_spec(), journal_limit=1 << 17)
    validate_broker_spec(spec)
    spec.journal_limit += 1
    _raises(lambda: validate_broker_spec(spec), "journal_limit: must be <= 131072 (got 131073)")


@pytest.mark.parametrize(("mutate", "message"), PROCESS_SPEC_CASES)
def test_consumer_spec_rejected(mutate: Callable[[pb.ProcessSpec], object], message: str) -> None:
    spec = cpb.ConsumerSpec(process_spec=_process_spec(), shard_limit=1 << 30)
    validate_consumer_spec(spec)
    mutate(spec.process_spec)
    _raises(lambda: validate_consumer_spec(spec), "process_spec." + message)


def _shard_spec() -> cpb.ShardSpec:
    return cpb.ShardSpec(
        id="shard-000",
        sources=[
            cpb.ShardSpec.Source(journal="a/journal", min_offset=0),
            cpb.ShardSpec.Source(journal="b/journal", min_offset=1024),
        ],
        recovery_log_prefix="recovery/logs",
        hint_prefix="/gazette/hints",
        hint_backups=2,
        max_txn_duration=Duration(seconds=1),
        min_txn_duration=Duration(seconds=0),
        hot_standbys=1,
        labels=label_set([("app.gazette.dev/managed-by", "me"), ("team", "a")]),
    )


def _set_sources(spec: cpb.ShardSpec, *journals: str) -> None:
    del spec.sources[:]
    spec.sources.extend(cpb.ShardSpec.Source(journal=j) for j in journals)


SHARD_SPEC_CASES: list[tuple[str, Callable[[cpb.ShardSpec], object], str]] = [
    ("short id", lambda s: setattr(s, "id", "abc"), 'id: length must be in [4, 512] bytes (got 3: "abc")'),
    ("bad id", lambda s: setattr(s, "id", "shard#1"), "id: must be only letters, numbers and \"-_+/.\" (got \"shard#1\": '#' at index 5)"),
    ("dirty prefix", lambda s: setattr(s, "recovery_log_prefix", "recovery/logs/"), 'recovery_log_prefix: must be a clean path, equal to its normalized form "recovery/logs/shard-000" (got "recovery/logs//shard-000")'),
    ("rooted prefix", lambda s: setattr(s, "recovery_log_prefix", "/recovery"), "recovery_log_prefix: must not begin with '/' (got \"/recovery/shard-000\")"),
    ("hints without log", lambda s: setattr(s, "recovery_log_prefix", ""), 'hint_prefix: must be empty when recovery_log_prefix is empty (got "/gazette/hints")'),
    ("no hints with log", lambda s: setattr(s, "hint_prefix", ""), 'hint_prefix: must be an absolute, clean path when recovery_log_prefix is set (got "")'),
    ("relative hints", lambda s: setattr(s, "hint_prefix", "gazette/hints"), 'hint_prefix: must be an absolute, clean path when recovery_log_prefix is set (got "gazette/hints")'),
    ("directory hints", lambda s: setattr(s, "hint_prefix", "/gazette/hints/"), 'hint_prefix: must be an absolute, clean path when recovery_log_prefix is set (got "/gazette/hints/")'),
    ("negative backups", lambda s: setattr(s, "hint_backups", -1), "hint_backups: must be >= 0 (got -1)"),
    ("negative min txn", lambda s: s.min_txn_duration.CopyFrom(Duration(nanos=-1)), "min_txn_duration: must be >= 0s (got -0.000000001s)"),
    ("zero max txn", lambda s: s.ClearField("max_txn_duration"), "max_txn_duration: must be > 0s (got 0s)"),
    ("max txn mixed signs", lambda s: s.max_txn_duration.CopyFrom(Duration(seconds=1, nanos=-5)), "max_txn_duration: seconds and nanos must have the same sign (got seconds=1, nanos=-5)"),
    ("max txn nanos overflow", lambda s: s.max_txn_duration.CopyFrom(Duration(nanos=2_000_000_000)), "max_txn_duration: nanos must be in [-999999999, 999999999] (got seconds=0, nanos=2000000000)"),
    ("min txn beyond Go", lambda s: s.min_txn_duration.CopyFrom(Duration(seconds=9_223_372_037)), "min_txn_duration: must be in [-9223372036.854775808s, 9223372036.854775807s] (Go's time.Duration) (got 9223372037s)"),
    ("bad label", lambda s: s.labels.labels.add(name="zz", value="a b"), "labels.labels[2].value: must be only letters, numbers and \"-_+/.=%\" (got \"a b\": ' ' at index 1)"),
    ("single-valued label", lambda s: s.labels.labels.insert(1, pb.Label(name="app.gazette.dev/managed-by", value="you")), 'labels.labels[1]: label "app.gazette.dev/managed-by" may have only one value (got "you" after "me")'),
    ("reserved id", lambda s: s.labels.labels.insert(1, pb.Label(name="id", value="x")), 'labels.labels[1].name: must not use reserved label name "id"'),
    ("checkpoint-ahead policy", lambda s: s.labels.labels.insert(1, pb.Label(name="gazette.dev/checkpoint-ahead", value="skip")), 'labels.labels[1].value: label "gazette.dev/checkpoint-ahead" must be one of "fail", "rewind", "wait" (got "skip")'),
    ("two checkpoint-ahead policies", lambda s: (s.labels.labels.insert(1, pb.Label(name="gazette.dev/checkpoint-ahead", value="fail")), s.labels.labels.insert(2, pb.Label(name="gazette.dev/checkpoint-ahead", value="wait"))), 'labels.labels[2]: label "gazette.dev/checkpoint-ahead" may have only one value (got "wait" after "fail")'),
    ("bad source", lambda s: _set_sources(s, "a/journal", "b//journal"), 'sources[1].journal: must be a clean path, equal to its normalized form "b/journal" (got "b//journal")'),
    ("unsorted sources", lambda s: _set_sources(s, "b/journal", "a/journal"), 'sources[1].journal: must be in unique, sorted order over sources (got "a/journal" after "b/journal")'),
    ("repeated source", lambda s: _set_sources(s, "a/journal", "a/journal"), 'sources[1].journal: must be in unique, sorted order over sources (got "a/journal" after "a/journal")'),
    ("negative offset", lambda s: setattr(s.sources[0], "min_offset", -1), "sources[0].min_offset: must be >= 0 (got -1)"),
]  # fmt: skip


def test_shard_spec_accepted() -> None:
    validate_shard_spec(_shard_spec())


@pytest.mark.parametrize(
    ("mutate", "message"),
    [(m, msg) for _, m, msg in SHARD_SPEC_CASES],
    ids=[name for name, _, _ in SHARD_SPEC_CASES],
)
def test_shard_spec_rejected(mutate: Callable[[cpb.ShardSpec], object], message: str) -> None:
    spec = _shard_spec()
    mutate(spec)
    _raises(lambda: validate_shard_spec(spec), message)


@pytest.mark.parametrize(
    "mutate",
    [
        lambda s: _set_sources(s),  # Gazette requires no source.
        lambda s: (s.ClearField("recovery_log_prefix"), s.ClearField("hint_prefix")),
        lambda s: setattr(s, "hint_prefix", "/"),
        # Gazette does not order min and max: the max alone bounds a transaction.
        lambda s: s.min_txn_duration.CopyFrom(Duration(seconds=5)),
        lambda s: s.MergeFrom(cpb.ShardSpec(ring_buffer_size=0, read_channel_size=1 << 20)),
        lambda s: s.labels.labels.insert(
            1, pb.Label(name="gazette.dev/checkpoint-ahead", value="rewind")
        ),
    ],
)
def test_shard_spec_boundaries_accepted(mutate: Callable[[cpb.ShardSpec], object]) -> None:
    spec = _shard_spec()
    mutate(spec)
    validate_shard_spec(spec)
