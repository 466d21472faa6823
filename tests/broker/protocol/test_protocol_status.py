"""The Status -> exception registries: complete, one-to-one, classified."""

from __future__ import annotations

import pickle

import pytest

from broker.protocol import consumer_pb2, protocol_pb2, status
from broker.protocol.status import (
    GazetteError,
    JournalNotFoundError,
    NotShardPrimaryError,
    ShardStatusError,
    StatusError,
    StatusLookupError,
    StatusRegistryError,
)

# Written out by hand from Gazette's enums, so that renaming a class or
# moving a code is a visible change here and not only in the registry.
JOURNAL_CLASSES: dict[str, str] = {
    "JOURNAL_NOT_FOUND": "JournalNotFoundError",
    "NO_JOURNAL_PRIMARY_BROKER": "NoJournalPrimaryBrokerError",
    "NOT_JOURNAL_PRIMARY_BROKER": "NotJournalPrimaryBrokerError",
    "NOT_JOURNAL_BROKER": "NotJournalBrokerError",
    "INSUFFICIENT_JOURNAL_BROKERS": "InsufficientJournalBrokersError",
    "OFFSET_NOT_YET_AVAILABLE": "OffsetNotYetAvailableError",
    "WRONG_ROUTE": "WrongRouteError",
    "PROPOSAL_MISMATCH": "ProposalMismatchError",
    "ETCD_TRANSACTION_FAILED": "EtcdTransactionFailedError",
    "NOT_ALLOWED": "NotAllowedError",
    "WRONG_APPEND_OFFSET": "WrongAppendOffsetError",
    "INDEX_HAS_GREATER_OFFSET": "IndexHasGreaterOffsetError",
    "REGISTER_MISMATCH": "RegisterMismatchError",
    "SUSPENDED": "SuspendedError",
    "FRAGMENT_STORE_UNHEALTHY": "FragmentStoreUnhealthyError",
}

SHARD_CLASSES: dict[str, str] = {
    "SHARD_NOT_FOUND": "ShardNotFoundError",
    "NO_SHARD_PRIMARY": "NoShardPrimaryError",
    "NOT_SHARD_PRIMARY": "NotShardPrimaryError",
    "ETCD_TRANSACTION_FAILED": "ShardEtcdTransactionFailedError",
    "SHARD_STOPPED": "ShardStoppedError",
}

# Retriable: a later identical request can succeed once the cluster converges
# (routing / assignment). See the module docstring of broker.protocol.status.
JOURNAL_RETRIABLE: dict[str, bool] = {
    "JOURNAL_NOT_FOUND": False,
    "NO_JOURNAL_PRIMARY_BROKER": True,
    "NOT_JOURNAL_PRIMARY_BROKER": True,
    "NOT_JOURNAL_BROKER": True,
    "INSUFFICIENT_JOURNAL_BROKERS": True,
    "OFFSET_NOT_YET_AVAILABLE": False,
    "WRONG_ROUTE": True,
    "PROPOSAL_MISMATCH": False,
    "ETCD_TRANSACTION_FAILED": False,
    "NOT_ALLOWED": False,
    "WRONG_APPEND_OFFSET": False,
    "INDEX_HAS_GREATER_OFFSET": False,
    "REGISTER_MISMATCH": False,
    "SUSPENDED": False,
    "FRAGMENT_STORE_UNHEALTHY": False,
}

SHARD_RETRIABLE: dict[str, bool] = {
    "SHARD_NOT_FOUND": False,
    "NO_SHARD_PRIMARY": True,
    "NOT_SHARD_PRIMARY": True,
    "ETCD_TRANSACTION_FAILED": False,
    "SHARD_STOPPED": True,
}


def _non_ok(items: list[tuple[str, int]]) -> dict[str, int]:
    return {name: number for name, number in items if name != "OK"}


def test_every_non_ok_journal_status_has_exactly_its_class() -> None:
    values = _non_ok(protocol_pb2.Status.items())
    assert set(values) == set(JOURNAL_CLASSES)
    for name, number in values.items():
        cls = status.for_status(number)
        assert cls.__name__ == JOURNAL_CLASSES[name]
        assert cls.STATUS == number
        assert issubclass(cls, GazetteError)
        assert not issubclass(cls, ShardStatusError)


def test_every_non_ok_shard_status_has_exactly_its_class() -> None:
    values = _non_ok(consumer_pb2.Status.items())
    assert set(values) == set(SHARD_CLASSES)
    for name, number in values.items():
        cls = status.for_shard_status(number)
        assert cls.__name__ == SHARD_CLASSES[name]
        assert cls.STATUS == number
        assert issubclass(cls, ShardStatusError)
        assert not issubclass(cls, GazetteError)


def test_classes_are_one_to_one_with_codes() -> None:
    journal = [status.for_status(n) for n in _non_ok(protocol_pb2.Status.items()).values()]
    shard = [status.for_shard_status(n) for n in _non_ok(consumer_pb2.Status.items()).values()]
    assert len(set(journal)) == len(journal)
    assert len(set(shard)) == len(shard)
    # Every exported per-status class is reachable from a code, and no other.
    exported = {getattr(status, name) for name in status.__all__}
    per_status = {c for c in exported if isinstance(c, type) and hasattr(c, "STATUS")}
    assert per_status == set(journal) | set(shard)


