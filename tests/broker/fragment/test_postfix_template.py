"""Path postfix templates: Go layout elements one by one, each template construct of the
subset, the typed error naming each unsupported construct, and apply-time validation."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from google.protobuf.duration_pb2 import Duration

from broker.protocol import protocol_pb2 as pb
from broker.protocol.go_time import GO_ZERO_TIME, format_time, parse_layout
from broker.protocol.path_postfix import (
    PostfixTemplateError,
    PostfixValues,
    check_template,
    evaluate,
    parse_template,
    postfix_of,
)
from broker.protocol.validate import ValidationError, validate_journal_spec

# Tuesday 2019-11-19 22:07:05.123456 UTC: day 323 of the year, 10 PM.
T = datetime(2019, 11, 19, 22, 7, 5, 123456, tzinfo=UTC)
VALUES = PostfixValues(
    journal="a/journal",
    begin=1024,
    end=2048,
    compression_codec=pb.SNAPPY,
    backing_store="s3://bucket/",
    first_append_time=T,
    name="a/journal",
    replication=3,
    max_append_rate=1 << 20,
)


# --- Go layouts, element by element -------------------------------------------------------------


@pytest.mark.parametrize(
    ("layout", "expected"),
    [
        ("2006", "2019"),
        ("06", "19"),
        ("01", "11"),
        ("1", "11"),
        ("Jan", "Nov"),
        ("January", "November"),
        ("02", "19"),
        ("2", "19"),
        ("_2", "19"),
        ("Mon", "Tue"),
        ("Monday", "Tuesday"),
        ("002", "323"),
        ("__2", "323"),
        ("15", "22"),
        ("3", "10"),
        ("03", "10"),
        ("4", "7"),
        ("04", "07"),
        ("5", "5"),
        ("05", "05"),
        ("PM", "PM"),
        ("pm", "pm"),
        ("MST", "UTC"),
        ("-0700", "+0000"),
        ("-07:00", "+00:00"),
        ("-07", "+00"),
        ("-070000", "+000000"),
        ("-07:00:00", "+00:00:00"),
        ("Z0700", "Z"),
        ("Z07:00", "Z"),
        ("Z07", "Z"),
        (".000", ".123"),
        (",000000", ",123456"),
        (".000000000", ".123456000"),
        (".999999999", ".123456"),
        (".9", ".1"),
    ],
)
def test_each_layout_element(layout: str, expected: str) -> None:
    assert format_time(T, layout) == expected


@pytest.mark.parametrize(
    ("layout", "expected"),
    [
        ("date=2006-01-02/hour=15", "date=2019-11-19/hour=22"),
        ("Janet", "Janet"),  # "Jan" then a lower-case letter is literal.
        ("Month", "Month"),  # Likewise "Mon".
        ("_2006", "_2019"),  # A literal "_", then the year.
        (".0001", ".0011"),  # Fraction digits followed by a digit are literal ("01" the month).
        ("y=2006 d=_2", "y=2019 d=19"),
        ("plain", "plain"),
        ("", ""),
    ],
)
def test_layout_tokenization_follows_go(layout: str, expected: str) -> None:
    assert format_time(T, layout) == expected


def test_padded_and_small_values() -> None:
    early = datetime(2020, 1, 5, 0, 3, 9, tzinfo=UTC)  # Sunday, day 5, midnight hour.
    assert format_time(early, "_2|__2|002|3 PM|03 pm|1|4|5") == " 5|  5|005|12 AM|12 am|1|3|9"
    assert format_time(early, ".999") == ""  # All-zero trimmed fractions vanish, dot included.
    assert format_time(early, "Monday") == "Sunday"


def test_go_zero_time() -> None:
    assert format_time(GO_ZERO_TIME, "2006-01-02T15:04:05 Mon") == "0001-01-01T00:00:00 Mon"
    assert evaluate("{{ .Spool.FirstAppendTime.Unix }}", PostfixValues()) == "-62135596800"


def test_parsed_layouts_are_reused_by_templates() -> None:
    chunks = parse_layout("date=2006")
    assert chunks[0] == "date="
    assert format_time(T, chunks) == "date=2019"


# --- Templates ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("template", "expected"),
    [
        ("", ""),
        ("plain/text", "plain/text"),
        (
            'date={{.Spool.FirstAppendTime.Format "2006-01-02"}}/hour={{.Spool.FirstAppendTime.Format "15"}}',
            "date=2019-11-19/hour=22",
        ),
        ("{{ .Spool.FirstAppendTime.Format `2006` }}", "2019"),  # Raw strings.
        ('{{ .FirstAppendTime.Format "01" }}', "11"),  # Promoted from the spool.
        ("{{ .Spool.Begin }}-{{ .Spool.End }}", "1024-2048"),
        ("{{ .Spool.Fragment.Begin }}", "1024"),
        ("{{ .Begin }}", "1024"),
        ("{{ .Spool.Journal }}", "a/journal"),
        ("{{ .Journal }}", "a/journal"),
        ("{{ .Name }}/{{ .JournalSpec.Name }}", "a/journal/a/journal"),
        ("r={{ .Replication }}/m={{ .JournalSpec.MaxAppendRate }}", "r=3/m=1048576"),
        ("{{ .Spool.CompressionCodec }}", "SNAPPY"),
        ("{{ .Spool.ModTime }}", "0"),
        ("x{{ .Spool.PathPostfix }}", "x"),
        ("{{ .Spool.FirstAppendTime.Unix }}", str(int(T.timestamp()))),
        ("{{ .Spool.FirstAppendTime.Year }}", "2019"),
        ("{{ .Spool.FirstAppendTime.YearDay }}", "323"),
        ("{{ .Spool.FirstAppendTime.Month }}", "November"),
        ("{{ .Spool.FirstAppendTime.Day }}", "19"),
        ("{{ .Spool.FirstAppendTime.Weekday }}", "Tuesday"),
        ("{{ .Spool.FirstAppendTime.Hour }}", "22"),
        ("{{ .Spool.FirstAppendTime.Minute }}", "7"),
        ("{{ .Spool.FirstAppendTime.Second }}", "5"),
        ("{{ .Spool.FirstAppendTime.Nanosecond }}", "123456000"),
        ('{{ "lit" }}/{{ "\\x41\\u00e9" }}', "lit/Aé"),
        ("a{{/* a comment }} */}}b", "ab"),
        ("a  {{- .Begin -}}  \n b", "a1024b"),  # Trim markers eat all adjacent whitespace.
        ("a {{- /* trimmed comment */ -}} b", "ab"),
        ("a-{{-  .Begin}}", "a-1024"),  # "{{-" then a space trims; "a-" keeps its dash.
    ],
)
def test_template_constructs(template: str, expected: str) -> None:
    assert parse_template(template).render(VALUES) == expected


@pytest.mark.parametrize(
    ("template", "construct", "rule"),
    [
        ('{{ printf "%d" .Begin }}', "printf", 'uses unsupported construct "printf"'),
        ("{{ .Begin | html }}", "|", 'uses unsupported construct "|"'),
        ("{{ $x := .Begin }}", "$x", 'uses unsupported construct "$x"'),
        ("{{ if .Begin }}x{{ end }}", "if", 'uses unsupported construct "if"'),
        ("{{ range .Labels }}{{ end }}", "range", 'uses unsupported construct "range"'),
        ("{{ (.Begin) }}", "(", 'uses unsupported construct "("'),
        ("{{ 42 }}", "42", 'uses unsupported construct "42"'),
        ("{{ . }}", ".", 'uses unsupported construct "."'),
        ("{{ .Spool }}", ".Spool", 'refers to field ".Spool", which has no value usable'),
        ("{{ .Spool.Sum }}", ".Spool.Sum", 'refers to field ".Spool.Sum", which has no value'),
        ("{{ .Fragment.Length }}", ".Fragment.Length", 'refers to field ".Fragment.Length"'),
        ("{{ .Spool.Nope }}", ".Spool.Nope", 'refers to unknown field ".Spool.Nope"'),
        ("{{ .Begin.X }}", ".Begin.X", 'refers to unknown field ".Begin.X"'),
        ("{{ .Spool.FirstAppendTime }}", ".Spool.FirstAppendTime", "must call one method"),
        ("{{ .FirstAppendTime.UTC.Format `x` }}", ".FirstAppendTime.UTC.Format", "must call one"),
        (
            "{{ .FirstAppendTime.Format }}",
            ".FirstAppendTime.Format",
            ".FirstAppendTime.Format takes one",
        ),
        (
            "{{ .FirstAppendTime.Unix `x` }}",
            ".FirstAppendTime.Unix",
            ".FirstAppendTime.Unix takes no",
        ),
        ('{{ .Begin "x" }}', ".Begin", "gives .Begin an argument it does not take"),
        ('{{ .FirstAppendTime.Format "a" "b" }}', '.FirstAppendTime.Format "a" "b"', "gives"),
        ('{{ "a" "b" }}', '"a" "b"', 'gives arguments to the string "a"'),
        ('{{ "\\q" }}', '"\\q"', "has an unsupported escape"),
        ("a/{{ .Name", "{{ .Name", "has an unclosed action at offset 2"),
        ("{{ }}", "{{}}", "has an empty action"),
        ("{{/* open", "{{/* open", "has an unclosed comment at offset 0"),
        ("{{/* x */ }}", "{{/* x */", "has a comment that ends before its closing delimiter"),
    ],
)
def test_unsupported_constructs_are_named(template: str, construct: str, rule: str) -> None:
    with pytest.raises(PostfixTemplateError) as info:
        parse_template(template)
    assert info.value.construct == construct
    assert info.value.rule.startswith(rule)
    assert isinstance(info.value, ValidationError)


def test_rendered_postfix_must_be_a_clean_relative_path() -> None:
    assert evaluate("{{ .Name }}/x", VALUES) == "a/journal/x"
    for template, shown in [
        ("{{ .Name }}/x", "/x"),  # An empty name leaves a leading '/'.
        ("a//{{ .Begin }}", "a//0"),
    ]:
        with pytest.raises(PostfixTemplateError, match="not a valid path postfix") as info:
            evaluate(template, PostfixValues())
        assert info.value.construct == shown
    with pytest.raises(PostfixTemplateError, match="must be only letters"):
        evaluate('{{ .FirstAppendTime.Format "15:04" }}', VALUES)


def test_postfix_of_a_fragment_under_its_spec() -> None:
    spec = pb.JournalSpec(
        name="a/journal",
        replication=1,
        fragment=pb.JournalSpec.Fragment(
            path_postfix_template='{{ .Spool.CompressionCodec }}/h={{ .Spool.FirstAppendTime.Format "15" }}/{{ .Spool.BackingStore }}'
        ),
    )
    fragment = pb.Fragment(
        journal="a/journal", begin=1, end=2, compression_codec=pb.GZIP, backing_store="x"
    )
    assert postfix_of(fragment, T.timestamp(), spec) == "GZIP/h=22/x"
    spec.fragment.path_postfix_template = ""
    assert postfix_of(fragment, T.timestamp(), spec) == ""


# --- Validation when a spec is applied ----------------------------------------------------------


def test_check_template_evaluates_over_zero_values() -> None:
    check_template('date={{ .Spool.FirstAppendTime.Format "2006-01-02" }}')
    check_template("{{- .Name -}}/{{ .Spool.Begin }}")  # "/0" over zero values: alphabet only.
    with pytest.raises(PostfixTemplateError, match="cannot be part of a path") as info:
        check_template('t={{ .Spool.FirstAppendTime.Format "Jan _2" }}')  # Spaces.
    assert info.value.construct == "t=Jan  1"


def test_journal_spec_with_unsupported_template_is_refused() -> None:
    spec = pb.JournalSpec(
        name="a/journal",
        replication=1,
        fragment=pb.JournalSpec.Fragment(
            length=1 << 20,
            compression_codec=pb.NONE,
            refresh_interval=Duration(seconds=60),
            path_postfix_template='{{ printf "%d" .Spool.Begin }}',
        ),
    )
    with pytest.raises(ValidationError) as info:
        validate_journal_spec(spec)
    assert str(info.value).startswith(
        'fragment.path_postfix_template: uses unsupported construct "printf"'
    )
    spec.fragment.path_postfix_template = "b={{ .Spool.Begin }}"
    validate_journal_spec(spec)
