"""samples.jsonl: a step's first trajectories decoded, and every infra failure with its detail."""

from __future__ import annotations

import json

from rl360cli.inference.testing import build_tiny_test_model
from rl360cli.loop.samples import SampleKeeper
from rl360cli.outcome import InfraCause
from tests.rl.factories import make_trajectory


def test_every_masked_sample_is_kept_with_its_detail(tmp_path):
    keeper = SampleKeeper(tmp_path / "samples.jsonl", build_tiny_test_model(tmp_path / "tiny"), per_step=2)
    trajectories = [make_trajectory(group_id="g0", sample_index=i, seed=i) for i in range(5)]
    trajectories[1] = make_trajectory(group_id="g0", sample_index=1, reward=None, cause=InfraCause.SANDBOX_LOST,
                                      metadata={"detail": "container gone", "node": "n2"})
    trajectories[4] = make_trajectory(group_id="g0", sample_index=4, reward=None, cause=InfraCause.UNKNOWN,
                                      metadata={"detail": "the agent raised KeyError: 'x'", "node": "n1"})
    keeper(3, trajectories)
    rows = [json.loads(line) for line in (tmp_path / "samples.jsonl").read_text().splitlines()]
    assert [(r["sample"], r["cause"], r["text"] is not None) for r in rows] == \
        [(0, None, True), (1, "sandbox_lost", True), (4, "unknown", False)]
    assert rows[2] == {**rows[2], "step": 3, "detail": "the agent raised KeyError: 'x'", "node": "n1",
                       "outcome": "infra_failure"}
    assert isinstance(rows[0]["text"], str)