@pytest.mark.parametrize("lookup", [status.for_status, status.for_shard_status])
def test_ok_has_no_class(lookup: object) -> None:
    assert callable(lookup)
    with pytest.raises(StatusLookupError, match="Status 0: OK is not an error"):
        lookup(0)


def test_unknown_code_lookup_names_the_enum_and_value() -> None:
    with pytest.raises(StatusLookupError, match=r"^protocol\.Status 99: not a known value$"):
        status.for_status(99)
    with pytest.raises(StatusLookupError, match=r"^consumer\.Status 42: not a known value$"):
        status.for_shard_status(42)


def test_round_trip_code_class_code() -> None:
    for number in _non_ok(protocol_pb2.Status.items()).values():
        err = status.for_status(number)("detail")
        assert err.status == number
        assert status.for_status(err.status) is type(err)
    for number in _non_ok(consumer_pb2.Status.items()).values():
        shard_err = status.for_shard_status(number)("detail")
        assert shard_err.status == number
        assert status.for_shard_status(shard_err.status) is type(shard_err)


def test_retriable_classification_journal() -> None:
    values = _non_ok(protocol_pb2.Status.items())
    assert set(JOURNAL_RETRIABLE) == set(values)
    actual = {name: status.for_status(n).retriable for name, n in values.items()}
    assert actual == JOURNAL_RETRIABLE


def test_retriable_classification_shard() -> None:
    values = _non_ok(consumer_pb2.Status.items())
    assert set(SHARD_RETRIABLE) == set(values)
    actual = {name: status.for_shard_status(n).retriable for name, n in values.items()}
    assert actual == SHARD_RETRIABLE


def test_raise_for_status_ok_returns() -> None:
    status.raise_for_status(protocol_pb2.OK, "ignored")
    status.raise_for_shard_status(consumer_pb2.OK, "ignored")


def test_raise_for_status_raises_the_class_with_message() -> None:
    with pytest.raises(JournalNotFoundError) as info:
        status.raise_for_status(protocol_pb2.JOURNAL_NOT_FOUND, "a/journal")
    assert info.value.status == protocol_pb2.JOURNAL_NOT_FOUND
    assert info.value.message == "a/journal"
    assert info.value.status_name == "JOURNAL_NOT_FOUND"
    assert str(info.value) == "JOURNAL_NOT_FOUND: a/journal"

    with pytest.raises(NotShardPrimaryError) as shard_info:
        status.raise_for_shard_status(consumer_pb2.NOT_SHARD_PRIMARY)
    assert str(shard_info.value) == "NOT_SHARD_PRIMARY"


def test_shared_etcd_name_maps_to_distinct_classes() -> None:
    # Both enums name a value ETCD_TRANSACTION_FAILED, with different numbers.
    journal = status.for_status(protocol_pb2.ETCD_TRANSACTION_FAILED)
    shard = status.for_shard_status(consumer_pb2.ETCD_TRANSACTION_FAILED)
    assert journal is not shard
    assert (journal.STATUS, shard.STATUS) == (9, 4)


def test_unknown_code_raises_the_base_class_not_retriable() -> None:
    with pytest.raises(GazetteError) as info:
        status.raise_for_status(77, "from a newer broker")
    assert type(info.value) is GazetteError
    assert info.value.retriable is False
    assert str(info.value) == "UNKNOWN_STATUS_77: from a newer broker"

    with pytest.raises(ShardStatusError) as shard_info:
        status.raise_for_shard_status(77)
    assert type(shard_info.value) is ShardStatusError


def test_errors_survive_pickling() -> None:
    # Spark moves exceptions between processes by pickle.
    for err in (
        JournalNotFoundError("a/journal"),
        NotShardPrimaryError("shard-1"),
        GazetteError(77, "x"),
        ShardStatusError(77, "y"),
    ):
        back = pickle.loads(pickle.dumps(err))
        assert type(back) is type(err)
        assert (back.status, back.message, str(back)) == (err.status, err.message, str(err))


def test_build_registry_reports_a_value_without_class() -> None:
    values = {"OK": 0, "JOURNAL_NOT_FOUND": 1, "BRAND_NEW": 16}
    with pytest.raises(
        StatusRegistryError, match=r"protocol\.Status BRAND_NEW \(16\) has no exception class"
    ):
        status.build_registry("protocol.Status", values, [JournalNotFoundError])


def test_build_registry_reports_a_class_without_value() -> None:
    with pytest.raises(
        StatusRegistryError,
        match=r"JournalNotFoundError has STATUS 1, not a non-OK protocol\.Status value",
    ):
        status.build_registry("protocol.Status", {"OK": 0}, [JournalNotFoundError])


def test_build_registry_reports_two_classes_for_one_value() -> None:
    class Duplicate(JournalNotFoundError):
        pass

    with pytest.raises(StatusRegistryError, match=r"protocol\.Status 1 has two classes"):
        status.build_registry(
            "protocol.Status",
            {"OK": 0, "JOURNAL_NOT_FOUND": 1},
            [JournalNotFoundError, Duplicate],
        )


def test_all_are_status_errors() -> None:
    assert issubclass(GazetteError, StatusError)
    assert issubclass(ShardStatusError, StatusError)
