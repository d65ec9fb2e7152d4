"""A few decoded trajectories of every step, for people to read: `samples.jsonl` in the run folder."""

from __future__ import annotations

import json
from pathlib import Path


class SampleKeeper:
    """Writes the first few trajectories of every step, decoded, to samples.jsonl."""

    def __init__(self, path: Path, tokenizer_dir: Path, per_step: int = 4):
        from transformers import AutoTokenizer

        self.path = path
        self.tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
        self.per_step = per_step

    def __call__(self, step: int, trajectories: list) -> None:
        with open(self.path, "a") as f:
            for t in trajectories[: self.per_step]:
                f.write(json.dumps({
                    "step": step, "task": t.task_id, "group": t.group_id, "sample": t.sample_index,
                    "outcome": t.outcome.value, "cause": t.cause.value if t.cause else None, "reward": t.reward,
                    "versions": list(t.versions), "text": self.tokenizer.decode(t.token_ids.tolist()),
                    "detail": t.metadata.get("detail"),
                }) + "\n")
