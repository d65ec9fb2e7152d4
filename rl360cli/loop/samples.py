"""What people read of a step's samples: `samples.jsonl` in the run folder.

The first few trajectories of every step, decoded, and every sample whose infrastructure failed,
with its cause and detail (no text): a masked sample is otherwise only a count by cause in
metrics.jsonl and a cause in the ledger, and an `unknown` one needs its detail to be looked at.
"""

from __future__ import annotations

import json
from pathlib import Path

from rl360cli.outcome import Outcome


class SampleKeeper:
    """Appends a step's first `per_step` trajectories (decoded) and its infra failures to samples.jsonl."""

    def __init__(self, path: Path, tokenizer_dir: Path, per_step: int = 4):
        from transformers import AutoTokenizer

        self.path = path
        self.tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
        self.per_step = per_step

    def __call__(self, step: int, trajectories: list) -> None:
        with open(self.path, "a") as f:
            for i, t in enumerate(trajectories):
                decoded = i < self.per_step
                if not decoded and t.outcome != Outcome.INFRA_FAILURE:
                    continue
                f.write(json.dumps({
                    "step": step, "task": t.task_id, "group": t.group_id, "sample": t.sample_index,
                    "outcome": t.outcome.value, "cause": t.cause.value if t.cause else None, "reward": t.reward,
                    "versions": list(t.versions), "node": t.metadata.get("node"), "detail": t.metadata.get("detail"),
                    "text": self.tokenizer.decode(t.token_ids.tolist()) if decoded else None,
                }) + "\n")
