"""The soak's checks, without a cluster: each kind of broken promise is reported, naming what
broke, and nothing is reported when nothing broke.

- `fold` (the summer's sequence rule): gaps, repeats and chunks after a stream's end raise
  `SequenceViolation` naming the stream, the expected and the observed chunk;
- `SumVerifier`: mismatched, duplicate, late and unexpected sums;
- `ContentLedger`: brokers disagreeing, content lost or rewritten between checks, torn lines,
  for whole reads and for reads from near the end of what was verified;
- the report's percentiles and summary table;
- the layout's replication modes (which journals the soak runs in quorum mode).
"""

from __future__ import annotations

import math

import pytest

from broker.protocol import labels
from examples.stream_sum.layout import default_layout
from examples.stream_sum.messages import Chunk, SequenceViolation, StreamState, Sum, fold
from examples.stream_sum.soak import checks
from examples.stream_sum.soak.checks import ContentLedger, Read
from examples.stream_sum.soak.report import FaultRecord, percentile, summary
from examples.stream_sum.verifier import SumVerifier


def chunks(stream: str, data: list[str]) -> list[Chunk]:
    """A whole stream: data chunks, then the final empty one."""
    return [Chunk(stream=stream, seq=i + 1, data=d) for i, d in enumerate([*data, ""])]


def folded(items: list[Chunk]) -> StreamState:
    state = StreamState()
    for c in items:
        state = fold(state, c)
    return state


def test_fold_sums_a_stream_and_ends_it() -> None:
    state = folded(chunks("s1", ["00ff", "abcd"]))
    assert state.done and state.seq == 3
    # The sum depends on order and content.
    assert state.value != folded(chunks("s1", ["abcd", "00ff"])).value
    assert StreamState.decode(state.encode()) == state


@pytest.mark.parametrize(
    ("sequence", "expected", "observed", "kind"),
    [
        ([1, 3], 2, 3, "gap"),
        ([1, 2, 2], 3, 2, "repeat"),
        ([1, 1], 2, 1, "repeat"),
    ],
)
def test_fold_refuses_a_chunk_out_of_sequence(
    sequence: list[int], expected: int, observed: int, kind: str
) -> None:
    state = StreamState()
    with pytest.raises(SequenceViolation) as caught:
        for seq in sequence:
            state = fold(state, Chunk(stream="s-7", seq=seq, data="aa"))
    err = caught.value
    assert (err.stream, err.expected, err.observed) == ("s-7", expected, observed)
    assert kind in err.kind
    assert f"stream s-7: expected chunk {expected}, observed chunk {observed}" in str(err)


def test_fold_refuses_a_chunk_after_the_end() -> None:
    state = folded(chunks("s2", ["aa"]))
    with pytest.raises(SequenceViolation, match=r"stream s2: expected nothing .* chunk 2"):
        fold(state, Chunk(stream="s2", seq=2, data=""))


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_verifier_matches_sums_in_either_order_and_reports_progress() -> None:
    clock, seen = Clock(), []
    v = SumVerifier(30.0, on_verified=lambda j, done, at: seen.append((j, done, at)), clock=clock)
    v.expect("a", "j/0", 3, 42)
    clock.now += 1
    v.observe(Sum(stream="a", seq=3, value=42))
    v.observe(Sum(stream="b", seq=2, value=7))  # Before the chunker heard its append succeed.
    clock.now += 1
    v.expect("b", "j/1", 2, 7)
    v.check_deadlines()
    assert v.findings == [] and v.verified == 2 and v.outstanding == 0
    assert seen == [("j/0", 1000.0, 1001.0), ("j/1", 1002.0, 1002.0)]


def test_verifier_reports_a_mismatch_and_a_duplicate() -> None:
    v = SumVerifier(30.0, clock=Clock())
    v.expect("a", "j/0", 3, 42)
    v.observe(Sum(stream="a", seq=3, value=41))
    v.observe(Sum(stream="a", seq=3, value=42))
    assert [f.kind for f in v.findings] == ["mismatch", "duplicate sum"]
    assert "stream a (journal j/0): expected seq 3 value 42, observed seq 3 value 41" in str(
        v.findings[0]
    )


