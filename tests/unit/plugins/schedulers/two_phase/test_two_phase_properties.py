"""Stateful property tests of the two-phase scheduler against real agents.

The network between the scheduler and the agents loses, repeats and reorders
messages; captures die and join; the maintainer fails over to a new epoch;
tables are moved by hand. After every step the invariants hold; at the end,
with a calm network and live captures, every span replicates.
"""

import asyncio

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from cdcflow.core.control.scheduling import Agent, InvalidScheduleRequestError, ReplicationState
from cdcflow.core.data.events import Span
from cdcflow.core.data.span_executor import SpanState
from cdcflow.core.testing.scheduling import MemorySpanExecutor
from cdcflow.plugins.schedulers.two_phase import TwoPhaseConfig, TwoPhaseScheduler

SPANS = [Span(t, b"", b"") for t in range(6)]
START_TS = 100
MOVING = (ReplicationState.PREPARE, ReplicationState.COMMIT)


class TwoPhaseUnderChaos(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.epoch = 1
        self.scheduler = self._new_scheduler()
        self.executors: dict[str, MemorySpanExecutor] = {}
        self.agents: dict[str, Agent] = {}
        self.next_capture = 0
        for _ in range(3):
            self._join()
        self.to_agents: list = []  # requests in flight
        self.to_scheduler: list = []  # responses in flight
        self.ts = START_TS
        self.seen_checkpoint: dict[Span, tuple[int, int]] = {}
        self.seen_watermark = (0, 0)
        self.watermark_epoch = 1
        self.flushed: dict[Span, int] = dict.fromkeys(SPANS, START_TS)
        self.starts_checked: dict[str, int] = {}
        # Spans whose move started from a replicating primary, still in flight.
        self.moves: set[Span] = set()

    @initialize()
    def everything_replicates(self):
        for _ in range(6):
            self.calm_round()

    @rule()
    def calm_round(self):
        """One tick with every message delivered in order."""
        self._tick(self.to_scheduler)
        self.to_scheduler = []
        requests, self.to_agents = self.to_agents, []
        for capture in list(self.agents):
            mine = [m for m in requests if m.capture_id == capture]
            self.to_scheduler += asyncio.run(self.agents[capture].handle(mine))
        self._check_replication_starts()

    def _new_scheduler(self) -> TwoPhaseScheduler:
        s = TwoPhaseScheduler(TwoPhaseConfig(max_concurrent_moves=2))
        s.bind("cf", self.epoch)
        return s

    def _join(self) -> str:
        name = f"c{self.next_capture}"
        self.next_capture += 1
        self.executors[name] = MemorySpanExecutor(prepare_polls=1, stop_polls=1)
        self.agents[name] = Agent("cf", name, self.executors[name])
        return name

    # -- the scheduler's tick and the network -------------------------------------

    @rule(data=st.data())
    def chaotic_round(self, data):
        """A tick, then each capture gets some of its requests, in any order, some twice."""
        inbox = data.draw(st.permutations(self.to_scheduler)) if self.to_scheduler else []
        again = data.draw(st.lists(st.sampled_from(inbox), max_size=2)) if inbox else []
        self.to_scheduler = list(again)  # delivered once more, later
        self._tick(inbox)
        for capture in data.draw(st.permutations(sorted(self.agents))):
            mine = [m for m in self.to_agents if m.capture_id == capture]
            picked = data.draw(st.lists(st.sampled_from(mine), max_size=len(mine) + 1)) if mine else []
            if not data.draw(st.booleans()):  # else they may arrive again later
                self.to_agents = [m for m in self.to_agents if m not in picked]
            self.to_scheduler += asyncio.run(self.agents[capture].handle(picked))
            self._check_replication_starts()
            self.at_most_one_capture_replicates_a_span()

    def _tick(self, inbox):
        # The maintainer passes the checkpoint it persisted (the last watermark).
        persisted = max(START_TS, self.seen_watermark[0])
        result = self.scheduler.tick(checkpoint_ts=persisted, spans=SPANS, captures=list(self.agents), messages=inbox)
        self.to_agents += result.messages
        if result.watermark is not None:
            wm = (result.watermark.checkpoint_ts, result.watermark.resolved_ts)
            assert wm[0] >= self.seen_watermark[0], "checkpoint regressed"
            # Resolved ts is not persisted: it may restart lower only after a failover.
            assert wm[1] >= self.seen_watermark[1] or self.epoch != self.watermark_epoch, "resolved ts regressed"
            self.seen_watermark, self.watermark_epoch = wm, self.epoch
        self._check_moves()

    @rule(data=st.data())
    def lose_messages(self, data):
        if self.to_agents:
            lost = data.draw(st.sampled_from(self.to_agents))
            self.to_agents = [m for m in self.to_agents if m is not lost]
        if self.to_scheduler:
            lost = data.draw(st.sampled_from(self.to_scheduler))
            self.to_scheduler = [m for m in self.to_scheduler if m is not lost]

    @rule(step=st.integers(1, 50))
    def data_flows(self, step):
        self.ts += step
        for executor in self.executors.values():
            executor.advance(self.ts)
            for span in executor.spans():
                status = executor.status(span)
                if status.state is SpanState.REPLICATING:
                    self.flushed[span] = max(self.flushed[span], status.checkpoint_ts)

    # -- failures and operations ---------------------------------------------------

    @precondition(lambda self: len(self.agents) > 1)
    @rule(data=st.data())
    def kill_capture(self, data):
        victim = data.draw(st.sampled_from(sorted(self.agents)))
        self.executors.pop(victim).crash()
        del self.agents[victim]

    @precondition(lambda self: len(self.agents) < 4)
    @rule()
    def join_capture(self):
        self._join()

    @rule()
    def maintainer_failover(self):
        self.epoch += 1
        self.scheduler = self._new_scheduler()
        self.moves.clear()

    @rule(data=st.data())
    def move_table(self, data):
        table = data.draw(st.sampled_from(SPANS)).table_id
        target = data.draw(st.sampled_from(sorted(self.agents)))
        try:
            self.scheduler.move_table(table, target)
        except InvalidScheduleRequestError:
            assert target not in self.scheduler._captures or not self.scheduler.manager.sets

    # -- invariants ----------------------------------------------------------------

    @invariant()
    def at_most_one_capture_replicates_a_span(self):
        for span in SPANS:
            writers = [c for c, e in self.executors.items() if e.status(span).state is SpanState.REPLICATING]
            assert len(writers) <= 1, f"{span} replicated by {writers}"

    @invariant()
    def one_primary_and_monotonic_checkpoints(self):
        for rs in self.scheduler.manager.sets.values():
            assert rs.primary is None or rs.primary != rs.secondary
            key = (self.epoch, rs.span)
            before = self.seen_checkpoint.get(key, (0, 0))
            assert rs.checkpoint_ts >= before[0] and rs.resolved_ts >= before[1], "set checkpoint regressed"
            assert rs.resolved_ts >= rs.checkpoint_ts
            self.seen_checkpoint[key] = (rs.checkpoint_ts, rs.resolved_ts)

    def _check_moves(self):
        """During a move the primary role is never empty, unless the primary capture died."""
        sets = self.scheduler.manager.sets
        for span in list(self.moves):
            rs = sets[span]
            if rs.state not in MOVING:
                self.moves.discard(span)
            elif rs.primary is None:
                assert rs.secondary is not None and rs.state is ReplicationState.PREPARE
                self.moves.discard(span)  # the source died: the move became an add
        for span, rs in sets.items():
            if rs.is_moving and rs.state is ReplicationState.PREPARE:
                self.moves.add(span)
                # Phase one of a move: the source still replicates (or it died unseen).
                if rs.primary in self.executors:
                    assert self.executors[rs.primary].status(span).state is SpanState.REPLICATING

    def _check_replication_starts(self):
        """No gap: a capture starts writing at or below what was flushed before."""
        for capture, executor in self.executors.items():
            done = self.starts_checked.get(capture, 0)
            for span, from_ts in executor.replication_starts[done:]:
                assert from_ts <= self.flushed[span], f"gap on {span}: starts at {from_ts}"
            self.starts_checked[capture] = len(executor.replication_starts)

    def teardown(self):
        # A calm network: everything delivered, in order, every tick.
        for _ in range(60):
            self.calm_round()
            self.at_most_one_capture_replicates_a_span()
        for rs in self.scheduler.manager.sets.values():
            assert rs.state is ReplicationState.REPLICATING, rs
            assert self.executors[rs.primary].status(rs.span).state is SpanState.REPLICATING
        counts = [sum(rs.primary == c for rs in self.scheduler.manager.sets.values()) for c in self.agents]
        assert max(counts) - min(counts) <= 1, counts


TwoPhaseUnderChaos.TestCase.settings = settings(
    max_examples=200,
    stateful_step_count=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
test_two_phase_under_chaos = TwoPhaseUnderChaos.TestCase
