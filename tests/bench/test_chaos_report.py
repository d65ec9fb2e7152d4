"""The chaos bench's accounting (bench/chaos.py), on ledger entries written by the real `step_entry`:
a fault's victim that a step trained counts as an unearned reward, a masked one does not, and a trained
sample that the same step recorded as infra-failed counts wherever it is."""

from __future__ import annotations

from bench.chaos import fault_rows, render, unearned_total
from bench.chaos_faults import SandboxKilled, sample_fate
from rl360cli.loop.ledger import step_entry


class LedgerOnly:
    """Stands in for a `ChaosRun` with only its ledger (what the accounting reads); no run, no CLI."""

    def __init__(self, seen: list[tuple[float, dict]]):
        self.seen = seen

    def ledger_seen(self) -> list[tuple[float, dict]]:
        return self.seen


def entry(step: int, *, trained: list[str] | dict[str, float], masked: dict[str, str], generated: list[str]) -> dict:
    rewards = trained if isinstance(trained, dict) else dict.fromkeys(trained, 1.0)
    return step_entry(step, policy_version=step + 1, trained_groups=[s.rsplit("-", 1)[0] for s in rewards],
                      trained_tasks=[], generated_groups=[s.rsplit("-", 1)[0] for s in generated],
                      trained_samples=rewards, masked_samples=masked)


def killed(victim: str, at: float) -> SandboxKilled:
    fault = SandboxKilled()
    fault.victims, fault.fired_at, fault.recovered_at = {victim}, at, at + 5
    return fault


def test_the_ledger_names_every_sample_once():
    e = entry(3, trained=["g-0", "g-1"], masked={"g-2": "sandbox_lost"}, generated=["g-0", "g-1", "g-2", "h-0", "h-1"])
    assert e["samples"] == ["g-0", "g-1"] and e["masked"] == {"g-2": "sandbox_lost"} and e["generated"] == ["g", "h"]
    assert sample_fate(e, "g-1") == "trained, reward 1"
    assert sample_fate(e, "g-2") == "masked as sandbox_lost"
    assert sample_fate(e, "h-0").startswith("not masked, not trained")
    assert sample_fate(e, "x-0") is None


def test_a_masked_victim_is_no_unearned_reward_and_a_trained_one_is():
    seen = [(10.0, entry(0, trained=["a-0", "a-1"], masked={"a-2": "sandbox_lost"}, generated=["a-0", "a-1", "a-2"])),
            (20.0, entry(1, trained=["b-0", "b-1"], masked={}, generated=["b-0", "b-1"]))]
    run = LedgerOnly(seen)
    masked, trained = killed("a-2", 5.0), killed("b-1", 15.0)
    rows = fault_rows(run, [masked, trained])
    assert rows[0]["unearned"] == 0 and rows[0]["masked_by_cause"] == {"sandbox_lost": 1}
    assert rows[1]["unearned"] == 1 and rows[1]["masked_by_cause"] == {}
    assert unearned_total(run, [masked, trained]) == 1


def test_an_oom_victim_trained_with_a_passing_reward_earned_it_and_one_with_a_failing_reward_may_not_have():
    from bench.chaos_faults import SandboxOOM

    e = entry(0, trained={"a-0": 1.0, "a-1": 0.0}, masked={}, generated=["a-0", "a-1"])
    assert (e["samples"], e["rewards"]) == (["a-0", "a-1"], [1.0, 0.0])
    assert sample_fate(e, "a-1") == "trained, reward 0"
    passed, failed = SandboxOOM(), SandboxOOM()
    passed.victims, passed.fired_at, failed.victims, failed.fired_at = {"a-0"}, 1.0, {"a-1"}, 2.0
    rows = fault_rows(LedgerOnly([(10.0, e)]), [passed, failed])
    assert [row["unearned"] for row in rows] == [0, 1]
    # A sandbox kill's victim is unearned whatever its reward: its verifier never ran.
    assert killed("a-0", 1.0).unearned({"a-0": 1.0}) == {"a-0"}


def test_a_trained_sample_the_step_recorded_as_infra_failed_counts_outside_any_fault():
    bad = entry(0, trained=["a-0"], masked={}, generated=["a-0"])
    bad["masked"] = {"a-0": "engine_error"}  # what build_batch must never let happen
    assert unearned_total(LedgerOnly([(1.0, bad)]), []) == 1


def test_the_table_says_what_did_not_recover():
    fault = killed("a-2", 5.0)
    fault.recovered_at = None
    report = {"steps": 2, "wall_s": 60.0, "unearned_total": 0, "down_exit": 0,
              "faults": fault_rows(LedgerOnly([]), [fault]),
              "run": {"status": "finished", "step": 2, "policy_version": 2, "engine_versions": {"u": 2}},
              "leftovers": {"processes": [], "ray": [], "containers": {"n1": ["c"]}, "slurm_jobs": []}}
    text = render(report)
    assert "| sandbox container killed | — | **not recovered** |" in text
    assert "containers 1, Ray 0, Slurm jobs 0" in text
