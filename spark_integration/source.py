"""GazetteDataSource: the "gazette" format of Spark's Python Data Source API.

    from spark_integration import GazetteDataSource
    spark.dataSource.register(GazetteDataSource)

    df = (spark.read.format("gazette")
          .option("broker", "localhost:8080")
          .option("journals", "orders/eu,orders/us")   # or .option("selector", "app=orders")
          .load())                 # journal, offset, uuid, producer, clock, content

    df.write.format("gazette").mode("append").option("broker", "localhost:8080") \\
        .option("journal", "orders/summary").save()

Options are validated here, on the driver, before anything is read or written (options.py).
The objects Spark ships to executors (readers, writers, partitions) hold options and offsets
only: every broker client is opened inside the call that uses it.
"""

from __future__ import annotations

from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    DataSourceStreamReader,
    DataSourceStreamWriter,
    DataSourceWriter,
)
from pyspark.sql.types import StructType

from spark_integration.batch_read import GazetteBatchReader, sample_schema
from spark_integration.options import parse_read_options, parse_write_options
from spark_integration.rows import META_SCHEMA
from spark_integration.stream_read import GazetteStreamReader
from spark_integration.write import GazetteBatchWriter, GazetteStreamWriter


class GazetteDataSource(DataSource):  # type: ignore[misc]
    """Reads journals of JSON-lines messages (read-committed by default) and writes to them
    exactly once. See the package docstring and docs/spark.md."""

    @classmethod
    def name(cls) -> str:
        return "gazette"

    def schema(self) -> StructType:
        # Called only when the user gave no schema.
        opts = parse_read_options(self.options)
        if opts.json_fields:
            return sample_schema(opts)
        return META_SCHEMA

    def reader(self, schema: StructType) -> DataSourceReader:
        return GazetteBatchReader(parse_read_options(self.options, "batch"), schema)

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        return GazetteStreamReader(parse_read_options(self.options, "stream"), schema)

    def writer(self, schema: StructType, overwrite: bool) -> DataSourceWriter:
        return GazetteBatchWriter(parse_write_options(self.options), schema, overwrite)

    def streamWriter(self, schema: StructType, overwrite: bool) -> DataSourceStreamWriter:
        return GazetteStreamWriter(
            parse_write_options(self.options, streaming=True), schema, overwrite
        )
