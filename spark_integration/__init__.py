"""The "gazette" PySpark data source: batch and streaming reads of journals with read-committed
semantics, and exactly-once batch and streaming writes.

    from spark_integration import GazetteDataSource
    spark.dataSource.register(GazetteDataSource)

Modules: `source` (the DataSource), `options` (validation), `batch_read`, `stream_read`,
`range_decode` (a journal range decoded), `range_read` (a journal range through the Sequencer),
`range_start` (message boundaries, and the transactions open where a read starts), `offsets`
(streaming offsets), `rows` (schemas and row conversion), `raw_json` (JSON lines as read and
written), `publish` (the task side of writes), `sink_task` (a write task's identity, producer
and clocks), `sink_commit` (committing a streaming micro-batch once), `batch_commit` (committing a batch
write), `write` (the writers),
`journal_io` (broker calls). See docs/spark.md.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from broker.lazy_exports import lazy_getattr

if TYPE_CHECKING:
    from spark_integration.batch_commit import (
        GazetteCommitOutcomeUnknownError,
        GazettePartialCommitError,
    )
    from spark_integration.journal_io import GazetteJournalError
    from spark_integration.offsets import GazetteOffsetError
    from spark_integration.options import GazetteOptionError
    from spark_integration.rows import META_SCHEMA, GazetteRowError
    from spark_integration.sink_task import GazetteSinkError, ProducerClaimedError
    from spark_integration.source import GazetteDataSource

# Where each public name is defined, imported on first use (PEP 562): a Spark Python worker
# unpickling a reader imports its module (batch_read, stream_read), which imports this package
# first; importing the whole data source here (the write side, the driver's planning) would
# cost every worker its imports before it reads a byte.
_EXPORTS = {
    "META_SCHEMA": "spark_integration.rows",
    "GazetteCommitOutcomeUnknownError": "spark_integration.batch_commit",
    "GazetteDataSource": "spark_integration.source",
    "GazetteJournalError": "spark_integration.journal_io",
    "GazetteOffsetError": "spark_integration.offsets",
    "GazetteOptionError": "spark_integration.options",
    "GazettePartialCommitError": "spark_integration.batch_commit",
    "GazetteRowError": "spark_integration.rows",
    "GazetteSinkError": "spark_integration.sink_task",
    "ProducerClaimedError": "spark_integration.sink_task",
}


__getattr__ = lazy_getattr(__name__, _EXPORTS)


__all__ = [
    "META_SCHEMA",
    "GazetteCommitOutcomeUnknownError",
    "GazetteDataSource",
    "GazetteJournalError",
    "GazetteOffsetError",
    "GazetteOptionError",
    "GazettePartialCommitError",
    "GazetteRowError",
    "GazetteSinkError",
    "ProducerClaimedError",
]
