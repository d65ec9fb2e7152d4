"""The megatron trainer: GRPO updates of a Llama/Qwen2 model as a megatron-core `GPTModel`, TP x DP.

The cluster counterpart of `torch_trainer.TorchTrainer`, with the same methods, the same batch
format and the same step loop (`rl360cli.trainer.step`). Every rank of a torchrun world builds
one; global rank 0 (the *leader*) is the one the RL loop talks to, the others *follow*:

    # every rank (torchrun --nproc-per-node 2 ...): collective, builds its TP shard from the HF folder
    trainer = MegatronTrainer(policy_dir, recipe.trainer, recipe.grpo, seed=0, device="cpu")
    if trainer.is_leader:
        stats = trainer.train_step(batch)          # the followers run the same step on their shards
        for name, tensor in trainer.named_tensors(): ...   # full HF tensors, gathered on rank 0
        trainer.save_checkpoint(path, {"next_step": 3})
        trainer.close()                            # releases the followers
    else:
        trainer.serve()                            # runs the leader's commands until close()

`megatron_launch.trainer_argv(...)` is the torchrun command line of the trainer component;
ranks > 0 of `python -m rl360cli.loop.driver` build their shard and `serve()`. How it works:
- Model: `GPTModel` with Megatron's local (non-Transformer-Engine) layer spec: RMSNorm, SwiGLU,
  RoPE, grouped-query attention, Qwen2's q/k/v bias, tied or untied embeddings. Weights are read
  from the Hugging Face safetensors and converted and sharded by `megatron_convert`.
- Logprobs: the logits stay split over the vocabulary (`parallel_output=True`) and Megatron's
  `vocab_parallel_cross_entropy` gives -log p(target) without gathering them; the vocabulary's
  padding (to a multiple of TP) is masked to -inf first. Same shift convention as the torch trainer.
- Data parallel: the batch's micro-batches are dealt round robin over the DP ranks; each part of
  the loss is already divided by the whole batch's denominator, so the gradients are *summed*
  over DP (one flat all-reduce), which makes a step equal to the torch trainer's.
- Optimizer: `torch.optim.AdamW` over each rank's local shards, with gradient clipping by the
  global norm (squares summed over TP/PP, TP-duplicated parameters counted once; clipped as
  `torch.nn.utils.clip_grad_norm_` does). Why not Megatron's optimizer: in megatron-core 0.16.1
  `get_megatron_optimizer`, its wrappers and `clip_grad_norm_fp32` allocate `device='cuda'`
  tensors unconditionally and need its DDP grad buffers; AdamW is element-wise, so AdamW over
  shards is exactly AdamW over the whole model (and exactly what the torch trainer does), and
  its state dict checkpoints per shard. It is also what Megatron itself falls back to
  (`torch.optim.AdamW`) without Transformer Engine or Apex.
- Pipeline parallel: not implemented (pipeline_parallel must be 1): Megatron's pipeline schedules
  and p2p communication need CUDA in 0.16.1, and rl360 has no GPU to test them on.
- On the CPU the workarounds of `megatron_cpu` are installed; on GPUs Megatron runs as shipped
  (that path is written but has not run here: no GPU).

Checkpoints: `megatron/tp{TT}_pp{PPP}.pt` per model-parallel rank (model shard and AdamW state,
written by DP rank 0), the gathered Hugging Face model in `model/` (what engines and the torch
trainer load), and `loop_state.json`. Resuming needs the same tensor_parallel.

Tests: tests/trainer/test_megatron_trainer.py (torchrun, gloo on 127.0.0.1); see docs/trainer.md.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch

from rl360cli.errors import Rl360Error
from rl360cli.rl.config import GRPOConfig
from rl360cli.rl.train_batch import TrainBatch
from rl360cli.trainer.config import TrainerConfig
from rl360cli.trainer.megatron_convert import ModelSpec, hf_sources, shard, to_hf, to_megatron
from rl360cli.trainer.step import train_step

# Followers wait for the leader's next command while it generates rollouts: allow a long wait.
_CONTROL_TIMEOUT = timedelta(hours=12)


class MegatronTrainer:
    def __init__(self, model_dir: Path, config: TrainerConfig, grpo: GRPOConfig, *, seed: int = 0,
                 device: str = "cpu"):
        if config.pipeline_parallel != 1:
            raise Rl360Error(f"the megatron trainer runs pipeline_parallel = 1 only (got {config.pipeline_parallel})",
                             fix="set [trainer] pipeline_parallel = 1; use tensor and data parallelism")  # fmt: skip
        import torch.distributed as dist
        from megatron.core import parallel_state as ps

        self.config = config
        self.grpo = grpo
        self.model_dir = Path(model_dir)
        self.device = _init_distributed(device)
        self.rank, self.world_size = dist.get_rank(), dist.get_world_size()
        tp = config.tensor_parallel
        if self.world_size % tp:
            raise Rl360Error(f"{self.world_size} trainer ranks cannot be split into tensor_parallel = {tp} groups",
                             fix="launch a multiple of tensor_parallel ranks (trainer_argv)")  # fmt: skip
        self.spec = ModelSpec.from_hf_config(json.loads((self.model_dir / "config.json").read_text()))
        self.spec.check_tp(tp)
        if not ps.model_parallel_is_initialized() or ps.get_tensor_model_parallel_world_size() != tp:
            if ps.model_parallel_is_initialized():
                ps.destroy_model_parallel()
            ps.initialize_model_parallel(tensor_model_parallel_size=tp, pipeline_model_parallel_size=1,
                                         create_gloo_process_groups=self.device.type != "cpu")  # fmt: skip
        self.tp, self.tp_rank = tp, ps.get_tensor_model_parallel_rank()
        self.dp, self.dp_rank = ps.get_data_parallel_world_size(), ps.get_data_parallel_rank()
        # Commands and their payloads travel over gloo on every device (pickled objects, CPU tensors).
        self._control = dist.new_group(backend="gloo", timeout=_CONTROL_TIMEOUT)
        torch.manual_seed(seed)
        if self.device.type == "cpu":
            from rl360cli.trainer import megatron_cpu

            megatron_cpu.install(seed)
        else:
            from megatron.core import tensor_parallel

            tensor_parallel.model_parallel_cuda_manual_seed(seed)
        self.model = self._build_model()
        self._params = dict(self.model.named_parameters())
        if set(self._params) != set(self.spec.megatron_names()):
            raise RuntimeError(f"GPTModel's parameters {sorted(self._params)} are not the expected "
                               f"{sorted(self.spec.megatron_names())}: megatron-core changed its layout")  # fmt: skip
        self._load_hf_weights(self.model_dir)
        self.model.train()
        self.optimizer = self._new_optimizer()
        self.version = 0
        self._closed = False

    # ------------------------------------------------------------------ public (the leader calls these)

    @property
    def is_leader(self) -> bool:
        return self.rank == 0

    def train_step(self, batch: TrainBatch) -> dict[str, float]:
        """One policy update on `batch` (num_epochs passes) on every rank; the policy version goes up by one."""
        self._command("train_step", batch)
        return self._train_step(batch)

    def logprobs(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        """log pi(token t+1 | tokens <= t) at every position t, [B, T-1], without gradient (on the CPU)."""
        self._command("logprobs", (input_ids, attention_mask))
        return self._logprobs(input_ids)

    def named_tensors(self) -> Iterator[tuple[str, torch.Tensor]]:
        """Full (unsharded) weights under their Hugging Face names, gathered from the TP ranks on the leader."""
        self._command("gather")
        gathered = self._gathered()
        try:
            yield from gathered
        finally:
            # The other ranks take part in every gather: finish them even if the consumer stopped early.
            for _ in gathered:
                pass

    def save_checkpoint(self, path: Path, loop_state: dict) -> None:
        path = Path(path)
        tmp = path.with_name(path.name + ".tmp")
        shutil.rmtree(tmp, ignore_errors=True)
        (tmp / "megatron").mkdir(parents=True)
        self._command("save", str(tmp))
        self._save(str(tmp))
        (tmp / "loop_state.json").write_text(json.dumps({**loop_state, "version": self.version,
                                                         "tensor_parallel": self.tp}))  # fmt: skip
        if path.exists():
            shutil.rmtree(path)
        tmp.rename(path)

    def load_checkpoint(self, path: Path) -> dict:
        path = Path(path)
        state = json.loads((path / "loop_state.json").read_text())
        if state.get("tensor_parallel", self.tp) != self.tp:
            raise Rl360Error(f"checkpoint {path} was written at tensor_parallel = {state['tensor_parallel']}, "
                             f"this trainer runs {self.tp}",
                             fix=f"resume with [trainer] tensor_parallel = {state['tensor_parallel']}")  # fmt: skip
        self._command("load", (str(path), state["version"]))
        self._load(str(path), state["version"])
        return state

    def close(self) -> None:
        """Release the followers (their `serve()` returns). The leader calls it once, at the end."""
        if not self._closed:
            self._closed = True
            self._command("stop")

    # ------------------------------------------------------------------ followers

    def serve(self) -> None:
        """Run the leader's commands until it calls close(); ranks > 0 call this after building the trainer."""
        import torch.distributed as dist

        handlers = {
            "train_step": self._train_step,
            "logprobs": lambda args: self._logprobs(args[0]),
            "gather": lambda _: [None for _ in self._gathered()],
            "save": self._save,
            "load": lambda args: self._load(*args),
        }
        while True:
            message: list[Any] = [None, None]
            dist.broadcast_object_list(message, src=0, group=self._control)
            name, payload = message
            if name == "stop":
                return
            handlers[name](payload)

    def _command(self, name: str, payload: Any = None) -> None:
        import torch.distributed as dist

        if not self.is_leader:
            raise RuntimeError(f"{name}: only rank 0 drives the megatron trainer; the other ranks call serve()")
        if self.world_size > 1:
            dist.broadcast_object_list([name, payload], src=0, group=self._control)

    # ------------------------------------------------------------------ what every rank runs

    def _build_model(self) -> Any:
        import torch.nn.functional as F
        from megatron.core.models.gpt import GPTModel
        from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
        from megatron.core.transformer.transformer_config import TransformerConfig

        spec = self.spec
        extra: dict[str, Any] = {}
        if self.device.type == "cpu":
            from rl360cli.trainer import megatron_cpu

            extra = dict(megatron_cpu.CPU_CONFIG)
        config = TransformerConfig(
            num_layers=spec.num_layers, hidden_size=spec.hidden_size, num_attention_heads=spec.num_heads,
            num_query_groups=spec.num_kv_heads, kv_channels=spec.head_dim, ffn_hidden_size=spec.ffn_hidden_size,
            normalization="RMSNorm", layernorm_epsilon=spec.norm_eps, gated_linear_unit=True,
            activation_func=F.silu, add_bias_linear=False, add_qkv_bias=spec.qkv_bias,
            hidden_dropout=0.0, attention_dropout=0.0, attention_softmax_in_fp32=True,
            tensor_model_parallel_size=self.tp, pipeline_model_parallel_size=1, sequence_parallel=False,
            params_dtype=torch.float32, **extra,
        )  # fmt: skip
        model = GPTModel(
            config=config, transformer_layer_spec=get_gpt_layer_local_spec(normalization="RMSNorm"),
            vocab_size=spec.padded_vocab(self.tp), max_sequence_length=spec.max_position_embeddings,
            pre_process=True, post_process=True, parallel_output=True,
            share_embeddings_and_output_weights=spec.tie_embeddings, position_embedding_type="rope",
            rotary_percent=1.0, rotary_base=spec.rope_theta,
        )  # fmt: skip
        if self.device.type == "cpu":
            from rl360cli.trainer import megatron_cpu

            megatron_cpu.cpu_rotary(model)
        # The padded vocabulary rows live at the end of the last TP rank's shard.
        local = spec.padded_vocab(self.tp) // self.tp
        first_pad = spec.vocab_size - self.tp_rank * local
        self._vocab_pad = None
        if first_pad < local:
            self._vocab_pad = torch.arange(local, device=self.device) >= max(first_pad, 0)
        return model.to(self.device)

    def _load_hf_weights(self, model_dir: Path) -> None:
        read = _safetensors_reader(model_dir)
        with torch.no_grad():
            for name in self.spec.megatron_names():
                full = to_megatron(self.spec, name, {s: read(s) for s in hf_sources(name)}, tp=self.tp)
                param = self._params[name]
                local = _local_part(param, full, self.tp_rank, self.tp)
                if local.shape != param.shape:
                    raise RuntimeError(f"{name}: converted {tuple(local.shape)} != Megatron's {tuple(param.shape)}")
                param.copy_(local)

    def _new_optimizer(self) -> torch.optim.Optimizer:
        return torch.optim.AdamW(self.model.parameters(), lr=self.config.lr, betas=tuple(self.config.betas),
                                 weight_decay=self.config.weight_decay)  # fmt: skip

    def _forward_logprobs(self, input_ids: torch.Tensor) -> torch.Tensor:
        """Per-token logprobs of input_ids[:, 1:], [B, T-1], with gradient."""
        from megatron.core import tensor_parallel

        ids = input_ids.to(self.device)
        batch, width = ids.shape
        positions = torch.arange(width, device=self.device).expand(batch, width)
        # Megatron's convention: True = masked. Causal only: with right padding, real tokens never
        # see padding, and padded positions are off the loss mask.
        causal = torch.ones(width, width, dtype=torch.bool, device=self.device).triu(1)[None, None]
        logits = self.model(ids, positions, causal)[:, :-1].float()  # [B, T-1, V/tp]
        if self._vocab_pad is not None:
            logits = logits.masked_fill(self._vocab_pad, float("-inf"))
        return -tensor_parallel.vocab_parallel_cross_entropy(logits.contiguous(), ids[:, 1:].contiguous())

    def _logprobs(self, input_ids: torch.Tensor) -> torch.Tensor:
        with torch.no_grad():
            return self._forward_logprobs(input_ids).cpu()

    def _train_step(self, batch: TrainBatch) -> dict[str, float]:
        import torch.distributed as dist
        from megatron.core import parallel_state as ps

        micro_batches = batch.split(max_tokens=self.config.micro_batch_tokens)
        dp_group = ps.get_data_parallel_group(with_context_parallel=False) if self.dp > 1 else None

        def sum_over_dp(sums: torch.Tensor) -> torch.Tensor:
            # One rank per TP position in each DP group: the sum counts every micro-batch once.
            if dp_group is not None:
                dist.all_reduce(sums, group=dp_group)
            return sums

        stats = train_step(
            micro_batches.shard(self.dp_rank, self.dp),  # dealt round robin over the DP ranks
            grpo=self.grpo, num_epochs=self.config.num_epochs, optimizer=self.optimizer,
            logprobs=lambda micro: self._forward_logprobs(micro.input_ids),
            clip_grads=self._clip_grads, reduce_grads=self._sum_grads_over_dp, reduce_sums=sum_over_dp,
        )
        self.version += 1
        return stats

    def _sum_grads_over_dp(self) -> None:
        import torch.distributed as dist
        from megatron.core import parallel_state as ps

        # A rank without micro-batches (fewer than DP) still takes part, with zero gradients.
        for param in self.model.parameters():
            if param.grad is None:
                param.grad = torch.zeros_like(param)
        if self.dp == 1:
            return
        from torch._utils import _flatten_dense_tensors, _unflatten_dense_tensors

        grads = [p.grad for p in self.model.parameters()]
        flat = _flatten_dense_tensors(grads)
        dist.all_reduce(flat, group=ps.get_data_parallel_group(with_context_parallel=False))
        for grad, summed in zip(grads, _unflatten_dense_tensors(flat, grads)):
            grad.copy_(summed)

    def _clip_grads(self) -> float:
        """Clip to config.grad_clip by the global norm, as torch.nn.utils.clip_grad_norm_; returns the norm."""
        import torch.distributed as dist
        from megatron.core import parallel_state as ps
        from megatron.core.tensor_parallel import param_is_not_tensor_parallel_duplicate

        grads = [p.grad for p in self.model.parameters()]
        owned = [p.grad for p in self.model.parameters() if param_is_not_tensor_parallel_duplicate(p)]
        squares = torch.stack([torch.linalg.vector_norm(g.float()) ** 2 for g in owned]).sum() if owned else \
            torch.zeros((), device=self.device)  # fmt: skip
        if self.tp > 1:
            dist.all_reduce(squares, group=ps.get_model_parallel_group())
        total = squares.sqrt()
        if self.config.grad_clip > 0:
            coef = (self.config.grad_clip / (total + 1e-6)).clamp(max=1.0)
            torch._foreach_mul_(grads, coef.to(grads[0].dtype))
        return float(total)

    def _gathered(self) -> Iterator[tuple[str, torch.Tensor]]:
        """The full weights as (HF name, tensor) on the leader; the other ranks of its TP group help gather."""
        import torch.distributed as dist
        from megatron.core import parallel_state as ps

        if self.dp_rank != 0:
            return  # DP replicas hold the same weights: DP rank 0's TP group gathers them
        group = ps.get_tensor_model_parallel_group()
        for name in self.spec.megatron_names():
            param = self._params[name]
            full = param.detach()  # (detach() drops Megatron's tensor_model_parallel attributes: read them on param)
            if self.tp > 1 and getattr(param, "tensor_model_parallel", False):
                parts = [torch.empty_like(full) for _ in range(self.tp)]
                dist.all_gather(parts, full.contiguous(), group=group)
                full = torch.cat(parts, dim=param.partition_dim)
            if self.is_leader:
                for hf_name, tensor in to_hf(self.spec, name, full, tp=self.tp):
                    yield hf_name, tensor.contiguous()

    def _save(self, folder: str) -> None:
        import torch.distributed as dist

        folder_path = Path(folder)
        if self.dp_rank == 0:
            torch.save({"model": self.model.state_dict(), "optimizer": self.optimizer.state_dict(),
                        "version": self.version}, folder_path / "megatron" / self._shard_file())  # fmt: skip
        tensors = {name: tensor.detach().cpu().clone() for name, tensor in self._gathered()}
        if self.is_leader:
            from safetensors.torch import save_file

            (folder_path / "model").mkdir()
            save_file(tensors, str(folder_path / "model" / "model.safetensors"), metadata={"format": "pt"})
            for extra in ("config.json", "generation_config.json"):
                if (self.model_dir / extra).is_file():
                    shutil.copy2(self.model_dir / extra, folder_path / "model" / extra)
        dist.barrier(group=self._control)

    def _load(self, folder: str, version: int) -> None:
        shard_path = Path(folder) / "megatron" / self._shard_file()
        if not shard_path.is_file():
            raise Rl360Error(f"checkpoint {folder} has no shard {shard_path.name} for this rank",
                             fix="resume with the tensor_parallel the checkpoint was written with")  # fmt: skip
        saved = torch.load(shard_path, map_location=self.device, weights_only=True)
        self.model.load_state_dict(saved["model"], strict=True)
        self.optimizer = self._new_optimizer()
        self.optimizer.load_state_dict(saved["optimizer"])
        self.version = version

    def _shard_file(self) -> str:
        return f"tp{self.tp_rank:02d}_pp000.pt"


