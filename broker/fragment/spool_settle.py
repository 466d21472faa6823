"""Settling a recovered spool once its journal is assigned to this broker again.

A replica created for a journal with a `RecoveredJournal` (spool_dir.py) resumes its Spool from
the recovered state, *pending*: the spool applies nothing until whoever first takes it to
synchronise (the primary's append machine, or a Replicate stream from the primary) settles it
here. The rules are spool_recovery.py's: the store check against the replica's first store
listing, then the synchronisation check against the primary's first proposal. Settling either
adopts the recovered content (the index serves it; completed fragments go to the persister)
or sets it aside (the spool starts over empty).

Settling waits for the replica's first store listing, bounded by the caller's wait and raced
against the invalidation of its resolution; on either, the spool stays pending and the caller
gives it back.
"""

from __future__ import annotations

import asyncio
import hashlib
from typing import Protocol

from broker import metrics
from broker.fragment.index import FragmentIndex
from broker.fragment.naming import sum_from_digest
from broker.fragment.spool import CompletedSpool, LocalFragment, Spool
from broker.fragment.spool_dir import RecoveredJournal, SpoolDir
from broker.fragment.spool_file import SpoolFile, unlink_durable
from broker.fragment.spool_recovery import (
    Verdict,
    keeps_completed,
    prefix_to_verify,
    settle_verdict,
    store_verdict,
)
from broker.fragment.spool_types import same_fragment
from broker.logging import get_logger
from broker.protocol import protocol_pb2 as pb

log = get_logger(__name__)

# Bytes read at a time when a recovered fragment's prefix is hashed against a proposal.
_HASH_CHUNK_BYTES = 1 << 20


class CompletedSink(Protocol):
    def on_complete(self, completed: CompletedSpool) -> None: ...


