"""Integrity through S3 (a real moto server): a broker persists a journal's fragments, then the
middle object is replaced by other content of the same length, or deleted. Reads through the
broker and directly from the store (signed URLs, do_not_proxy) fail with DataLossError naming
the journal, the fragment and the s3:// store, after exactly the first fragment's bytes."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from broker import client
from broker.client.appender import append
from broker.fragment import naming
from broker.protocol import protocol_pb2 as pb
from broker.testing.moto_server import MotoServer
from tests.broker.broker_testkit import Cluster, journal_spec, replica_of, wait_until
from tests.broker.fragment import test_s3_e2e_broker as s3_e2e

# The moto server, credentials, a fresh bucket and a cluster: the S3 end-to-end test's fixtures.
moto, aws_env, bucket, cluster = s3_e2e.moto, s3_e2e.aws_env, s3_e2e.bucket, s3_e2e.cluster

J = "s3/integrity"
PIECES = [bytes([ord("a") + i]) * 1541 + b"\n" for i in range(3)]
WAIT_S = 20.0


@pytest.mark.parametrize("how", ["corrupt", "deleted"])
@pytest.mark.parametrize("direct", [False, True], ids=["proxied", "direct"])
async def test_a_damaged_s3_object_is_data_loss(
    cluster: Cluster,
    moto: MotoServer,
    bucket: str,
    how: str,
    direct: bool,
) -> None:
    store = moto.store_url(bucket, "p/")
    broker = await cluster.start_broker("zone-a", "broker-a")
    await cluster.create(journal_spec(J, length=1024, codec=pb.NONE, stores=[store]), [broker])
    c = client.JournalClient(broker.endpoint)
    try:
        for piece in PIECES:
            await append(c, pb.AppendRequest(journal=J), piece)
        index = replica_of(broker, J).index
        await wait_until(lambda: index.query(len(PIECES[0])).file is None, WAIT_S)
        middle = index.query(len(PIECES[0])).fragment
        assert middle is not None
        key = "p/" + naming.content_path(middle)
        s3: Any = moto.client()
        try:
            if how == "corrupt":
                s3.put_object(Bucket=bucket, Key=key, Body=PIECES[1].replace(b"b", b"B", 3))
            else:
                s3.delete_object(Bucket=bucket, Key=key)
        finally:
            s3.close()

        request = pb.ReadRequest(journal=J, offset=0, do_not_proxy=direct)
        reader = client.RetryReader(c, request, registry=cluster.stores)
        got = b""
        with pytest.raises(client.DataLossError) as caught:
            async with asyncio.timeout(WAIT_S):
                while chunk := await reader.read():
                    got += chunk
        await reader.close()
    finally:
        await c.close()
    assert got == PIECES[0]
    text = str(caught.value)
    assert J in text and naming.content_name(middle) in text and store in text, text
