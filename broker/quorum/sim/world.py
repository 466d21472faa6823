"""One simulated run: the world, its phases, its step loop, and `run_seed`. Its faults are in
chaos.py (the chaos timer), faults.py (crashes, lost disks, the heal) and double_faults.py.

Phases. FAULTS (`fault_ticks`): clients append and read while a chaos timer crashes members
(the leader more often than others) and coordinators, partitions and heals the network, on a
network whose loss, duplication and delay the seed chooses. LIVENESS: everything heals (no
partition, loss or duplication; every crashed node restarts) and within `liveness_ticks_max` an
append sent after the heal must be acknowledged and every member's commit offset must reach it.

Ensemble changes. Half the seeds keep one spare member outside the ensemble and, now and then,
want another ensemble (`wanted`, what every broker reads from the allocator's route): a member
replaced by the spare, the spare added, or an added member removed. The coordinators move the
term register's ensemble towards it one member per term (Rules.next_ensemble); the checker
judges every step against the register's current ensemble.

The checker runs after every step (one delivery or timer). A ProtocolError raised by a core
(an illegal transition, a diverged log) fails the run like a broken invariant.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field, replace
from typing import cast

from broker.quorum.config import CoordinatorConfig, QuorumConfig
from broker.quorum.errors import QuorumError, QuorumInvariantError
from broker.quorum.messages import ReplicaResponse
from broker.quorum.register import MemoryCasRegister, TermRecord
from broker.quorum.rules import CORRECT_RULES, Rules
from broker.quorum.sim import faults
from broker.quorum.sim.chaos import CHAOS, chaos
from broker.quorum.sim.checker import Acked, Checker, Violation
from broker.quorum.sim.double_faults import wipe_after_remove_first
from broker.quorum.sim.network import DELIVER, Network
from broker.quorum.sim.nodes import (
    CRASH,
    ClientNode,
    CoordinatorNode,
    MemberNode,
    RegisterNode,
)


@dataclass(frozen=True, slots=True)
class SimConfig:
    fault_ticks: int = 500
    liveness_ticks_max: int = 1500
    member_tick_ticks: int = 2
    coordinator_tick_ticks: int = 4
    client_tick_ticks: int = 5
    client_timeout_ticks: int = 60
    client_inflight_max: int = 3
    clients: int = 2
    coordinators: int = 2
    append_p: float = 0.8
    read_p: float = 0.3
    sync_delay_max: int = 3
    upload_every_ticks: int = 4
    upload_bytes_max: int = 48
    chaos_every_ticks: int = 12
    down_ticks_max: int = 100
    quorum: QuorumConfig = field(
        default_factory=lambda: QuorumConfig(
            inflight_messages_max=3,
            replicate_entries_max=4,
            replicate_bytes_max=64,
            log_bytes_max=160,
            log_entries_max=24,
            pending_appends_max=8,
            ack_timeout_ticks=8,
            retry_backoff_max_ticks=32,
            heartbeat_interval_ticks=6,
            silent_after_ticks=30,
        )
    )
    coordinator: CoordinatorConfig = field(
        default_factory=lambda: CoordinatorConfig(
            leader_timeout_ticks=30,
            election_timeout_ticks=20,
            request_timeout_ticks=8,
            retry_backoff_max_ticks=32,
        )
    )


@dataclass(slots=True)
class SimResult:
    seed: int
    violation: Violation | None
    steps: int
    time: int
    members: int
    acked: int
    reads: int
    terms: int
    crashes: int
    trace: list[str] | None
    disk_losses: int = 0
    # Term register records whose ensemble differed from the one before (ensemble changes).
    ensemble_changes: int = 0
    # Replacements whose first step removed the old member (it was silent: ensemble_step).
    removed_first: int = 0
    # Disks wiped just as a remove-first step reached the register (double_faults.py),
    # and unsettled changes that went back to the ensemble they left (Rules.next_ensemble,
    # blocked).
    removed_then_lost: int = 0
    fallbacks: int = 0
    # Coordinator ticks at which a coordinator hosted by a member outside its term's ensemble
    # still carried its own election (Coordinator.takes_part), and terms it appointed so.
    outsider_ticks: int = 0
    # Disks wiped beside a deposed leader (double_faults.py), and messages
    # re-delivered late (Network.late_p, replay_to).
    deposed_wipes: int = 0
    late_deliveries: int = 0
    # Compare-and-set appends whose check was verified against the committed registers, and
    # mismatch answers verified likewise.
    registers_verified: int = 0
    mismatches_verified: int = 0
    # Messages delivered, by type (ReplicaResponse also by status): which paths a run took.
    delivered: dict[str, int] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return self.violation is None

    def summary(self) -> str:
        outcome = "ok" if self.violation is None else f"VIOLATION {self.violation}"
        return (
            f"seed {self.seed}: {outcome} ({self.members} members, {self.steps} steps, "
            f"t={self.time}, {self.acked} acked, {self.reads} reads, {self.terms} terms, "
            f"{self.crashes} crashes, {self.disk_losses} disks lost, "
            f"{self.ensemble_changes} ensemble changes)"
        )


class World:
    def __init__(self, seed: int, config: SimConfig, rules: Rules, trace: bool) -> None:
        rng = random.Random(seed)
        self.config = config
        self.rules = rules
        members = 5 if rng.random() < 0.3 else 3
        initial = tuple(f"m{i}" for i in range(members))
        self.initial = initial
        # Ensemble changes (see the module docstring), from a generator of their own: a seed
        # without them takes the course it took before they existed.
        self.change_rng = random.Random(f"ensemble/{seed}")
        self.change_p = self.change_rng.choice((0.0, 0.0, 0.1, 0.25))
        self.pool = (*initial, f"m{members}") if self.change_p else initial
        self.wanted: tuple[str, ...] | None = None
        self.ensemble_changes = 0
        self.removed_first = 0
        self.fallbacks = 0
        # How often a remove-first step reaching the register also wipes the disk of a member
        # that remains (double_faults.py). From a generator of its own: a seed that
        # never takes this path takes the course it took before the path existed.
        self.double_rng = random.Random(f"double/{seed}")
        self.removed_then_lost_p = self.double_rng.choice((0.0, 0.5))
        self.removed_then_lost = 0
        self._record_seen = TermRecord(0, "", initial)
        self.down_since: dict[str, int] = {}  # when each member last crashed
        self._ensemble_seen = initial
        self.net = Network(
            rng,
            delay_max=rng.choice((1, 2, 4, 8)),
            drop_p=rng.choice((0.0, 0.02, 0.1, 0.25)),
            dup_p=rng.choice((0.0, 0.05, 0.2)),
            late_rng=(late_rng := random.Random(f"late/{seed}")),
            # Half the seeds re-deliver nothing late (and take the course they took before
            # late copies existed); the rest re-deliver some messages up to 150 ticks late.
            late_p=late_rng.choice((0.0, 0.0, 0.02, 0.08)),
            late_ticks_max=60,
        )
        self.chaos_scale = rng.choice((0.5, 1.0, 2.0))
        # How often a new leader dies within a few ticks, its barrier and first appends on a
        # minority at most: the terms that leave uncommitted entries behind (Raft's figure 8).
        self.early_crash_p = rng.choice((0.0, 0.3, 0.6))
        # How often a member's crash also wipes its disk (one member at a time, never while
        # another wiped member is still unaligned: the mode tolerates one lost disk for R=3).
        self.disk_loss_p = rng.choice((0.0, 0.3, 0.6))
        # How often the chaos wipes the disk of a member fenced into a newer term while the
        # leader it followed, deposed, still leads, and cuts the two off from the rest: what
        # a lost member's fence must survive. From a generator of its own: a seed that never
        # takes this path takes the course it took before the path existed.
        self.deposed_rng = random.Random(f"deposed/{seed}")
        self.deposed_wipe_p = self.deposed_rng.choice((0.0, 0.6))
        # Small messages and windows make followers acknowledge an earlier term's entries
        # apart from the barrier after them (what Raft's figure 8 needs).
        quorum = replace(
            config.quorum,
            replicate_entries_max=rng.choice((1, 2, config.quorum.replicate_entries_max)),
            inflight_messages_max=rng.choice((1, config.quorum.inflight_messages_max)),
        )
        self.store = bytearray()
        self.register_name = "register"
        self.register = MemoryCasRegister(TermRecord(0, "", initial))
        self.coordinator_names = tuple(f"c{i}" for i in range(config.coordinators))
        # In the seeds with ensemble changes, c0 is hosted by a member, as every coordinator
        # is on brokers: a leader's heartbeats reach it only while that member is in the
        # leader's ensemble (`hears`), and outside the ensemble it takes part only in its own
        # election (Coordinator.outsider); c1 stays a coordinator of its own. From a
        # generator of its own: a seed that never takes this path takes the course it took
        # before the path existed.
        host = random.Random(f"hosted/{seed}").choice(self.pool)
        self.hosts: dict[str, str] = {self.coordinator_names[0]: host} if self.change_p else {}
        self.outsider_ticks = 0
        self.members = [MemberNode(self, n, quorum, rules) for n in self.pool]
        self.coordinators = [
            CoordinatorNode(self, n, initial, config.coordinator, rules, self.hosts.get(n, ""))
            for n in self.coordinator_names
        ]
        # Compare-and-set appends (registers) in every seed: one append in three checks and
        # sets the register.
        self.clients = [ClientNode(self, f"k{i}", register_every=3) for i in range(config.clients)]
        self.startable: list[MemberNode | CoordinatorNode | ClientNode] = [
            *self.members,
            *self.coordinators,
            *self.clients,
        ]
        self.nodes: dict[str, MemberNode | CoordinatorNode | RegisterNode | ClientNode] = {
            node.name: node for node in self.startable
        }
        self.nodes[self.register_name] = RegisterNode(self, self.register_name, self.register)
        # The checker's majority is its own, not the rules' under test (a mutation may change
        # the quorum the protocol uses; never the one it is judged by).
        self.checker = Checker(self.pool)
        self.trace: list[str] | None = [] if trace else None
        self.steps = 0
        self.crashes = 0
        self.disk_losses = 0
        self.nonces = 0  # the last nonce given to a member back from a lost disk
        self.deposed_wipes = 0
        self.wiped: set[str] = set()  # members whose disk was wiped before
        self.rewipe_p = self.deposed_rng.choice((0.0, 0.7))
        self.logs = {m.name: m.log for m in self.members}  # the disks (a wipe replaces one)
        self.live_from = -1  # the tick the faults stopped, once they did
        self.live_probe_end = -1  # the end of the first append acknowledged after that
        self.delivered: dict[str, int] = {}

    @property
    def ensemble(self) -> tuple[str, ...]:
        """The term register's current ensemble."""
        return self.register.read().record.ensemble

    def hears(self, coordinator: str, ensemble: tuple[str, ...]) -> bool:
        """Whether a leader of `ensemble` tells `coordinator` (its heartbeats): every
        coordinator of its own; a hosted one only if its member is in that ensemble (a broker's
        node tells its peers' coordinators)."""
        host = self.hosts.get(coordinator)
        return host is None or host in ensemble

    def doubtful(self) -> frozenset[str] | None:
        """The members the leader of the register's term cannot count on
        (LeaderRole.doubtful), as a broker's leader hands them to its own coordinator; None
        (no change now) while no live member leads that term."""
        term, now = self.register.read().record.term, self.net.now
        for node in self.members:
            member = node.member
            if member is not None and member.leader is not None and member.term == term:
                return member.leader.doubtful(now)
        return None

    # --- Running -------------------------------------------------------------------------------

    def run(self) -> None:
        net, config, checker = self.net, self.config, self.checker
        for node in self.startable:
            node.start()
        net.timer(config.chaos_every_ticks, CHAOS, None)
        logs = self.logs
        while True:
            event = net.pop()
            if event is None:
                raise Violation("liveness", "nothing left to happen")
            time, _, kind, name, payload = event
            if self.live_from < 0 and time >= config.fault_ticks:
                faults.heal_all(self)
            self.steps += 1
            if name == CHAOS:
                if self.live_from < 0:
                    chaos(self)
            elif kind == DELIVER:
                src, msg = cast(tuple[str, object], payload)
                kind_name = type(msg).__name__
                if isinstance(msg, ReplicaResponse):
                    kind_name = f"{kind_name}.{msg.status.value}"
                self.delivered[kind_name] = self.delivered.get(kind_name, 0) + 1
                if self.trace is not None:
                    self.trace.append(f"{time:5d} {name} <- {src}: {msg!r}")
                self.nodes[name].deliver(src, msg)
            else:
                if self.trace is not None:
                    self.trace.append(f"{time:5d} {name} timer {payload}")
                self.nodes[name].timer(payload)  # type: ignore[arg-type]
            record = self.register.read().record
            ensemble = record.ensemble
            if ensemble != self._ensemble_seen:
                seen = self._record_seen
                if not seen.settled and (record.ensemble, record.previous) == (
                    seen.previous,
                    seen.ensemble,
                ):
                    self.fallbacks += 1
                    self.note(f"register back to {ensemble} (a blocked change)")
                elif len(ensemble) < len(self._ensemble_seen) and self.wanted is not None:
                    if len(self.wanted) > len(ensemble):
                        self.removed_first += 1  # a replacement that removed first
                        wipe_after_remove_first(self, ensemble)
                self._ensemble_seen = ensemble
                self.ensemble_changes += 1
                self.note(f"register ensemble {ensemble}")
            self._record_seen = record
            checker.check(logs, self.members, self.store, ensemble)
            if self.live_from >= 0:
                if self.live_probe_end >= 0 and all(
                    logs[m].end_at(logs[m].commit_index) >= self.live_probe_end for m in ensemble
                ):
                    checker.check_final()
                    return
                if time > self.live_from + config.liveness_ticks_max:
                    raise Violation(
                        "liveness",
                        f"no progress {config.liveness_ticks_max} ticks after the faults stopped: {self.describe()}",
                    )

    def describe(self) -> str:
        parts = [repr(m.member) if m.member is not None else f"{m.name} down" for m in self.members]
        parts += [
            repr(c.core) if c.core is not None else f"{c.name} down" for c in self.coordinators
        ]
        parts.append(f"register {self.register.read()}")
        return "; ".join(parts)

    # --- Observations --------------------------------------------------------------------------

    def on_ack(self, client: str, sent_at: int, acked: Acked) -> None:
        if self.trace is not None:
            self.trace.append(f"{self.net.now:5d} {client} acked {acked}")
        self.checker.on_ack(acked)
        if self.live_from >= 0 and sent_at >= self.live_from and self.live_probe_end < 0:
            self.live_probe_end = acked.end

    def read_from(self, name: str, rng: random.Random) -> None:
        node = self.nodes[name]
        if not isinstance(node, MemberNode) or node.member is None:
            return
        limit = node.member.read_limit
        offset = rng.randint(0, limit)
        end = min(limit, offset + 32)
        base_end = node.log.base.end
        data = bytes(self.store[offset : min(end, base_end)]) if offset < base_end else b""
        data += node.log.read(max(offset, base_end), end) if end > base_end else b""
        self.checker.on_read(name, offset, data)

    # --- Faults (chaos.py, faults.py, double_faults.py) -----------------------------------------

    def on_new_leader(self, node: MemberNode) -> None:
        rng = self.net.rng
        if self.live_from < 0 and self.early_crash_p and rng.random() < self.early_crash_p:
            self.net.timer(rng.randint(1, 6), node.name, (CRASH, node.incarnation))

    def crash(self, name: str) -> None:
        if self.live_from < 0:
            faults.crash(self, name)

    def note(self, what: str) -> None:
        """A line of the trace for what the chaos did."""
        if self.trace is not None:
            self.trace.append(f"{self.net.now:5d} CHAOS {what}")


