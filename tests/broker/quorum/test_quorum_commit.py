"""The leader's commit rule: a quorum holds the entry, and the entry is of the current term."""

from __future__ import annotations

import pytest

from broker.quorum.quorum_ack import advance_commit, quorum_index
from broker.quorum.rules import CORRECT_RULES


@pytest.mark.parametrize(
    ("acks", "quorum", "expected"),
    [
        ([5, 3, 0], 2, 3),
        ([5, 5, 0], 2, 5),
        ([5, 0, 0], 2, 0),
        ([9, 7, 4, 2, 0], 3, 4),
        ([9, 7, 4, 2, 0], 4, 2),
        ([1], 1, 1),
        ([3, 3], 3, 0),  # fewer acknowledgements than the quorum
    ],
)
def test_quorum_index(acks: list[int], quorum: int, expected: int) -> None:
    assert quorum_index(acks, quorum) == expected


def _terms(*terms: int) -> dict[int, int]:
    return {index: term for index, term in enumerate(terms, start=1)}


def test_a_majority_of_three_commits_and_one_does_not() -> None:
    terms = _terms(1, 1, 1)
    assert advance_commit([3, 0, 0], 3, 0, 1, terms.get, CORRECT_RULES) == 0
    assert advance_commit([3, 2, 0], 3, 0, 1, terms.get, CORRECT_RULES) == 2
    assert advance_commit([3, 3, 1], 3, 0, 1, terms.get, CORRECT_RULES) == 3


def test_five_members_need_three() -> None:
    terms = _terms(1, 1, 1, 1)
    assert advance_commit([4, 4, 0, 0, 0], 5, 0, 1, terms.get, CORRECT_RULES) == 0
    assert advance_commit([4, 4, 3, 0, 0], 5, 0, 1, terms.get, CORRECT_RULES) == 3


def test_an_earlier_terms_entry_does_not_commit_by_counting() -> None:
    # Entries 1-2 of term 2, then the barrier (3) of term 4: a majority holding entry 2 does
    # not commit it; a majority holding the barrier commits all three.
    terms = _terms(2, 2, 4)
    assert advance_commit([3, 2, 2], 3, 0, 4, terms.get, CORRECT_RULES) == 0
    assert advance_commit([3, 3, 2], 3, 0, 4, terms.get, CORRECT_RULES) == 3


def test_commit_never_goes_back() -> None:
    terms = _terms(1, 1, 1)
    assert advance_commit([3, 1, 1], 3, 2, 1, terms.get, CORRECT_RULES) == 2
