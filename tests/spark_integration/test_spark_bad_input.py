"""Bad input: a clear error naming the problem, and nothing read or written."""

from __future__ import annotations

import json
import re

import pytest

from spark_integration.offsets import GazetteOffsetError, from_json
from spark_integration.options import GazetteOptionError, parse_write_options
from spark_integration.read_options import parse_read_options
from tests.spark_integration.spark_testkit import create_journals, read_all, reader, unique

pytestmark = pytest.mark.spark


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"journals": "aa/b"}, "option 'broker': is required"),
        ({"broker": "ftp://x"}, "option 'broker': endpoint: must be http://host:port"),
        ({"broker": "h:1"}, "option 'journals': is required"),
        ({"broker": "h:1", "journals": "aa/b", "selector": "x=y"}, "either journals or selector"),
        ({"broker": "h:1", "journals": "aa/b,aa/b"}, "names a journal more than once"),
        ({"broker": "h:1", "journals": "bad name"}, "option 'journals': journal 'bad name'"),
        ({"broker": "h:1", "selector": "x in (y"}, "option 'selector'"),
        (
            {"broker": "h:1", "journals": "aa/b", "begin": "{aa/b: 1}"},
            "option 'begin': must be a JSON",
        ),
        ({"broker": "h:1", "journals": "aa/b", "begin": "[1]"}, "got list"),
        (
            {"broker": "h:1", "journals": "aa/b", "end": '{"aa/b": -5}'},
            "offset of aa/b: must be an",
        ),
        (
            {"broker": "h:1", "journals": "aa/b", "begin": '{"cc/d": 5}'},
            "names journals not read: cc/d",
        ),
        (
            {"broker": "h:1", "journals": "aa/b", "begin": '{"aa/b": 9}', "end": '{"aa/b": 5}'},
            "must be >= its begin 9",
        ),
        ({"broker": "h:1", "journals": "aa/b", "isolation": "dirty"}, "option 'isolation'"),
        ({"broker": "h:1", "journals": "aa/b", "ringSize": "0"}, "option 'ringSize': must be in"),
        ({"broker": "h:1", "journals": "aa/b", "startingOffsets": "newest"}, "startingOffsets"),
    ],
)
def test_read_options_are_validated(options: dict[str, str], message: str) -> None:
    with pytest.raises(GazetteOptionError) as err:
        parse_read_options(options)
    assert message in str(err.value)


def test_write_options_are_validated() -> None:
    with pytest.raises(GazetteOptionError, match="option 'broker': is required"):
        parse_write_options({"journal": "aa/b"})
    # What Spark passes on to a streaming sink is accepted there, and only there.
    spark_given = {"broker": "h:1", "checkpointlocation": "/x", "queryname": "q"}
    assert parse_write_options(spark_given, streaming=True).broker == "h:1"
    with pytest.raises(GazetteOptionError, match="option 'checkpointlocation': unknown option"):
        parse_write_options(spark_given)
    with pytest.raises(GazetteOptionError, match="option 'sinkId': is no longer used"):
        parse_write_options({"broker": "h:1", "sinkId": "s"}, streaming=True)


@pytest.mark.parametrize(
    ("kind", "given", "message"),
    [
        ("batch", "isolaton", "unknown option (did you mean 'isolation'?)"),
        ("stream", "ISOLATON", "unknown option (did you mean 'isolation'?)"),  # Spark lowercases.
        (
            "stream",
            "maxOffsetsPerTrigger",  # Kafka's.
            "unknown option (did you mean 'maxBytesPerTrigger'?); the options of a streaming"
            " read are: broker, contentType,",
        ),
        (
            "batch",
            "maxBytesPerTrigger",
            "unknown option; the options of a batch read are: begin, broker, contentType, end,",
        ),
        ("stream", "begin", "unknown option; the options of a streaming read"),
        ("any", "path", "unknown option; the options of a read are"),
    ],
)
def test_unknown_read_options_are_refused(kind: str, given: str, message: str) -> None:
    options = {"broker": "h:1", "journals": "aa/b", given: "1"}
    with pytest.raises(GazetteOptionError, match=re.escape(f"option {given!r}: {message}")):
        parse_read_options(options, kind)  # type: ignore[arg-type]


