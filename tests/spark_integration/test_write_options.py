"""Write options, checked on the driver before anything is written: what file sinks take
(a path, maxRecordsPerFile, compression) is refused with what to give instead and the list of
valid options; appendAttempts bounds the tries of each append of a task."""

from __future__ import annotations

import json
import re

import grpc
import grpc.aio
import pytest
import structlog.testing

from broker.client.appender import attempts_max_default
from broker.client.route_cache import JournalClient
from broker.protocol import labels
from broker.testing.ports import free_port
from spark_integration.options import GazetteOptionError, parse_write_options
from spark_integration.publish import RowShape, batches_of_rows, publish_batches
from spark_integration.sink_task import TaskIdentity

BASE = {"broker": "h:1", "journal": "aa/b"}
JOURNAL = "aa/b"
QUERY = "11111111-1111-1111-1111-111111111111"


@pytest.mark.parametrize("streaming", [False, True])
def test_a_path_is_refused_with_how_to_name_the_journal(streaming: bool) -> None:
    what = "a streaming write" if streaming else "a batch write"
    with pytest.raises(
        GazetteOptionError,
        match=re.escape("option 'path': a write to journals takes no path: name the journal")
        + f".* the options of {what} are: appendAttempts, broker, ",
    ):
        parse_write_options({"broker": "h:1", "path": "aa/b"}, streaming=streaming)


@pytest.mark.parametrize("name", ["maxRecordsPerFile", "compression", "partitionOverwriteMode"])
def test_file_sink_options_are_refused(name: str) -> None:
    with pytest.raises(
        GazetteOptionError,
        match=re.escape(f"option {name!r}: unknown option")
        + ".*; the options of a batch write are: appendAttempts, broker, contentType, journal,"
        " keyColumn, mapping, protobufClass, selector",
    ):
        parse_write_options({**BASE, name: "10"})


@pytest.mark.parametrize("streaming", [False, True])
def test_append_attempts_bound_each_append_and_are_checked(streaming: bool) -> None:
    assert parse_write_options(BASE, streaming=streaming).append_attempts == attempts_max_default
    given = parse_write_options({**BASE, "appendattempts": "2"}, streaming=streaming)
    assert given.append_attempts == 2  # Spark passes names lowercased.
    for bad, rule in [
        ("0", "must be in [1, 100] (got 0)"),
        ("101", "must be in [1, 100] (got 101)"),
        ("two", "must be an integer (got 'two')"),
    ]:
        with pytest.raises(GazetteOptionError, match=re.escape(f"option 'appendAttempts': {rule}")):
            parse_write_options({**BASE, "appendAttempts": bad}, streaming=streaming)


@pytest.mark.parametrize("streaming", [False, True])
@pytest.mark.parametrize(("attempts", "retries"), [(1, 0), (3, 2)])
async def test_a_task_tries_each_append_append_attempts_times(
    attempts: int, retries: int, streaming: bool
) -> None:
    # A broker that cannot be reached (nothing listens on its port): every try is refused
    # UNAVAILABLE, and each append is tried `attempts` times (retried `attempts - 1` times after
    # a back-off): a batch task's append of its rows, then its rollback; a streaming task's
    # first, the append of nothing that reads the journal's registers (it then has nothing to
    # roll back).
    client = JournalClient(f"http://127.0.0.1:{free_port()}")
    shape = RowShape(
        content_column=True,
        journal_column=False,
        journal=JOURNAL,
        content_types=((JOURNAL, labels.CONTENT_TYPE_JSON_LINES),),
    )
    rows = batches_of_rows([{"content": json.dumps({"n": 1})}])
    task = TaskIdentity(QUERY, "run-1", 0, 0, 0) if streaming else TaskIdentity("", "", -1, 0, 0)
    try:
        with structlog.testing.capture_logs() as logs, pytest.raises(grpc.aio.AioRpcError) as err:
            await publish_batches(client, shape, rows, 1 << 60, task, append_attempts=attempts)
    finally:
        await client.close()
    assert err.value.code() == grpc.StatusCode.UNAVAILABLE
    tries = [e for e in logs if e["event"] == "append failed (will retry)"]
    appends = 1 if streaming else 2
    assert [e["attempt"] for e in tries] == [*range(1, retries + 1)] * appends
