"""Resolutions (resolving.py): the message after a point that resolves each producer's pending
transaction is its first ACK (any clock: a commit or a rollback) or its first other message
above its last ACK; earlier duplicates (at or below the last ACK) and CONTINUE_TXN messages do
not; each point watches its own producers from where it was watched."""

from __future__ import annotations

from spark_integration.json_lines import bulk_batch
from spark_integration.resolving import Resolutions
from tests.gazette_consumer.sequencer.read_iter_testkit import (
    ACK,
    CONTINUE,
    OUTSIDE,
    P1,
    P2,
    P3,
    frames,
    msg,
)

P1_ID, P2_ID, P3_ID = (int.from_bytes(bytes(p), "big") for p in (P1, P2, P3))


def test_the_first_resolving_message_of_each_watched_producer() -> None:
    messages = [
        msg(P1, 5, OUTSIDE, "dup"),  # 0: at P1's last ACK (5): already acknowledged.
        msg(P1, 12, CONTINUE, "c"),  # 1: extends the span.
        msg(P2, 30, OUTSIDE, "p2"),  # 2: above P2's last ACK (20): commits, resolves P2.
        msg(P1, 3, ACK),  # 3: an older ACK: rolls P1 back, resolves it.
        msg(P3, 40, ACK),  # 4: P3 is not watched at the first point.
        msg(P1, 13, ACK),  # 5: P1 again: already resolved for the first point.
        msg(P3, 41, ACK),  # 6: resolves P3 for the second point.
    ]
    batch = bulk_batch("j", 0, frames(*messages))
    assert batch is not None
    spans = list(zip(batch.begins.tolist(), batch.ends.tolist(), strict=True))
    resolutions = Resolutions()
    resolutions.watch(0, {P1_ID: 5, P2_ID: 20})
    resolutions.note(batch, 0, 5)
    resolutions.watch(int(batch.begins[5]), {P1_ID: 3, P3_ID: 40})
    resolutions.watch(int(batch.begins[6]), {})
    resolutions.note(batch, 5, len(batch))
    assert resolutions.at == {
        0: [spans[2], spans[3]],
        int(batch.begins[5]): [spans[5], spans[6]],
        int(batch.begins[6]): [],
    }
