"""How many rows each recent micro-batch of a streaming query committed in a journal (sans-IO).

Spark knows a micro-batch by its number. A re-run of micro-batch B (a new run of the query, after
a driver died just after the commit) holds the rows B held before when the source plans B the
same way: the offsets of B are in the checkpoint's offset log. It holds others when they are
not: a checkpoint restored from an older copy re-plans micro-batches that an earlier run
committed (more rows arrived since, or a rate limit changed), and a query that is not
deterministic (a filter on rand()) gives other rows each run. The sink commits each micro-batch
once (sink_commit.py), so re-planned rows under a committed number would be rolled back (lost),
or rows committed under the old numbers would be written again under new ones (duplicates),
without an error: Spark's file and Delta sinks behave so.

So beside its register (`SinkMark`: the last micro-batch resolved) a query keeps, in each
journal, a second register `gazette.spark.rows/<query id>` (`BatchRows`): the number of rows
each of its recent micro-batches committed there. A re-run whose rows in a journal differ in
number from what the first run committed there is refused (`ReplayMismatchError`): nothing of
it is committed, and the error says what to do. A count is what a replay must preserve (a
re-run holding the same number of other rows, a query with a nondeterministic column, is
Spark's own semantics for nondeterministic queries), and costs nothing to keep.

The record covers micro-batches `since` to `upto` (the last it recorded a commit of); one of
those it does not list committed no rows there. It is pruned from its oldest end to fit one
label value (1024 bytes: about 70 micro-batches), so that a re-run of an older micro-batch
cannot be checked: that is refused too (a restored checkpoint that old). Option `replayCheck`
set to `none` turns the check off, for queries whose output may differ between runs by design.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Final

from broker.protocol.validate import LABEL_VALUE_LEN_MAX
from spark_integration.sink_task import GazetteSinkError

ROWS_PREFIX: Final = "gazette.spark.rows/"
# What a record may take of a label value: it is pruned from its oldest micro-batch to fit.
rows_value_len_max: Final = LABEL_VALUE_LEN_MAX


class ReplayMismatchError(GazetteSinkError):
    """A re-run micro-batch holds another number of rows in a journal than the run that
    committed it did (or the journal no longer records that micro-batch): committing it would
    lose or repeat rows, so nothing of it is committed."""


def rows_register_name(query: str) -> str:
    return ROWS_PREFIX + query


@dataclass(frozen=True)
class BatchRows:
    since: int
    upto: int
    # (micro-batch, rows) of each micro-batch of since..upto that committed rows, ascending.
    counts: tuple[tuple[int, int], ...] = ()

    @classmethod
    def first(cls, batch: int, rows: int) -> BatchRows:
        return cls(batch, batch, ((batch, rows),) if rows else ())

    def rows_of(self, batch: int) -> int | None:
        """The rows micro-batch `batch` committed, or None if the record does not cover it."""
        if not self.since <= batch <= self.upto:
            return None
        return dict(self.counts).get(batch, 0)

    def after(self, batch: int, rows: int) -> BatchRows:
        """The record once micro-batch `batch` (after `upto`) committed `rows` rows."""
        if batch <= self.upto:
            raise ValueError(f"micro-batch {batch} is not after {self.upto}")
        counts = (*self.counts, (batch, rows)) if rows else self.counts
        out = replace(self, upto=batch, counts=counts)
        while len(out.encode()) > rows_value_len_max:
            dropped = out.counts[0][0]
            out = replace(out, since=dropped + 1, counts=out.counts[1:])
        return out

    def encode(self) -> str:
        return f"{self.since}/{self.upto}" + "".join(f"/{b}={r}" for b, r in self.counts)

    @classmethod
    def parse(cls, text: str) -> BatchRows:
        parts = text.split("/")
        try:
            since, upto = int(parts[0]), int(parts[1])
            counts = tuple(
                (int(batch), int(rows)) for batch, rows in (part.split("=") for part in parts[2:])
            )
        except (ValueError, IndexError):
            counts, since, upto = (), 0, -1
        batches = [b for b, _ in counts]
        if (
            since < 0
            or upto < since
            or batches != sorted(set(batches))
            or any(not since <= b <= upto or r <= 0 for b, r in counts)
        ):
            raise GazetteSinkError(
                f"register value {text!r}: not since/upto[/batch=rows...], as this sink writes it"
            )
        return cls(since, upto, counts)
