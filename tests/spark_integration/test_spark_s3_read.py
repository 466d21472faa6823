"""A batch read straight from an s3:// fragment store (a moto server) with every broker stopped
returns every persisted row: the store URL names the endpoint and region, and the credentials
reach Spark's Python workers as the executors' environment (`spark.executorEnv.*`, set by
conftest's session as docs/spark.md tells users to), the driver's as its own."""

from __future__ import annotations

import json
import secrets
from pathlib import Path
from typing import Any

import pytest

from broker.testing.moto_server import MotoServer
from tests.broker.serve_testkit import gazette_serve
from tests.spark_integration.spark_testkit import (
    OUTSIDE,
    Msg,
    append_messages,
    create_journals,
    producer,
    unique,
)

pytestmark = pytest.mark.spark


def _objects(moto: MotoServer, bucket: str) -> list[str]:
    s3: Any = moto.client()
    try:
        return [o["Key"] for o in s3.list_objects_v2(Bucket=bucket).get("Contents", ())]
    finally:
        s3.close()


def test_a_read_from_an_s3_store_with_the_broker_stopped_returns_every_row(
    spark: Any, moto_server: MotoServer, aws_env: None, tmp_path: Path
) -> None:
    bucket = f"spark-{secrets.token_hex(6)}"
    moto_server.create_bucket(bucket)
    store = moto_server.store_url(bucket, "frag/")
    journal = unique("spark/s3")
    p = producer()
    messages = [Msg(p, 1000 + i, OUTSIDE, {"text": f"m{i}", "n": i}) for i in range(300)]
    # The broker inherits this process's environment: moto's credentials (aws_env).
    with gazette_serve(tmp_path) as (port, _proc):
        broker = f"127.0.0.1:{port}"
        create_journals(broker, [journal], stores=[store])
        append_messages(broker, journal, messages[:150], together=True)
        append_messages(broker, journal, messages[150:], together=True)
    # Stopped gracefully: a broker persists the fragments it holds as it stops.
    assert any(key.startswith(f"frag/{journal}/") for key in _objects(moto_server, bucket))

    rows = (
        spark.read.format("gazette")
        .option("store", store)  # No broker: it is stopped.
        .option("journals", journal)
        .schema("offset LONG, text STRING, n LONG, content STRING")
        .load()
        .orderBy("offset")
        .collect()
    )

    assert [(r.text, r.n) for r in rows] == [(m.fields["text"], m.fields["n"]) for m in messages]  # type: ignore[index]
    assert json.loads(rows[0].content)["text"] == "m0"
