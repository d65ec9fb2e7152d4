"""The torch trainer: GRPO updates of any Hugging Face causal LM, on CPU or one GPU.

It recomputes the policy's logprobs of every generated token, takes the GRPO
loss from `rl360cli.rl.grpo`, and steps AdamW with gradient clipping over
micro-batches cut by a token budget. Checkpoints hold the model in Hugging
Face format, the optimizer, and the loop's own state, so that a run resumes
exactly where it stopped.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import torch

from rl360cli.rl.config import GRPOConfig
from rl360cli.rl.grpo import policy_loss
from rl360cli.rl.train_batch import TrainBatch
from rl360cli.trainer.config import TrainerConfig


class TorchTrainer:
    def __init__(self, model_dir: Path, config: TrainerConfig, grpo: GRPOConfig, *, seed: int = 0,
                 device: str = "cpu"):
        from transformers import AutoModelForCausalLM

        torch.manual_seed(seed)
        self.config = config
        self.grpo = grpo
        self.device = torch.device(device)
        self.model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).to(self.device)
        self.model.train()
        self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=config.lr, betas=tuple(config.betas),
                                           weight_decay=config.weight_decay)
        self.version = 0

    def train_step(self, batch: TrainBatch) -> dict[str, float]:
        """One policy update on `batch` (num_epochs passes); the policy version goes up by one."""
        totals: dict[str, float] = {}
        for _ in range(self.config.num_epochs):
            self.optimizer.zero_grad(set_to_none=True)
            for micro in batch.split(max_tokens=self.config.micro_batch_tokens):
                logprobs = self.logprobs(micro.input_ids, micro.attention_mask)
                loss, stats = policy_loss(
                    logprobs, micro.old_logprobs, micro.advantages, micro.loss_mask,
                    denominator=micro.loss_denominator(self.grpo.aggregation, norm_tokens=self.grpo.norm_tokens),
                    **self.grpo.loss_kwargs(),
                )
                loss.backward()
                # Each micro-batch's loss is its share of the whole: sums are the batch's figures,
                # token-weighted means come out right after dividing by the token count below.
                for name in ("loss", "pg_loss", "kl_loss"):
                    totals[name] = totals.get(name, 0.0) + getattr(stats, name)
                for name in ("clip_frac", "ratio_mean", "approx_kl"):
                    totals[name] = totals.get(name, 0.0) + getattr(stats, name) * stats.num_tokens
                totals["tokens"] = totals.get("tokens", 0.0) + stats.num_tokens
            clip = self.config.grad_clip if self.config.grad_clip > 0 else float("inf")
            totals["grad_norm"] = float(torch.nn.utils.clip_grad_norm_(self.model.parameters(), clip))
            self.optimizer.step()
        self.version += 1
        tokens = max(totals.pop("tokens", 0.0), 1.0)
        epochs = self.config.num_epochs
        return {
            "loss": totals["loss"] / epochs, "pg_loss": totals["pg_loss"] / epochs,
            "kl_loss": totals["kl_loss"] / epochs, "grad_norm": totals["grad_norm"],
            **{name: totals[name] / tokens for name in ("clip_frac", "ratio_mean", "approx_kl")},
        }

    def logprobs(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        """log pi(token t+1 | tokens <= t) at every position t, [B, T-1] (prediction-aligned)."""
        input_ids = input_ids.to(self.device)
        logits = self.model(input_ids=input_ids, attention_mask=attention_mask.to(self.device)).logits
        logp = torch.log_softmax(logits[:, :-1].float(), dim=-1)
        return logp.gather(-1, input_ids[:, 1:, None])[..., 0]

    def named_tensors(self) -> Iterator[tuple[str, torch.Tensor]]:
        """The weights the engines need, by the names their models use."""
        for name, param in self.model.named_parameters():
            yield name, param.detach()

    # ------------------------------------------------------------------ checkpoints

    def save_checkpoint(self, path: Path, loop_state: dict) -> None:
        tmp = path.with_name(path.name + ".tmp")
        tmp.mkdir(parents=True, exist_ok=True)
        self.model.save_pretrained(tmp / "model")
        torch.save(self.optimizer.state_dict(), tmp / "optimizer.pt")
        (tmp / "loop_state.json").write_text(json.dumps({**loop_state, "version": self.version}))
        if path.exists():
            import shutil

            shutil.rmtree(path)
        tmp.rename(path)

    def load_checkpoint(self, path: Path) -> dict:
        from transformers import AutoModelForCausalLM

        self.model = AutoModelForCausalLM.from_pretrained(path / "model", dtype=torch.float32).to(self.device)
        self.model.train()
        self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=self.config.lr,
                                           betas=tuple(self.config.betas), weight_decay=self.config.weight_decay)
        self.optimizer.load_state_dict(torch.load(path / "optimizer.pt", weights_only=True))
        state = json.loads((path / "loop_state.json").read_text())
        self.version = state["version"]
        return state


def latest_checkpoint(run_dir: Path) -> Path | None:
    """The newest complete checkpoint of a run (`checkpoints/step_000012`), if any."""
    found = sorted(p for p in (run_dir / "checkpoints").glob("step_*") if (p / "loop_state.json").exists())
    return found[-1] if found else None
