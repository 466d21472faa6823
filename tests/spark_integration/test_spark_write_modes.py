"""What file sinks take and journals cannot: partitionBy (refused by Spark itself: the data
source declares no partitioning, and Python data sources are not told of it) and overwrite are
refused before anything is written."""

from __future__ import annotations

from typing import Any

import pytest

from tests.spark_integration.spark_testkit import create_journals, read_all, unique

pytestmark = pytest.mark.spark


def test_partition_by_and_overwrite_are_refused(spark: Any, broker: str) -> None:
    journal = unique("spark/modes")
    create_journals(broker, [journal])
    df = spark.createDataFrame([("a", 1)], "key STRING, n LONG")

    def writer() -> Any:  # A new one each time: partitionBy() changes the writer it is given.
        return df.write.format("gazette").option("broker", broker).option("journal", journal)

    with pytest.raises(Exception, match="partitioning or clustering columns do not match"):
        writer().mode("append").partitionBy("key").save()
    with pytest.raises(Exception, match="journals are append-only"):
        writer().mode("overwrite").save()

    assert read_all(broker, journal) == b""
