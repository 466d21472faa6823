"""What the read-committed iterator commits at once, to return one by one: a run of one
producer's OUTSIDE_TXN messages (`Sequencer.commit_alone_run`) or of several producers'
(`commit_alone_mixed`), a whole transaction in what was
decoded (`commit_span_run`), a replay's messages (`dequeue_replayed`); when it tries, and the
bounds on looking (sans-IO).
"""

from __future__ import annotations

from collections import deque
from typing import Any, Final

from gazette_consumer.message.message import Envelope
from gazette_consumer.sequencer.types import FLAG_OUTSIDE_TXN

SPAN_RUN_LOOK_MAX: Final = 32
"""Messages of a transaction looked at for its ACK, to commit it at once (`commit_span_run`)
before linking it into the ring: a longer one most often continues in the next piece, and the
look would be wasted; through the ring it costs a little more per transaction. The iterator
stops looking after a longer transaction, until a shorter one comes through the ring."""

REPLAY_RUN_MIN: Final = 2
"""Replayed messages held beyond which they are taken as a run (`Sequencer.dequeue_replayed`)
rather than stepped one by one."""


def run_next(pending: deque[Envelope[Any]]) -> bool:
    """True if the next two pending messages may begin a run (`Sequencer.commit_alone_run`):
    OUTSIDE_TXN messages of one producer. Checked before committing the first alone, so that
    a run later in a piece is not taken one message at a time: a cheap test, where trying the
    run costs more than `commit_alone` when the producers alternate message by message."""
    if len(pending) < 2:
        return False
    first, second = pending[0], pending[1]
    return bool(
        first.flags == FLAG_OUTSIDE_TXN
        and first.clock  # Without a UUID: commit_alone's, never a run's.
        and second.flags == FLAG_OUTSIDE_TXN
        and first.producer == second.producer
    )


def alone_next(pending: deque[Envelope[Any]]) -> bool:
    """True if the next two pending messages are OUTSIDE_TXN messages with UUIDs, of any
    producers: they may begin a run of several producers' (`Sequencer.commit_alone_mixed`),
    committed in one pass rather than a `commit_alone` (and a `try_next` frame) each."""
    if len(pending) < 2:
        return False
    first, second = pending[0], pending[1]
    return bool(
        first.flags == FLAG_OUTSIDE_TXN
        and first.clock
        and second.flags == FLAG_OUTSIDE_TXN
        and second.clock
    )