def test_unknown_write_options_are_refused() -> None:
    with pytest.raises(
        GazetteOptionError, match=r"'journals': unknown option \(did you mean 'journal'"
    ):
        parse_write_options({"broker": "h:1", "journals": "aa/b"})
    with pytest.raises(
        GazetteOptionError,
        match="are: appendAttempts, broker, checkpointLocation, contentType, journal, keyColumn,"
        " mapping, protobufClass, queryName, replayCheck, selector",
    ):
        parse_write_options({"broker": "h:1", "path": "/tmp/x"}, streaming=True)


def test_malformed_stream_offsets_are_refused() -> None:
    with pytest.raises(GazetteOffsetError, match="offset of journal aa/b: malformed"):
        from_json({"aa/b": {"offset": "12"}})
    with pytest.raises(GazetteOffsetError, match="offset of journal aa/b: malformed"):
        from_json({"aa/b": {"offset": 1, "producers": {"zz": {"ack": "1", "begin": -1}}}})


def test_bad_input_through_spark(spark, broker) -> None:  # type: ignore[no-untyped-def]
    """The errors reach the Spark user as they are. (Each failing query costs Spark a Python
    worker, so the other cases are checked on the data source objects below.)"""
    journal = unique("spark/bad")
    create_journals(broker, [journal])
    missing = unique("spark/missing")

    with pytest.raises(Exception, match=f"journal '{missing}' does not exist"):
        reader(spark, broker, journals=missing).load().collect()
    with pytest.raises(Exception, match="option 'begin': must be a JSON object"):
        reader(spark, broker, journals=journal, begin="{oops").load().collect()
    df = spark.createDataFrame([("{}",)], "content STRING")
    with pytest.raises(Exception, match="option 'journal': is required, unless"):
        df.write.format("gazette").mode("append").option("broker", broker).save()
    assert read_all(broker, journal) == b""  # Nothing was written.


def test_bad_input_against_the_broker(broker) -> None:  # type: ignore[no-untyped-def]
    """What Spark would call on the driver, called directly against the real broker."""
    from pyspark.sql.types import StringType, StructField, StructType

    from spark_integration import GazetteDataSource, GazetteJournalError

    journal, missing = unique("spark/bad"), unique("spark/missing")
    create_journals(broker, [journal])
    csv = unique("spark/csv")
    create_journals(broker, [csv], content_type="text/csv")
    schema = StructType([StructField("content", StringType())])

    def partitions(**options: str) -> object:
        source = GazetteDataSource({"broker": broker, **options})
        return source.reader(schema).partitions()

    with pytest.raises(GazetteJournalError, match=f"journal '{missing}' does not exist"):
        partitions(journals=missing)
    with pytest.raises(GazetteOptionError, match=f"offset 100 of {journal} is beyond its write"):
        partitions(journals=journal, end=json.dumps({journal: 100}))
    with pytest.raises(GazetteJournalError, match="matches no journal"):
        partitions(selector="test=no-such-journal")
    with pytest.raises(GazetteJournalError, match="content-type is 'text/csv', not"):
        partitions(journals=csv, contentType="application/x-ndjson")
    with pytest.raises(GazetteJournalError, match=f"journal '{missing}' does not exist"):
        GazetteDataSource({"broker": broker, "journal": missing}).writer(schema, False)
    with pytest.raises(GazetteOptionError, match="journals are append-only"):
        GazetteDataSource({"broker": broker, "journal": journal}).writer(schema, True)
    with pytest.raises(GazetteOptionError, match="option 'sinkId': is no longer used"):
        GazetteDataSource({"broker": broker, "journal": journal, "sinkId": "s"}).streamWriter(
            schema, False
        )
    assert read_all(broker, journal) == b""
