"""The "gazette" PySpark data source: batch and streaming reads of journals with read-committed
semantics, and exactly-once batch and streaming writes.

    from spark_integration import GazetteDataSource
    spark.dataSource.register(GazetteDataSource)

Modules: `source` (the DataSource), `options` (validation), `batch_read`, `stream_read`,
`range_read` (a journal range through the Sequencer), `range_start` (message boundaries, and
the transactions open where a read starts), `offsets` (streaming offsets), `rows` (schemas and
row conversion), `raw_json` (JSON lines as read and written), `publish` (the task side of
writes), `sink_task` (a write task's identity, producer and clocks), `sink_commit` (committing
a streaming micro-batch once), `write` (the writers), `journal_io` (broker calls).
See docs/spark.md.
"""

from spark_integration.journal_io import GazetteJournalError
from spark_integration.offsets import GazetteOffsetError
from spark_integration.options import GazetteOptionError
from spark_integration.rows import META_SCHEMA, GazetteRowError
from spark_integration.sink_task import GazetteSinkError
from spark_integration.source import GazetteDataSource

__all__ = [
    "META_SCHEMA",
    "GazetteDataSource",
    "GazetteJournalError",
    "GazetteOffsetError",
    "GazetteOptionError",
    "GazetteRowError",
    "GazetteSinkError",
]
