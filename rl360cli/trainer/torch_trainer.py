"""The torch trainer: GRPO updates of any Hugging Face causal LM, on CPU or one GPU.

It recomputes the policy's logprobs of every generated token (each distinct prompt of a
micro-batch once: `trainer.share_prompts`) and runs the
shared step loop (`rl360cli.trainer.step`: the GRPO loss of `rl360cli.rl.grpo`,
AdamW with gradient clipping over micro-batches cut by a token budget).
Checkpoints hold the model in Hugging Face format, the optimizer, and the
loop's own state, so that a run resumes exactly where it stopped.

`trainer.precision = "bf16"` runs each forward pass under bf16 autocast (the backward follows the
forward's dtypes) with the weights and AdamW's state in float32; "fp32" (the default) computes in
float32 throughout. Its logprobs' agreement with the engine's: tests/trainer/test_precision.py.

`trainer.lora` trains a LoRA adapter on frozen weights (rl360cli/trainer/lora.py): AdamW and gradient
clipping over the adapter alone, checkpoints of the adapter (peft's format) instead of the model, and
`named_tensors()` the targeted weights with the adapter merged in, all the engines need beside policy v0.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import torch

from rl360cli.errors import Rl360Error
from rl360cli.rl.config import GRPOConfig
from rl360cli.rl.train_batch import TrainBatch
from rl360cli.trainer.config import TrainerConfig
from rl360cli.trainer.fault_points import fault_point
from rl360cli.trainer.lora import add_adapter, load_adapter, merged_weights, save_adapter
from rl360cli.trainer.protocol import logprob_temperature
from rl360cli.trainer.shared_prompts import logprobs_sharing_prompts
from rl360cli.trainer.step import train_step


ADAPTER_DIR = "adapter"  # a LoRA checkpoint's adapter, where a full one has `model`


class TorchTrainer:
    def __init__(self, model_dir: Path, config: TrainerConfig, grpo: GRPOConfig, *, seed: int = 0,
                 device: str = "cpu", temperature: float = 1.0):
        from transformers import AutoModelForCausalLM

        torch.manual_seed(seed)
        self.config = config
        self.grpo = grpo
        self.temperature = logprob_temperature(temperature)
        self.device = torch.device(device)
        self.model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).to(self.device)
        if config.lora is not None:  # after the seed: the adapter's A is drawn from it
            add_adapter(self.model, config.lora)
        self.model.train()
        self.optimizer = self._new_optimizer()
        self.version = 0
        if config.precision == "bf16" and self.device.type == "cuda":
            # What autocast leaves in float32 (the optimizer's own math aside) runs on TF32 tensor cores.
            # Process-wide: the trainer owns its process.
            torch.backends.cuda.matmul.allow_tf32 = True
            torch.backends.cudnn.allow_tf32 = True
            torch.set_float32_matmul_precision("high")

    def train_step(self, batch: TrainBatch) -> dict[str, float]:
        """One policy update on `batch` (num_epochs passes); the policy version goes up by one."""
        clip = self.config.grad_clip if self.config.grad_clip > 0 else float("inf")
        share = self.config.share_prompts
        stats = train_step(
            batch.split(max_tokens=self.config.micro_batch_tokens, keep_groups=share), grpo=self.grpo,
            num_epochs=self.config.num_epochs, optimizer=self.optimizer, lr=self.config.lr_at(self.version),
            logprobs=(lambda micro: self._shared_logprobs(micro)) if share
            else (lambda micro: self.logprobs(micro.input_ids, micro.attention_mask)),
            clip_grads=lambda: float(torch.nn.utils.clip_grad_norm_(self.trained_parameters(), clip)),
        )
        self.version += 1
        return stats

    def logprobs(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        """log pi(token t+1 | tokens <= t) at every position t, [B, T-1] (prediction-aligned)."""
        input_ids = input_ids.to(self.device)
        with self._autocast():
            logits = self.model(input_ids=input_ids, attention_mask=attention_mask.to(self.device)).logits
            logp = torch.log_softmax(logits[:, :-1].float() / self.temperature, dim=-1)
        return logp.gather(-1, input_ids[:, 1:, None])[..., 0]

    def _shared_logprobs(self, micro) -> torch.Tensor:
        with self._autocast():
            return logprobs_sharing_prompts(self.model, micro, temperature=self.temperature)

    def _autocast(self) -> contextlib.AbstractContextManager:
        """The forward pass's number format (`trainer.precision`); backward runs outside it, as autocast wants."""
        if self.config.precision == "bf16":
            return torch.autocast(device_type=self.device.type, dtype=torch.bfloat16)
        return contextlib.nullcontext()

    def named_tensors(self) -> Iterator[tuple[str, torch.Tensor]]:
        """The weights the engines need, by the names their models use: every weight, or with `lora` the
        targeted ones with the adapter merged in (the others are policy v0's, which every engine holds)."""
        if self.config.lora is not None:
            yield from merged_weights(self.model)
            return
        for name, param in self.model.named_parameters():
            yield name, param.detach()

    def trained_parameters(self) -> list[torch.nn.Parameter]:
        """What the optimizer updates: every weight, or with `lora` the adapter's A and B."""
        return [param for param in self.model.parameters() if param.requires_grad]

    def close(self) -> None:
        """Nothing to release: the torch trainer is this one process."""

    def _new_optimizer(self) -> torch.optim.Optimizer:
        return torch.optim.AdamW(self.trained_parameters(), lr=self.config.lr, betas=tuple(self.config.betas),
                                 weight_decay=self.config.weight_decay)

    # ------------------------------------------------------------------ checkpoints

    def save_checkpoint(self, path: Path, loop_state: dict) -> None:
        """Model (with `lora`: the adapter alone, in `adapter/`), optimizer, RNG and `loop_state` in a staging
        folder, fsynced, then renamed in: a crash leaves either the old checkpoint set or the new one, never a
        folder that looks whole."""
        tmp = path.with_name(path.name + ".tmp")
        shutil.rmtree(tmp, ignore_errors=True)  # what an earlier crash left half-written
        tmp.mkdir(parents=True)
        if self.config.lora is not None:
            save_adapter(self.model, tmp / ADAPTER_DIR)
        else:
            self.model.save_pretrained(tmp / "model")
        torch.save(self.optimizer.state_dict(), tmp / "optimizer.pt")
        torch.save({"torch": torch.get_rng_state()}, tmp / "rng.pt")
        (tmp / "loop_state.json").write_text(json.dumps({**loop_state, "version": self.version}))
        fsync_tree(tmp)
        fault_point("checkpoint_write", int(loop_state.get("next_step", 0)) - 1)
        if path.exists():
            shutil.rmtree(path)
        tmp.rename(path)
        fsync_tree(path.parent, files=False)

    def load_checkpoint(self, path: Path) -> dict:
        from transformers import AutoModelForCausalLM

        has_adapter = (path / ADAPTER_DIR).is_dir()
        if has_adapter != (self.config.lora is not None):
            raise Rl360Error(f"checkpoint {path} holds " + ("a LoRA adapter; the recipe trains every weight" if has_adapter
                             else "a whole model; the recipe trains a LoRA adapter ([trainer.lora])"),
                             fix="resume with [trainer.lora] as the run started, or start a new run")
        if self.config.lora is not None:  # the base weights are policy v0's, frozen: only the adapter comes back
            load_adapter(self.model, self.config.lora, path / ADAPTER_DIR)
        else:
            self.model = AutoModelForCausalLM.from_pretrained(path / "model", dtype=torch.float32).to(self.device)
        self.model.train()
        self.optimizer = self._new_optimizer()
        self.optimizer.load_state_dict(torch.load(path / "optimizer.pt", weights_only=True))
        if (path / "rng.pt").is_file():  # checkpoints from before the RNG was kept have none
            torch.set_rng_state(torch.load(path / "rng.pt", weights_only=True)["torch"])
        state = json.loads((path / "loop_state.json").read_text())
        self.version = state["version"]
        return state


def fsync_tree(folder: Path, *, files: bool = True) -> None:
    """Flush `folder`'s files (with `files`) and its directory entries to disk, so a rename that
    follows publishes complete files even across a power loss."""
    if files:
        for item in folder.rglob("*"):
            if item.is_file():
                with open(item, "rb") as f:
                    os.fsync(f.fileno())
    for directory in ([folder, *(d for d in folder.rglob("*") if d.is_dir())] if files else [folder]):
        fd = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
