"""The megatron trainer: GRPO updates of a Llama/Qwen2/Qwen3 model as a megatron-core `GPTModel`, TP x PP x DP.

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
ranks > 0 of `python -m rl360cli.run.driver` build their shard and `serve()`. How it works:
- Model: `GPTModel` with Megatron's local (non-Transformer-Engine) layer spec: RMSNorm, SwiGLU,
  RoPE, grouped-query attention, Qwen2's q/k/v bias, Qwen3's QK-norm, tied or untied embeddings. Weights are read
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
- Pipeline parallel: each stage builds its layers (`pre_process` on the first, `post_process` on
  the last) and Megatron's own 1F1B schedule (`get_forward_backward_func`) runs each rank's
  micro-batches through the stages, with `variable_seq_lengths` (micro-batches differ in shape)
  and `calculate_per_token_loss` (the schedule must not divide the loss: each micro-batch's loss
  is already its share of the batch's). The loss is taken on the last stage; the statistic sums
  are summed over PP as over DP. A tied embedding's copy on the last stage gets the embedding's
  gradient summed in (Megatron's embedding group), and counts once in the gradient norm.
- On the CPU the workarounds of `megatron_cpu` are installed; on GPUs Megatron runs as shipped
  (that path is written but has not run here: no GPU).

Checkpoints do not depend on the layout: `megatron/stage{PPP}-tp{TT}.safetensors` per pipeline
stage and TP rank (of DP 0) holds a share of the stage's weights and AdamW moments, whole
(gathered over TP), under Hugging Face names (`param/...`, `exp_avg/...`, `exp_avg_sq/...`), and `megatron/layout.json`
the layout and Adam's step; any TP x PP resumes from it. Beside them: the gathered Hugging Face
model in `model/` (what engines and the torch trainer load) and `loop_state.json`.

Tests: tests/trainer/test_megatron_trainer.py and test_megatron_pipeline.py (one torchrun world of 4 ranks,
gloo on 127.0.0.1); see docs/trainer.md.
"""

from __future__ import annotations

import contextlib
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
from rl360cli.trainer.fault_points import fault_point
from rl360cli.trainer.megatron_convert import (
    ModelSpec,
    global_name,
    hf_sources,
    shard,
    to_hf,
    to_megatron,
)
from rl360cli.trainer.protocol import logprob_temperature
from rl360cli.trainer.step import train_step

# Followers wait for the leader's next command while it generates rollouts: allow a long wait.
_CONTROL_TIMEOUT = timedelta(hours=12)
CHECKPOINT_FORMAT = 2
_MOMENTS = ("exp_avg", "exp_avg_sq")
# The last stage's copy of a tied embedding (pipeline_parallel > 1): not a weight of its own.
_TIED_COPY = "output_layer.weight"


