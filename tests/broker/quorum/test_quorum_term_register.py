"""The term register in the keyspace: its JSON record, the compare-and-swap on the key's mod
revision, on the embedded keyspace and on a real etcd, and the coordinator core electing
through it (two coordinators racing never both own a term)."""

from __future__ import annotations

import shutil
from collections.abc import AsyncIterator

import pytest

from broker.keyspace.backend import Backend, KeyValue
from broker.keyspace.embedded import EmbeddedBackend
from broker.keyspace.etcd import EtcdBackend
from broker.quorum.coordinator import REGISTER, CoordState
from broker.quorum.register import RegisterCas, RegisterRead, TermRecord
from broker.quorum_shell.term_record import (
    QuorumTerm,
    TermRecordDecodeError,
    decode_term_record,
    encode_term_record,
)
from broker.quorum_shell.term_register import KeyspaceTermRegister
from broker.testing.etcd_server import EtcdServer
from broker.topology import TopologyDecodeError, make_decoder
from tests.broker.quorum.quorum_testkit import coordinator

ROOT = "/gazette/cluster"
ENSEMBLE = ("m0", "m1", "m2")


@pytest.fixture(params=["embedded", pytest.param("etcd", marks=pytest.mark.etcd)])
async def backend(request: pytest.FixtureRequest) -> AsyncIterator[Backend]:
    if request.param == "embedded":
        embedded = EmbeddedBackend()
        yield embedded
        await embedded.close()
        return
    if shutil.which("etcd") is None:
        pytest.skip("etcd not installed: run `make system-deps`")
    async with EtcdServer() as server:
        etcd = EtcdBackend([server.endpoint], dial_timeout_s=5, request_timeout_s=5)
        yield etcd
        await etcd.close()


def test_record_round_trips_and_malformed_values_are_refused() -> None:
    record = TermRecord(7, "c1", ENSEMBLE, "m2")
    assert decode_term_record(encode_term_record(record)) == record
    for bad, why in [
        (b"\xff", "not JSON"),
        (b'{"format":2}', "format must be 1"),
        (b'{"format":1,"term":-1,"owner":"","ensemble":["a"],"leader":""}', "term must be"),
        (b'{"format":1,"term":1,"owner":"","ensemble":[],"leader":""}', "ensemble must be"),
        (b'{"format":1,"term":1,"owner":"","ensemble":["a","a"],"leader":""}', "distinct"),
        (b'{"format":1,"term":1,"owner":"","ensemble":["a"],"leader":"b"}', "not in the ensemble"),
    ]:
        with pytest.raises(TermRecordDecodeError, match=why):
            decode_term_record(bad)


def test_keyspace_decodes_the_register_beside_the_topology() -> None:
    decode = make_decoder(ROOT)
    record = TermRecord(3, "c0", ENSEMBLE, "m1")
    kv = KeyValue(f"{ROOT}/quorum/a/journal".encode(), encode_term_record(record), 5, 9, 2)
    assert decode(kv) == QuorumTerm("a/journal", record)
    bad = KeyValue(f"{ROOT}/quorum/a/journal".encode(), b"{}", 5, 9, 2)
    with pytest.raises(TopologyDecodeError, match="quorum/a/journal"):
        decode(bad)


async def test_compare_and_swap_on_mod_revision(backend: Backend) -> None:
    register = KeyspaceTermRegister(backend, ROOT, "a/journal", ENSEMBLE)
    initial = await register.read()
    assert (initial.record, initial.revision) == (TermRecord(0, "", ENSEMBLE), 0)

    claim = TermRecord(1, "c0", ENSEMBLE)
    won = await register.compare_and_swap(0, claim)
    assert won.ok and won.current.record == claim and won.current.revision > 0

    # A second claim on the initial revision loses, sees the winner, and changes nothing.
    lost = await register.compare_and_swap(0, TermRecord(1, "c1", ENSEMBLE))
    assert not lost.ok and lost.current == won.current
    assert await register.read() == won.current

    appoint = TermRecord(1, "c0", ENSEMBLE, "m2")
    appointed = await register.compare_and_swap(won.current.revision, appoint)
    assert appointed.ok and appointed.current.revision > won.current.revision
    stale = await register.compare_and_swap(won.current.revision, TermRecord(2, "c1", ENSEMBLE))
    assert not stale.ok and stale.current == appointed.current

    # Another journal's register is another key.
    other = KeyspaceTermRegister(backend, ROOT, "a/journal-2", ENSEMBLE)
    assert (await other.read()).revision == 0


async def test_racing_coordinators_never_both_own_a_term(backend: Backend) -> None:
    register = KeyspaceTermRegister(backend, ROOT, "a/journal", ENSEMBLE)
    c0, c1 = coordinator("c0", seed=1), coordinator("c1", seed=2)
    c0.start(0)
    c1.start(0)
    # Both read the initial register before either claims: both try to claim term 1.
    for c in (c0, c1):
        [(dest, read)] = c.outbox
        c.outbox.clear()
        assert dest == REGISTER and isinstance(read, RegisterRead)
        c.handle(await register.answer(read), 1)
    claims = []
    for c in (c0, c1):
        [(_, cas)] = [m for m in c.outbox if m[0] == REGISTER]
        c.outbox.clear()
        assert isinstance(cas, RegisterCas) and cas.record.term == 1
        claims.append((c, cas))
    for c, cas in claims:
        c.handle(await register.answer(cas), 2)
    states = sorted(c.state.value for c in (c0, c1))
    assert states == sorted([CoordState.FENCING.value, CoordState.WAITING.value])
    record = (await register.read()).record
    assert record.term == 1 and record.owner in ("c0", "c1")
    fencing = next(c for c in (c0, c1) if c.state is CoordState.FENCING)
    assert fencing.name == record.owner and fencing.term == 1
