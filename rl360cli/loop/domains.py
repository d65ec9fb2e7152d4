"""A step's figures per task domain: the reward and pass rate of each tag's sessions, as the RL360 release logs
them (`reward/domain/<tag>`), beside the step's reward over every session and over the kept ones.

A task's tags are its `[metadata] tags` in task.toml (Harbor's field), or those a calibration manifest gives it
(`rl360 tasks calibrate`); a session carries them in its metadata (rl360cli/agent/session.py). A session counts
once (its first segment), and only a valid one (an infra failure has no reward). A verifier's several metrics
(reward.json's keys, Harbor's multi-metric rewards) each get their mean, `reward/metric/<key>`.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence

from rl360cli.rl.trajectory import Trajectory


def domain_figures(trajectories: Sequence[Trajectory], kept: Sequence[Trajectory], *,
                   pass_threshold: float = 1.0) -> dict[str, float | int]:
    """`reward_mean_all` (every valid session of the step, all generation rounds), `reward_mean_kept` (the
    sessions the batch trained on), and per tag `reward/domain/<tag>`, `pass_rate/domain/<tag>` and
    `sessions/domain/<tag>`."""
    sessions = [t for t in trajectories if t.segment == 0 and t.is_valid]
    trained = [t for t in kept if t.segment == 0]
    figures: dict[str, float | int] = {}
    if sessions:
        figures["reward_mean_all"] = sum(t.reward for t in sessions) / len(sessions)
    if trained:
        figures["reward_mean_kept"] = sum(t.reward for t in trained) / len(trained)
    by_tag: dict[str, list[float]] = defaultdict(list)
    for t in sessions:
        for tag in t.metadata.get("tags") or ():
            by_tag[str(tag)].append(t.reward)
    for tag, rewards in sorted(by_tag.items()):
        figures[f"reward/domain/{tag}"] = sum(rewards) / len(rewards)
        figures[f"pass_rate/domain/{tag}"] = sum(r >= pass_threshold for r in rewards) / len(rewards)
        figures[f"sessions/domain/{tag}"] = len(rewards)
    # A verifier that writes several metrics (Harbor's reward.json): each one's mean over the sessions with it.
    by_metric: dict[str, list[float]] = defaultdict(list)
    for t in sessions:
        for key, value in (t.metadata.get("rewards") or {}).items():
            by_metric[str(key)].append(float(value))
    for key, values in sorted(by_metric.items()):
        figures[f"reward/metric/{key}"] = sum(values) / len(values)
    return figures
