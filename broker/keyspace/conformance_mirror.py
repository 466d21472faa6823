"""Keyspace conformance checks of the KeySpace mirror over a backend: resume, reload after
compaction, decode failures, observers (see conformance.py)."""

from __future__ import annotations

from broker.keyspace import (
    conformance_kit,  # Its tunables are read at call time (tests patch them).
)
from broker.keyspace.backend import (
    KeyValue,
    OpPut,
    prefix_end,
)
from broker.keyspace.conformance_kit import (
    Check as Check,
)
from broker.keyspace.conformance_kit import (
    ConformanceError,
    KeySpaceHarness,
    _expect,
    _running,
    _scope,
)
from broker.keyspace.keyspace import KeySpace


def _decode_text(kv: KeyValue) -> str:
    if kv.value.startswith(b"bad"):
        raise ValueError(f"undecodable value {kv.value!r}")
    return kv.value.decode()


def _values(ks: KeySpace[str]) -> dict[bytes, str]:
    return {entry.kv.key[len(ks.root) :]: entry.decoded for entry in ks.kvs}


async def _reach(ks: KeySpace[str], revision: int) -> None:
    try:
        await ks.wait_for_revision(revision, conformance_kit.event_timeout_s)
    except TimeoutError as exc:
        raise ConformanceError(f"the KeySpace mirror did not follow the writes: {exc}") from None


async def check_mirror_resume(harness: KeySpaceHarness) -> None:
    """A KeySpace mirror keeps running across interrupted connections and reflects writes made
    while its watch was broken and after."""
    b = harness.backend
    root = _scope("mirror_resume")
    await b.put(root + b"/k1", b"one")
    ks = KeySpace(root, _decode_text)
    await ks.load(b)
    async with _running(ks.watch(b)):
        h2 = await b.put(root + b"/k2", b"two")
        await _reach(ks, h2.revision)
        await harness.interrupt()
        await b.put(root + b"/k3", b"three")
        await harness.interrupt()
        h4 = await b.put(root + b"/k4", b"four")
        await _reach(ks, h4.revision)
        got = _values(ks)
        want = {b"/k1": "one", b"/k2": "two", b"/k3": "three", b"/k4": "four"}
        _expect(got == want, f"mirror after interruptions: {got}, expected {want}")
        hd, _ = await b.delete(root + b"/k1")
        await _reach(ks, hd.revision)
        _expect(ks.get(root + b"/k1") is None, "mirror kept a deleted key")
        try:
            await ks.wait_for_revision(hd.revision + 1000, 0.05)
        except TimeoutError:
            pass
        else:
            raise ConformanceError("wait_for_revision of a far revision did not time out")
    await b.delete(root, prefix_end(root))


async def check_mirror_reload_after_compaction(harness: KeySpaceHarness) -> None:
    """A mirror whose resume revision was compacted re-loads and carries on."""
    b = harness.backend
    root = _scope("mirror_reload")
    await b.put(root + b"/k1", b"one")
    ks = KeySpace(root, _decode_text)
    await ks.load(b)
    await b.put(root + b"/k2", b"two")
    await b.delete(root + b"/k1")
    h = await b.put(root + b"/k3", b"three")
    await b.compact(h.revision)
    async with _running(ks.watch(b)):
        await _reach(ks, h.revision)
        h4 = await b.put(root + b"/k4", b"four")
        await _reach(ks, h4.revision)
    got = _values(ks)
    want = {b"/k2": "two", b"/k3": "three", b"/k4": "four"}
    _expect(got == want, f"mirror re-loaded after compaction: {got}, expected {want}")
    await b.delete(root, prefix_end(root))


async def check_mirror_decode_failures(harness: KeySpaceHarness) -> None:
    """Values that fail to decode are left out, without stopping the watch; a later good
    value for the key is picked up."""
    b = harness.backend
    root = _scope("mirror_decode")
    await b.put(root + b"/good", b"ok")
    await b.put(root + b"/bad", b"bad-1")
    ks = KeySpace(root, _decode_text)
    await ks.load(b)
    _expect(_values(ks) == {b"/good": "ok"}, f"loaded {_values(ks)}")
    async with _running(ks.watch(b)):
        await b.put(root + b"/new-bad", b"bad-2")
        await b.put(root + b"/good", b"bad-3")  # The previous, good value is kept.
        h = await b.put(root + b"/good2", b"ok2")
        await _reach(ks, h.revision)
        got = _values(ks)
        want = {b"/good": "ok", b"/good2": "ok2"}
        _expect(got == want, f"after undecodable updates: {got}, expected {want}")

        await b.put(root + b"/bad", b"fixed")
        await b.delete(root + b"/new-bad")  # Never in the mirror: ignored.
        h = await b.put(root + b"/good", b"ok-again")
        await _reach(ks, h.revision)
        got = _values(ks)
        want = {b"/bad": "fixed", b"/good": "ok-again", b"/good2": "ok2"}
        _expect(got == want, f"after corrections: {got}, expected {want}")
    await b.delete(root, prefix_end(root))


async def check_mirror_observers(harness: KeySpaceHarness) -> None:
    """Observers run after each load and each applied batch, seeing the mirror updated; a
    txn's changes arrive as one batch."""
    b = harness.backend
    root = _scope("mirror_observers")
    await b.put(root + b"/a", b"a")
    ks = KeySpace(root, _decode_text)
    seen: list[tuple[int, dict[bytes, str]]] = []
    ks.observers.append(lambda: seen.append((ks.header.revision, _values(ks))))
    await ks.load(b)
    _expect(seen == [(ks.header.revision, {b"/a": "a"})], f"observer after load saw {seen}")
    async with _running(ks.watch(b)):
        t = await b.txn([], [OpPut(root + b"/b", b"b"), OpPut(root + b"/c", b"c")])
        await _reach(ks, t.header.revision)
    want = (t.header.revision, {b"/a": "a", b"/b": "b", b"/c": "c"})
    _expect(
        seen[1:] == [want],
        f"observer calls after one txn: {seen[1:]}, expected exactly {[want]}",
    )
    await b.delete(root, prefix_end(root))
