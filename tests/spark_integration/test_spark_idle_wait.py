"""An idle streaming query costs next to nothing: `latestOffset` with nothing new waits (at most
option idleWaitMs) for an append, woken by it, instead of answering at once and being called
again within milliseconds by Spark's default trigger.

The broker Read RPCs are counted by the broker's own metric (`gazette_reads_total`), so these
tests run a broker of their own that serves its HTTP gateway (the session's broker does not).
"""

from __future__ import annotations

import re
import threading
import time
import urllib.request
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from gazette_consumer.message.clock import clock_from_unix_nanos
from spark_integration import offsets
from spark_integration.options import GazetteOptionError
from spark_integration.read_options import parse_read_options
from spark_integration.rows import META_SCHEMA
from spark_integration.stream_read import GazetteStreamReader
from tests.broker.serve_testkit import free_port
from tests.spark_integration.spark_testkit import (
    OUTSIDE,
    Msg,
    append_messages,
    broker_process,
    create_journals,
    producer,
    unique,
)

pytestmark = pytest.mark.spark

# How long a test waits for something that should happen at once (a wake, a delivery): far
# above the time it takes, far below the idle bounds it is told apart from.
prompt_s = 3.0
# The idle bound of the tests that tell a wait from an answer at once.
long_wait_ms = 10_000


@pytest.fixture(scope="module")
def metered(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, str]]:
    """(host:port, metrics URL) of a broker process serving its HTTP gateway too."""
    http_port = free_port()
    with broker_process(
        tmp_path_factory.mktemp("idle-broker"), "--http-port", str(http_port)
    ) as port:
        yield f"127.0.0.1:{port}", f"http://127.0.0.1:{http_port}/debug/metrics"


def reads(metrics_url: str) -> int:
    """Read RPCs the broker has received so far."""
    with urllib.request.urlopen(metrics_url, timeout=prompt_s) as response:
        text = response.read().decode()
    found = re.search(r"^gazette_reads_total ([0-9.e+]+)$", text, re.MULTILINE)
    assert found, text
    return int(float(found.group(1)))


def stream_reader(broker: str, **options: str) -> GazetteStreamReader:
    """The stream reader Spark would build from these options."""
    return GazetteStreamReader(parse_read_options({"broker": broker, **options}), META_SCHEMA)


def timed(call: Any, *args: Any) -> tuple[Any, float]:
    began = time.monotonic()
    result = call(*args)
    return result, time.monotonic() - began


def test_idle_latest_offset_waits_for_the_bound(metered: tuple[str, str]) -> None:
    """Nothing new: latestOffset answers the start offsets, after about idleWaitMs."""
    broker, _ = metered
    journal = unique("spark/idle")
    create_journals(broker, [journal])
    append_messages(broker, journal, [Msg(producer(), 1, OUTSIDE, {"n": 0})])
    r = stream_reader(broker, journals=journal, startingOffsets="latest", idleWaitMs="1000")
    start = r.initialOffset()
    end, took = timed(r.latestOffset, start)
    assert end == start
    assert took >= 0.9, took


def test_append_wakes_the_wait(metered: tuple[str, str]) -> None:
    """An append during the wait ends it at once: latestOffset answers the new write head long
    before idleWaitMs. The append is made once the broker has received the blocking read."""
    broker, metrics_url = metered
    journal = unique("spark/wake")
    create_journals(broker, [journal])
    r = stream_reader(broker, journals=journal, idleWaitMs=str(long_wait_ms))
    start = r.initialOffset()
    before = reads(metrics_url)
    appended: list[tuple[int, int]] = []

    def append_once_waiting() -> None:
        # latestOffset's Reads: the write head, then the blocking read at it.
        deadline = time.monotonic() + prompt_s
        while reads(metrics_url) < before + 2 and time.monotonic() < deadline:
            time.sleep(0.01)  # Polls a counter the broker offers no event for.
        clock = clock_from_unix_nanos(time.time_ns())
        appended.extend(append_messages(broker, journal, [Msg(producer(), clock, OUTSIDE)]))

    appender = threading.Thread(target=append_once_waiting)
    appender.start()
    try:
        end, took = timed(r.latestOffset, start)
    finally:
        appender.join()
    assert appended, "the append did not happen"
    assert offsets.read_through(end) == {journal: appended[-1][1]}
    assert took < prompt_s + 1.0, took


def test_no_wait_when_disabled_available_now_or_nothing_matched(metered: tuple[str, str]) -> None:
    """idleWaitMs=0, Trigger.AvailableNow and a selector matching no journal answer at once."""
    broker, _ = metered
    journal = unique("spark/nowait")
    create_journals(broker, [journal])

    disabled = stream_reader(broker, journals=journal, idleWaitMs="0")
    start = disabled.initialOffset()
    end, took = timed(disabled.latestOffset, start)
    assert end == start and took < prompt_s, took

    available_now = stream_reader(broker, journals=journal, idleWaitMs=str(long_wait_ms))
    start = available_now.initialOffset()
    available_now.prepareForTriggerAvailableNow()
    end, took = timed(available_now.latestOffset, start)
    assert end == start and took < prompt_s, took

    nothing = stream_reader(
        broker, selector=f"test={uuid.uuid4().hex[:10]}", idleWaitMs=str(long_wait_ms)
    )
    end, took = timed(nothing.latestOffset, offsets.to_json({}))
    assert end == {} and took < prompt_s, took


@pytest.mark.parametrize(
    ("value", "rule"),
    [
        ("-1", "must be in [0, 60000] (got -1)"),
        ("60001", "must be in [0, 60000] (got 60001)"),
        ("0.5", "must be an integer (got '0.5')"),
        ("soon", "must be an integer (got 'soon')"),
    ],
)
def test_idle_wait_option_is_validated(value: str, rule: str) -> None:
    with pytest.raises(GazetteOptionError) as err:
        parse_read_options({"broker": "h:1", "journals": "aa/b", "idleWaitMs": value})
    assert err.value.option == "idleWaitMs"
    assert str(err.value) == f"gazette data source: option 'idleWaitMs': {rule}"


def test_idle_query_with_default_trigger_is_quiet(spark, metered: tuple[str, str]) -> None:  # type: ignore[no-untyped-def]
    """A query with Spark's default trigger over an idle journal makes a few Read RPCs a second
    (not hundreds), then delivers a message appended later, once."""
    broker, metrics_url = metered
    journal = unique("spark/quiet")
    create_journals(broker, [journal])
    table = f"idle_{uuid.uuid4().hex[:10]}"
    query = (
        spark.readStream.format("gazette")
        .option("broker", broker)
        .option("journals", journal)
        .load()
        .selectExpr("content")
        .writeStream.format("memory")
        .queryName(table)
        .start()
    )
    try:
        query.processAllAvailable()  # Started and planning.
        window_s = 2.0
        before = reads(metrics_url)
        time.sleep(window_s)  # The measurement window, not a synchronisation.
        idle_reads = reads(metrics_url) - before
        # Each idle look is 3 Reads (the head, the blocking read, the head again) per 0.5 s: 12
        # in the window, plus a look in flight. Without the wait it is one per Spark poll (10 ms).
        assert idle_reads <= 24, idle_reads

        append_messages(
            broker,
            journal,
            [Msg(producer(), clock_from_unix_nanos(time.time_ns()), OUTSIDE, {"text": "late"})],
        )
        query.processAllAvailable()
        rows = [r.content for r in spark.sql(f"select content from {table}").collect()]
        assert len(rows) == 1 and '"late"' in rows[0], rows
    finally:
        query.stop()
