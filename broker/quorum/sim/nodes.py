"""The simulation's nodes: shells around the sans-IO cores, and the clients.

Each node handles one event at a time (a delivery or a timer) and then sends what its core put
in its outbox. A crashed node ignores every event until it restarts; events scheduled by an
earlier incarnation are recognised by their incarnation number and dropped. A member's
ReplicaLog is its disk: it survives a crash, minus what was never synced (`ReplicaLog.crash`).
The log records its changes as the broker's log file does: every restart encodes them in the
file format, replays them, and requires the replayed log to equal the one that survived
(log_codec.py, log_change.py); the records kept are then the snapshot a rewrite keeps.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, cast

from broker.quorum.config import CoordinatorConfig, QuorumConfig
from broker.quorum.coordinator import REGISTER, Coordinator
from broker.quorum.entry import NO_REGISTERS, EntryId, Registers
from broker.quorum.errors import (
    LogFullError,
    NotLeaderError,
    PendingAppendsFullError,
    QuorumInvariantError,
)
from broker.quorum.leader import Committed, RegistersMismatched
from broker.quorum.log import ReplicaLog
from broker.quorum.log_codec import decode_log, encode_log
from broker.quorum.log_replay import durable_state, replay, snapshot
from broker.quorum.member import Member
from broker.quorum.messages import COORDINATORS
from broker.quorum.register import MemoryCasRegister, RegisterCas, RegisterRead, RegisterReply
from broker.quorum.rules import Rules
from broker.quorum.sim.checker import Acked

if TYPE_CHECKING:
    from broker.quorum.sim.world import World

TICK = "tick"
SYNC = "sync"
RESTART = "restart"
CRASH = "crash"


@dataclass(frozen=True, slots=True)
class AppendRequest:
    """`check`: the registers the journal must hold (None: no check); `set_to`: its
    registers after the append (None: unchanged). A compare-and-set, as fencing uses them."""

    client: str
    request_id: int
    data: bytes
    check: Registers | None = None
    set_to: Registers | None = None


@dataclass(frozen=True, slots=True)
class AppendReply:
    """`mismatch`: the check failed (not ok) against `registers`, committed through `end`."""

    request_id: int
    ok: bool
    entry: EntryId | None = None
    begin: int = 0
    end: int = 0
    reason: str = ""
    registers: Registers = NO_REGISTERS
    mismatch: bool = False


class MemberNode:
    def __init__(self, world: World, name: str, config: QuorumConfig, rules: Rules) -> None:
        self.world = world
        self.name = name
        self.config = config
        self.rules = rules
        self.log = ReplicaLog()  # the disk
        self.log.changes = []  # its file's records
        self.member: Member | None = None
        # The disk was wiped: what a broker knows from the term register listing it in the
        # ensemble while it has no log file. Stays set: the log says when it was aligned.
        self.disk_lost = False
        self.incarnation = 0
        self._sync_scheduled = False
        self._tick_scheduled = False
        self._ticks = 0

    @property
    def up(self) -> bool:
        return self.member is not None

    def start(self) -> None:
        world = self.world
        self.incarnation += 1
        self._check_replay()
        self.member = Member(self.name, self.log, self.config, self.rules)
        if self.disk_lost:
            # As a broker's node does once it decided its member is lost: a nonce of this
            # start, and the term register's current term, read after the loss (the broker
            # reads the keyspace before it takes part; here the register is read directly).
            world.nonces += 1
            self.member.begin_lost(world.nonces, world.register.read().record.term)
        self.member.on_stored(len(world.store))
        if self.incarnation > 1:
            world.net.replay_to(self.name)  # old messages re-delivered after a restart
        self._sync_scheduled = False
        self._tick_scheduled = False

    @property
    def voter(self) -> bool:
        """Whether this member counts in an election, as its host knows it: a member whose
        disk was wiped does not until its Member latches `voter` (Rules.may_vote); the host
        then clears its lost mark, so it stays a voter across restarts (a broker's
        `_clear_lost_mark`). While it is down, the mark alone says. The checker judges this
        by its own rule: every quorum of voters must hold every committed entry."""
        member = self.member
        if self.disk_lost and member is not None and member.voter:
            self.disk_lost = False
        return not self.disk_lost

    def crash(self, wipe: bool = False) -> None:
        self.member = None
        self.incarnation += 1
        self.log.crash()
        if wipe:  # the disk is lost too: the member comes back with an empty log
            self.log = ReplicaLog()
            self.log.changes = []
            self.disk_lost = True

    def _check_replay(self) -> None:
        """What a broker restarting from its log file would rebuild is what survived."""
        log = self.log
        assert log.changes is not None
        replayed = replay(decode_log(encode_log(log.changes)).changes)
        if durable_state(replayed) != durable_state(log):
            raise QuorumInvariantError(
                f"{self.name}: its log file replays to {durable_state(replayed)!r}, "
                f"not {durable_state(log)!r}"
            )
        log.changes = snapshot(log)

    def deliver(self, src: str, msg: object) -> None:
        member = self.member
        if member is None:
            return
        now = self.world.net.now
        if isinstance(msg, AppendRequest):
            self._append(member, src, msg, now)
        else:
            leading = member.leader is not None
            member.handle(msg, now)
            if not leading and member.leader is not None:
                self.world.on_new_leader(self)
        self._flush(member)

    def timer(self, payload: tuple[str, int]) -> None:
        kind, incarnation = payload
        if kind == RESTART:
            if self.member is None and incarnation == self.incarnation:
                self.start()
            return
        if kind == CRASH:
            if incarnation == self.incarnation:
                self.world.crash(self.name)
            return
        member = self.member
        if member is None or incarnation != self.incarnation:
            return
        now = self.world.net.now
        if kind == SYNC:
            self._sync_scheduled = False
            member.sync(now)
        else:
            self._tick_scheduled = False
            member.tick(now)
            self._ticks += 1
            if (
                member.leader is not None
                and self._ticks % self.world.config.upload_every_ticks == 0
            ):
                self._upload(member)
        self._flush(member)

    def _append(self, member: Member, src: str, req: AppendRequest, now: int) -> None:
        expect, set_to = req.check, req.set_to
        try:
            member.append(
                req.data,
                (src, req.request_id, req.data),
                now,
                None if expect is None else lambda current: current == expect,
                None if set_to is None else lambda _: set_to,
            )
        except (NotLeaderError, LogFullError, PendingAppendsFullError) as exc:
            self.world.net.send(self.name, src, AppendReply(req.request_id, False, reason=str(exc)))

    def _upload(self, member: Member) -> None:
        """The leader writes committed content to the snapshot store (Gazette's persister),
        and learns how far the store holds the journal, whoever wrote it (the broker's
        fragment index listing): a deposed leader may have stored more."""
        store = self.world.store
        begin = len(store)
        end = min(member.read_limit, begin + self.world.config.upload_bytes_max)
        if end > begin:
            store.extend(self.log.read(begin, end))
        member.on_stored(len(store))

    def _flush(self, member: Member) -> None:
        world, net = self.world, self.world.net
        for dst, msg in member.outbox:
            if dst == COORDINATORS:
                leader = member.leader
                ensemble = leader.ensemble if leader is not None else ()
                for coordinator in world.coordinator_names:
                    if world.hears(coordinator, ensemble):
                        net.send(self.name, coordinator, msg)
            else:
                net.send(self.name, dst, msg)
        member.outbox.clear()
        for notice in member.notices:
            client, request_id, _ = cast(tuple[str, int, bytes], notice.token)
            if isinstance(notice, Committed):
                reply = AppendReply(
                    request_id,
                    True,
                    notice.entry,
                    notice.begin,
                    notice.end,
                    registers=notice.registers,
                )
            elif isinstance(notice, RegistersMismatched):
                end = notice.end
                reply = AppendReply(
                    request_id, False, notice.entry, end, end, "mismatch", notice.registers, True
                )
            else:
                reply = AppendReply(request_id, False, reason=notice.reason)
            net.send(self.name, client, reply)
        member.notices.clear()
        if not self._sync_scheduled and self.log.synced_index < self.log.head_index:
            self._sync_scheduled = True
            net.timer(
                net.rng.randint(1, world.config.sync_delay_max), self.name, (SYNC, self.incarnation)
            )
        # Only a leader has anything to do on a tick.
        if member.leader is not None and not self._tick_scheduled:
            self._tick_scheduled = True
            net.timer(world.config.member_tick_ticks, self.name, (TICK, self.incarnation))


class CoordinatorNode:
    def __init__(
        self,
        world: World,
        name: str,
        ensemble: tuple[str, ...],
        config: CoordinatorConfig,
        rules: Rules,
        member: str = "",
    ) -> None:
        self.world = world
        self.name = name
        self.ensemble = ensemble
        self.config = config
        self.rules = rules
        self.member = member  # the member hosting it ("": none; World.hosts)
        self.core: Coordinator | None = None
        self.incarnation = 0

    @property
    def up(self) -> bool:
        return self.core is not None

    def start(self) -> None:
        self.incarnation += 1
        rng = random.Random(self.world.net.rng.getrandbits(32))
        self.core = Coordinator(
            self.name, self.ensemble, rng, self.config, self.rules, member=self.member
        )
        self.core.start(self.world.net.now)
        self._flush(self.core)
        self.world.net.timer(
            self.world.config.coordinator_tick_ticks, self.name, (TICK, self.incarnation)
        )

    def crash(self) -> None:
        self.core = None
        self.incarnation += 1

    def deliver(self, src: str, msg: object) -> None:
        core = self.core
        if core is None:
            return
        core.wanted = self.world.wanted
        core.doubtful = self.world.doubtful()
        core.handle(msg, self.world.net.now)
        self._flush(core)

    def timer(self, payload: tuple[str, int]) -> None:
        kind, incarnation = payload
        if kind == RESTART:
            if self.core is None and incarnation == self.incarnation:
                self.start()
            return
        core = self.core
        if core is None or incarnation != self.incarnation:
            return
        core.wanted = self.world.wanted  # the allocator's route, as every broker sees it
        core.doubtful = self.world.doubtful()  # as the broker's leader tells its coordinator
        if core.outsider and core.takes_part:
            self.world.outsider_ticks += 1
        core.tick(self.world.net.now)
        self._flush(core)
        self.world.net.timer(
            self.world.config.coordinator_tick_ticks, self.name, (TICK, self.incarnation)
        )

    def _flush(self, core: Coordinator) -> None:
        net = self.world.net
        for dst, msg in core.outbox:
            net.send(self.name, self.world.register_name if dst == REGISTER else dst, msg)
        core.outbox.clear()


class RegisterNode:
    """The keyspace holding the term register: never crashes (etcd's own replication is not
    under test), but messages to and from it are lost, delayed and partitioned like any."""

    def __init__(self, world: World, name: str, register: MemoryCasRegister) -> None:
        self.world = world
        self.name = name
        self.register = register
        self.up = True

    def deliver(self, src: str, msg: object) -> None:
        if isinstance(msg, RegisterRead):
            reply = RegisterReply(msg.request_id, True, self.register.read())
        elif isinstance(msg, RegisterCas):
            result = self.register.compare_and_swap(msg.expect_revision, msg.record)
            reply = RegisterReply(msg.request_id, result.ok, result.current)
        else:
            return
        self.world.net.send(self.name, src, reply)

    def timer(self, payload: object) -> None:
        return


@dataclass(slots=True)
class ClientNode:
    """Appends unique payloads (to the register's leader, or now and then to any member) and
    reads committed content from random members. An append unanswered within
    `client_timeout_ticks` has an unknown outcome: it is forgotten, neither acked nor failed.

    Every `register_every`-th append (0: none) is a compare-and-set of the registers: it checks that they
    hold what this client last learned of them (from an answer: committed) and sets them to a
    value naming the append. The two clients race, so checks both pass and fail."""

    world: World
    name: str
    up: bool = True
    next_id: int = 0
    inflight: dict[int, tuple[bytes, int, Registers | None]] = field(default_factory=dict)
    registers_seen: Registers = NO_REGISTERS
    register_every: int = 3

    def start(self) -> None:
        self.world.net.timer(
            self.world.net.rng.randint(1, self.world.config.client_tick_ticks), self.name, TICK
        )

    def deliver(self, src: str, msg: object) -> None:
        if not isinstance(msg, AppendReply):
            return
        sent = self.inflight.pop(msg.request_id, None)
        if sent is None:
            return
        if msg.mismatch:
            self.registers_seen = msg.registers
            self.world.checker.on_mismatch(msg.end, msg.registers)
            return
        if not msg.ok:
            return
        if msg.entry is None:
            raise AssertionError("an acknowledgement without an entry")
        self.registers_seen = msg.registers
        acked = Acked(sent[0], msg.entry, msg.begin, msg.end, sent[2], msg.registers)
        self.world.on_ack(self.name, sent[1], acked)

    def timer(self, payload: object) -> None:
        world, net = self.world, self.world.net
        rng, now, config = net.rng, net.now, world.config
        for request_id, (_, sent_at, _) in list(self.inflight.items()):
            if now - sent_at > config.client_timeout_ticks:
                del self.inflight[request_id]
        if len(self.inflight) < config.client_inflight_max and rng.random() < config.append_p:
            self.next_id += 1
            data = f"<{self.name}{self.next_id}>".encode() * rng.choice((1, 1, 1, 2, 5))
            leader = world.register.read().record.leader
            target = leader if leader and rng.random() < 0.9 else rng.choice(world.ensemble)
            request = AppendRequest(self.name, self.next_id, data)
            if self.register_every and self.next_id % self.register_every == 0:
                owner: Registers = (("owner", f"{self.name}.{self.next_id}"),)
                request = replace(request, check=self.registers_seen, set_to=owner)
            self.inflight[self.next_id] = (data, now, request.check)
            net.send(self.name, target, request)
        if rng.random() < config.read_p:
            world.read_from(rng.choice(world.ensemble), rng)
        net.timer(rng.randint(1, config.client_tick_ticks), self.name, TICK)
