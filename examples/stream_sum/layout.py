"""The journals and shards of a stream-sum deployment (specs only; sans-IO).

A `Layout` names, for each summer shard, its chunk journal (one source per shard), the journal's
replication and fragment store, and the shard's store (postgres or rocksdb) with its hot
standbys; plus the sums journal. `journal_specs()` and `shard_specs()` build what to apply:
chunk and sums journals of JSON lines, and for each rocksdb shard its recovery log journal
(``<recovery prefix>/<shard id>``, content-type recovery log, at the chunk journal's
replication and store).

Each journal has a replication mode (label ``gazette.dev/replication-mode``): all-replicas
(no label: Gazette's) or quorum (docs/design/quorum.md). `with_replication_mode` makes the R=3
journals quorum journals (``quorum``), some of them (``mixed``: the PostgreSQL shard's chunk
journal and the standby shard's recovery log, while the sums and that shard's own chunk journal
stay all-replicas), or none (``all``, the default).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Final

from google.protobuf.duration_pb2 import Duration

from broker.protocol import consumer_pb2 as cpb
from broker.protocol import labels
from broker.protocol import protocol_pb2 as pb
from examples.stream_sum.summer import STORE_LABEL, STORE_POSTGRES, STORE_ROCKSDB, SUMS_LABEL

__all__ = ["REPLICATION_MODES", "Layout", "ShardPlan", "default_layout"]

RECOVERY_PREFIX: Final = "stream-sum/recovery"
HINT_PREFIX: Final = "/stream-sum/hints"
# The soak's --replication-mode values (see the module docstring).
REPLICATION_MODES: Final = ("all", "quorum", "mixed")


@dataclass(frozen=True)
class ShardPlan:
    """One summer shard and the chunk journal it reads."""

    shard: str
    journal: str
    replication: int
    store_url: str  # The journal's fragment store (and its recovery log's).
    store: str  # STORE_POSTGRES or STORE_ROCKSDB.
    hot_standbys: int = 0
    quorum: bool = False  # The chunk journal's replication mode.
    quorum_recovery_log: bool = False  # The recovery log's.

    @property
    def recovery_log(self) -> str:
        return f"{RECOVERY_PREFIX}/{self.shard}" if self.store == STORE_ROCKSDB else ""


@dataclass(frozen=True)
class Layout:
    shards: Sequence[ShardPlan]
    sums_journal: str = "stream-sum/sums"
    sums_replication: int = 3
    sums_store_url: str = "file:///fragments/"
    sums_quorum: bool = False
    # Fragments roll (and are persisted) at this many bytes: small, so that persisted
    # fragments, and reads of them from the stores, are part of every run. Flushing by time
    # (flush_interval_s: 0, or at least 60 s) is off by default.
    fragment_bytes: int = 1 << 16
    flush_interval_s: int = 0
    max_txn_s: float = 0.5
    journal_labels: Sequence[tuple[str, str]] = field(default_factory=tuple)

    @property
    def chunk_journals(self) -> list[str]:
        return [p.journal for p in self.shards]

    def journal_specs(self) -> list[pb.JournalSpec]:
        json_lines = [(labels.CONTENT_TYPE, labels.CONTENT_TYPE_JSON_LINES)]
        out = [
            self._journal(p.journal, p.replication, p.store_url, json_lines, p.quorum)
            for p in self.shards
        ]
        out.append(
            self._journal(
                self.sums_journal,
                self.sums_replication,
                self.sums_store_url,
                json_lines,
                self.sums_quorum,
            )
        )
        for p in self.shards:
            if p.recovery_log:
                log_labels = [(labels.CONTENT_TYPE, labels.CONTENT_TYPE_RECOVERY_LOG)]
                out.append(
                    self._journal(
                        p.recovery_log,
                        p.replication,
                        p.store_url,
                        log_labels,
                        p.quorum_recovery_log,
                    )
                )
        return out

    def quorum_journals(self) -> list[str]:
        """The journals in quorum mode."""
        return [s.name for s in self.journal_specs() if labels.is_quorum_journal(s.labels)]

    def with_replication_mode(self, mode: str) -> Layout:
        """This layout with its R=3 journals in `mode` (REPLICATION_MODES; see the module
        docstring). Quorum mode needs R >= 3 to outlive a member, so R=2 journals stay
        all-replicas."""
        if mode not in REPLICATION_MODES:
            raise ValueError(f"unknown replication mode {mode!r}; known: {REPLICATION_MODES}")
        every = mode == "quorum"
        # In `mixed`: the first R=3 shard's chunk journal, and the recovery log of the first
        # R=3 shard that records one (another shard's, if there are two).
        r3 = [p for p in self.shards if p.replication >= 3]
        chunk_first = r3[0].shard if r3 and mode == "mixed" else None
        logged = [p for p in r3 if p.recovery_log and p.shard != chunk_first]
        log_first = logged[0].shard if logged and mode == "mixed" else None
        return replace(
            self,
            shards=[
                replace(
                    p,
                    quorum=p.replication >= 3 and (every or p.shard == chunk_first),
                    quorum_recovery_log=p.replication >= 3
                    and bool(p.recovery_log)
                    and (every or p.shard == log_first),
                )
                for p in self.shards
            ],
            sums_quorum=every and self.sums_replication >= 3,
        )

    def shard_specs(self) -> list[cpb.ShardSpec]:
        out = []
        for p in self.shards:
            spec = cpb.ShardSpec(
                id=p.shard,
                sources=[cpb.ShardSpec.Source(journal=p.journal)],
                max_txn_duration=_duration(self.max_txn_s),
                hot_standbys=p.hot_standbys,
                labels=labels.label_set([(STORE_LABEL, p.store), (SUMS_LABEL, self.sums_journal)]),
            )
            if p.store == STORE_ROCKSDB:
                spec.recovery_log_prefix = RECOVERY_PREFIX
                spec.hint_prefix = HINT_PREFIX
                spec.hint_backups = 2
            out.append(spec)
        return out

    def capped(self, replication_max: int, hot_standbys_max: int) -> Layout:
        """The same layout on fewer brokers or consumers: replications and standbys capped
        (one broker and one consumer process: 1 and 0)."""
        return replace(
            self,
            shards=[
                replace(
                    p,
                    replication=min(p.replication, replication_max),
                    hot_standbys=min(p.hot_standbys, hot_standbys_max),
                    # Quorum mode needs three members to outlive one.
                    quorum=p.quorum and replication_max >= 3,
                    quorum_recovery_log=p.quorum_recovery_log and replication_max >= 3,
                )
                for p in self.shards
            ],
            sums_replication=min(self.sums_replication, replication_max),
            sums_quorum=self.sums_quorum and replication_max >= 3,
        )

    def journals(self) -> list[str]:
        return [spec.name for spec in self.journal_specs()]

    def _journal(
        self,
        name: str,
        replication: int,
        store: str,
        label_pairs: Sequence[tuple[str, str]],
        quorum: bool = False,
    ) -> pb.JournalSpec:
        mode = [(labels.REPLICATION_MODE, labels.REPLICATION_MODE_QUORUM)] if quorum else []
        return pb.JournalSpec(
            name=name,
            replication=replication,
            labels=labels.label_set([*label_pairs, *mode, *self.journal_labels]),
            fragment=pb.JournalSpec.Fragment(
                length=self.fragment_bytes,
                compression_codec=pb.GZIP,
                stores=[store],
                refresh_interval=Duration(seconds=1),
                flush_interval=Duration(seconds=self.flush_interval_s),
            ),
        )


def default_layout(
    *, file_store: str, s3_store: str | None = None, postgres: bool = True
) -> Layout:
    """Four shards: journals at R=3 and R=2, fragments in `file_store` and (if given)
    `s3_store`; shards on PostgreSQL (if `postgres`) without a standby and on RocksDB with and
    without one."""
    second = s3_store or file_store
    pg = STORE_POSTGRES if postgres else STORE_ROCKSDB
    return Layout(
        shards=[
            ShardPlan("sum-pg-0", "stream-sum/chunks/part-0", 3, file_store, pg),
            ShardPlan("sum-pg-1", "stream-sum/chunks/part-1", 2, second, pg),
            ShardPlan(
                "sum-rdb-0", "stream-sum/chunks/part-2", 3, second, STORE_ROCKSDB, hot_standbys=1
            ),
            ShardPlan("sum-rdb-1", "stream-sum/chunks/part-3", 2, file_store, STORE_ROCKSDB),
        ],
        sums_store_url=second,
    )


def _duration(seconds: float) -> Duration:
    d = Duration()
    d.FromNanoseconds(int(seconds * 1e9))
    return d
