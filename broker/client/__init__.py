"""The Python client of a Gazette broker cluster (ours or Gazette's own).

- `JournalClient`: dispatches requests to the right broker (route cache + channel pool).
- `Reader` / `RetryReader`: read a journal from an offset, optionally blocking at the head.
- `Appender` / `append`: transactional appends.
- `AppendService`: asynchronous appends, batched and ordered per journal, with retries.
- `list_journals`, `watch_journals`, `get_journal`, `apply_journals`, `list_all_fragments`.

    client = JournalClient("http://localhost:8080")
    await append(client, pb.AppendRequest(journal="a/journal"), b"hello\\n")
    async for chunk in RetryReader(client, pb.ReadRequest(journal="a/journal", block=True)):
        ...
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from broker.lazy_exports import lazy_getattr

if TYPE_CHECKING:
    from broker.client.append_errors import (
        AppendCancelledError,
        AppendRetriesExhaustedError,
        AppendServiceClosedError,
        AppendsFailedError,
        DependencyCancelledError,
        DependencyFailedError,
    )
    from broker.client.append_service import AppendService
    from broker.client.appender import Appender, AppenderStateError, append
    from broker.client.async_append import AsyncAppend, AsyncAppendStateError
    from broker.client.list_apply import (
        apply_journals,
        delete,
        get_journal,
        list_all_fragments,
        list_journals,
        upsert,
        watch_journals,
    )
    from broker.client.reader import (
        Chunk,
        DataLossError,
        FragmentContentError,
        FragmentIntegrityError,
        Reader,
        ReadProtocolError,
    )
    from broker.client.retry_reader import RetryReader
    from broker.client.route_cache import ChannelPool, JournalClient, RouteCache

# Where each public name is defined, imported on first use (PEP 562): importing one module of
# the client (a Spark worker imports the reader and the route cache) does not import them all
# (the append service, its retries and errors).
_EXPORTS = {
    "AppendCancelledError": "broker.client.append_errors",
    "AppendRetriesExhaustedError": "broker.client.append_errors",
    "AppendServiceClosedError": "broker.client.append_errors",
    "AppendsFailedError": "broker.client.append_errors",
    "DependencyCancelledError": "broker.client.append_errors",
    "DependencyFailedError": "broker.client.append_errors",
    "AppendService": "broker.client.append_service",
    "Appender": "broker.client.appender",
    "AppenderStateError": "broker.client.appender",
    "append": "broker.client.appender",
    "AsyncAppend": "broker.client.async_append",
    "AsyncAppendStateError": "broker.client.async_append",
    "apply_journals": "broker.client.list_apply",
    "delete": "broker.client.list_apply",
    "get_journal": "broker.client.list_apply",
    "list_all_fragments": "broker.client.list_apply",
    "list_journals": "broker.client.list_apply",
    "upsert": "broker.client.list_apply",
    "watch_journals": "broker.client.list_apply",
    "Chunk": "broker.client.reader",
    "DataLossError": "broker.client.reader",
    "FragmentContentError": "broker.client.reader",
    "FragmentIntegrityError": "broker.client.reader",
    "Reader": "broker.client.reader",
    "ReadProtocolError": "broker.client.reader",
    "RetryReader": "broker.client.retry_reader",
    "ChannelPool": "broker.client.route_cache",
    "JournalClient": "broker.client.route_cache",
    "RouteCache": "broker.client.route_cache",
}


__getattr__ = lazy_getattr(__name__, _EXPORTS)


__all__ = [
    "AppendCancelledError",
    "AppendRetriesExhaustedError",
    "AppendService",
    "AppendServiceClosedError",
    "Appender",
    "AppenderStateError",
    "AppendsFailedError",
    "AsyncAppend",
    "AsyncAppendStateError",
    "ChannelPool",
    "Chunk",
    "DataLossError",
    "DependencyCancelledError",
    "DependencyFailedError",
    "FragmentContentError",
    "FragmentIntegrityError",
    "JournalClient",
    "ReadProtocolError",
    "Reader",
    "RetryReader",
    "RouteCache",
    "append",
    "apply_journals",
    "delete",
    "get_journal",
    "list_all_fragments",
    "list_journals",
    "upsert",
    "watch_journals",
]
