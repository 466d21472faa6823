"""Path postfixes through a broker: fragments persisted to a file:// store land under the
directories the journal's template names for their first-append time, and a fresh broker's
index finds them there again (listings walk every postfix) and serves reads from them."""

from __future__ import annotations

import contextlib
import gzip
import hashlib
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from pathlib import Path

import pytest

from broker import client
from broker.append_pulse import pulse
from broker.fragment.naming import parse_content_name
from broker.fragment.stores.registry import new_registry
from broker.protocol import protocol_pb2 as pb
from broker.protocol.status import OffsetNotYetAvailableError
from broker.server import Broker
from tests.broker.broker_testkit import Cluster, journal_spec, replica_of, wait_until

J = "postfix/journal"
STORE = "file:///frags/"
TEMPLATE = (
    'date={{ .Spool.FirstAppendTime.Format "2006-01-02" }}'
    '/hour={{ .Spool.FirstAppendTime.Format "15" }}'
)
# Tuesday 2019-11-19 22:07:05 UTC, and the next day at 01:30.
T1 = datetime(2019, 11, 19, 22, 7, 5, tzinfo=UTC).timestamp()
T2 = datetime(2019, 11, 20, 1, 30, 0, tzinfo=UTC).timestamp()


@pytest.fixture
async def cluster(tmp_path: Path) -> AsyncIterator[Cluster]:
    (tmp_path / "frags").mkdir()
    c = Cluster(stores=new_registry(file_root=tmp_path))
    try:
        yield c
    finally:
        await c.close()


def stored_files(root: Path) -> dict[str, tuple[int, int, bytes]]:
    """Relative path under the journal's directory -> (begin, end, decompressed content)."""
    out = {}
    for path in sorted((root / J).rglob("*")):
        if path.is_file():
            begin, end, _, _ = parse_content_name(path.name)
            out[path.relative_to(root / J).as_posix()] = (
                begin,
                end,
                gzip.decompress(path.read_bytes()),
            )
    return out


async def read_all(endpoint: str) -> bytes:
    c = client.JournalClient(endpoint)
    reader = client.RetryReader(c, pb.ReadRequest(journal=J, offset=0, block=False))
    out = b""
    try:
        with contextlib.suppress(OffsetNotYetAvailableError):
            while chunk := await reader.read():
                out += chunk
    finally:
        await reader.close()
        await c.channels.close()
    return out


async def test_fragments_land_under_their_postfix_and_are_found_again(
    cluster: Cluster, tmp_path: Path
) -> None:
    now = [T1]
    b1 = await cluster.start_broker("zone-a", "broker-a", pulse_enabled=False, clock=lambda: now[0])
    spec = journal_spec(J, codec=pb.GZIP, stores=[STORE], flush_interval_s=3600)
    spec.fragment.path_postfix_template = TEMPLATE
    await cluster.create(spec, [b1])
    index = replica_of(b1, J).index
    await index.wait_first_refresh(5.0)

    assert (await cluster.append(b1, J, [b"first\n"])).status == pb.OK
    # The journal's first content is rolled by the next append (so it is persisted at once).
    assert (await cluster.append(b1, J, [b"second\n"])).status == pb.OK
    now[0] = T2
    await pulse(b1.append_env, J)  # The hour has passed: [6, 13) rolls, first appended at T1.
    assert (await cluster.append(b1, J, [b"third\n"])).status == pb.OK
    now[0] = T2 + 3600
    await pulse(b1.append_env, J)  # And [13, 19), first appended at T2.
    await wait_until(lambda: not index.has_local)

    assert stored_files(tmp_path / "frags") == {
        f"date=2019-11-19/hour=22/{name}": span
        for name, span in _names([(0, b"first\n"), (6, b"second\n")]).items()
    } | {
        f"date=2019-11-20/hour=01/{name}": span for name, span in _names([(13, b"third\n")]).items()
    }
    assert [f.path_postfix for f in index.fragments()] == [
        "date=2019-11-19/hour=22",
        "date=2019-11-19/hour=22",
        "date=2019-11-20/hour=01",
    ]
    # Reads of persisted fragments open them by their postfixed keys.
    assert await read_all(b1.endpoint) == b"first\nsecond\nthird\n"

    # A broker that never held the content lists the store, walking every postfix directory.
    await cluster.stop_broker(b1)
    b2: Broker = await cluster.start_broker("zone-b", "broker-b", pulse_enabled=False)
    await cluster.assign(J, [b2])
    fresh = replica_of(b2, J).index
    await fresh.wait_first_refresh(5.0)
    assert [(f.begin, f.end, f.path_postfix, f.backing_store) for f in fresh.fragments()] == [
        (0, 6, "date=2019-11-19/hour=22", STORE),
        (6, 13, "date=2019-11-19/hour=22", STORE),
        (13, 19, "date=2019-11-20/hour=01", STORE),
    ]
    assert not fresh.has_local
    assert await read_all(b2.endpoint) == b"first\nsecond\nthird\n"


def _names(spans: list[tuple[int, bytes]]) -> dict[str, tuple[int, int, bytes]]:
    """Expected content names (GZIP) of content spans, with their (begin, end, content)."""
    return {
        "%016x-%016x-%s.gz" % (b, b + len(c), hashlib.sha1(c).hexdigest()): (b, b + len(c), c)  # noqa: UP031
        for b, c in spans
    }


async def test_unevaluable_postfix_leaves_content_local_and_readable(
    cluster: Cluster, tmp_path: Path
) -> None:
    # A template that validates (over Go's zero values) but renders no valid postfix for this
    # journal: a '/'-led path. The persister gives up; the content stays served from the spool.
    # (Retries back off for longer than the test: stopping gives up on them after a second.)
    b = await cluster.start_broker("zone-a", "broker-a", pulse_enabled=False, persist_drain_s=1.0)
    spec = journal_spec(J, stores=[STORE])
    spec.fragment.path_postfix_template = "{{ .Spool.PathPostfix }}/x"
    await cluster.create(spec, [b])
    await replica_of(b, J).index.wait_first_refresh(5.0)

    assert (await cluster.append(b, J, [b"kept\n"])).status == pb.OK
    assert (await cluster.append(b, J, [b"local\n"])).status == pb.OK  # Rolls [0, 5).
    await wait_until(lambda: b.persister is not None and b.persister.stats.failed_attempts >= 1)
    assert not (tmp_path / "frags" / J).exists()
    assert await read_all(b.endpoint) == b"kept\nlocal\n"
