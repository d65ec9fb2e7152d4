"""The further rounds' accounting of bench/bench_round_yield.py, on ledger entries written by the real
`step_entry`: the first round's groups split into signal, all passed and all failed; what each further
round sampled and kept; and a task's further groups counted by how long its first-round group has had no signal."""

from __future__ import annotations

from bench.bench_round_yield import group_round, yields
from rl360cli.loop.ledger import step_entry

SAMPLES = 2


def entry(step: int, *, trained: dict[str, list[float]], generated: list[str]) -> dict:
    """A step that trained the groups of `trained` (group -> its samples' rewards) and generated `generated`."""
    rewards = {f"{group}-{i}": r for group, values in trained.items() for i, r in enumerate(values)}
    return step_entry(step, policy_version=step + 1, trained_groups=list(trained), trained_tasks=[],
                      generated_groups=generated, trained_samples=rewards)


def test_group_ids_name_their_round_and_task():
    assert group_round("s3-r0-arith-07") == ("r0", "arith-07")
    assert group_round("s3-r2-arith-07.2") == ("r2", "arith-07")


def test_first_rounds_and_further_rounds_are_counted_by_kind_and_history():
    # Three tasks, 2 samples a group. Step 0: a has signal, b all passed, c all failed.
    step0 = entry(0, trained={"s0-r0-a": [1.0, 0.0]}, generated=["s0-r0-a", "s0-r0-b", "s0-r0-c"])
    # Step 1: b and c again without signal; b's second round has signal, c's does not, c's third round neither.
    step1 = entry(1, trained={"s1-r0-a": [0.0, 1.0], "s1-r1-b": [1.0, 0.0]},
                  generated=["s1-r0-a", "s1-r0-b", "s1-r0-c", "s1-r1-b", "s1-r1-c", "s1-r2-c"])
    # Step 2: only a lacks signal now (all passed), for the first time; its second round keeps it.
    step2 = entry(2, trained={"s2-r0-b": [1.0, 0.0], "s2-r0-c": [0.0, 1.0], "s2-r1-a": [0.0, 1.0]},
                  generated=["s2-r0-a", "s2-r0-b", "s2-r0-c", "s2-r1-a"])
    # First-round mean rewards: step 0 (1 + 2 + 0) / 6, step 1 (1 + 2 + 0) / 6, step 2 (2 + 1 + 1) / 6.
    result = yields([step2, step0, step1], {0: 0.5, 1: 0.5, 2: 4 / 6}, samples=SAMPLES)

    assert [(s["step"], s["first_round_signal"], s["all_passed"], s["all_failed"]) for s in result["steps"]] == [
        (0, 1, 1, 1), (1, 1, 1, 1), (2, 2, 1, 0)]
    assert [(s["further_sampled"], s["further_kept"]) for s in result["steps"]] == [(0, 0), (3, 1), (1, 1)]
    history = result["by_history"]
    # Step 1: b and c had no signal in step 0's first round either; c twice sampled again, never kept.
    assert history[(1, "and the step before", "sampled")] == 3
    assert history[(1, "and the step before", "kept")] == 1
    # Step 2: a had signal in step 1's first round, so its group is counted as "this step only".
    assert history[(2, "this step only", "sampled")] == 1
    assert history[(2, "this step only", "kept")] == 1
    assert history[(2, "and the two steps before", "sampled")] == 0
