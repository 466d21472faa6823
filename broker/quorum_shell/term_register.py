"""The term register of one quorum journal on a keyspace backend (etcd or embedded): the
asyncio side of `term_record.py`. It answers the coordinator core's register requests
(`RegisterRead`, `RegisterCas`) with `RegisterReply`, each a single etcd request: a range, or
one transaction comparing the key's mod revision, as assignments are updated.

A backend that is unreachable raises `UnavailableError` to the caller; the coordinator core
re-sends its request on its own bounded, doubling backoff (`CoordinatorConfig.
request_timeout_ticks` .. `retry_backoff_max_ticks`), so this module never retries. A CAS whose
answer was lost is recognised by the core on its retry (the register then holds its record).
"""

from __future__ import annotations

from collections.abc import Sequence

from broker.keyspace.backend import Backend
from broker.quorum.register import (
    CasResult,
    RegisterCas,
    RegisterRead,
    RegisterReply,
    TermRecord,
    Versioned,
)
from broker.quorum_shell.term_record import cas_result, cas_txn, versioned_of
from broker.topology import quorum_term_key


class KeyspaceTermRegister:
    """`<root>/quorum/<journal>` on `backend`; `ensemble` is the initial record's (the route);
    `journal_revision` the journal's identity (term_record.py; 0: not checked)."""

    def __init__(
        self,
        backend: Backend,
        root: str,
        journal: str,
        ensemble: Sequence[str],
        journal_revision: int = 0,
    ) -> None:
        self._backend = backend
        self.key = quorum_term_key(root, journal).encode()
        self._ensemble = tuple(ensemble)
        self._journal_revision = journal_revision

    async def read(self) -> Versioned:
        resp = await self._backend.range(self.key)
        return versioned_of(resp.kvs, self._ensemble, self._journal_revision)

    async def compare_and_swap(self, expect_revision: int, record: TermRecord) -> CasResult:
        compares, success, failure = cas_txn(
            self.key, expect_revision, record, self._journal_revision
        )
        resp = await self._backend.txn(compares, success, failure)
        return cas_result(resp, self._ensemble, self._journal_revision)

    async def answer(self, request: RegisterRead | RegisterCas) -> RegisterReply:
        if isinstance(request, RegisterRead):
            return RegisterReply(request.request_id, True, await self.read())
        result = await self.compare_and_swap(request.expect_revision, request.record)
        return RegisterReply(request.request_id, result.ok, result.current)
