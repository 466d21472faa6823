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
