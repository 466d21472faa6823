"""What a Spark Python worker imports to read a partition: the module of the pickled reader
(batch_read, stream_read) and what it needs, not the write side, not the store backends (boto3:
the store registry imports it only for an s3:// URL), not pandas. Each check runs in a fresh
interpreter, as a worker starts."""

from __future__ import annotations

import pytest

from tests.fresh_interpreter import imported_of

# Not needed to read a partition (each pulls in hundreds of modules, or a second of imports).
UNWANTED = (
    "pandas",
    "boto3",
    "botocore",
    "broker.fragment.stores.s3_store",
    "spark_integration.source",
    "spark_integration.write",
    "spark_integration.publish",
    "spark_integration.sink_commit",
    "gazette_consumer.sequencer.read_iter",
    "broker.client.append_service",
    "broker.client.appender",
)


# What the driver's process of a streaming query (and a batch read's planning) imports: the
# data source, which imports the write side only when writing.
DRIVER_UNWANTED = tuple(m for m in UNWANTED if m != "spark_integration.source")
# What the look-up of a read's schema (Spark's process that asks the data source for `schema()`)
# imports: not the readers, nor pyarrow (every session's first read paid ~0.35 s of CPU for them).
LOOKUP_UNWANTED = (
    *DRIVER_UNWANTED,
    "pyarrow",
    "spark_integration.batch_read",
    "spark_integration.stream_read",
)
# What a streaming query's source process imports to plan (the data source, the stream reader)
# and to walk a journal's new content (a content-less scan: the lines' tails, or their UUIDs
# decoded in bulk): not what builds content columns (pyarrow.compute's first import ~0.3 s of
# CPU), nor the token codec (PyJWT imports `cryptography`, ~0.1-0.25 s), on the path to the
# query's first micro-batch.
PLANNER_UNWANTED = (
    *DRIVER_UNWANTED,
    "pyarrow.compute",
    "pyarrow.json",
    "jwt",
    "cryptography",
    "spark_integration.arrow_rows",
)
_V1 = "2f1e0c1a-1d2c-11ef-8000-0242ac120002"
PLANNER = (
    "import spark_integration.source, spark_integration.stream_read;"
    " from spark_integration.json_lines import scan_decoder;"
    " d = scan_decoder('a/j', 0);"
    f' tails = b\'{{"a":1,"UUID":"{_V1}"}}\\n\' * 3;'
    f' bulk = b\'{{"UUID":"{_V1}","a":1}}\\n\' * 3;'
    " assert sum(len(b) for b in d.feed(tails, 0) + d.flush()) == 3;"
    " d = scan_decoder('a/j', 0);"
    " assert sum(len(b) for b in d.feed(bulk, 0) + d.flush()) == 3"
)
LOOKUP = (
    "from spark_integration.source import GazetteDataSource;"
    " GazetteDataSource({'broker': 'localhost:8080', 'journals': 'orders/eu'}).schema()"
)


@pytest.mark.parametrize(
    ("module", "unwanted"),
    [
        ("spark_integration.batch_read", UNWANTED),
        ("spark_integration.stream_read", UNWANTED),
        ("spark_integration.source", DRIVER_UNWANTED),
        (LOOKUP, LOOKUP_UNWANTED),
        (PLANNER, PLANNER_UNWANTED),
    ],
)
def test_a_worker_imports_only_what_reading_needs(module: str, unwanted: tuple[str, ...]) -> None:
    code = module if " " in module else f"import {module}"
    _, loaded = imported_of(code, unwanted)
    assert loaded == [], f"{module} imports {','.join(loaded)}"


def test_the_package_still_exports_its_names() -> None:
    import spark_integration

    for name in spark_integration.__all__:
        assert getattr(spark_integration, name) is not None
    with pytest.raises(AttributeError):
        _ = spark_integration.no_such_name  # type: ignore[attr-defined]
