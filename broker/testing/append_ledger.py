"""A test's ledger of appends tried once each, and the check of a journal's content against it.

Fault tests append while brokers fail, then read the journal back from every member. An append
that fails (UNAVAILABLE, a refusal during an election, a term changed under it) has an unknown
outcome: it may still commit. Retrying the same record could then commit it twice, and the test
could not tell a duplicate written by the broker from its own retry. So each attempt appends a
new record, tried once, and the ledger keeps it as *unknown*; an acknowledged record is kept
with the offsets its answer named. The check then holds the journal to what a client was
promised: every acknowledged record at its offsets, no record twice, and nothing but
acknowledged and unknown-outcome records.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import grpc

from broker.client.appender import append
from broker.client.route_cache import JournalClient
from broker.protocol import protocol_pb2 as pb
from broker.protocol.status import GazetteError


@dataclass
class AppendLedger:
    """Acknowledged records with their offsets, and records of unknown outcome."""

    journal: str
    acked: dict[bytes, tuple[int, int]] = field(default_factory=dict)
    unknown: set[bytes] = field(default_factory=set)
    end: int = 0  # The end of the last acknowledged append.
    count: int = 0  # Records tried, to name the next one.

    def next_record(self, tag: str, width: int = 5) -> bytes:
        """A new record, never tried before: `<tag>-<count>\\n`."""
        self.count += 1
        return f"{tag}-{self.count:0{width}d}\n".encode()

    async def try_once(self, client: JournalClient, data: bytes) -> pb.AppendResponse | None:
        """Append `data` once: its answer if acknowledged, else None with `data` kept as of
        unknown outcome. Offsets only grow (unknown-outcome records may lie between)."""
        try:
            resp = await append(
                client, pb.AppendRequest(journal=self.journal), data, attempts_max=1
            )
        except (grpc.aio.AioRpcError, GazetteError):
            self.unknown.add(data)
            return None
        assert resp.status == pb.OK, pb.Status.Name(resp.status)
        assert resp.commit.begin >= self.end, (data, resp.commit, self.end)
        self.acked[data] = (resp.commit.begin, resp.commit.end)
        self.end = resp.commit.end
        return resp

    def check(self, content: bytes, who: str) -> None:
        """`content` (the whole journal as `who` serves it) holds every acknowledged record at
        its offsets, each record once, and nothing else but unknown-outcome records."""
        offset, seen = 0, set()
        for line in content.splitlines(keepends=True):
            assert line not in seen, (who, line)  # No record twice.
            seen.add(line)
            if line in self.acked:
                assert self.acked[line] == (offset, offset + len(line)), (who, line, offset)
            else:
                assert line in self.unknown, (who, line)
            offset += len(line)
        missing = [d for d in self.acked if d not in seen]
        assert not missing, (who, missing[:3])
