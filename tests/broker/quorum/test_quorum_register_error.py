"""A node's `register_error` (what the quorum Status shows as TERM REGISTER) is the outcome of
its newest term register request, not of the last one to end: requests overlap (the coordinator
re-sends one on its backoff while an earlier one waits for etcd's timeout), and a request
that times out after a later one succeeded must not show a healthy journal as failing."""

from __future__ import annotations

import asyncio

from broker.keyspace.backend import UnavailableError
from broker.quorum.register import RegisterCas, RegisterRead, RegisterReply
from broker.quorum_shell.node import Register
from tests.broker.quorum.quorum_nodes_testkit import NAMES, Cluster, wait_s


class FirstRequestTimesOut:
    """A term register whose first request waits until `released`, then fails as one to an
    etcd endpoint that was cut off; later requests go through to the register."""

    def __init__(self, inner: Register) -> None:
        self.inner = inner
        self.released = asyncio.Event()
        self.held_failed = asyncio.Event()
        self.answered = 0  # requests after the first that the register answered
        self._first = True

    async def answer(self, request: RegisterRead | RegisterCas) -> RegisterReply:
        if self._first:
            self._first = False
            try:
                await self.released.wait()
                raise UnavailableError("etcd request timed out (an endpoint cut off)")
            finally:
                self.held_failed.set()
        reply = await self.inner.answer(request)
        self.answered += 1
        return reply


async def test_a_late_timeout_of_an_earlier_request_does_not_show(quorum_nodes: Cluster) -> None:
    held: list[FirstRequestTimesOut] = []

    def wrap(inner: Register) -> Register:
        held.append(FirstRequestTimesOut(inner))
        return held[-1]

    first = await quorum_nodes.start(NAMES[0], register=wrap)
    for name in NAMES[1:]:
        await quorum_nodes.start(name)
    [register] = held
    # A later request of this node's answered (its coordinator re-sent), and a leader serves.
    await quorum_nodes.until(
        lambda: register.answered > 0 and quorum_nodes.leader() is not None, "a leader"
    )
    assert first.register_error is None
    register.released.set()  # The first request now ends: timed out.
    async with asyncio.timeout(wait_s):
        # Set in the node's task as the request fails, which records the outcome in the same
        # step, before this wakes.
        await register.held_failed.wait()
    assert first.register_error is None, first.register_error
    await quorum_nodes.append(b"still writable")
