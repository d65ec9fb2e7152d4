"""The scale bench's rate at peak (bench/bench_scale_sim.py `busy_seconds`): the actors' ledgers merged by
wall-clock second, each reading carried forward, and only the seconds with enough sandboxes live."""

from __future__ import annotations

from bench.bench_scale_sim import busy_seconds, recipe_latencies


def test_busy_seconds_sum_the_actors_and_keep_only_the_seconds_at_the_peak():
    # Two actors; readings are (second, sandboxes live, agent commands so far) at each second's first command.
    first = {"timeline": [(100, 10, 0), (101, 40, 50), (102, 40, 120), (104, 5, 200)]}
    second = {"timeline": [(100, 10, 0), (102, 40, 90), (103, 30, 150), (104, 2, 160)]}
    # Live: 100: 20, 101: 40 + 10 (carried), 102: 80, 103: 40 (carried) + 30, 104: 7.
    # Agent commands so far: 100: 0, 101: 50, 102: 210, 103: 120 + 150 = 270, 104: 360.
    assert busy_seconds([first, second], at_least=50) == {101: 160, 102: 60, 103: 90}
    assert busy_seconds([first, second], at_least=80) == {102: 60}
    assert busy_seconds([first, second], at_least=81) == {}


def test_a_gap_with_no_command_at_all_is_not_counted_as_one_second():
    ledger = {"timeline": [(10, 100, 0), (11, 100, 30), (15, 100, 40)]}
    assert busy_seconds([ledger], at_least=1) == {10: 30}


def test_the_latencies_the_bench_scales_are_read_from_the_recipe():
    latencies = recipe_latencies()
    assert set(latencies) == {"engine.simulated.per_token_ms", "sandbox.simulated.exec_median_s",
                              "sandbox.simulated.start_latency_s", "sandbox.simulated.verifier_latency_s",
                              "trainer.simulated.step_s"}
    assert all(isinstance(v, float) and v > 0 for v in latencies.values())
