"""A batch write's commit over several journals (batch_commit.py): a journal that stopped
taking appends between the tasks and the commit refuses the whole commit, with nothing
committed anywhere; a failure after the check is reported as a partial commit, naming both sets.

Found by review (2026-11-28): the commit appended each journal's ACKs independently, so a
journal made read-only in between left the other journals committed while the job failed, and
a re-run duplicated them. Runs against the real broker process of the Spark tests, without
Spark: the writer's methods are called as Spark calls them (write per task, then commit, then
abort when commit raised).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import pyarrow as pa
import pytest
from pyspark.sql.types import StringType, StructField, StructType

from broker.client import JournalClient, apply_journals, delete, upsert
from broker.client.append_errors import AppendRetriesExhaustedError
from broker.client.list_apply import list_journals
from broker.protocol import protocol_pb2 as pb
from broker.protocol.status import JournalNotFoundError
from spark_integration.batch_commit import (
    GazetteCommitOutcomeUnknownError,
    GazettePartialCommitError,
    commit_acks,
    commit_outcome,
)
from spark_integration.journal_io import GazetteJournalError
from spark_integration.options import parse_write_options
from spark_integration.write import GazetteBatchWriter, _group
from tests.spark_integration.spark_testkit import committed_texts, create_journals, unique


def _change(
    broker: str, journal: str, how: Callable[[pb.JournalSpec, int], pb.ApplyRequest.Change]
) -> None:
    async def go() -> None:
        client = JournalClient(broker)
        try:
            listing = await list_journals(client, f"name={journal}")
            (found,) = [j for j in listing.journals if j.spec.name == journal]
            spec = pb.JournalSpec()
            spec.CopyFrom(found.spec)
            await apply_journals(client, [how(spec, found.mod_revision)])
        finally:
            await client.close()

    asyncio.run(go())


def _read_only(spec: pb.JournalSpec, revision: int) -> pb.ApplyRequest.Change:
    spec.flags = pb.JournalSpec.O_RDONLY
    return upsert(spec, revision)


def _deleted(spec: pb.JournalSpec, revision: int) -> pb.ApplyRequest.Change:
    return delete(spec.name, revision)


def _two_tasks(broker: str) -> tuple[GazetteBatchWriter, list[object], str, str]:
    j1, j2 = unique("batch-commit/a"), unique("batch-commit/b")
    create_journals(broker, [j1, j2])
    schema = StructType([StructField("journal", StringType()), StructField("text", StringType())])
    writer = GazetteBatchWriter(parse_write_options({"broker": broker}), schema, False)

    def batch(journal: str, texts: list[str]) -> pa.RecordBatch:
        return pa.RecordBatch.from_pydict({"journal": [journal] * len(texts), "text": texts})

    # Two tasks, one per journal (rows routed by the `journal` column).
    messages: list[object] = [
        writer.write(iter([batch(j1, ["a-0", "a-1", "a-2"])])),
        writer.write(iter([batch(j2, ["b-0", "b-1"])])),
    ]
    return writer, messages, j1, j2


@pytest.mark.parametrize(
    ("change", "says"), [(_read_only, "no longer takes appends"), (_deleted, "no longer exists")]
)
def test_a_journal_lost_before_the_commit_commits_nothing(
    broker: str, change: Callable[[pb.JournalSpec, int], pb.ApplyRequest.Change], says: str
) -> None:
    writer, messages, j1, j2 = _two_tasks(broker)
    _change(broker, j2, change)  # Between the tasks and the driver's commit.

    with pytest.raises(GazetteJournalError, match=f"{j2}.*{says}.*nothing of the write"):
        writer.commit(messages)
    # Spark's V2 write calls abort(messages) after a commit that raised: it rolls back j1, and
    # says that j2 refused its rollback.
    with pytest.raises(GazetteJournalError, match=f"rollback was refused in .*{j2}"):
        writer.abort(messages)

    assert committed_texts(broker, j1) == []
    if change is _read_only:
        assert committed_texts(broker, j2) == []


def test_a_failure_after_the_check_is_a_partial_commit_naming_both_sets(broker: str) -> None:
    """The window the check cannot close (a broker dying between it and the ACK appends),
    opened here by skipping the check: the error names what landed and what did not."""
    _, messages, j1, j2 = _two_tasks(broker)
    _change(broker, j2, _read_only)

    async def skip(_client: JournalClient, _journal: str) -> None:
        return None

    async def go() -> None:
        client = JournalClient(broker)
        try:
            await commit_acks(client, _group(messages, "acks"), check=skip)
        finally:
            await client.close()

    with pytest.raises(GazettePartialCommitError) as failed:
        asyncio.run(go())
    assert failed.value.committed == [j1] and list(failed.value.failed) == [j2]
    assert "write only the rows of the journals not committed" in str(failed.value)
    assert committed_texts(broker, j1) == ["a-0", "a-1", "a-2"]


def test_a_commit_that_may_have_landed_is_reported_as_unknown_not_as_not_committed() -> None:
    """Found by review (2026-11-29): an ACK append that failed after an attempt whose response
    was lost (retries exhausted, a timeout, a transport error) may have landed; it was reported
    as not committed, and the advice to write those rows again duplicated them. A status (the
    broker refused the append) is still known not to have landed."""
    lost = AppendRetriesExhaustedError("j/b", 3, 9.0, TimeoutError("no response"))
    refused = JournalNotFoundError("j/c")

    commit_outcome(["j/a", "j/b"], [None, None])  # All landed: nothing to say.
    with pytest.raises(JournalNotFoundError):  # Every journal refused: the error as it came.
        commit_outcome(["j/c"], [refused])
    with pytest.raises(GazetteCommitOutcomeUnknownError) as unknown:
        commit_outcome(["j/b", "j/c"], [lost, refused])
    assert unknown.value.unknown == ["j/b"] and "j/b" in str(unknown.value)
    assert "may have landed" in str(unknown.value)

    with pytest.raises(GazettePartialCommitError) as partial:
        commit_outcome(["j/a", "j/b", "j/c"], [None, lost, refused])
    err = partial.value
    assert err.committed == ["j/a"] and list(err.failed) == ["j/b", "j/c"]
    assert err.unknown == ["j/b"]
    text = str(err)
    assert "but not to ['j/c']" in text and "may or may not have been to ['j/b']" in text
