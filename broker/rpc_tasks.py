"""In-flight RPCs: a gRPC server's handler tasks, so that stopping waits for them to end.

grpc.aio's ``Server.stop(grace)`` cancels the calls still running after ``grace`` in gRPC's core
and returns. The handlers' asyncio tasks learn of it later, as core reports each call's
cancellation, and only then run their cleanup: a Read closes the fragment file it streams (a
worker thread's ``close``), an Append releases its journal's pipeline. A process that returned
from its stop meanwhile left those tasks, and their open files, behind: in the same process (a
broker stopped and started again, an embedded or test cluster) they outlive the stop, and once
the event loop goes the files are left to the garbage collector.

``InFlightRpcs`` is a server interceptor that records the task of each RPC: grpc.aio runs a
call's interceptors in the task that then runs its handler, so recording costs a set insertion
per call and nothing per message. ``drain`` waits for the recorded tasks, bounded, cancels the
ones still running, and waits for their cleanup (bounded again).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any, Final

import grpc
import grpc.aio

from broker.logging import get_logger

log = get_logger(__name__)

# After Server.stop, handlers end as core reports their calls cancelled: a moment, unless one
# is stuck in something that ignores cancellation for a while (a blocking store call in a
# worker thread). Past this, the stragglers are cancelled from here.
drain_wait_s_default: Final = 5.0
# Cancelled stragglers get this long for their cleanup before stop gives up on them (logged).
cancelled_wait_s_default: Final = 5.0


class InFlightRpcs(grpc.aio.ServerInterceptor):  # type: ignore[misc]
    """See the module docstring."""

    def __init__(self) -> None:
        self._tasks: set[asyncio.Task[Any]] = set()

    @property
    def running(self) -> int:
        """RPCs whose tasks have not ended (a task that ended leaves the set by a callback the
        loop runs soon after: done() counts it out at once). Not __len__: grpc.aio drops falsy
        interceptors."""
        return sum(1 for t in self._tasks if not t.done())

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Any],
        details: grpc.HandlerCallDetails,
    ) -> Any:
        task = asyncio.current_task()
        if task is not None and task not in self._tasks:
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
        return await continuation(details)

    async def drain(
        self,
        wait_s: float = drain_wait_s_default,
        cancelled_wait_s: float = cancelled_wait_s_default,
    ) -> int:
        """Wait until every recorded RPC task has ended: up to `wait_s`, then cancel the rest
        and wait up to `cancelled_wait_s` for their cleanup. Returns how many were still
        running after that (0 when all ended; the rest are logged)."""
        me = asyncio.current_task()
        pending = {t for t in self._tasks if t is not me and not t.done()}
        if pending:
            _, pending = await asyncio.wait(pending, timeout=wait_s)
        if pending:
            log.warning(
                "RPCs still running after the server stopped; cancelling", count=len(pending)
            )
            for task in pending:
                task.cancel()
            _, pending = await asyncio.wait(pending, timeout=cancelled_wait_s)
        if pending:
            log.error(
                "RPCs did not end after cancellation; left running",
                count=len(pending),
                tasks=[repr(t) for t in pending][:8],
            )
        return len(pending)
