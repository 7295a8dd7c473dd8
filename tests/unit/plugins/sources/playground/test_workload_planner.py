"""The workload planner: every transaction follows from the seed alone."""

from __future__ import annotations

from cdcflow.plugins.sources.playground.workload import WorkloadPlanner


def test_planner_is_deterministic_for_a_seed() -> None:
    a, b, c = WorkloadPlanner(seed=3, ddl_every=10), WorkloadPlanner(seed=3, ddl_every=10), WorkloadPlanner(seed=4)
    plans_a = [a.next_plan() for _ in range(300)]
    assert plans_a == [b.next_plan() for _ in range(300)]
    assert plans_a != [c.next_plan() for _ in range(300)]
    kinds = {op.kind for plan in plans_a for op in plan.ops}
    assert kinds == {"insert", "update", "delete"}
    assert any(plan.ddl is not None for plan in plans_a)
    assert any(len(plan.ops) > 1 and len({op.table for op in plan.ops}) > 1 for plan in plans_a)
    assert any(len(plan.ops) >= 100 for plan in plans_a)
