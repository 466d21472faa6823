import datetime

from broker.protocol import protocol_pb2 as _protocol_pb2
from broker.protocol import recorded_op_pb2 as _recorded_op_pb2
from google.protobuf import duration_pb2 as _duration_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class Status(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    OK: _ClassVar[Status]
    SHARD_NOT_FOUND: _ClassVar[Status]
    NO_SHARD_PRIMARY: _ClassVar[Status]
    NOT_SHARD_PRIMARY: _ClassVar[Status]
    ETCD_TRANSACTION_FAILED: _ClassVar[Status]
    SHARD_STOPPED: _ClassVar[Status]
OK: Status
SHARD_NOT_FOUND: Status
NO_SHARD_PRIMARY: Status
NOT_SHARD_PRIMARY: Status
ETCD_TRANSACTION_FAILED: Status
SHARD_STOPPED: Status

class ShardSpec(_message.Message):
    __slots__ = ("id", "sources", "recovery_log_prefix", "hint_prefix", "hint_backups", "max_txn_duration", "min_txn_duration", "disable", "hot_standbys", "labels", "disable_wait_for_ack", "ring_buffer_size", "read_channel_size")
    class Source(_message.Message):
        __slots__ = ("journal", "min_offset")
        JOURNAL_FIELD_NUMBER: _ClassVar[int]
        MIN_OFFSET_FIELD_NUMBER: _ClassVar[int]
        journal: str
        min_offset: int
        def __init__(self, journal: _Optional[str] = ..., min_offset: _Optional[int] = ...) -> None: ...
    ID_FIELD_NUMBER: _ClassVar[int]
    SOURCES_FIELD_NUMBER: _ClassVar[int]
    RECOVERY_LOG_PREFIX_FIELD_NUMBER: _ClassVar[int]
    HINT_PREFIX_FIELD_NUMBER: _ClassVar[int]
    HINT_BACKUPS_FIELD_NUMBER: _ClassVar[int]
    MAX_TXN_DURATION_FIELD_NUMBER: _ClassVar[int]
    MIN_TXN_DURATION_FIELD_NUMBER: _ClassVar[int]
    DISABLE_FIELD_NUMBER: _ClassVar[int]
    HOT_STANDBYS_FIELD_NUMBER: _ClassVar[int]
    LABELS_FIELD_NUMBER: _ClassVar[int]
    DISABLE_WAIT_FOR_ACK_FIELD_NUMBER: _ClassVar[int]
    RING_BUFFER_SIZE_FIELD_NUMBER: _ClassVar[int]
    READ_CHANNEL_SIZE_FIELD_NUMBER: _ClassVar[int]
    id: str
    sources: _containers.RepeatedCompositeFieldContainer[ShardSpec.Source]
    recovery_log_prefix: str
    hint_prefix: str
    hint_backups: int
    max_txn_duration: _duration_pb2.Duration
    min_txn_duration: _duration_pb2.Duration
    disable: bool
    hot_standbys: int
    labels: _protocol_pb2.LabelSet
    disable_wait_for_ack: bool
    ring_buffer_size: int
    read_channel_size: int
    def __init__(self, id: _Optional[str] = ..., sources: _Optional[_Iterable[_Union[ShardSpec.Source, _Mapping]]] = ..., recovery_log_prefix: _Optional[str] = ..., hint_prefix: _Optional[str] = ..., hint_backups: _Optional[int] = ..., max_txn_duration: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ..., min_txn_duration: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ..., disable: _Optional[bool] = ..., hot_standbys: _Optional[int] = ..., labels: _Optional[_Union[_protocol_pb2.LabelSet, _Mapping]] = ..., disable_wait_for_ack: _Optional[bool] = ..., ring_buffer_size: _Optional[int] = ..., read_channel_size: _Optional[int] = ...) -> None: ...

class ConsumerSpec(_message.Message):
    __slots__ = ("process_spec", "shard_limit", "exiting")
    PROCESS_SPEC_FIELD_NUMBER: _ClassVar[int]
    SHARD_LIMIT_FIELD_NUMBER: _ClassVar[int]
    EXITING_FIELD_NUMBER: _ClassVar[int]
    process_spec: _protocol_pb2.ProcessSpec
    shard_limit: int
    exiting: bool
    def __init__(self, process_spec: _Optional[_Union[_protocol_pb2.ProcessSpec, _Mapping]] = ..., shard_limit: _Optional[int] = ..., exiting: _Optional[bool] = ...) -> None: ...

class ReplicaStatus(_message.Message):
    __slots__ = ("code", "errors")
    class Code(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
        __slots__ = ()
        IDLE: _ClassVar[ReplicaStatus.Code]
        BACKFILL: _ClassVar[ReplicaStatus.Code]
        STANDBY: _ClassVar[ReplicaStatus.Code]
        PRIMARY: _ClassVar[ReplicaStatus.Code]
        FAILED: _ClassVar[ReplicaStatus.Code]
    IDLE: ReplicaStatus.Code
    BACKFILL: ReplicaStatus.Code
    STANDBY: ReplicaStatus.Code
    PRIMARY: ReplicaStatus.Code
    FAILED: ReplicaStatus.Code
    CODE_FIELD_NUMBER: _ClassVar[int]
    ERRORS_FIELD_NUMBER: _ClassVar[int]
    code: ReplicaStatus.Code
    errors: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, code: _Optional[_Union[ReplicaStatus.Code, str]] = ..., errors: _Optional[_Iterable[str]] = ...) -> None: ...

class Checkpoint(_message.Message):
    __slots__ = ("sources", "ack_intents")
    class Source(_message.Message):
        __slots__ = ("read_through", "producers")
        class ProducerEntry(_message.Message):
            __slots__ = ("id", "state")
            ID_FIELD_NUMBER: _ClassVar[int]
            STATE_FIELD_NUMBER: _ClassVar[int]
            id: bytes
            state: Checkpoint.ProducerState
            def __init__(self, id: _Optional[bytes] = ..., state: _Optional[_Union[Checkpoint.ProducerState, _Mapping]] = ...) -> None: ...
        READ_THROUGH_FIELD_NUMBER: _ClassVar[int]
        PRODUCERS_FIELD_NUMBER: _ClassVar[int]
        read_through: int
        producers: _containers.RepeatedCompositeFieldContainer[Checkpoint.Source.ProducerEntry]
        def __init__(self, read_through: _Optional[int] = ..., producers: _Optional[_Iterable[_Union[Checkpoint.Source.ProducerEntry, _Mapping]]] = ...) -> None: ...
    class ProducerState(_message.Message):
        __slots__ = ("last_ack", "begin")
        LAST_ACK_FIELD_NUMBER: _ClassVar[int]
        BEGIN_FIELD_NUMBER: _ClassVar[int]
        last_ack: int
        begin: int
        def __init__(self, last_ack: _Optional[int] = ..., begin: _Optional[int] = ...) -> None: ...
    class SourcesEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: Checkpoint.Source
        def __init__(self, key: _Optional[str] = ..., value: _Optional[_Union[Checkpoint.Source, _Mapping]] = ...) -> None: ...
    class AckIntentsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: bytes
        def __init__(self, key: _Optional[str] = ..., value: _Optional[bytes] = ...) -> None: ...
    SOURCES_FIELD_NUMBER: _ClassVar[int]
    ACK_INTENTS_FIELD_NUMBER: _ClassVar[int]
    sources: _containers.MessageMap[str, Checkpoint.Source]
    ack_intents: _containers.ScalarMap[str, bytes]
    def __init__(self, sources: _Optional[_Mapping[str, Checkpoint.Source]] = ..., ack_intents: _Optional[_Mapping[str, bytes]] = ...) -> None: ...

class ListRequest(_message.Message):
    __slots__ = ("selector", "extension")
    SELECTOR_FIELD_NUMBER: _ClassVar[int]
    EXTENSION_FIELD_NUMBER: _ClassVar[int]
    selector: _protocol_pb2.LabelSelector
    extension: bytes
    def __init__(self, selector: _Optional[_Union[_protocol_pb2.LabelSelector, _Mapping]] = ..., extension: _Optional[bytes] = ...) -> None: ...

class ListResponse(_message.Message):
    __slots__ = ("status", "header", "shards", "extension")
    class Shard(_message.Message):
        __slots__ = ("spec", "mod_revision", "route", "status", "create_revision")
        SPEC_FIELD_NUMBER: _ClassVar[int]
        MOD_REVISION_FIELD_NUMBER: _ClassVar[int]
        ROUTE_FIELD_NUMBER: _ClassVar[int]
        STATUS_FIELD_NUMBER: _ClassVar[int]
        CREATE_REVISION_FIELD_NUMBER: _ClassVar[int]
        spec: ShardSpec
        mod_revision: int
        route: _protocol_pb2.Route
        status: _containers.RepeatedCompositeFieldContainer[ReplicaStatus]
        create_revision: int
        def __init__(self, spec: _Optional[_Union[ShardSpec, _Mapping]] = ..., mod_revision: _Optional[int] = ..., route: _Optional[_Union[_protocol_pb2.Route, _Mapping]] = ..., status: _Optional[_Iterable[_Union[ReplicaStatus, _Mapping]]] = ..., create_revision: _Optional[int] = ...) -> None: ...
    STATUS_FIELD_NUMBER: _ClassVar[int]
    HEADER_FIELD_NUMBER: _ClassVar[int]
    SHARDS_FIELD_NUMBER: _ClassVar[int]
    EXTENSION_FIELD_NUMBER: _ClassVar[int]
    status: Status
    header: _protocol_pb2.Header
    shards: _containers.RepeatedCompositeFieldContainer[ListResponse.Shard]
    extension: bytes
    def __init__(self, status: _Optional[_Union[Status, str]] = ..., header: _Optional[_Union[_protocol_pb2.Header, _Mapping]] = ..., shards: _Optional[_Iterable[_Union[ListResponse.Shard, _Mapping]]] = ..., extension: _Optional[bytes] = ...) -> None: ...

class ApplyRequest(_message.Message):
    __slots__ = ("changes", "extension")
    class Change(_message.Message):
        __slots__ = ("expect_mod_revision", "upsert", "delete", "primary_hints")
        EXPECT_MOD_REVISION_FIELD_NUMBER: _ClassVar[int]
        UPSERT_FIELD_NUMBER: _ClassVar[int]
        DELETE_FIELD_NUMBER: _ClassVar[int]
        PRIMARY_HINTS_FIELD_NUMBER: _ClassVar[int]
        expect_mod_revision: int
        upsert: ShardSpec
        delete: str
        primary_hints: _recorded_op_pb2.FSMHints
        def __init__(self, expect_mod_revision: _Optional[int] = ..., upsert: _Optional[_Union[ShardSpec, _Mapping]] = ..., delete: _Optional[str] = ..., primary_hints: _Optional[_Union[_recorded_op_pb2.FSMHints, _Mapping]] = ...) -> None: ...
    CHANGES_FIELD_NUMBER: _ClassVar[int]
    EXTENSION_FIELD_NUMBER: _ClassVar[int]
    changes: _containers.RepeatedCompositeFieldContainer[ApplyRequest.Change]
    extension: bytes
    def __init__(self, changes: _Optional[_Iterable[_Union[ApplyRequest.Change, _Mapping]]] = ..., extension: _Optional[bytes] = ...) -> None: ...

class ApplyResponse(_message.Message):
    __slots__ = ("status", "header", "extension")
    STATUS_FIELD_NUMBER: _ClassVar[int]
    HEADER_FIELD_NUMBER: _ClassVar[int]
    EXTENSION_FIELD_NUMBER: _ClassVar[int]
    status: Status
    header: _protocol_pb2.Header
    extension: bytes
    def __init__(self, status: _Optional[_Union[Status, str]] = ..., header: _Optional[_Union[_protocol_pb2.Header, _Mapping]] = ..., extension: _Optional[bytes] = ...) -> None: ...

class StatRequest(_message.Message):
    __slots__ = ("header", "shard", "read_through", "extension")
    class ReadThroughEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: int
        def __init__(self, key: _Optional[str] = ..., value: _Optional[int] = ...) -> None: ...
    HEADER_FIELD_NUMBER: _ClassVar[int]
    SHARD_FIELD_NUMBER: _ClassVar[int]
    READ_THROUGH_FIELD_NUMBER: _ClassVar[int]
    EXTENSION_FIELD_NUMBER: _ClassVar[int]
    header: _protocol_pb2.Header
    shard: str
    read_through: _containers.ScalarMap[str, int]
    extension: bytes
    def __init__(self, header: _Optional[_Union[_protocol_pb2.Header, _Mapping]] = ..., shard: _Optional[str] = ..., read_through: _Optional[_Mapping[str, int]] = ..., extension: _Optional[bytes] = ...) -> None: ...

class StatResponse(_message.Message):
    __slots__ = ("status", "header", "read_through", "publish_at", "extension")
    class ReadThroughEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: int
        def __init__(self, key: _Optional[str] = ..., value: _Optional[int] = ...) -> None: ...
    class PublishAtEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: int
        def __init__(self, key: _Optional[str] = ..., value: _Optional[int] = ...) -> None: ...
    STATUS_FIELD_NUMBER: _ClassVar[int]
    HEADER_FIELD_NUMBER: _ClassVar[int]
    READ_THROUGH_FIELD_NUMBER: _ClassVar[int]
    PUBLISH_AT_FIELD_NUMBER: _ClassVar[int]
    EXTENSION_FIELD_NUMBER: _ClassVar[int]
    status: Status
    header: _protocol_pb2.Header
    read_through: _containers.ScalarMap[str, int]
    publish_at: _containers.ScalarMap[str, int]
    extension: bytes
    def __init__(self, status: _Optional[_Union[Status, str]] = ..., header: _Optional[_Union[_protocol_pb2.Header, _Mapping]] = ..., read_through: _Optional[_Mapping[str, int]] = ..., publish_at: _Optional[_Mapping[str, int]] = ..., extension: _Optional[bytes] = ...) -> None: ...

class GetHintsRequest(_message.Message):
    __slots__ = ("shard", "extension")
    SHARD_FIELD_NUMBER: _ClassVar[int]
    EXTENSION_FIELD_NUMBER: _ClassVar[int]
    shard: str
    extension: bytes
    def __init__(self, shard: _Optional[str] = ..., extension: _Optional[bytes] = ...) -> None: ...

class GetHintsResponse(_message.Message):
    __slots__ = ("status", "header", "primary_hints", "backup_hints", "extension")
    class ResponseHints(_message.Message):
        __slots__ = ("hints",)
        HINTS_FIELD_NUMBER: _ClassVar[int]
        hints: _recorded_op_pb2.FSMHints
        def __init__(self, hints: _Optional[_Union[_recorded_op_pb2.FSMHints, _Mapping]] = ...) -> None: ...
    STATUS_FIELD_NUMBER: _ClassVar[int]
    HEADER_FIELD_NUMBER: _ClassVar[int]
    PRIMARY_HINTS_FIELD_NUMBER: _ClassVar[int]
    BACKUP_HINTS_FIELD_NUMBER: _ClassVar[int]
    EXTENSION_FIELD_NUMBER: _ClassVar[int]
    status: Status
    header: _protocol_pb2.Header
    primary_hints: GetHintsResponse.ResponseHints
    backup_hints: _containers.RepeatedCompositeFieldContainer[GetHintsResponse.ResponseHints]
    extension: bytes
    def __init__(self, status: _Optional[_Union[Status, str]] = ..., header: _Optional[_Union[_protocol_pb2.Header, _Mapping]] = ..., primary_hints: _Optional[_Union[GetHintsResponse.ResponseHints, _Mapping]] = ..., backup_hints: _Optional[_Iterable[_Union[GetHintsResponse.ResponseHints, _Mapping]]] = ..., extension: _Optional[bytes] = ...) -> None: ...

class UnassignRequest(_message.Message):
    __slots__ = ("shards", "only_failed", "dry_run")
    SHARDS_FIELD_NUMBER: _ClassVar[int]
    ONLY_FAILED_FIELD_NUMBER: _ClassVar[int]
    DRY_RUN_FIELD_NUMBER: _ClassVar[int]
    shards: _containers.RepeatedScalarFieldContainer[str]
    only_failed: bool
    dry_run: bool
    def __init__(self, shards: _Optional[_Iterable[str]] = ..., only_failed: _Optional[bool] = ..., dry_run: _Optional[bool] = ...) -> None: ...

class UnassignResponse(_message.Message):
    __slots__ = ("status", "shards")
    STATUS_FIELD_NUMBER: _ClassVar[int]
    SHARDS_FIELD_NUMBER: _ClassVar[int]
    status: Status
    shards: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, status: _Optional[_Union[Status, str]] = ..., shards: _Optional[_Iterable[str]] = ...) -> None: ...
