"""A step's figures per task domain (rl360cli/loop/domains.py), from trajectories built by hand."""

from __future__ import annotations

from rl360cli.loop.domains import domain_figures
from rl360cli.outcome import InfraCause, Outcome
from rl360cli.rl.trajectory import Trajectory


def session(reward: float | None, tags: list[str], *, sample: int, segment: int = 0,
            rewards: dict[str, float] | None = None) -> Trajectory:
    valid = reward is not None
    return Trajectory(task_id="t", group_id="g", sample_index=sample, segment=segment, token_ids=[1, 2, 3],
                      loss_mask=[0, 1, 1], logprobs=[0.0, -0.5, -0.5], versions=(0,), num_prompt_tokens=1,
                      reward=reward, outcome=Outcome.OK if valid else Outcome.INFRA_FAILURE,
                      cause=None if valid else InfraCause.SANDBOX_START,
                      metadata={"tags": tags, **({"rewards": rewards} if rewards else {})})


def test_each_tag_gets_its_sessions_reward_and_pass_rate_and_a_session_counts_once():
    sessions = [session(1.0, ["strings"], sample=0), session(1.0, ["strings"], sample=0, segment=1),
                session(0.0, ["strings", "parsing"], sample=1), session(0.5, ["parsing"], sample=2),
                session(None, ["parsing"], sample=3), session(1.0, [], sample=4)]
    figures = domain_figures(sessions, kept=sessions[:3])
    assert figures["reward/domain/strings"] == 0.5 and figures["pass_rate/domain/strings"] == 0.5
    assert figures["sessions/domain/strings"] == 2  # its second segment is the same session
    assert figures["reward/domain/parsing"] == 0.25 and figures["sessions/domain/parsing"] == 2  # not the masked
    assert figures["reward_mean_all"] == 2.5 / 4 and figures["reward_mean_kept"] == 0.5


def test_no_tags_no_domain_figures():
    assert [k for k in domain_figures([session(1.0, [], sample=0)], kept=[]) if "domain" in k] == []


def test_a_verifiers_several_metrics_each_get_their_mean_over_the_valid_sessions():
    sessions = [session(0.5, [], sample=0, rewards={"reward": 0.5, "style": 1.0}),
                session(0.5, [], sample=0, segment=1, rewards={"reward": 0.5, "style": 1.0}),
                session(1.0, [], sample=1, rewards={"reward": 1.0, "style": 0.0, "speed": 0.25}),
                session(None, [], sample=2, rewards={"reward": 0.0, "style": 0.0}), session(1.0, [], sample=3)]
    figures = domain_figures(sessions, kept=[])
    assert figures["reward/metric/reward"] == 0.75 and figures["reward/metric/style"] == 0.5
    assert figures["reward/metric/speed"] == 0.25  # only the session that has it