def test_verifier_reports_late_and_unexpected_sums_once() -> None:
    clock = Clock()
    v = SumVerifier(30.0, clock=clock)
    v.expect("late", "j/0", 5, 1)
    v.observe(Sum(stream="ghost", seq=4, value=9))
    clock.now += 29
    v.check_deadlines()
    assert v.findings == []
    clock.now += 2
    v.check_deadlines()
    v.check_deadlines()
    assert sorted(f.kind for f in v.findings) == ["late sum", "unexpected sum"]
    # A late sum still has its value checked, and is not a duplicate.
    v.observe(Sum(stream="late", seq=5, value=1))
    assert len(v.findings) == 2 and v.outstanding == 0


def test_verifier_forgets_streams_it_cannot_vouch_for() -> None:
    clock = Clock()
    v = SumVerifier(30.0, clock=clock)
    v.expect("a", "j/0", 3, 42)
    v.forget("a")
    v.observe(Sum(stream="a", seq=3, value=0))
    clock.now += 100
    v.check_deadlines()
    assert v.findings == [] and v.outstanding == 0


LINES = b'{"UUID":"u1","x":1}\n{"UUID":"u2","x":2}\n'


def test_ledger_accepts_reads_that_grow_and_agree() -> None:
    ledger = ContentLedger({"j"})
    assert ledger.check("j", {"a/gRPC": LINES, "b/HTTP": LINES[:20]}) == []
    more = LINES + b'{"UUID":"u3"}\n'
    assert ledger.check("j", {"a/gRPC": more, "b/gRPC": LINES}) == []
    assert ledger.verified_length("j") == len(more)


def test_ledger_reports_brokers_that_disagree() -> None:
    ledger = ContentLedger({"j"})
    other = LINES.replace(b"u2", b"u9")
    findings = ledger.check("j", {"a/gRPC": LINES, "b/gRPC": other})
    assert [f.kind for f in findings] == ["content differs"]
    assert "differ at offset 30" in findings[0].detail
    assert ledger.verified_length("j") == 0  # Nothing verified while they disagree.


def test_ledger_reports_content_lost_and_rewritten_since_the_last_check() -> None:
    ledger = ContentLedger(set())
    assert ledger.check("log", {"a/gRPC": b"0123456789"}) == []
    lost = ledger.check("log", {"a/gRPC": b"01234", "b/gRPC": b"0123456789"})
    assert [f.kind for f in lost] == ["content lost"]
    assert "a/gRPC reads to offset 5; 10 bytes were verified before" in lost[0].detail
    rewritten = ledger.check("log", {"a/gRPC": b"01234x6789abc"})
    assert [f.kind for f in rewritten] == ["content rewritten"]


