"""The leader's commit rule (the seed's QuorumAckTracker), as pure functions.

`acks` holds, for every member of the ensemble, the highest index it durably holds as far as
the leader knows: the leader's own synced index, each aligned follower's acknowledged index, and
0 for a member not yet aligned in this term. The candidate is the highest index held by a
quorum; it commits if it is beyond the current commit index and its entry is of the leader's
term (the term rule lives in Rules.committable). Committing an index commits every entry before
it: logs agree on their prefixes.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from broker.quorum.rules import Rules


def quorum_index(acks: Sequence[int], quorum: int) -> int:
    """The highest index at least `quorum` of `acks` reach (0 if fewer than `quorum` acks)."""
    if quorum <= 0 or quorum > len(acks):
        return 0
    return sorted(acks, reverse=True)[quorum - 1]


def advance_commit(
    acks: Sequence[int],
    ensemble_size: int,
    commit_index: int,
    current_term: int,
    term_at: Callable[[int], int | None],
    rules: Rules,
) -> int:
    """The new commit index (`commit_index` if it cannot move)."""
    candidate = quorum_index(acks, rules.quorum(ensemble_size))
    if candidate <= commit_index:
        return commit_index
    term = term_at(candidate)
    if term is None or not rules.committable(term, current_term):
        return commit_index
    return candidate