class MegatronTrainer:
    def __init__(self, model_dir: Path, config: TrainerConfig, grpo: GRPOConfig, *, seed: int = 0,
                 device: str = "cpu", temperature: float = 1.0):
        import torch.distributed as dist
        from megatron.core import parallel_state as ps

        self.config = config
        self.grpo = grpo
        self.temperature = logprob_temperature(temperature)
        self.model_dir = Path(model_dir)
        self.device = _init_distributed(device)
        self.rank, self.world_size = dist.get_rank(), dist.get_world_size()
        tp, pp = config.tensor_parallel, config.pipeline_parallel
        if self.world_size % (tp * pp):
            raise Rl360Error(f"{self.world_size} trainer ranks cannot be split into tensor_parallel = {tp} x "
                             f"pipeline_parallel = {pp} groups",
                             fix="launch a multiple of tensor_parallel x pipeline_parallel ranks (trainer_argv)")  # fmt: skip
        self.spec = ModelSpec.from_hf_config(json.loads((self.model_dir / "config.json").read_text()))
        self.spec.check_tp(tp)
        self.spec.check_pp(pp)
        if not ps.model_parallel_is_initialized() or (ps.get_tensor_model_parallel_world_size(),
                                                       ps.get_pipeline_model_parallel_world_size()) != (tp, pp):
            if ps.model_parallel_is_initialized():
                ps.destroy_model_parallel()
            ps.initialize_model_parallel(tensor_model_parallel_size=tp, pipeline_model_parallel_size=pp,
                                         create_gloo_process_groups=self.device.type != "cpu")  # fmt: skip
        self.tp, self.tp_rank = tp, ps.get_tensor_model_parallel_rank()
        self.pp, self.pp_rank = pp, ps.get_pipeline_model_parallel_rank()
        self.dp, self.dp_rank = ps.get_data_parallel_world_size(), ps.get_data_parallel_rank()
        self.is_first_stage, self.is_last_stage = self.pp_rank == 0, self.pp_rank == pp - 1
        self._first_layer = self.spec.stage_layers(self.pp_rank, pp).start
        # The weights this stage owns, by global Megatron name (each owned by exactly one stage).
        self._owned = self.spec.stage_names(self.pp_rank, pp)
        self._has_tied_copy = self.spec.tie_embeddings and self.is_last_stage and not self.is_first_stage
        # Commands and their payloads travel over gloo on every device (pickled objects, CPU tensors).
        self._control = dist.new_group(backend="gloo", timeout=_CONTROL_TIMEOUT)
        torch.manual_seed(seed)
        if self.device.type == "cpu":
            from rl360cli.trainer import megatron_cpu

            megatron_cpu.install(seed)
        else:
            from megatron.core import tensor_parallel

            tensor_parallel.model_parallel_cuda_manual_seed(seed)
        with self._on_device():
            self.model = self._build_model()
        # By global name; a tied model's last stage also has its embedding copy, under _TIED_COPY.
        self._params = {global_name(n, first_layer=self._first_layer): p for n, p in self.model.named_parameters()}
        expected = {*self._owned, *([_TIED_COPY] if self._has_tied_copy else [])}
        if set(self._params) != expected:
            raise RuntimeError(f"GPTModel's parameters {sorted(self._params)} are not the expected "
                               f"{sorted(expected)}: megatron-core changed its layout")  # fmt: skip
        self._full_shapes = self._collect_full_shapes()
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
        """Full (unsharded) weights under their Hugging Face names, each once, gathered from the TP ranks
        and the pipeline stages on the leader."""
        self._command("gather")
        gathered = self._gathered()
        try:
            yield from gathered
        finally:
            # The other ranks take part in every gather: finish them even if the consumer stopped early.
            for _ in gathered:
                pass

    def named_gradients(self) -> Iterator[tuple[str, torch.Tensor]]:
        """The gradients the last optimizer step used (after reduction and clipping), gathered as
        `named_tensors`; for checks that compare layouts."""
        self._command("gather_grads")
        gathered = self._gathered(what="grad")
        try:
            yield from gathered
        finally:
            for _ in gathered:
                pass

    def save_checkpoint(self, path: Path, loop_state: dict) -> None:
        path = Path(path)
        tmp = path.with_name(path.name + ".tmp")
        shutil.rmtree(tmp, ignore_errors=True)
        (tmp / "megatron").mkdir(parents=True)
        self._command("save", str(tmp))
        self._save(str(tmp))
        (tmp / "loop_state.json").write_text(json.dumps({**loop_state, "version": self.version}))
        fault_point("checkpoint_write", int(loop_state.get("next_step", 0)) - 1)
        if path.exists():
            shutil.rmtree(path)
        tmp.rename(path)

    def load_checkpoint(self, path: Path) -> dict:
        path = Path(path)
        state = json.loads((path / "loop_state.json").read_text())
        layout = path / "megatron" / "layout.json"
        if not layout.is_file() or json.loads(layout.read_text()).get("format") != CHECKPOINT_FORMAT:
            raise Rl360Error(f"checkpoint {path} is not a megatron checkpoint of format {CHECKPOINT_FORMAT}",
                             fix="resume from a checkpoint this version of the megatron trainer wrote")  # fmt: skip
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
            "gather_grads": lambda _: [None for _ in self._gathered(what="grad")],
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
            qk_layernorm=spec.qk_norm,
            tensor_model_parallel_size=self.tp, pipeline_model_parallel_size=self.pp, sequence_parallel=False,
            params_dtype=torch.float32, **extra,
            # Pipeline schedules: micro-batches of different shapes (sent ahead of each activation),
            # and the loss used as the trainer gives it (no division by micro-batches or tokens).
            pipeline_dtype=torch.float32, variable_seq_lengths=True, calculate_per_token_loss=True,
            # (no experts; only so that TransformerConfig accepts variable_seq_lengths)
            moe_token_dispatcher_type="alltoall",
        )  # fmt: skip
        model = GPTModel(
            config=config,
            transformer_layer_spec=get_gpt_layer_local_spec(normalization="RMSNorm", qk_layernorm=spec.qk_norm),
            vocab_size=spec.padded_vocab(self.tp), max_sequence_length=spec.max_position_embeddings,
            pre_process=self.is_first_stage, post_process=self.is_last_stage, parallel_output=True,
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
            for name, param in self._params.items():
                param.copy_(self._local_from_hf(name, param, read))

    def _local_from_hf(self, name: str, param: torch.Tensor, read: Any) -> torch.Tensor:
        """This rank's part of Megatron weight `name` (global), from Hugging Face tensors `read(hf_name)`."""
        source = "embedding.word_embeddings.weight" if name == _TIED_COPY and self._has_tied_copy else name
        full = to_megatron(self.spec, source, {s: read(s) for s in hf_sources(source)}, tp=self.tp)
        local = _local_part(param, full, self.tp_rank, self.tp)
        if local.shape != param.shape:
            raise RuntimeError(f"{name}: converted {tuple(local.shape)} != Megatron's {tuple(param.shape)}")
        return local

    def _collect_full_shapes(self) -> dict[str, torch.Size]:
        """On the leader: every owned weight's full (TP-gathered) shape, from the stage that holds it."""
        import torch.distributed as dist

        mine = {}
        if self.tp_rank == 0 and self.dp_rank == 0:
            for name in self._owned:
                param = self._params[name]
                shape = list(param.shape)
                if self.tp > 1 and getattr(param, "tensor_model_parallel", False):
                    shape[param.partition_dim] *= self.tp
                mine[name] = torch.Size(shape)
        if self.world_size == 1:
            return mine
        everyone: list[Any] = [None] * self.world_size if self.is_leader else None
        dist.gather_object(mine, everyone, dst=0, group=self._control)
        return {name: shape for part in everyone for name, shape in part.items()} if self.is_leader else {}

    def _on_device(self) -> Any:
        """Where Megatron code asks for CUDA tensors: the CPU workarounds on the CPU, nothing on GPUs."""
        if self.device.type == "cpu":
            from rl360cli.trainer import megatron_cpu

            return megatron_cpu.cuda_on_cpu()
        return contextlib.nullcontext()

    def _new_optimizer(self) -> torch.optim.Optimizer:
        return torch.optim.AdamW(self.model.parameters(), lr=self.config.lr, betas=tuple(self.config.betas),
                                 weight_decay=self.config.weight_decay)  # fmt: skip

    def _forward(self, ids: torch.Tensor) -> torch.Tensor:
        """This stage's output for ids [B, T] on the device: the last stage's logits [B, T, V/tp], else
        the hidden states [T, B, H] for the next stage (a stage after the first reads its input from
        the schedule's `set_input_tensor`)."""
        batch, width = ids.shape
        positions = torch.arange(width, device=self.device).expand(batch, width)
        # Megatron's convention: True = masked. Causal only: with right padding, real tokens never
        # see padding, and padded positions are off the loss mask.
        causal = torch.ones(width, width, dtype=torch.bool, device=self.device).triu(1)[None, None]
        return self.model(ids, positions, causal)

    def _token_logprobs(self, logits: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
        """log p(ids[:, 1:]) from the last stage's vocabulary-split logits, [B, T-1]."""
        from megatron.core import tensor_parallel

        logits = logits[:, :-1].float() / self.temperature  # [B, T-1, V/tp], at the sampling temperature
        if self._vocab_pad is not None:
            logits = logits.masked_fill(self._vocab_pad, float("-inf"))
        return -tensor_parallel.vocab_parallel_cross_entropy(logits.contiguous(), ids[:, 1:].contiguous())

    def _forward_logprobs(self, input_ids: torch.Tensor) -> torch.Tensor:
        """Per-token logprobs of input_ids[:, 1:], [B, T-1], with gradient (pipeline_parallel = 1)."""
        ids = input_ids.to(self.device)
        return self._token_logprobs(self._forward(ids), ids)

    def _pipeline(self, inputs: list[torch.Tensor], consume: Any, *, forward_only: bool) -> None:
        """Megatron's pipeline schedule over micro-batches `inputs` (token ids [B, T]) on this rank's
        pipeline; on the last stage `consume(index, logprobs)` gives each micro-batch's loss."""
        from megatron.core.pipeline_parallel import get_forward_backward_func

        if not inputs:  # a DP rank without micro-batches: so are the other stages of its pipeline
            return

        def forward_step(indices: Iterator[int], model: Any) -> tuple[torch.Tensor, Any]:
            index = next(indices)
            ids = inputs[index].to(self.device)

            def loss_func(logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, dict]:
                # Three values: the loss is used as given (calculate_per_token_loss), the count unused.
                return consume(index, self._token_logprobs(logits, ids)), torch.zeros((), dtype=torch.int), {}

            return self._forward(ids), loss_func

        run = get_forward_backward_func()
        with self._on_device(), (torch.no_grad() if forward_only else contextlib.nullcontext()):
            run(forward_step_func=forward_step, data_iterator=iter(range(len(inputs))), model=self.model,
                num_microbatches=len(inputs), seq_length=inputs[0].shape[1], micro_batch_size=inputs[0].shape[0],
                forward_only=forward_only)  # fmt: skip

    def _logprobs(self, input_ids: torch.Tensor) -> torch.Tensor:
        if self.pp == 1:
            with torch.no_grad():
                return self._forward_logprobs(input_ids).cpu()
        import torch.distributed as dist

        out: list[torch.Tensor] = []
        self._pipeline([input_ids], lambda _, logprobs: out.append(logprobs) or logprobs.sum(), forward_only=True)
        # Computed on the last stage; the leader (first stage) takes them from its own pipeline's last stage.
        if self.tp_rank == 0 and self.dp_rank == 0:
            from megatron.core import parallel_state as ps

            if self.is_last_stage:
                dist.send(out[0].contiguous(), dst=0)
            elif self.is_leader:
                got = torch.empty(input_ids.shape[0], input_ids.shape[1] - 1, device=self.device)
                dist.recv(got, src=dist.get_global_rank(ps.get_pipeline_model_parallel_group(), self.pp - 1))
                return got.cpu()
        return out[0].cpu() if out else torch.empty(0)

    def _train_step(self, batch: TrainBatch) -> dict[str, float]:
        import torch.distributed as dist
        from megatron.core import parallel_state as ps

        micro_batches = batch.split(max_tokens=self.config.micro_batch_tokens)
        dp_group = ps.get_data_parallel_group(with_context_parallel=False) if self.dp > 1 else None

        def sum_over_dp(sums: torch.Tensor) -> torch.Tensor:
            # Only the last stage took the loss (the others hold zeros): summed over the pipeline first.
            if self.pp > 1:
                sums = sums.to(self.device)
                dist.all_reduce(sums, group=ps.get_pipeline_model_parallel_group())
            # One rank per TP position in each DP group: the sum counts every micro-batch once.
            if dp_group is not None:
                sums = sums.to(self.device)
                dist.all_reduce(sums, group=dp_group)
            return sums.cpu()

        def pipelined(micros: Any, loss_of: Any) -> None:
            self._pipeline([m.input_ids for m in micros], lambda i, logprobs: loss_of(micros[i], logprobs),
                           forward_only=False)  # fmt: skip

        stats = train_step(
            micro_batches.shard(self.dp_rank, self.dp),  # dealt round robin over the DP ranks
            grpo=self.grpo, num_epochs=self.config.num_epochs, optimizer=self.optimizer,
            lr=self.config.lr_at(self.version),
            logprobs=lambda micro: self._forward_logprobs(micro.input_ids),
            forward_backward=pipelined if self.pp > 1 else None,
            clip_grads=self._clip_grads, reduce_grads=self._reduce_grads, reduce_sums=sum_over_dp,
        )
        self.version += 1
        return stats

    def _reduce_grads(self) -> None:
        import torch.distributed as dist
        from megatron.core import parallel_state as ps

        # A rank without micro-batches (fewer than DP) still takes part, with zero gradients.
        for param in self.model.parameters():
            if param.grad is None:
                param.grad = torch.zeros_like(param)
        if self.spec.tie_embeddings and self.pp > 1 and (self.is_first_stage or self._has_tied_copy):
            # The embedding (first stage) and its copy (last stage) are one weight: both take the sum
            # of their gradients (what Megatron's finalize_model_grads does over its embedding group).
            shared = self._params["embedding.word_embeddings.weight" if self.is_first_stage else _TIED_COPY]
            dist.all_reduce(shared.grad, group=ps.get_embedding_group())
        if self.spec.qk_norm and self.tp > 1:
            # Qwen3's q/k norm weight is the same on every TP rank, but each rank's heads give it only
            # part of its gradient: sum over TP (as Megatron's finalize_model_grads does for qk_layernorm).
            for name, param in self._params.items():
                if name.endswith(("q_layernorm.weight", "k_layernorm.weight")):
                    dist.all_reduce(param.grad, group=ps.get_tensor_model_parallel_group())
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
        from megatron.core.transformer.module import param_is_not_shared

        grads = [p.grad for p in self.model.parameters()]
        # Each weight once: not TP-duplicated norms (counted on one TP rank), not a tied embedding's copy.
        owned = [p.grad for p in self.model.parameters()
                 if param_is_not_tensor_parallel_duplicate(p) and param_is_not_shared(p)]  # fmt: skip
        squares = torch.stack([torch.linalg.vector_norm(g.float()) ** 2 for g in owned]).sum() if owned else \
            torch.zeros((), device=self.device)  # fmt: skip
        if self.tp * self.pp > 1:
            dist.all_reduce(squares, group=ps.get_model_parallel_group())
        total = squares.sqrt()
        if self.config.grad_clip > 0:
            coef = (self.config.grad_clip / (total + 1e-6)).clamp(max=1.0)
            torch._foreach_mul_(grads, coef.to(grads[0].dtype))
        return float(total)

    def _gathered(self, what: str = "param") -> Iterator[tuple[str, torch.Tensor]]:
        """The full weights (or `what` = "grad": their gradients) as (HF name, tensor) on the leader, each
        once: stage by stage, each stage's TP group gathers, and its TP-0 rank sends to the leader."""
        import torch.distributed as dist
        from megatron.core import parallel_state as ps

        if self.dp_rank != 0:
            return  # DP replicas hold the same weights: DP rank 0's pipeline gathers them
        for stage in range(self.pp):
            source = dist.get_global_rank(ps.get_pipeline_model_parallel_group(), stage) if self.pp > 1 else 0
            for name in self.spec.stage_names(stage, self.pp):
                full = None
                if stage == self.pp_rank:
                    param = self._params[name]
                    full = self._tp_gathered(param, param.detach() if what == "param" else param.grad)
                if stage == 0 or self.tp_rank != 0 or not (self.is_leader or stage == self.pp_rank):
                    pass  # the leader's own stage, or not a sender / receiver of this stage
                elif self.is_leader:
                    full = torch.empty(self._full_shapes[name], device=self.device)
                    dist.recv(full, src=source)
                else:
                    dist.send(full.contiguous(), dst=0)
                if self.is_leader:
                    for hf_name, tensor in to_hf(self.spec, name, full, tp=self.tp):
                        yield hf_name, tensor.contiguous()

    def _tp_gathered(self, param: torch.Tensor, local: torch.Tensor) -> torch.Tensor:
        """The full tensor of `local` (param's shard, or its gradient or Adam moment), over this stage's TP group."""
        import torch.distributed as dist
        from megatron.core import parallel_state as ps

        # (detach() drops Megatron's tensor_model_parallel attributes: they are read on param)
        if self.tp == 1 or not getattr(param, "tensor_model_parallel", False):
            return local
        parts = [torch.empty_like(local) for _ in range(self.tp)]
        dist.all_gather(parts, local.contiguous(), group=ps.get_tensor_model_parallel_group())
        return torch.cat(parts, dim=param.partition_dim)

    def _save(self, folder: str) -> None:
        import torch.distributed as dist

        folder_path = Path(folder)
        self._save_stage(folder_path / "megatron")
        tensors = {name: tensor.detach().cpu().clone() for name, tensor in self._gathered()}
        if self.is_leader:
            from safetensors.torch import save_file

            (folder_path / "model").mkdir()
            save_file(tensors, str(folder_path / "model" / "model.safetensors"), metadata={"format": "pt"})
            for extra in ("config.json", "generation_config.json"):
                if (self.model_dir / extra).is_file():
                    shutil.copy2(self.model_dir / extra, folder_path / "model" / extra)
        dist.barrier(group=self._control)

    def _save_stage(self, folder: Path) -> None:
        """This stage's weights and Adam moments, TP-gathered, under HF names (see the module docstring).

        Every TP rank of the stage gets each full tensor (all-gather); the stage's weights are dealt
        round robin over its TP ranks, each writing its share: no rank holds a whole stage's state.
        """
        if self.dp_rank != 0:
            return
        tensors: dict[str, torch.Tensor] = {}
        steps = set()
        for index, name in enumerate(self._owned):
            param = self._params[name]
            state = self.optimizer.state.get(param, {})
            for what in ("param", *_MOMENTS):
                if what != "param" and what not in state:
                    continue
                full = self._tp_gathered(param, param.detach() if what == "param" else state[what])
                if index % self.tp == self.tp_rank:
                    for hf_name, tensor in to_hf(self.spec, name, full, tp=self.tp):
                        tensors[f"{what}/{hf_name}"] = tensor.detach().cpu().contiguous()
            if "step" in state:
                steps.add(float(state["step"]))
        from safetensors.torch import save_file

        save_file(tensors, str(folder / f"stage{self.pp_rank:03d}-tp{self.tp_rank:02d}.safetensors"),
                  metadata={"format": "pt"})  # fmt: skip
        if self.is_leader:
            # One Adam step count for all (every weight steps together); none before the first step.
            (folder / "layout.json").write_text(json.dumps({
                "format": CHECKPOINT_FORMAT, "tensor_parallel": self.tp, "pipeline_parallel": self.pp,
                "adam_step": max(steps) if steps else None}))  # fmt: skip

    def _load(self, folder: str, version: int) -> None:
        from safetensors import safe_open

        megatron_dir = Path(folder) / "megatron"
        layout = json.loads((megatron_dir / "layout.json").read_text())
        with contextlib.ExitStack() as stack:
            # Each stage's file opened once; every rank reads the tensors its own shards are cut from.
            files = {}
            for path in sorted(megatron_dir.glob("stage*.safetensors")):
                handle = stack.enter_context(safe_open(str(path), framework="pt"))
                files.update({key: handle for key in handle.keys()})

            def reader(what: str) -> Any:
                def read(hf_name: str) -> torch.Tensor:
                    key = f"{what}/{hf_name}"
                    if key not in files:
                        raise Rl360Error(f"checkpoint {folder} lacks {key}", fix="resume from a complete checkpoint")
                    return files[key].get_tensor(key)

                return read

            self.optimizer = self._new_optimizer()
            with torch.no_grad():
                for name, param in self._params.items():
                    param.copy_(self._local_from_hf(name, param, reader("param")))
                    if layout["adam_step"] is not None:
                        self.optimizer.state[param] = {
                            "step": torch.tensor(layout["adam_step"], dtype=torch.float32),
                            **{m: self._local_from_hf(name, param, reader(m)).to(self.device).clone()
                               for m in _MOMENTS},
                        }  # fmt: skip
        self.version = version


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