async def _wait_first(events: list[asyncio.Event], timeout_s: float) -> None:
    waiters = [asyncio.ensure_future(e.wait()) for e in events]
    try:
        await asyncio.wait(waiters, timeout=timeout_s, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for waiter in waiters:
            waiter.cancel()
        await asyncio.gather(*waiters, return_exceptions=True)


def _hash_range(file: SpoolFile, begin: int, end: int) -> pb.SHA1Sum:
    summer = hashlib.sha1()
    offset = begin
    while offset < end:
        chunk = file.pread(min(_HASH_CHUNK_BYTES, end - offset), offset)
        if not chunk:
            raise OSError(f"recovered spool file ends at {offset}, before {end}")
        summer.update(chunk)
        offset += len(chunk)
    return sum_from_digest(summer.digest())


class RecoverySettler:
    """The pending recovery of one replica's journal (see the module docstring)."""

    def __init__(
        self,
        recovered: RecoveredJournal,
        spool_dir: SpoolDir,
        index: FragmentIndex,
        persister: CompletedSink | None,
    ) -> None:
        self.recovered = recovered
        self._spool_dir = spool_dir
        self._index = index
        self._persister = persister
        self.verdict: Verdict | None = None

    @property
    def journal(self) -> str:
        return self.recovered.journal

    async def settle(
        self,
        spool: Spool,
        proposal: pb.Fragment | None,
        *,
        invalidated: asyncio.Event,
        wait_s: float,
    ) -> bool:
        """Settle `spool` (owned by the caller) as the journal's primary (`proposal` None) or
        as a replica receiving `proposal` first. Returns False, changing nothing, if the
        replica's first store listing is not done within `wait_s` or `invalidated` is set."""
        if not spool.recovery_pending:
            return True
        if not self._index.first_refresh.is_set():
            await _wait_first([self._index.first_refresh, invalidated], wait_s)
            if not self._index.first_refresh.is_set():
                return False

        completed = self.recovered.completed
        # The open fragment counts even when empty: its offset and registers are stale too if
        # the journal was persisted past it without this broker.
        persisted = [e.fragment for e in self._index.snapshot() if e.file is None]
        store = store_verdict([c.fragment for c in completed], persisted, spool.fragment)
        for index in sorted(store.redundant, reverse=True):
            redundant = completed.pop(index)
            unlink_durable(redundant.file)
            redundant.file.close()
            metrics.SPOOL_RECOVERY.labels("redundant").inc()
        if store.conflict is not None:
            conflict = store.conflict
            self._disown(
                spool,
                f"the store holds [{conflict.begin}, {conflict.end}), written without this"
                " broker over its recovered content",
            )
            return True
        if store.stale_open is not None:
            stale = store.stale_open
            self._keep_completed(primary=True)  # The store lacks them: persisted at once.
            self._disown(
                spool,
                f"the store holds [{stale.begin}, {stale.end}), written without this broker"
                " past its recovered content",
            )
            return True

        prefix_sum: pb.SHA1Sum | None = None
        if proposal is not None and not same_fragment(proposal, spool.fragment):
            span = prefix_to_verify(spool.fragment, proposal)
            local = spool.local_fragment
            if span is not None and local is not None:
                prefix_sum = await asyncio.to_thread(_hash_range, local.file, *span)
        span = None
        if completed:
            span = (
                min(c.fragment.begin for c in completed),
                max(c.fragment.end for c in completed),
            )
        verdict = settle_verdict(spool.fragment, proposal, prefix_sum, span)
        if verdict is Verdict.ADOPT:
            self._adopt(spool, primary=proposal is None)
        else:
            theirs = f"[{proposal.begin}, {proposal.end})" if proposal is not None else "none"
            if keeps_completed([c.fragment for c in completed], proposal):
                # The primary went on after them; as a replica's, uploaded after the primary's
                # expected upload (the persister's replica delay), if it does not come.
                self._keep_completed(primary=False)
            self._disown(
                spool,
                f"the primary's first proposal {theirs} is not this broker's recovered"
                " content: the journal went on without it",
            )
        return True

    def _adopt(self, spool: Spool, *, primary: bool) -> None:
        self.verdict = Verdict.ADOPT
        spool.adopt_recovery()
        adopted = len(self.recovered.completed) + (1 if spool.content_length else 0)
        self._keep_completed(primary=primary)
        if adopted:
            metrics.SPOOL_RECOVERY.labels("adopted").inc(adopted)
            log.info(
                "recovered spool adopted",
                journal=self.journal,
                fragment_end=spool.fragment.end,
                fragments=adopted,
            )

    def _keep_completed(self, *, primary: bool) -> None:
        """Index the recovered completed fragments and hand them to the persister."""
        kept = self.recovered.completed
        for fragment in kept:
            self._index.spool_commit(LocalFragment(fragment.fragment, fragment.file))
            if self._persister is not None:
                # As the primary, persisted at once; as a replica, once the primary's copy
                # fails to show up in the store (the persister's replica delay).
                self._persister.on_complete(
                    CompletedSpool(
                        fragment=fragment.fragment,
                        registers=fragment.registers,
                        first_append_time=fragment.first_append_time,
                        content_file=fragment.file,
                        compressed_file=None,
                        compressed_length=0,
                        primary=primary,
                    )
                )
        self.recovered.completed = []
        if kept and self.verdict is not Verdict.ADOPT:
            metrics.SPOOL_RECOVERY.labels("kept").inc(len(kept))
            log.warning(
                "recovered completed fragments kept, the open one set aside",
                journal=self.journal,
                fragments=len(kept),
                begin=kept[0].fragment.begin,
                end=kept[-1].fragment.end,
            )

    def _disown(self, spool: Spool, reason: str) -> None:
        self.verdict = Verdict.DISOWN
        stale = len(self.recovered.completed)
        for fragment in self.recovered.completed:
            self._spool_dir.set_aside_file(self.journal, fragment.file, reason)
        self.recovered.completed = []
        end = spool.fragment.end
        file = spool.disown_recovery()
        if file is not None:
            stale += 1
            self._spool_dir.set_aside_file(self.journal, file, reason)
        if stale:
            metrics.SPOOL_RECOVERY.labels("stale").inc(stale)
        log.error(
            "recovered spool set aside: it starts over empty",
            journal=self.journal,
            recovered_end=end,
            fragments=stale,
            reason=reason,
        )

    def give_back(self) -> None:
        """The replica stops before settling: its recovered state waits for the next one."""
        self._spool_dir.put_back(self.recovered)
