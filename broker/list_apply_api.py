"""The List and Apply RPCs: journal specs, read from the KeySpace and written to etcd.

List. The journals whose labels match the request's selector, each with its spec, its etcd
create and mod revisions, and its current Route (from the assignments, with endpoints; a quorum
journal's names its term's leader as primary, quorum_shell/leader_route.py). Besides
a journal's own labels, selectors match its meta-labels: `name` (the journal name) and `prefix`
(each prefix of the name ending in '/'). As in Gazette, `prefix=a/b/` is rewritten into
`name:prefix=a/b/` (a prefix match of the name), so the two spellings select the same journals.

The response is a stream: a listing of more than `journals_per_response_max` journals, or of
more than `list_response_bytes_max` bytes, is split over several messages (the first carries
status and header; the rest only journals), which keeps each under gRPC's message size limits
and bounds the time the event loop spends building and serializing one. With `watch`, the
stream stays open: each snapshot is followed by an empty message marking its end, and a new snapshot is sent whenever the selected
journals change (a journal created, updated or deleted). `watch_resume` (the header of the last
snapshot a client saw) resumes a watch: the next snapshot is of a later revision.

A List never holds the event loop for long, however many journals it goes through: it selects
from a pinned view of the KeySpace (the mirror as of one revision, see `_pinned`), yielding to
the loop whenever it has run for `list_loop_hold_s_max`, and builds each message only once the
one before it is sent. Matching a journal costs a bisection per selector label, whatever the
number of its labels (selector.matches).

Apply. Upserts and deletions of specs in one etcd transaction: each change is guarded by its
`expect_mod_revision` (0: the journal must not exist; -1: no check), and if any guard fails,
nothing is applied and the answer is ETCD_TRANSACTION_FAILED. Every upsert is validated first
(`validate_journal_spec`), and a bad one fails the whole request with INVALID_ARGUMENT naming
the change and field (`changes[2].upsert.fragment.length: ...`). A successful Apply answers once
this broker's KeySpace reflects the transaction, so a List that follows sees it.

A journal named under another (`a/b` under `a`) may not share a fragment store with it: a
store's listing of the outer journal would take the inner one's files for its own (see
journal_nesting.py). An upsert making such a pair is refused with INVALID_ARGUMENT naming both,
nothing applied.

The replication mode of a live journal (label `gazette.dev/replication-mode`) cannot change: its
members' content would be taken over by the other mode's as if it were empty (acknowledged
appends overwritten, reads stalled; docs/design/quorum.md). An upsert changing it is refused
with INVALID_ARGUMENT, nothing applied (delete the journal and create it again, or create
another). The check reads the KeySpace mirror, which may lag etcd: so each upsert is guarded on
the revision the mirror shows of its journal too, and if the transaction fails while every
expectation of the client holds in the mirror once it shows the revision the transaction was
refused at (a guard failed: the spec changed meanwhile), the request is checked and tried
again, at most `apply_attempts_max` times (then UNAVAILABLE, nothing applied).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from typing import Final, NamedTuple

import grpc
import grpc.aio

from broker.apply_txn import apply_txn
from broker.journal_nesting import nesting_conflict
from broker.keyspace.backend import (
    Backend,
    Compare,
    CompareResult,
    CompareTarget,
    Header,
    KeySpaceError,
    OpDelete,
    OpPut,
)
from broker.keyspace.keyspace import Entry, KeySpace
from broker.loop_slices import LoopSlices, loop_hold_s_max
from broker.protocol import labels as gl
from broker.protocol import protocol_pb2 as pb
from broker.protocol.apply_changes import apply_changes_max as apply_changes_max
from broker.protocol.apply_changes import (
    is_upsert,
    validate_changes,
    validate_expect_mod_revision,
)
from broker.protocol.selector import matches
from broker.protocol.validate import (
    ValidationError,
    at,
    validate_journal_name,
    validate_journal_spec,
    validate_label_selector,
)
from broker.quorum_shell.leader_route import leader_route
from broker.read_api import Context
from broker.topology import (
    Decoded,
    JournalItem,
    assignment_of,
    attach_endpoints,
    etcd_header,
    item_key,
    items_prefix,
    journal_assignments,
    route_from_assignments,
)

# Journals per List message (Gazette's value): a snapshot larger than this is split.
journals_per_response_max: Final = 1000
# Bytes of journals per List message: gRPC serializes each message in one piece on the event
# loop, which takes about a millisecond per MiB. (A journal larger than this is sent alone.)
list_response_bytes_max: Final = 4 << 20
# The longest a List or an Apply runs on the event loop between yields to other work.
list_loop_hold_s_max: Final = loop_hold_s_max
# How long an Apply waits for the KeySpace to reflect its own transaction.
apply_revision_wait_s: Final = 10.0
# Tries of an Apply whose guards on the mirror's revisions failed (see the module docstring).
apply_attempts_max: Final = 4

# A watching List re-checks its end of stream at least this often while nothing changes.
watch_poll_s: Final = 60.0


class Selected(NamedTuple):
    """A journal a List selected: its KeySpace entry (revisions, raw value), spec and route."""

    entry: Entry[Decoded]
    spec: pb.JournalSpec
    route: pb.Route


def validate_list_request(request: pb.ListRequest) -> None:
    with at("selector"):
        validate_label_selector(request.selector)
        for side in ("include", "exclude"):
            for value in gl.values_of(getattr(request.selector, side), gl.META_PREFIX):
                if not value.endswith("/"):
                    raise ValidationError(
                        f"must end in '/' (got {value!r})", side, f"labels[{gl.META_PREFIX}]"
                    )


def validate_apply_request(request: pb.ApplyRequest) -> None:
    for _ in _validate_apply_changes(request):
        pass


async def validate_apply_request_sliced(request: pb.ApplyRequest) -> None:
    """validate_apply_request, yielding the event loop between changes now and then: an Apply
    of many large specs is many milliseconds of validation."""
    slices = LoopSlices(list_loop_hold_s_max)
    for _ in _validate_apply_changes(request):
        await slices.next_item()


def _validate_apply_changes(request: pb.ApplyRequest) -> Iterator[None]:
    """Validates the request's changes, one per step."""
    return validate_changes(request.changes, _validate_change, item="journal")


