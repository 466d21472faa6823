"""Prometheus metrics of a gazette process, served by the HTTP gateway at ``/debug/metrics``.

The metric objects are module-level and registered once, in prometheus_client's default
registry, so that every broker of a process (tests run several) adds to the same series, as
Gazette's own `promauto` collectors do. A test that wants to see its own effect reads a value
before and after (``value_of``) rather than expecting an absolute number.

Names follow Gazette's where it has an equivalent (`gazette_allocator_converge_total`,
`gazette_store_persisted_bytes_total`); the rest use the same `gazette_` prefix and Prometheus
conventions (a `_total` counter, base units in the name).

Code paths record through the objects (or the small helpers below) with one line each; nothing
here blocks or allocates per call beyond prometheus_client's own lock-protected increments.
"""

from __future__ import annotations

from typing import Any, Final

from prometheus_client import REGISTRY, CollectorRegistry, Counter, Gauge

from broker.protocol import protocol_pb2 as pb

# --- Appends (broker/append_api.py, broker/append_fsm.py, broker/pipeline.py) ---------------------

APPENDS: Final = Counter(
    "gazette_appends_total",
    "Append RPCs this broker answered as the journal's primary, by response status.",
    ["status"],
)
APPEND_BYTES: Final = Counter(
    "gazette_append_bytes_total",
    "Bytes committed by Append RPCs this broker served as the journal's primary.",
)
PIPELINE_COMMITS: Final = Counter(
    "gazette_pipeline_commits_total",
    "Transactions (client appends and pulses) a primary committed through its replication"
    " pipeline, acknowledged by every peer.",
)
PIPELINE_SYNCS: Final = Counter(
    "gazette_pipeline_syncs_total",
    "Synchronisation rounds of replication pipelines with their peers (one or more per new"
    " pipeline).",
)

# --- Reads (broker/read_api.py) -------------------------------------------------------------------

READS: Final = Counter(
    "gazette_reads_total",
    "Read RPCs received by this broker (served locally, proxied or refused).",
)
READ_BYTES: Final = Counter(
    "gazette_read_bytes_total",
    "Journal content bytes this broker's Read RPCs streamed from its local fragment index.",
)

READ_VERIFIED_WHOLE: Final = Counter(
    "gazette_read_verified_whole_fragments_total",
    "Stored fragments over 1 MiB verified whole before a Read served them, by how: staged"
    " (decoded into a scratch copy, served from it) or first_pass (read twice, no room for a copy).",
    ["how"],
)
READ_STAGED_BYTES: Final = Gauge(
    "gazette_read_staged_bytes",
    "Bytes of stored fragments' scratch copies staged for Reads (read_staging.py).",
)
DATA_LOSS_READS: Final = Counter(
    "gazette_read_data_loss_total",
    "Read RPCs this broker failed with DATA_LOSS: a fragment file did not verify against its"
    " name, could not be decoded, or is missing (broker/fragment/verify.py), by failure.",
    ["failure"],
)
READ_HOLE_WAITS: Final = Counter(
    "gazette_read_hole_waits_total",
    "Blocking reads that waited longer than read_api.hole_wait_warning_s at an offset below the"
    " write head that no fragment covers (content not uploaded by a former primary, or lost"
    " without a trace): each is also logged as a WARNING naming the journal and offset.",
)

# --- Persistence (broker/fragment/persister.py) ---------------------------------------------------

