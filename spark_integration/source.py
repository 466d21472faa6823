"""GazetteDataSource: the "gazette" format of Spark's Python Data Source API.

    from spark_integration import GazetteDataSource
    spark.dataSource.register(GazetteDataSource)

    df = (spark.read.format("gazette")
          .option("broker", "localhost:8080")
          .option("journals", "orders/eu,orders/us")   # or .option("selector", "app=orders")
          .load())        # journal, offset, uuid, producer, clock, timestamp, content

    df.write.format("gazette").mode("append").option("broker", "localhost:8080") \\
        .option("journal", "orders/summary").save()

Options are validated here, on the driver, before anything is read or written (options.py,
read_options.py). The objects Spark ships to executors (readers, writers, partitions) hold
options and offsets only: every broker client is opened inside the call that uses it.
"""

from __future__ import annotations

from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    DataSourceStreamReader,
    DataSourceStreamWriter,
    DataSourceWriter,
)
from pyspark.sql.types import BinaryType, MapType, StringType, StructField, StructType

from spark_integration.options import GazetteOptionError, parse_write_options
from spark_integration.read_options import ReadOptions, parse_read_options
from spark_integration.rows import LABELS_COLUMN, LABELS_FIELD, META_SCHEMA

# The readers and writers are imported by the method that builds them. Spark calls each method
# in a Python process of its own kind (the look-up that asks `schema()`, the planning of a read,
# of a write, the driver's process of a streaming query), started on first use in a session:
# the look-up needs none of them, and importing the readers there (pyarrow, the broker client:
# ~0.5 s of CPU) was paid by every session's first read.


def default_schema(opts: ReadOptions) -> StructType:
    """The metadata columns (content as BINARY for protobuf payloads), then the labels map
    (option includeLabels)."""
    fields = list(META_SCHEMA.fields)
    if opts.protobuf_class:
        fields = [
            StructField("content", BinaryType(), False) if f.name == "content" else f
            for f in fields
        ]
    if opts.include_labels:
        fields.append(LABELS_FIELD)
    return StructType(fields)


def check_schema(schema: StructType) -> None:
    """A `labels` column must be a map of strings, or a struct of strings (arrow_rows.py)."""
    for f in schema.fields:
        if f.name != LABELS_COLUMN:
            continue
        t = f.dataType
        if isinstance(t, MapType) and isinstance(t.keyType, StringType):
            if isinstance(t.valueType, StringType):
                continue
        if isinstance(t, StructType) and all(isinstance(g.dataType, StringType) for g in t.fields):
            continue
        raise GazetteOptionError(
            "schema",
            f"column {LABELS_COLUMN!r} must be MAP<STRING, STRING> (every label) or a STRUCT of"
            f" STRING fields (the labels of those names), not {t.simpleString()}",
        )


class GazetteDataSource(DataSource):  # type: ignore[misc]
    """Reads journals (read-committed by default) and writes to them exactly once. See the
    package docstring and docs/spark.md."""

    @classmethod
    def name(cls) -> str:
        return "gazette"

    def schema(self) -> StructType:
        # Called only when the user gave no schema.
        opts = parse_read_options(self.options)
        if opts.json_fields:
            from spark_integration.batch_read import sample_schema

            sampled = sample_schema(opts)
            if opts.include_labels:
                sampled = StructType([*sampled.fields, LABELS_FIELD])
            return sampled
        return default_schema(opts)

    def reader(self, schema: StructType) -> DataSourceReader:
        from spark_integration.batch_read import GazetteBatchReader, GazetteFilteringReader

        opts = parse_read_options(self.options, "batch")
        check_schema(schema)
        if opts.filter_pushdown:
            return GazetteFilteringReader(opts, schema)
        return GazetteBatchReader(opts, schema)

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        from spark_integration.stream_read import GazetteStreamReader

        check_schema(schema)
        return GazetteStreamReader(parse_read_options(self.options, "stream"), schema)

    def writer(self, schema: StructType, overwrite: bool) -> DataSourceWriter:
        from spark_integration.write import GazetteBatchWriter

        return GazetteBatchWriter(parse_write_options(self.options), schema, overwrite)

    def streamWriter(self, schema: StructType, overwrite: bool) -> DataSourceStreamWriter:
        from spark_integration.write import GazetteStreamWriter

        return GazetteStreamWriter(
            parse_write_options(self.options, streaming=True), schema, overwrite
        )