def _validate_change(change: pb.ApplyRequest.Change) -> str:
    """The journal a change is about, once it is validated."""
    if is_upsert(change):
        with at("upsert"):
            validate_journal_spec(change.upsert)
        validate_expect_mod_revision(change, upsert=True)
        return change.upsert.name
    with at("delete"):
        validate_journal_name(change.delete)
    validate_expect_mod_revision(change, upsert=False)
    return change.delete


def rewrite_prefix_labels(selector: pb.LabelSelector) -> pb.LabelSelector:
    """`selector` with each "prefix" label turned into a prefix match of "name"."""
    out = pb.LabelSelector()
    out.CopyFrom(selector)
    for side in (out.include, out.exclude):
        prefixes = gl.values_of(side, gl.META_PREFIX)
        if prefixes:
            gl.remove(side, gl.META_PREFIX)
            for value in prefixes:
                gl.add_value(side, gl.META_NAME + gl.PREFIX_SUFFIX, value)
    return out


class ListApplyAPI:
    """The List and Apply RPC handlers over a broker's KeySpace mirror (kept current by the
    broker's watch) and its etcd backend. `process_id` is this broker's, for headers."""

    def __init__(
        self,
        ks: KeySpace[Decoded],
        backend: Backend,
        root: str,
        process_id: pb.ProcessSpec.ID,
        *,
        revision_wait_s: float = apply_revision_wait_s,
        journals_per_response: int = journals_per_response_max,
    ) -> None:
        if journals_per_response < 1:
            raise ValueError(f"journals_per_response: must be >= 1 (got {journals_per_response})")
        self._journals_per_response = journals_per_response
        self._ks = ks
        self._backend = backend
        self._root = root
        self._process_id = process_id
        self._revision_wait_s = revision_wait_s

    def _header(self, revision: int | None = None, etcd: Header | None = None) -> pb.Header:
        # Not about one journal: no route (Gazette's "unrouted" header).
        header = pb.Header(route=pb.Route(primary=-1), etcd=etcd_header(etcd or self._ks.header))
        header.process_id.CopyFrom(self._process_id)
        if revision is not None:
            header.etcd.revision = revision
        return header

    # --- List ---

    async def snapshot(self, selector: pb.LabelSelector) -> tuple[list[Selected], Header]:
        """The journals `selector` matches, all as of one revision (whose header is returned),
        selected in slices of at most `list_loop_hold_s_max` of the event loop."""
        ks = _pinned(self._ks)
        items = ks.search(items_prefix(self._root))
        name_values = gl.values_of(selector.include, gl.META_NAME)
        if len(name_values) == 1 and not any(
            label.name == gl.META_NAME and label.prefix for label in selector.include.labels
        ):
            # One exact name: look it up rather than scan every journal.
            entry = ks.get(item_key(self._root, name_values[0]))
            items = [entry] if entry is not None else []
        selected: list[Selected] = []
        slices = LoopSlices(list_loop_hold_s_max)
        for entry in items:
            journal = self._selected(ks, entry, selector)
            if journal is not None:
                selected.append(journal)
            await slices.next_item()
        return selected, ks.header

    def _selected(
        self, ks: KeySpace[Decoded], entry: Entry[Decoded], selector: pb.LabelSelector
    ) -> Selected | None:
        item = entry.decoded
        if not isinstance(item, JournalItem):
            return None
        spec = item.spec
        if not matches(selector, spec.labels, meta=gl.journal_meta_labels(spec.name)):
            return None
        route = route_from_assignments(
            assignment_of(a) for a in journal_assignments(ks, self._root, spec.name)
        )
        attach_endpoints(route, ks, self._root)
        # A quorum journal's route names its leader as primary (quorum_shell/leader_route.py):
        # a watcher gets a new snapshot when the leader changes.
        route = leader_route(ks, self._root, spec, entry.kv.create_revision, route)
        return Selected(entry, spec, route)

    def _messages(self, selected: list[Selected], etcd: Header) -> Iterator[pb.ListResponse]:
        """The messages of one snapshot, each of at most `journals_per_response` journals and
        `list_response_bytes_max` bytes (or of one journal, if larger), built one at a time."""
        message = pb.ListResponse(status=pb.OK, header=self._header(etcd=etcd))
        count = size = 0
        for journal in selected:
            # The spec's size is that of its etcd value, known without serializing it.
            journal_size = len(journal.entry.kv.value) + journal.route.ByteSize()
            if count and (
                count >= self._journals_per_response
                or size + journal_size > list_response_bytes_max
            ):
                yield message
                message, count, size = pb.ListResponse(), 0, 0
            message.journals.add(
                spec=journal.spec,
                mod_revision=journal.entry.kv.mod_revision,
                create_revision=journal.entry.kv.create_revision,
                route=journal.route,
            )
            count += 1
            size += journal_size
        yield message

    async def list(
        self, request: pb.ListRequest, context: Context
    ) -> AsyncIterator[pb.ListResponse]:
        try:
            validate_list_request(request)
        except ValidationError as err:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"ListRequest.{err}")
        selector = rewrite_prefix_labels(request.selector)
        min_revision = 0
        if request.HasField("watch_resume"):
            min_revision = request.watch_resume.etcd.revision + 1
        last: list[tuple[str, int, bytes]] | None = None  # What the last snapshot showed.
        while True:
            if not await self._reached(min_revision, context):
                continue
            selected, etcd = await self.snapshot(selector)
            min_revision = etcd.revision + 1
            # A watcher wants a new snapshot when a journal is created, updated or deleted, and
            # also when its route changes (assignments, a new primary): compare all three.
            seen = [
                (j.spec.name, j.entry.kv.mod_revision, j.route.SerializeToString())
                for j in selected
            ]
            if seen == last:
                continue
            last = seen
            for message in self._messages(selected, etcd):
                yield message
            if not request.watch:
                return
            yield pb.ListResponse()  # End of this snapshot.

    async def _reached(self, revision: int, context: Context) -> bool:
        """Whether the KeySpace reached `revision`, after waiting at most `watch_poll_s`."""
        if revision <= self._ks.header.revision:
            return True
        try:
            await self._ks.wait_for_revision(revision, watch_poll_s)
        except TimeoutError:
            return False
        except KeySpaceError as err:
            await context.abort(grpc.StatusCode.UNAVAILABLE, f"keyspace watch stopped: {err}")
        return True

    # --- Apply ---

    async def apply(self, request: pb.ApplyRequest, context: Context) -> pb.ApplyResponse:
        try:
            await validate_apply_request_sliced(request)
        except ValidationError as err:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"ApplyRequest.{err}")
        for _ in range(apply_attempts_max):
            compares, ops, guarded = _txn(self._root, self._ks, request)
            problem = self._mode_change(request) or self._nesting(request)
            if problem:
                await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"ApplyRequest.{problem}")
            succeeded, revision = await apply_txn(
                self._backend, self._ks, compares, ops, context,
                revision_wait_s=self._revision_wait_s, viewer="this broker",
            )  # fmt: skip
            if succeeded:
                return pb.ApplyResponse(status=pb.OK, header=self._header(revision))
            if not guarded:
                break
            # A guard of its own, or the client's, failed: which, the mirror tells once it
            # shows the revision the transaction was refused at.
            await self._mirror_reaches(revision, context)
            if not self._expectations_hold(request):
                break
        else:
            await context.abort(
                grpc.StatusCode.UNAVAILABLE,
                f"the journals changed under {apply_attempts_max} tries of this Apply; nothing"
                " applied: try again",
            )
        return pb.ApplyResponse(status=pb.ETCD_TRANSACTION_FAILED, header=self._header(revision))

    def _mode_change(self, request: pb.ApplyRequest) -> str:
        """What is wrong if an upsert changes a live journal's replication mode (see the
        module docstring), else ""."""
        for i, change in enumerate(request.changes):
            if not change.HasField("upsert"):
                continue
            current = self._ks.get(item_key(self._root, change.upsert.name))
            if current is None or not isinstance(current.decoded, JournalItem):
                continue
            was = gl.value_of(current.decoded.spec.labels, gl.REPLICATION_MODE)
            now = gl.value_of(change.upsert.labels, gl.REPLICATION_MODE)
            was, now = (
                was or gl.REPLICATION_MODE_ALL_REPLICAS,
                now or gl.REPLICATION_MODE_ALL_REPLICAS,
            )
            if was != now:
                return (
                    f"changes[{i}].upsert.labels: journal {change.upsert.name!r} is replicated"
                    f" {was!r} ({gl.REPLICATION_MODE}); a live journal's mode cannot change to"
                    f" {now!r} (its content would be overwritten): create another journal, or"
                    " delete this one and create it again"
                )
        return ""

    def _nesting(self, request: pb.ApplyRequest) -> str:
        """What is wrong if the request makes a journal named under another share a fragment
        store with it (journal_nesting.py), else "". Read from the mirror, as `_mode_change`."""
        upserts: dict[str, pb.JournalSpec] = {}
        index: dict[str, int] = {}
        deleted: set[str] = set()
        for i, change in enumerate(request.changes):
            if change.HasField("upsert"):
                upserts[change.upsert.name] = change.upsert
                index[change.upsert.name] = i
            else:
                deleted.add(change.delete)

        def current(name: str) -> pb.JournalSpec | None:
            entry = self._ks.get(item_key(self._root, name))
            if entry is None or not isinstance(entry.decoded, JournalItem):
                return None
            return entry.decoded.spec

        def named_under(name: str) -> Iterator[pb.JournalSpec]:
            for entry in self._ks.search(item_key(self._root, name + "/")):
                if isinstance(entry.decoded, JournalItem):
                    yield entry.decoded.spec

        found = nesting_conflict(upserts, deleted, current, named_under)
        if found is None:
            return ""
        return f"changes[{index[found.journal]}].upsert.name: {found.describe()}"

    def _expectations_hold(self, request: pb.ApplyRequest) -> bool:
        """Whether the mirror shows each spec at the revision the client expects."""
        for change in request.changes:
            if change.expect_mod_revision == -1:
                continue
            name = change.upsert.name if change.HasField("upsert") else change.delete
            current = self._ks.get(item_key(self._root, name))
            if (current.kv.mod_revision if current else 0) != change.expect_mod_revision:
                return False
        return True

    async def _mirror_reaches(self, revision: int, context: Context) -> None:
        if revision <= self._ks.header.revision:
            return
        try:
            await self._ks.wait_for_revision(revision, self._revision_wait_s)
        except (TimeoutError, KeySpaceError) as err:
            await context.abort(
                grpc.StatusCode.UNAVAILABLE,
                f"this broker's view of etcd did not reach revision {revision}: {err}; nothing"
                " applied",
            )