SPOOL_BLOCKS: Final = Counter(
    "gazette_spool_blocks_total",
    "Blocks memory spools took (gazette serve --spool-memory), by source: re-used from the"
    " pool, or allocated anew (fresh memory: costly on first touch).",
    ["source"],
)
SPOOL_RECOVERY: Final = Counter(
    "gazette_spool_recovery_fragments_total",
    "Fragments a restarted broker found in its durable spools (--data-dir), by outcome:"
    " adopted (its content is the journal's: indexed, and persisted once complete), redundant"
    " (the store already held it), kept (completed fragments kept while the open one was set"
    " aside: the journal went on after them), stale (the journal went on without this broker)"
    " and corrupt"
    " (no commit record verified against the content). Stale and corrupt ones are set aside"
    " under <data-dir>/spool-quarantine, never persisted.",
    ["outcome"],
)
QUORUM_LOG_OPENED: Final = Counter(
    "gazette_quorum_log_opened_total",
    "Quorum journals' member log files (<data-dir>/quorum/<journal>/log) a broker opened, by"
    " outcome: new, replayed, torn_tail (a write cut short by a crash, cut off), corrupt (a"
    " damaged record before intact ones: the member does not take part) and earlier_journal"
    " (the files of a deleted journal of the same name: removed, and the member starts fresh).",
    ["outcome"],
)
QUORUM_NODE_RESTARTS: Final = Counter(
    "gazette_quorum_node_restarts_total",
    "Quorum nodes this broker started again after they stopped because their member log could"
    " not be written (a full disk, say), or their log could not be opened for want of room, by"
    " journal. Growing: a member that keeps failing (its broker's data directory needs room).",
    ["journal"],
)
QUORUM_LOST_DISKS: Final = Counter(
    "gazette_quorum_lost_disk_starts_total",
    "Quorum members this broker started as lost: the keyspace shows the member joined the"
    " journal, but its log is new (a lost disk) or it was not caught up since; it does not vote"
    " until a leader has caught it up.",
)
QUORUM_ELECTIONS_BLOCKED: Final = Gauge(
    "gazette_quorum_elections_blocked",
    "Quorum journals whose election this broker's coordinator found impossible: more members"
    " lost their disk (and are not caught up) than the ensemble can spare. The journal takes no"
    " appends until an operator acts (docs/design/quorum.md, Built (lost disks)).",
)
# Per quorum journal and member (the broker's own name: one per journal in a broker process;
# tests that run several brokers in one process get one each). A node's series are removed
# when it stops, so the label set is bounded by the quorum journals this broker is a member of.
QUORUM_LABELS: Final = ("journal", "member")
QUORUM_TERM: Final = Gauge(
    "gazette_quorum_term",
    "The term of this member's log (the last term it joined) per quorum journal.",
    QUORUM_LABELS,
)
QUORUM_LEADING: Final = Gauge(
    "gazette_quorum_leading",
    "1 while this member leads its quorum journal's current term, else 0.",
    QUORUM_LABELS,
)
QUORUM_COMMIT_LAG: Final = Gauge(
    "gazette_quorum_commit_lag_bytes",
    "Bytes this member's log holds beyond the commit offset it knows: on the leader, content"
    " appended and not yet acknowledged by a quorum (appends waiting to commit).",
    QUORUM_LABELS,
)
QUORUM_ELECTIONS_STARTED: Final = Counter(
    "gazette_quorum_elections_started_total",
    "Terms this member's coordinator claimed in the term register (elections it started).",
    QUORUM_LABELS,
)
QUORUM_ELECTIONS_WON: Final = Counter(
    "gazette_quorum_elections_won_total",
    "Terms this member became the leader of.",
    QUORUM_LABELS,
)
QUORUM_LOG_FULL: Final = Counter(
    "gazette_quorum_log_full_total",
    "Appends this member refused as leader because its entry log was full (log_bytes_max or"
    " log_entries_max of entries not yet in the fragment store): answered RESOURCE_EXHAUSTED.",
    QUORUM_LABELS,
)
QUORUM_SNAPSHOTS_SENT: Final = Counter(
    "gazette_quorum_snapshots_sent_total",
    "Snapshot messages this member sent as leader: a follower behind the leader's log base"
    " (compacted away: the fragment store holds it) is caught up from the store.",
    QUORUM_LABELS,
)
QUORUM_SNAPSHOTS_INSTALLED: Final = Counter(
    "gazette_quorum_snapshots_installed_total",
    "Snapshots this member took from its leader: its log was behind the leader's base, and now"
    " starts at it (its spool rolls forward: what is before the base is read from the store).",
    QUORUM_LABELS,
)
QUORUM_LOG_BASE: Final = Gauge(
    "gazette_quorum_log_base_offset",
    "The journal offset this member's entry log begins at: content before it was compacted"
    " away (the fragment store holds it) or came by a Snapshot.",
    QUORUM_LABELS,
)
QUORUM_APPLY_ERRORS: Final = Counter(
    "gazette_quorum_apply_errors_total",
    "Failed tries of this member's commit applier: applying committed entries to the journal's"
    " spool (what this broker's readers see), or telling the quorum how far the fragment store"
    " holds the journal (what lets the log compact). Each is tried again after a backoff; a"
    " count that keeps rising means committed content this broker does not serve.",
    QUORUM_LABELS,
)
QUORUM_KEPT_UNASSIGNED: Final = Gauge(
    "gazette_quorum_kept_unassigned",
    "1 while this member's node of a quorum journal runs though the journal is not assigned to"
    " this broker, because the term register names the member: in the ensemble, or in the one"
    " an ensemble change not yet settled left (which it may have to go back to). It stops once"
    " a settled ensemble no longer names it; its files stay.",
    QUORUM_LABELS,
)
FRAGMENTS_PERSISTED: Final = Counter(
    "gazette_fragments_persisted_total",
    "Fragment files this broker uploaded to fragment stores.",
)
PERSISTED_BYTES: Final = Counter(
    "gazette_store_persisted_bytes_total",
    "Journal (uncompressed) bytes of the fragment files this broker uploaded.",
)

