"""Raft's figure 8, scripted: why a leader must not commit an earlier term's entry by counting.

m0 leads term 1 and writes E on itself only; m2 leads term 2 and writes its barrier and F on
itself only; m0 leads term 3 and replicates E to m1, one entry per message. Counting m0 and m1,
E is on a majority. With the correct rule m0 does not commit it (E is of term 1); with the
mutation it does, and m2, which holds a later term's entries, is then elected in term 4 by m1
and truncates E: an offset committed twice. The simulation finds the same (test_quorum_sim).
"""

from __future__ import annotations

from dataclasses import replace

from broker.quorum.entry import EntryId
from broker.quorum.member import Member
from broker.quorum.messages import BecomeLeader, Replicate
from broker.quorum.rules import CORRECT_RULES, Rules
from tests.broker.quorum.quorum_testkit import CONFIG, ENSEMBLE, Router, response_of
from tests.sim.quorum_mutations import CommitPreviousTerm

ONE_ENTRY = replace(CONFIG, replicate_entries_max=1, inflight_messages_max=1)


def _lead(members: dict[str, Member], leader: str, voters: tuple[str, ...], term: int) -> None:
    responses = [response_of(members[v], term) for v in voters if v != leader]
    response_of(members[leader], term)
    members[leader].handle(BecomeLeader(term, "c0", ENSEMBLE, tuple(responses)), 0)


def figure8(rules: Rules) -> tuple[bytes, bytes]:
    """Run the script; return what m0 and m2 expose as committed at E's offsets."""
    from broker.quorum.log import ReplicaLog

    members = {n: Member(n, ReplicaLog(), ONE_ENTRY, rules) for n in ENSEMBLE}
    router = Router(members)
    only = set(ENSEMBLE)
    router.cut = lambda src, dst, msg: src not in only or dst not in only
    # Term 1: m0 leads; its barrier commits everywhere, then E reaches nobody.
    _lead(members, "m0", ENSEMBLE, 1)
    router.run()
    members["m0"].sync(0)
    router.tick(CONFIG.heartbeat_interval_ticks)
    only = {"m0"}
    members["m0"].append(b"EEEE", "e", 0)
    members["m0"].sync(0)
    router.run()
    # Term 2: m2 leads with m1's vote; its barrier and F reach nobody.
    only = {"m2"}
    _lead(members, "m2", ("m1", "m2"), 2)
    members["m2"].append(b"FFFF", "f", 0)
    members["m2"].sync(0)
    router.run()
    # Term 3: m0 leads with m1's vote (m0's head 1.2 beats m1's 1.1); E, alone in a message,
    # reaches m1 and is acknowledged; the barrier after it does not.
    only = {"m0", "m1"}
    seen: list[object] = []

    def cut(src: str, dst: str, msg: object) -> bool:
        if not (src in only and dst in only):
            return True
        if isinstance(msg, Replicate) and msg.entries and msg.entries[0].term == 3:
            seen.append(msg)
            return True  # the barrier of term 3 is lost
        return False

    router.cut = cut
    _lead(members, "m0", ("m0", "m1"), 3)
    router.run()
    assert members["m1"].log.head == EntryId(1, 2)
    m0_sees = members["m0"].log.read(0, members["m0"].read_limit)
    # Term 4: m2 leads with m1's vote (m2's head 2.3 beats m1's 1.2), commits its entries.
    only = {"m1", "m2"}
    router.cut = lambda src, dst, msg: not (src in only and dst in only)
    _lead(members, "m2", ("m1", "m2"), 4)
    router.run()
    members["m2"].sync(0)
    router.run()
    m2_sees = members["m2"].log.read(0, members["m2"].read_limit)
    return m0_sees, m2_sees


def test_the_current_term_rule_keeps_figure_8_safe() -> None:
    m0_sees, m2_sees = figure8(CORRECT_RULES)
    assert m0_sees == b""  # E was never committed
    assert m2_sees == b"FFFF"


def test_committing_an_earlier_terms_entry_by_counting_loses_it() -> None:
    m0_sees, m2_sees = figure8(CommitPreviousTerm())
    assert m0_sees == b"EEEE"  # committed, and visible to readers of m0
    assert m2_sees == b"FFFF"  # ... and later committed as other bytes at the same offsets