def default_device() -> str:
    return "cuda" if torch.cuda.is_available() else "cpu"


def _init_distributed(device: str) -> torch.device:
    """The default process group (from torchrun's environment, or a world of one) and this rank's device."""
    import torch.distributed as dist

    if device not in ("cpu", "cuda"):
        raise ValueError(f"device must be 'cpu' or 'cuda' (got {device!r})")
    if device == "cuda":
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
        where = torch.device("cuda", torch.cuda.current_device())
    else:
        where = torch.device("cpu")
    if not dist.is_initialized():
        backend = "nccl" if device == "cuda" else "gloo"
        if backend == "gloo" and os.environ.get("MASTER_ADDR", "127.0.0.1").startswith(("127.", "localhost")):
            os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
        if "RANK" in os.environ:
            dist.init_process_group(backend)
        else:
            # Not under torchrun: a world of one, no network.
            dist.init_process_group(backend, store=dist.HashStore(), rank=0, world_size=1)
    return where


def _local_part(param: Any, full: torch.Tensor, tp_rank: int, tp: int) -> torch.Tensor:
    if tp > 1 and getattr(param, "tensor_model_parallel", False):
        return shard(full, dim=param.partition_dim, rank=tp_rank, tp=tp)
    return full


def _safetensors_reader(model_dir: Path):  # noqa: ANN202 — returns name -> tensor
    """A function reading one tensor by name from a Hugging Face folder's safetensors (one file or sharded)."""
    from safetensors import safe_open

    index = model_dir / "model.safetensors.index.json"
    if index.is_file():
        files = {name: model_dir / file for name, file in json.loads(index.read_text())["weight_map"].items()}
    else:
        single = model_dir / "model.safetensors"
        if not single.is_file():
            raise Rl360Error(f"{model_dir} has no model.safetensors", fix="save the model with save_pretrained()")
        with safe_open(str(single), framework="pt") as f:
            files = {name: single for name in f.keys()}

    def read(name: str) -> torch.Tensor:
        if name not in files:
            raise Rl360Error(f"{model_dir} lacks weight {name}", fix="check the model folder is complete")
        with safe_open(str(files[name]), framework="pt") as f:
            return f.get_tensor(name)

    return read