# --- Allocator (broker/allocator/allocator.py) ----------------------------------------------------

ALLOCATOR_ROUNDS: Final = Counter(
    "gazette_allocator_converge_total",
    "Rounds of the allocator's convergence loop run while this member led.",
)
ALLOCATOR_ROUND_FAILURES: Final = Counter(
    "gazette_allocator_round_failures_total",
    "Leader rounds whose transaction was not applied, by why: compare (the state moved on),"
    " unavailable (etcd unreachable, a lease gone), no_space (etcd's NOSPACE alarm).",
    ["reason"],
)

# --- Operator interfaces (broker/http_gateway.py, broker/auth.py) ---------------------------------

HTTP_REQUESTS: Final = Counter(
    "gazette_http_gateway_requests_total",
    "Requests answered by the HTTP gateway, by method and HTTP status code.",
    ["method", "code"],
)
AUTH_REJECTIONS: Final = Counter(
    "gazette_auth_rejections_total",
    "RPCs refused for their authorization, by reason (missing, invalid, capability, selector).",
    ["reason"],
)


# APPENDS' child counter of each status (bounded by the enum): `labels()` looks the child up
# under a lock, by the status's name, on every append.
_appends_by_status: dict[int, Any] = {}


def record_append(status: int, committed_bytes: int = 0) -> None:
    """One Append RPC answered with `status` (a protocol.Status), committing `committed_bytes`."""
    child = _appends_by_status.get(status)
    if child is None:
        child = _appends_by_status[status] = APPENDS.labels(pb.Status.Name(status))
    child.inc()
    if committed_bytes:
        APPEND_BYTES.inc(committed_bytes)


def record_data_loss(failure: str) -> None:
    """One Read failed with DATA_LOSS for `failure` (a verify.IntegrityFailure value)."""
    DATA_LOSS_READS.labels(failure).inc()


def record_persisted(fragment_bytes: int) -> None:
    """One fragment file of `fragment_bytes` (uncompressed) uploaded."""
    FRAGMENTS_PERSISTED.inc()
    PERSISTED_BYTES.inc(fragment_bytes)


def value_of(
    name: str, labels: dict[str, str] | None = None, registry: CollectorRegistry = REGISTRY
) -> float:
    """The current value of sample `name` (0 if it has not been recorded yet)."""
    value = registry.get_sample_value(name, labels or {})
    return 0.0 if value is None else value