def test_ledger_checks_reads_from_near_the_end_against_what_was_verified(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(checks, "overlap_bytes", 4)  # A small tail, to see it at work.
    ledger = ContentLedger(set())
    assert ledger.check("log", {"a/gRPC": b"0123456789"}) == []
    start = ledger.read_start("log")
    assert start == 6
    # Every source but one reads from near the end; the whole read vouches for the prefix.
    grown = {"a/gRPC": Read(start, b"6789abc"), "b/HTTP": Read(0, b"0123456789ab")}
    assert ledger.check("log", grown) == []
    assert ledger.verified_length("log") == 13
    # The tail a late read repeats must be what was verified: a rewrite inside it is caught.
    rewritten = ledger.check("log", {"a/gRPC": Read(9, b"9aXcdef")})
    assert [f.kind for f in rewritten] == ["content rewritten"]
    # A rewrite below the tail is caught by the next whole read, against the prefix's SHA-1.
    below = ledger.check("log", {"a/gRPC": Read(9, b"9abcd"), "b/gRPC": Read(0, b"0X23456789abcd")})
    assert [f.kind for f in below] == ["content rewritten"]  # The late read agrees with it.
    # A late read that ends before what was verified: content lost.
    lost = ledger.check("log", {"a/gRPC": Read(9, b"9a")})
    assert [f.kind for f in lost] == ["content lost"]
    # Nothing of these was verified; a good late read goes on from 13.
    assert ledger.check("log", {"a/gRPC": Read(9, b"9abcdef")}) == []
    assert ledger.verified_length("log") == 16


def test_ledger_checks_json_lines_from_a_late_read() -> None:
    ledger = ContentLedger({"j"})
    assert ledger.check("j", {"a/gRPC": LINES}) == []
    more = b'{"UUID":"u3"}\n'
    late = ledger.read_start("j")  # 0: the journal is shorter than the tail.
    assert ledger.check("j", {"a/gRPC": Read(late, (LINES + more)[late:])}) == []
    torn = ledger.check("j", {"a/gRPC": Read(0, LINES + more + b'{"UUID"')})
    assert [f.kind for f in torn] == ["torn content"]


@pytest.mark.parametrize(
    "content", [LINES + b'{"UUID":"u3"', LINES + b"not json\n", LINES + b'{"x":1}\n']
)
def test_ledger_reports_torn_or_foreign_lines(content: bytes) -> None:
    findings = ContentLedger({"j"}).check("j", {"a/gRPC": content})
    assert [f.kind for f in findings] == ["torn content"]


def test_percentiles_and_the_summary_table() -> None:
    assert percentile([3.0, 1.0, 2.0], 0.5) == 2.0
    assert percentile([1.0, math.inf], 1.0) == math.inf
    records = [
        FaultRecord(1, "shard-kill", append_s={}, progress_s={"s1": 2.0}, standby={"s1": True}),
        FaultRecord(2, "shard-kill", progress_s={"s2": 6.0, "s3": None}, restored_s=9.0),
        FaultRecord(
            3,
            "broker-kill",
            append_s={"r2": 0.5, "r3": 7.0, "r3b": 8.0},
            replication={"r2": 2, "r3": 3, "r3b": 3},
            progress_s={"s1": 1.0},
            standby={"s1": True},
            restored_s=9.5,
        ),
        FaultRecord(
            4,
            "quorum-leader-kill",
            leader_s={"q1": 2.5, "q2": 4.0},
            stall_s={"q1": 0.2},
            restored_s=5.0,
        ),
    ]
    table = summary(records)
    lines = table.splitlines()
    assert lines[0].split()[:3] == ["fault", "n", "failed"] and "append R=3" in lines[0]
    shard_kill, broker_kill = lines[3], lines[4]
    # Progress with a standby: 2.0 (one fault); without: the second fault's worst, never.
    assert shard_kill.split() == [
        *("shard-kill", "2", "0", "-", "-", "2.0s", "/", "2.0s"),
        *("never", "/", "never", "9.0s", "/", "never", "-", "-"),
    ]
    # Appends by replication: R=2 0.5, R=3 the worst of the fault's R=3 journals.
    assert broker_kill.split() == [
        *("broker-kill", "1", "0", "0.5s", "/", "0.5s", "8.0s", "/", "8.0s"),
        *("1.0s", "/", "1.0s", "-", "9.5s", "/", "9.5s", "-", "-"),
    ]
    # Quorum journals: the worst kill-to-leader of the fault, and its longest append stall.
    assert "leader (quorum)" in lines[0] and "stall (quorum)" in lines[0]
    assert lines[5].split() == [
        *("quorum-leader-kill", "1", "0", "-", "-", "-", "-", "5.0s", "/", "5.0s"),
        *("4.0s", "/", "4.0s", "0.2s", "/", "0.2s"),
    ]
    line = records[1].line()
    assert "progress  never" in line and "restored   9.0s" in line


def test_replication_modes_make_r3_journals_quorum_journals() -> None:
    layout = default_layout(file_store="file:///f/", s3_store="s3://b/")
    r3 = {s.name for s in layout.journal_specs() if s.replication == 3}
    r2 = {s.name for s in layout.journal_specs() if s.replication == 2}
    assert layout.with_replication_mode("all").journal_specs() == layout.journal_specs()
    assert layout.quorum_journals() == []
    # Every R=3 journal (chunks, sums, a recovery log); R=2 ones stay all-replicas.
    quorum = layout.with_replication_mode("quorum")
    assert set(quorum.quorum_journals()) == r3 and len(r3) == 4
    for spec in quorum.journal_specs():
        mode = labels.values_of(spec.labels, labels.REPLICATION_MODE)
        assert mode == ([labels.REPLICATION_MODE_QUORUM] if spec.name in r3 else [])
    # Mixed: a chunk journal and another shard's recovery log; the rest of R=3 stays.
    mixed = layout.with_replication_mode("mixed")
    assert mixed.quorum_journals() == [
        "stream-sum/chunks/part-0",
        "stream-sum/recovery/sum-rdb-0",
    ]
    assert r2.isdisjoint(mixed.quorum_journals())
    # Capped below three brokers: no quorum journal left.
    assert quorum.capped(2, 0).quorum_journals() == []
    with pytest.raises(ValueError, match="unknown replication mode 'most'"):
        layout.with_replication_mode("most")


def test_content_not_listed_yet_is_waited_for_then_reported() -> None:
    """A read that finds content below the write head its broker does not hold yet (a replica
    restarted after a fault serves it once another replica's upload is listed, as Gazette's
    do) is retried past `read_attempts_max`, for a bounded time; still missing after that, it
    is reported, naming the offset and how long it was waited for."""
    import asyncio

    calls = 0

    async def listed_after(n: int) -> bool:
        nonlocal calls
        calls += 1
        if calls <= n:
            raise checks._NotListedYet(checks._below_head(100, 200))
        return True

    # Listed after more tries than read_attempts_max allows for other failures: read.
    n = checks.read_attempts_max + 3
    asyncio.run(checks._retrying("j via b", lambda: listed_after(n), [], not_listed_wait_s=30))
    assert calls == n + 1

    async def never() -> bool:
        raise checks._NotListedYet(checks._below_head(100, 200))

    with pytest.raises(
        checks.ReadFailedError, match=r"j via b: no content available at offset 100.*waited"
    ):
        asyncio.run(checks._retrying("j via b", never, [], not_listed_wait_s=0.3))

    async def unavailable() -> bool:
        return False  # Another transient failure: bounded by attempts.

    with pytest.raises(checks.ReadFailedError, match="still failing after"):
        asyncio.run(checks._retrying("j via b", unavailable, ["UNAVAILABLE"]))


def test_an_http_read_cut_mid_body_keeps_what_it_received_and_goes_on() -> None:
    """The check's HTTP read of a whole journal (100 MB and more after an hour, through a
    loaded S3 server) kept nothing of a GET that failed, and its GETs were bounded in total:
    every attempt timed out from the same offset. A body cut short is the journal's bytes at
    their offsets: kept, and the next GET goes on from its end, as many times as it makes
    progress. Here a gateway on loopback cuts each body after 1,000 bytes."""
    import asyncio

    import aiohttp
    from aiohttp import web

    content = bytes(range(256)) * 40  # 10,240 bytes: eleven cut GETs.
    offsets: list[int] = []

    async def serve(request: web.Request) -> web.StreamResponse:
        at = int(request.query["offset"])
        offsets.append(at)
        if at >= len(content):
            return web.Response(status=416, headers={"X-Write-Head": str(len(content))})
        resp = web.StreamResponse(
            status=206, headers={"Content-Range": f"bytes {at}-{len(content)}/{len(content)}"}
        )
        resp.content_length = len(content) - at
        await resp.prepare(request)
        await resp.write(content[at : at + 1000])
        assert request.transport is not None
        request.transport.close()  # Cut: the rest of the announced body never comes.
        return resp

    async def run() -> bytes:
        app = web.Application()
        app.router.add_get("/{journal:.*}", serve)
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        try:
            async with aiohttp.ClientSession() as session:
                return await checks.read_http(session, f"http://127.0.0.1:{port}", "a/journal")
        finally:
            await runner.cleanup()

    assert asyncio.run(run()) == content
    assert offsets == [*range(0, len(content), 1000), len(content)]