def _txn(
    root: str, ks: KeySpace[Decoded], request: pb.ApplyRequest
) -> tuple[list[Compare], list[OpPut | OpDelete], bool]:
    """The request's compares and operations, and whether any compare is a guard of its own:
    each upsert is guarded on the revision the mirror shows of its journal (the spec its mode
    was checked against), unless that is the client's own expectation."""
    compares: list[Compare] = []
    ops: list[OpPut | OpDelete] = []
    guarded = False
    for change in request.changes:
        if change.HasField("upsert"):
            key = item_key(root, change.upsert.name).encode()
            ops.append(OpPut(key, change.upsert.SerializeToString()))
        else:
            key = item_key(root, change.delete).encode()
            ops.append(OpDelete(key))
        expect = change.expect_mod_revision
        if expect != -1:
            compares.append(Compare(key, CompareTarget.MOD, CompareResult.EQUAL, expect))
        if change.HasField("upsert"):
            current = ks.get(key)
            shown = current.kv.mod_revision if current else 0
            if shown != expect:
                compares.append(Compare(key, CompareTarget.MOD, CompareResult.EQUAL, shown))
                guarded = True
    return compares, ops, guarded


def _pinned(ks: KeySpace[Decoded]) -> KeySpace[Decoded]:
    """A read-only view of `ks` as it is now, which later updates leave as it is: a KeySpace
    replaces its list of entries on every update, never changing one in place (see
    keyspace.apply_events), so the view holds the state of one revision while a List yields the
    event loop to the watch that applies updates."""
    view: KeySpace[Decoded] = KeySpace(ks.root, ks.decoder)
    view.header, view.kvs = ks.header, ks.kvs
    return view
