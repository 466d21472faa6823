"""Mapping functions over static partitions: Gazette-compatible modulo hashing, rendezvous
distribution and stability (hypothesis), random choice, and refused partitions."""

from __future__ import annotations

import random
from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from broker.protocol import protocol_pb2 as pb
from gazette_consumer.message import CONTENT_TYPE_JSON_LINES
from gazette_consumer.message.mapping import (
    EmptyPartitionsError,
    InvalidPartitionsError,
    Partition,
    Partitions,
    fnv1a32,
    modulo_mapping,
    random_mapping,
    rendezvous_choice,
    rendezvous_mapping,
)

CT = CONTENT_TYPE_JSON_LINES


def parts(n: int, prefix: str = "test/part-") -> Partitions:
    return Partitions.of_journals([f"{prefix}{i:03d}" for i in range(n)], CT)


def identity(key: str) -> str:
    return key


def test_fnv1a32_matches_the_reference_vectors() -> None:
    # From the FNV reference test suite (and Go's hash/fnv).
    assert fnv1a32(b"") == 0x811C9DC5
    assert fnv1a32(b"a") == 0xE40C292C
    assert fnv1a32(b"foobar") == 0xBF9CF968


def test_modulo_picks_the_fnv_hash_modulo_over_journals_sorted_by_name() -> None:
    # Given out of order: partitions are sorted by name, as brokers list them.
    partitions = Partitions([("test/c", CT), ("test/a", CT), ("test/b", "text/csv")])
    assert partitions.journals == ["test/a", "test/b", "test/c"]
    mapping = modulo_mapping(identity, partitions)
    for key in ("alpha", "beta", "gamma", "delta", ""):
        assert mapping(key) == partitions[fnv1a32(key.encode()) % 3]
    assert mapping("x").content_type == partitions[fnv1a32(b"x") % 3].content_type
    # Bytes keys hash as themselves; other keys are refused.
    assert modulo_mapping(lambda k: k, partitions)(b"alpha") == mapping("alpha")
    with pytest.raises(TypeError, match="mapping key"):
        modulo_mapping(lambda k: 5, partitions)("x")  # type: ignore[arg-type,return-value]


def test_rendezvous_spreads_keys_evenly() -> None:
    partitions = parts(8)
    mapping = rendezvous_mapping(identity, partitions)
    counts = Counter(mapping(f"user-{i}").journal for i in range(8000))
    assert set(counts) == set(partitions.journals)
    assert all(700 <= c <= 1300 for c in counts.values()), counts


def test_random_mapping_uses_every_partition() -> None:
    partitions = parts(4)
    mapping = random_mapping(partitions, rng=random.Random(7))
    counts = Counter(mapping(object()).journal for _ in range(4000))
    assert set(counts) == set(partitions.journals)
    assert all(800 <= c <= 1200 for c in counts.values()), counts


def test_random_mapping_follows_a_partitions_function() -> None:
    current = [parts(3)]
    mapping = random_mapping(lambda: current[0], rng=random.Random(11))
    counts = Counter(mapping(object()).journal for _ in range(3000))
    assert set(counts) == set(current[0].journals)
    assert all(800 <= c <= 1200 for c in counts.values()), counts
    current[0] = parts(1, "test/other-")
    assert {mapping(object()).journal for _ in range(20)} == {"test/other-000"}
    current[0] = Partitions()
    with pytest.raises(EmptyPartitionsError, match="no partitions"):
        mapping(object())


def test_random_mapping_of_one_partition_is_that_partition() -> None:
    only = parts(1)
    assert {random_mapping(only)(object()) for _ in range(10)} == {only[0]}


# Journal names from small integers: cheap to generate, and collisions between the two lists
# of a test (partitions both before and after) are common.
journal_names = st.lists(st.integers(0, 60), min_size=1, max_size=12, unique=True).map(
    lambda ids: [f"test/part-{i}" for i in ids]
)


@settings(max_examples=100)
@given(journal_names, journal_names, st.lists(st.binary(max_size=12), min_size=1, max_size=30))
def test_rendezvous_moves_only_keys_that_added_partitions_win(
    before: list[str], added: list[str], keys: list[bytes]
) -> None:
    old = Partitions.of_journals(before, CT)
    new = Partitions.of_journals(set(before) | set(added), CT)
    for key in keys:
        was, now = rendezvous_choice(key, old), rendezvous_choice(key, new)
        # A key stays where it was, or moves to a partition that was added. (Read backwards:
        # removing partitions moves only the keys they held.)
        assert now == was or now.journal not in before


@settings(max_examples=50)
@given(journal_names, st.lists(st.text(max_size=8), min_size=1, max_size=30))
def test_rendezvous_cache_never_changes_a_choice(names: list[str], keys: list[str]) -> None:
    partitions = Partitions.of_journals(names, CT)
    cached = rendezvous_mapping(identity, partitions, cache_entries_max=3)
    uncached = rendezvous_mapping(identity, partitions, cache_entries_max=0)
    for key in keys + keys:
        assert cached(key) == uncached(key) == rendezvous_choice(key.encode(), partitions)


def test_mappings_follow_a_partitions_function() -> None:
    current = [parts(1)]
    mapping = rendezvous_mapping(identity, lambda: current[0])
    assert mapping("k").journal == "test/part-000"
    current[0] = Partitions.of_journals(["test/elsewhere"], CT)
    assert mapping("k").journal == "test/elsewhere"  # A new snapshot drops cached choices.


def test_no_partitions_is_a_typed_error() -> None:
    empty = Partitions()
    for mapping in (
        random_mapping(empty),
        modulo_mapping(identity, empty),
        rendezvous_mapping(identity, empty),
    ):
        with pytest.raises(EmptyPartitionsError, match="no partitions"):
            mapping("key")
    with pytest.raises(EmptyPartitionsError):
        rendezvous_choice(b"key", empty)


def test_invalid_partitions_are_refused() -> None:
    with pytest.raises(InvalidPartitionsError, match="listed twice"):
        Partitions([("test/a", CT), ("test/a", "text/csv")])
    with pytest.raises(InvalidPartitionsError, match="not a journal"):
        Partitions([("not a journal", CT)])
    with pytest.raises(ValueError, match="cache_entries_max"):
        rendezvous_mapping(identity, parts(1), cache_entries_max=-1)


def test_partitions_of_a_listing_take_the_content_type_label() -> None:
    response = pb.ListResponse(
        journals=[
            pb.ListResponse.Journal(
                spec=pb.JournalSpec(
                    name="test/b",
                    labels=pb.LabelSet(
                        labels=[
                            pb.Label(name="app", value="orders"),
                            pb.Label(name="content-type", value=CT),
                        ]
                    ),
                )
            ),
            pb.ListResponse.Journal(spec=pb.JournalSpec(name="test/a")),
        ]
    )
    partitions = Partitions.from_list_response(response)
    assert list(partitions) == [Partition("test/a", ""), Partition("test/b", CT)]
    assert partitions == Partitions([("test/b", CT), ("test/a", "")])
    assert len(partitions) == 2 and partitions() is partitions
