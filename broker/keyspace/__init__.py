"""The keyspace: Gazette's view of etcd.

``Backend`` is the small subset of etcd's v3 API everything else uses; ``EmbeddedBackend`` serves
it in-process (``EtcdBackend``, in ``broker.keyspace.etcd``, talks to a real cluster).
``KeySpace`` is a decoded, watched mirror of one prefix. The conformance kit that every backend
must pass is ``broker.keyspace.conformance.check_keyspace``.
"""

from broker.keyspace.backend import (
    Backend,
    BackendFailedError,
    CompactedError,
    Compare,
    CompareResult,
    CompareTarget,
    Event,
    EventType,
    FutureRevisionError,
    Header,
    KeySpaceError,
    KeyValue,
    LeaseNotFoundError,
    NoSpaceError,
    Op,
    OpDelete,
    OpGet,
    OpPut,
    RangeResponse,
    TxnResponse,
    UnavailableError,
    WatchResponse,
    prefix_end,
)
from broker.keyspace.embedded import (
    BackendClosedError,
    EmbeddedBackend,
    EmbeddedStore,
    KeySpaceStorageError,
)
from broker.keyspace.keyspace import (
    ApplyIssue,
    Entry,
    InvalidRootError,
    KeySpace,
    WatchStoppedError,
    apply_events,
)
from broker.keyspace.mvcc import InvalidRequestError, LeaseExistsError, MVCCStore
from broker.keyspace.persisted import KeySpaceDirError, KeySpaceLockedError
from broker.keyspace.wal import CorruptLogError

__all__ = [
    "ApplyIssue",
    "Backend",
    "BackendClosedError",
    "BackendFailedError",
    "CompactedError",
    "Compare",
    "CompareResult",
    "CompareTarget",
    "CorruptLogError",
    "EmbeddedBackend",
    "EmbeddedStore",
    "Entry",
    "Event",
    "EventType",
    "FutureRevisionError",
    "Header",
    "InvalidRequestError",
    "InvalidRootError",
    "KeySpace",
    "KeySpaceDirError",
    "KeySpaceError",
    "KeySpaceLockedError",
    "KeySpaceStorageError",
    "KeyValue",
    "LeaseExistsError",
    "LeaseNotFoundError",
    "MVCCStore",
    "NoSpaceError",
    "Op",
    "OpDelete",
    "OpGet",
    "OpPut",
    "RangeResponse",
    "TxnResponse",
    "UnavailableError",
    "WatchResponse",
    "WatchStoppedError",
    "apply_events",
    "prefix_end",
]
