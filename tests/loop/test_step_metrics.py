"""`step_metrics` reads the phases sessions record: the sandbox start under the attempt's own name
("start") and whether the sandbox came from a warm pool."""

from __future__ import annotations

import dataclasses

from rl360cli.loop.train_loop import step_metrics
from rl360cli.outcome import InfraCause
from rl360cli.rollout.rollouts import GenerationReport
from tests.rl.factories import make_trajectory


def test_start_latency_and_pool_hit_rate_come_from_the_sessions_records():
    made = [make_trajectory(group_id="g", sample_index=i, metadata={"pool_hit": i < 3}) for i in range(4)]
    made = [dataclasses.replace(t, timings={**t.timings, "start": 0.1 * (i + 1)}) for i, t in enumerate(made)]
    # An attempt whose sandbox never started: no start phase, no pool answer.
    made.append(make_trajectory(group_id="g", sample_index=4, reward=None, cause=InfraCause.SANDBOX_START))
    gen = GenerationReport(step=0, seconds=1.0, rounds=1, num_groups=1, first_round_rewards=[1.0] * 4)
    metrics = step_metrics(made, {}, gen, {}, None, waited_s=0.0, train_s=1.0, busy_s=1.0, hidden_s=None,
                           step_s=2.0, version=1)
    assert metrics["sandbox_start_s_mean"] == 0.25
    assert metrics["sandbox_pool_hit_rate"] == 0.75
    assert metrics["infra_failures_by_cause"] == {"sandbox_start": 1}
