"""metrics.jsonl across a resume: the steps a resumed run trains again keep one row each."""

from __future__ import annotations

import json

from rl360cli.metrics import MetricsLogger, drop_steps_from, read_metrics


def test_a_resume_replaces_the_rows_of_the_steps_it_runs_again(tmp_path):
    logger = MetricsLogger(tmp_path, run_name="r", project="p", config={}, use_wandb=False)
    for step in range(4):
        logger.log(step, {"reward_mean": step / 10})
    with open(logger.path, "a") as f:
        f.write('{"step": 4, "rew')  # a crash cut the last line short

    assert drop_steps_from(logger.path, 2) == 3
    for step in (2, 3):
        logger.log(step, {"reward_mean": 1.0})
    rows = read_metrics(logger.path)
    assert [row["step"] for row in rows] == [0, 1, 2, 3]
    assert [row["reward_mean"] for row in rows] == [0.0, 0.1, 1.0, 1.0]


def test_nothing_to_drop_leaves_the_file_as_it_was(tmp_path):
    path = tmp_path / "samples.jsonl"
    assert drop_steps_from(path, 0) == 0 and not path.exists()
    path.write_text(json.dumps({"step": 0, "text": "x"}) + "\n")
    before = path.stat().st_mtime_ns
    assert drop_steps_from(path, 1) == 0
    assert path.stat().st_mtime_ns == before and read_metrics(path) == [{"step": 0, "text": "x"}]