def run_seed(
    seed: int,
    config: SimConfig | None = None,
    rules: Rules = CORRECT_RULES,
    trace: bool = False,
) -> SimResult:
    """Run one seed; never raises for a protocol failure (it is the result's violation)."""
    world = World(seed, config or SimConfig(), rules, trace)
    violation: Violation | None = None
    try:
        world.run()
    except Violation as exc:
        violation = exc
    except (QuorumError, QuorumInvariantError) as exc:
        violation = Violation("protocol", f"{type(exc).__name__}: {exc}")
    if violation is not None and world.trace is not None:
        world.trace.append(f"{world.net.now:5d} VIOLATION {violation}")
        world.trace.append(f"      state: {world.describe()}")
    return SimResult(
        seed=seed,
        violation=violation,
        steps=world.steps,
        time=world.net.now,
        members=len(world.initial),
        acked=world.checker.acked_count,
        reads=world.checker.read_count,
        terms=world.register.read().record.term,
        crashes=world.crashes,
        disk_losses=world.disk_losses,
        ensemble_changes=world.ensemble_changes,
        removed_first=world.removed_first,
        removed_then_lost=world.removed_then_lost,
        fallbacks=world.fallbacks,
        outsider_ticks=world.outsider_ticks,
        deposed_wipes=world.deposed_wipes,
        late_deliveries=world.net.stats.late,
        registers_verified=world.checker.registers_verified,
        mismatches_verified=world.checker.mismatches_verified,
        trace=world.trace,
        delivered=world.delivered,
    )
