"""The prepared GPU check: rl360's GPU path on one GPU, measured in one run of a few minutes.

    python3 bench/gpu/check.py [--out FILE]      # on a GPU machine (bench/gpu/check.sh wraps it)
    python3 bench/gpu/check.py --dry-run         # prints the plan, then runs it all on the CPU, tiny

Eight parts, each timed, all figures into one JSON file (default: $OUT/gpu-check.json, else
bench/gpu/gpu-check.json). Issue 40 measures before and after in one run on the same model: the
engine's dynamic KV cache against its static one with the decode step captured as CUDA graphs
(`--static-kv`), the torch trainer in float32 against bf16 autocast (`[trainer] precision`), and how
far the trainer's logprobs are from the engine's. The default parts, in order:
1. env: the machine, torch, CUDA and transformers versions.
2. engine: rl360's engine (`python -m rl360cli.inference.server --device cuda --dtype bfloat16`, a
   real server process driven over HTTP by the rollouts' `EngineClient`) serving a randomly
   initialised Qwen3-architecture model of ~0.5 B parameters (no download): generated tokens/s at
   batch 1, 32 and 256, with the dynamic cache, then with `--static-kv` (captured on a GPU).
3. trainer: the torch trainer's step time on one GRPO batch in fp32 and in bf16; the megatron
   trainer's on the same batch when megatron-core is importable (it travels as a wheel; else the
   part says why not).
4. logprobs: the engine's logprobs of its own tokens (temperature 1, a model initialised with wider
   weights so that its logits are far from uniform) against the torch trainer's recomputation, per
   token (mean, p99, max of |difference|), for an engine in bf16 and in float32 and a trainer in fp32
   and bf16; and the static, captured engine's greedy tokens against the dynamic one's.
5. engine_step: where one decode step goes, at each batch size, without HTTP: the dynamic cache's
   forward alone (launched back to back, one sync at the end), the sampling alone (`sample_next` on
   logits of the vocabulary's width), the engine's whole step; the static cache's step uncaptured and
   captured, and the engine's whole step with it; kernel launches and device time a step at batch 1
   for both (the torch profiler), and the dynamic step's top operators by host time (printed).
6. loop: 5 GRPO steps on local-smoke's 32 tasks and its policy: rollouts through the engine on the
   GPU with `--static-kv` (the arith conversation of `rl360cli.demo.arith_rollout`, its emulated shell
   standing in for sandboxes: the GPU machine has no bubblewrap, Ray or router), `build_batch`, the
   torch trainer in bf16 on the GPU, the hand-over into the captured engine; reward and seconds a step.
Also there, run with `--parts`: 7. handoff: the trainer's weights to the engine on the same GPU by
CUDA IPC handles (`rl360cli.trainer.handoff`), in seconds, against a raw device-to-device copy of the
same bytes; 8. trainer_profile: where the torch trainer's step goes (the profiler's top operators by
device and host time, printed; the step's device and host totals).

A part that fails records its error and the others still run; the exit code is 1 if any failed.
`--dry-run` runs the same code with tiny sizes on the CPU (float32, gloo-free; the static cache's step
uncaptured, the trainer's bf16 under CPU autocast), so CI checks that the script works end to end
before a GPU is ever lent (tests/bench/test_gpu_check.py).
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import os
import platform
import sys
import tempfile
import time
import traceback
from dataclasses import asdict, dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from bench.gpu.support import (EngineServer, device_sync, exact_float32_matmuls, free_device_memory,
                               launch_counts, served_version, server_info)


@dataclass(frozen=True)
class Plan:
    device: str
    dtype: str
    # The Qwen3-architecture model of the engine and trainer parts.
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    intermediate_size: int
    vocab_size: int
    batches: tuple[int, ...]
    prompt_tokens: int
    new_tokens: int
    train_sequences: int
    train_tokens: int
    loop_steps: int
    loop_tasks: int
    loop_samples: int


GPU = Plan(device="cuda", dtype="bfloat16", hidden_size=1024, num_layers=28, num_heads=16, num_kv_heads=8,
           intermediate_size=3072, vocab_size=151936, batches=(1, 32, 256), prompt_tokens=16, new_tokens=128,
           train_sequences=64, train_tokens=512, loop_steps=5, loop_tasks=32, loop_samples=8)
DRY = Plan(device="cpu", dtype="float32", hidden_size=64, num_layers=2, num_heads=4, num_kv_heads=2,
           intermediate_size=128, vocab_size=512, batches=(1, 4), prompt_tokens=8, new_tokens=8,
           train_sequences=4, train_tokens=32, loop_steps=2, loop_tasks=4, loop_samples=4)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--dry-run", action="store_true", help="print the plan, then run it tiny on the CPU")
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--parts", default=",".join(DEFAULT_PARTS), help=f"comma-separated, of: {', '.join(PARTS)}")
    args = parser.parse_args()
    unknown = sorted(set(args.parts.split(",")) - set(PARTS))
    if unknown:
        parser.error(f"unknown part(s) {', '.join(unknown)}; choose from {', '.join(PARTS)}")
    plan = DRY if args.dry_run else GPU
    out = args.out or Path(os.environ.get("OUT") or REPO / "bench" / "gpu") / "gpu-check.json"
    print(f"plan ({'dry run: tiny, on the CPU' if args.dry_run else 'one GPU'}):")
    for key, value in asdict(plan).items():
        print(f"  {key} = {value}")
    if not args.dry_run:
        import torch

        if not torch.cuda.is_available():
            print("no CUDA device: run with --dry-run on a machine without a GPU", file=sys.stderr)
            return 2
    report: dict = {"plan": asdict(plan), "dry_run": args.dry_run, "parts": {}}
    with tempfile.TemporaryDirectory(prefix="rl360-gpu-check-") as tmp:
        work = Path(tmp)
        for name in args.parts.split(","):
            part = PARTS[name]
            began = time.perf_counter()
            print(f"[{name}] ...", flush=True)
            try:
                result = {"ok": True, **part(plan, work)}
            except Exception as e:  # noqa: BLE001 — one part failing must not hide the others' figures
                result = {"ok": False, "error": f"{type(e).__name__}: {e}", "traceback": traceback.format_exc()[-3000:]}
            result["seconds"] = round(time.perf_counter() - began, 2)
            report["parts"][name] = result
            print(f"[{name}] {json.dumps({k: v for k, v in result.items() if k != 'traceback'})}", flush=True)
            out.parent.mkdir(parents=True, exist_ok=True)
            out.write_text(json.dumps(report, indent=2) + "\n")  # after each part: a timeout keeps what ran
    print(f"figures: {out}")
    return 0 if all(p["ok"] for p in report["parts"].values()) else 1


# ----------------------------------------------------------------------------- parts


def env(plan: Plan, work: Path) -> dict:
    import torch
    import transformers

    info = {"python": platform.python_version(), "machine": platform.machine(), "torch": torch.__version__,
            "transformers": transformers.__version__, "cuda": torch.version.cuda}
    if plan.device == "cuda":
        info["gpu"] = torch.cuda.get_device_name(0)
        info["gpu_memory_gib"] = round(torch.cuda.get_device_properties(0).total_memory / 2**30, 1)
    return info


def qwen3_model(plan: Plan, folder: Path, *, init_std: float = 0.02) -> tuple[Path, int]:
    """A randomly initialised Qwen3 (QK-norm, GQA, tied embeddings) saved as a Hugging Face folder.
    `init_std` 0.02 (Hugging Face's default) gives near-uniform logits; 0.1 puts their spread nearer a
    trained model's (a logit's std ~ init_std x sqrt(hidden_size): 3.2 at 0.1 and 1024 wide)."""
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM

    config = Qwen3Config(hidden_size=plan.hidden_size, num_hidden_layers=plan.num_layers,
                         num_attention_heads=plan.num_heads, num_key_value_heads=plan.num_kv_heads,
                         head_dim=plan.hidden_size // plan.num_heads, intermediate_size=plan.intermediate_size,
                         vocab_size=plan.vocab_size, max_position_embeddings=4096, tie_word_embeddings=True,
                         initializer_range=init_std)
    torch.manual_seed(0)
    model = Qwen3ForCausalLM(config).to(getattr(torch, plan.dtype))
    model.save_pretrained(folder)
    return folder, sum(p.numel() for p in model.parameters())


def engine_throughput(plan: Plan, work: Path) -> dict:
    """Tokens/s over HTTP at each batch size: the dynamic cache (before), then `--static-kv` (after)."""
    model, params = qwen3_model(plan, work / "qwen3")
    out: dict = {"parameters": params}
    for label, flags in (("dynamic", ()), ("static", ("--static-kv",))):
        server = EngineServer(model, plan, max_batch_size=max(plan.batches), log=work / f"engine-{label}.log",
                              flags=flags)
        try:
            for b in plan.batches:
                out[f"{label}_batch_{b}_tokens_per_s"] = round(asyncio.run(_generate_rate(server.url, plan, b)), 1)
            out[f"{label}_decode"] = server_info(server.url)["decode"]
        finally:
            server.stop()
    for b in plan.batches:
        out[f"static_over_dynamic_batch_{b}"] = round(
            out[f"static_batch_{b}_tokens_per_s"] / max(out[f"dynamic_batch_{b}_tokens_per_s"], 1e-9), 2)
    return out


async def _generate_rate(url: str, plan: Plan, batch: int) -> float:
    from rl360cli.inference.client import EngineClient

    params = {"temperature": 1.0, "max_new_tokens": plan.new_tokens, "ignore_eos": True}
    prompt = list(range(1, plan.prompt_tokens + 1))
    async with EngineClient(url) as client:
        # Warm-up, the same batch and lengths: kernels, the allocator, and for the static cache its
        # buffers' growth and each bucket's capture, none of which the measured run should pay.
        await asyncio.gather(*(client.generate(prompt, params) for _ in range(batch)))
        began = time.perf_counter()
        answers = await asyncio.gather(*(client.generate(prompt, params) for _ in range(batch)))
        seconds = time.perf_counter() - began
    return sum(len(a.output_ids) for a in answers) / seconds


def trainer_steps(plan: Plan, work: Path) -> dict:
    import torch

    from rl360cli.rl.config import GRPOConfig
    from rl360cli.trainer.torch_trainer import TorchTrainer

    model, config, batch = _trainer_inputs(plan, work / "qwen3-train")
    out: dict = {}
    for precision in ("fp32", "bf16"):  # fp32 first: bf16 turns TF32 on for the process
        trainer = TorchTrainer(model, dataclasses.replace(config, precision=precision), GRPOConfig(),
                               device=plan.device)
        out[f"torch_{precision}_step_s"] = _timed_steps(trainer, batch, plan)
        if plan.device == "cuda":
            out[f"torch_{precision}_peak_memory_gib"] = round(torch.cuda.max_memory_allocated() / 2**30, 1)
        del trainer
        free_device_memory(plan)
        exact_float32_matmuls()
    out["bf16_speedup"] = round(out["torch_fp32_step_s"] / max(out["torch_bf16_step_s"], 1e-9), 2)
    try:
        from rl360cli.trainer.megatron_trainer import MegatronTrainer
    except ImportError as e:
        out["megatron"] = f"not run: {e} (megatron-core travels as a wheel: see bench/gpu/check.sh)"
        return out
    try:
        megatron = MegatronTrainer(model, config, GRPOConfig(), device=plan.device)
    except Exception as e:  # noqa: BLE001 — the torch figure stands either way
        out["megatron"] = f"not run: {type(e).__name__}: {e}"
        return out
    try:
        out["megatron_step_s"] = _timed_steps(megatron, batch, plan)
    finally:
        megatron.close()
    return out


def trainer_profile(plan: Plan, work: Path) -> dict:
    """Where the torch trainer's step goes: the torch profiler's top operators by device and by host time
    over one step after a warm-up one (printed), and the step's device and host totals."""
    import torch

    from rl360cli.rl.config import GRPOConfig
    from rl360cli.trainer.torch_trainer import TorchTrainer

    model, config, batch = _trainer_inputs(plan, work / "qwen3-profile")
    trainer = TorchTrainer(model, config, GRPOConfig(), device=plan.device)
    trainer.train_step(batch)  # warm-up: kernels, optimizer state
    device_sync(plan)
    began = time.perf_counter()
    with torch.profiler.profile() as profiler:
        trainer.train_step(batch)
        device_sync(plan)
    seconds = time.perf_counter() - began
    events = profiler.key_averages()
    if plan.device == "cuda":
        print(events.table(sort_by="self_device_time_total", row_limit=15), flush=True)
    print(events.table(sort_by="self_cpu_time_total", row_limit=15), flush=True)
    # Kernels only: an operator's row repeats its kernels' device time.
    kernels = [e for e in events if e.device_type != torch.autograd.DeviceType.CPU]
    return {"step_s_profiled": round(seconds, 3), "host_busy_s": round(events.self_cpu_time_total / 1e6, 3),
            "device_busy_s": round(sum(e.self_device_time_total for e in kernels) / 1e6, 3)}


def _trainer_inputs(plan: Plan, folder: Path):
    """What the trainer parts train: a saved random Qwen3, the trainer's settings, one GRPO batch."""
    from rl360cli.trainer.config import TrainerConfig

    model, _ = qwen3_model(plan, folder)
    return model, TrainerConfig(lr=1e-6, micro_batch_tokens=plan.train_tokens * 8), _synthetic_batch(plan)


def _timed_steps(trainer, batch, plan: Plan) -> float:
    import torch

    trainer.train_step(batch)  # warm-up: kernels, optimizer state
    if plan.device == "cuda":
        torch.cuda.synchronize()
    began = time.perf_counter()
    trainer.train_step(batch)
    if plan.device == "cuda":
        torch.cuda.synchronize()
    return round(time.perf_counter() - began, 3)


def _synthetic_batch(plan: Plan):
    """`train_sequences` groups' worth of trajectories of `train_tokens` tokens, through the real build_batch."""
    import numpy as np

    from rl360cli.outcome import Outcome
    from rl360cli.rl.batch import build_batch
    from rl360cli.rl.trajectory import Trajectory

    rng = np.random.default_rng(0)
    prompt = plan.train_tokens // 4
    trajectories = []
    for i in range(plan.train_sequences):
        generated = plan.train_tokens - prompt
        trajectories.append(Trajectory(
            task_id=f"t{i // 8}", group_id=f"g{i // 8}", sample_index=i % 8,
            token_ids=rng.integers(1, plan.vocab_size, plan.train_tokens).astype(np.int32),
            loss_mask=np.array([0] * prompt + [1] * generated, dtype=np.uint8),
            logprobs=np.array([0.0] * prompt + list(rng.uniform(-3, -0.1, generated)), dtype=np.float32),
            versions=(0,), num_prompt_tokens=prompt, reward=float(i % 2), outcome=Outcome.OK))
    batch, _ = build_batch(trajectories)
    return batch


def logprob_agreement(plan: Plan, work: Path) -> dict:
    """How far the torch trainer's logprobs of the engine's own tokens are from the engine's, per token:
    engines (static cache, captured on a GPU) in the plan's dtype and in float32, trainers in fp32 and bf16
    (float32 weights either way); and the captured engine's greedy tokens against the dynamic cache's."""
    import torch

    from rl360cli.rl.config import GRPOConfig
    from rl360cli.trainer.config import TrainerConfig
    from rl360cli.trainer.torch_trainer import TorchTrainer

    model_dir, _ = qwen3_model(plan, work / "qwen3-logprobs", init_std=0.1)
    rows, new = 16, max(plan.new_tokens // 2, 4)
    generator = torch.Generator().manual_seed(1)
    prompts = [torch.randint(1, plan.vocab_size, (plan.prompt_tokens,), generator=generator).tolist()
               for _ in range(rows)]
    sampled = {"max_new_tokens": new, "ignore_eos": True, "temperature": 1.0}
    out: dict = {"rows": rows, "new_tokens": new}
    answers = {}
    for dtype in dict.fromkeys((plan.dtype, "float32")):
        answers[dtype], out[f"engine_{dtype}_decode"] = _engine_answers(model_dir, plan, dtype, prompts, sampled,
                                                                        static_kv=True)
    greedy = {**sampled, "temperature": 0.0}
    dynamic, _ = _engine_answers(model_dir, plan, plan.dtype, prompts, greedy, static_kv=False)
    static, _ = _engine_answers(model_dir, plan, plan.dtype, prompts, greedy, static_kv=True)
    out["static_vs_dynamic_greedy"] = _greedy_agreement(dynamic, static)
    for precision in ("fp32", "bf16"):
        trainer = TorchTrainer(model_dir, TrainerConfig(precision=precision), GRPOConfig(), device=plan.device)
        for dtype, engine_answers in answers.items():
            out[f"engine_{dtype}_trainer_{precision}"] = _logprob_differences(trainer, prompts, engine_answers)
        del trainer
        free_device_memory(plan)
        exact_float32_matmuls()
    return out


def _engine_answers(model_dir: Path, plan: Plan, dtype: str, prompts: list[list[int]], params: dict, *,
                    static_kv: bool) -> tuple[list[dict], dict]:
    """Every prompt through an engine in this process at once: its answers (with logprobs) and decode_info."""
    from rl360cli.inference.engine import Engine
    from rl360cli.inference.protocol import parse_generate

    engine = Engine.load(model_dir, dtype=dtype, device=plan.device, max_batch_size=len(prompts), max_wait_ms=50,
                         static_kv=static_kv)
    engine.start()
    try:
        items = parse_generate({"input_ids": prompts, "sampling_params": params, "return_logprob": True})[0]
        answers = [future.result(timeout=300) for future in [engine.submit(item) for item in items]]
        info = engine.decode_info()
    finally:
        engine.stop()
    del engine
    free_device_memory(plan)
    return answers, info


def _logprob_differences(trainer, prompts: list[list[int]], answers: list[dict]) -> dict:
    """|trainer's logprob - engine's| over every generated token: mean, p99, max."""
    import torch

    ids = torch.tensor([prompt + answer["output_ids"] for prompt, answer in zip(prompts, answers)])
    engine = torch.tensor([[entry[0] for entry in answer["meta_info"]["output_token_logprobs"]] for answer in answers])
    with torch.no_grad():
        mine = trainer.logprobs(ids, torch.ones_like(ids))[:, len(prompts[0]) - 1:].float().cpu()
    diff = (mine - engine).abs().flatten()
    return {"mean": round(float(diff.mean()), 5), "p99": round(float(diff.quantile(0.99)), 5),
            "max": round(float(diff.max()), 5), "tokens": len(diff), "engine_mean_logprob": round(float(engine.mean()), 3)}


def _greedy_agreement(reference: list[dict], other: list[dict]) -> dict:
    """How many sequences are token for token the same; where the others first differ; the largest
    logprob difference over the tokens before that."""
    same, firsts, largest = 0, [], 0.0
    for a, b in zip(reference, other):
        ids_a, ids_b = a["output_ids"], b["output_ids"]
        first = next((i for i, (x, y) in enumerate(zip(ids_a, ids_b)) if x != y), len(ids_a))
        same += first == len(ids_a)
        if first < len(ids_a):
            firsts.append(first)
        lps = zip(a["meta_info"]["output_token_logprobs"][:first], b["meta_info"]["output_token_logprobs"][:first])
        largest = max([largest, *(abs(x[0] - y[0]) for x, y in lps)])
    return {"identical_sequences": same, "sequences": len(reference), "first_differences": firsts,
            "max_logprob_diff_before_a_difference": round(largest, 5)}


def engine_step(plan: Plan, work: Path) -> dict:
    """Milliseconds per decode step: the dynamic cache's forward alone, sampling alone, the engine's whole
    step; the static cache's step uncaptured and captured, and the engine's whole step with it; kernel
    launches and device time a step at batch 1 for the dynamic and the captured step."""
    import torch
    from transformers import DynamicCache

    from rl360cli.inference.engine import Engine
    from rl360cli.inference.kv import BatchKV
    from rl360cli.inference.protocol import SamplingParams
    from rl360cli.inference.sampling import sample_next

    model_dir, _ = qwen3_model(plan, work / "qwen3-step")
    engine = Engine.load(model_dir, dtype=plan.dtype, device=plan.device, max_batch_size=max(plan.batches),
                         max_wait_ms=0)
    steps = plan.new_tokens
    out: dict = {}

    def prefilled(batch: int) -> tuple[BatchKV, torch.Tensor]:
        ids = torch.ones(batch, plan.prompt_tokens, dtype=torch.long, device=plan.device)
        cache = DynamicCache(config=engine.config)
        engine.model(input_ids=ids, **{engine._cache_kw: cache}, use_cache=True, logits_to_keep=1)
        return BatchKV(cache=cache, mask=torch.ones_like(ids)), ids

    for batch in plan.batches:
        params = [SamplingParams(temperature=1.0)] * batch
        generator = torch.Generator(device=plan.device).manual_seed(0)
        with torch.no_grad():
            kv, ids = prefilled(batch)

            def decode(ids=ids, cache=kv.cache):  # one token for every row, on the cache so far
                return engine.model(input_ids=ids[:, :1], **{engine._cache_kw: cache}, use_cache=True).logits

            device_sync(plan)
            began = time.perf_counter()
            for _ in range(steps):
                logits = decode()
            device_sync(plan)
            out[f"batch_{batch}_forward_ms"] = round((time.perf_counter() - began) / steps * 1000, 2)
            began = time.perf_counter()
            for _ in range(steps):
                sample_next(logits[:, -1, :], params, [None] * batch, generator)
            out[f"batch_{batch}_sampling_ms"] = round((time.perf_counter() - began) / steps * 1000, 2)
            if batch == plan.batches[0]:  # what the host spends a step on, operator by operator
                with torch.profiler.profile() as profiler:
                    for _ in range(8):
                        logits = decode()
                        sample_next(logits[:, -1, :], params, [None] * batch, generator)
                    device_sync(plan)
                events = profiler.key_averages()
                print(events.table(sort_by="self_cpu_time_total", row_limit=20), flush=True)
                out.update({f"batch_{batch}_dynamic_{k}": v for k, v in launch_counts(events, 8).items()})
        del kv, logits
    out.update(_engine_steps(engine, plan, "engine_step"))
    # The static cache: the step uncaptured, then captured (on a GPU; the dry run has no graphs to capture).
    for label, graphs in (("static", False), ("captured", None)):
        static_engine = Engine(engine.model, engine.tokenizer, model_path=str(model_dir), device=plan.device,
                               max_batch_size=max(plan.batches), max_wait_ms=0, static_kv=True, cuda_graphs=graphs)
        static = static_engine._static_kv()
        for batch in plan.batches:
            params = [SamplingParams(temperature=1.0)] * batch
            generator = torch.Generator(device=plan.device).manual_seed(0)
            tokens = [1] * batch
            with torch.no_grad():
                static.adopt(prefilled(batch)[0])
                static.reserve(batch, plan.prompt_tokens + steps + 16)
                for _ in range(3):  # captures this bucket's step (on a GPU), then warm
                    static.decode(tokens)
                device_sync(plan)
                began = time.perf_counter()
                for _ in range(steps):
                    static.decode(tokens)
                device_sync(plan)
                out[f"batch_{batch}_{label}_forward_ms"] = round((time.perf_counter() - began) / steps * 1000, 2)
                if label == "captured" and batch == plan.batches[0]:
                    try:  # the profiler over graph replays: its figures are wanted, not worth the part's others
                        with torch.profiler.profile() as profiler:
                            for _ in range(8):
                                sample_next(static.decode(tokens), params, [None] * batch, generator)
                            device_sync(plan)
                        out.update({f"batch_{batch}_captured_{k}": v
                                    for k, v in launch_counts(profiler.key_averages(), 8).items()})
                    except Exception as e:  # noqa: BLE001
                        out[f"batch_{batch}_captured_profile_error"] = f"{type(e).__name__}: {e}"
        if label == "captured":
            out.update(_engine_steps(static_engine, plan, "captured_engine_step"))
            out["captured_decode"] = static_engine.decode_info()
        del static, static_engine
        free_device_memory(plan)
    return out


def _engine_steps(engine, plan: Plan, label: str) -> dict:
    """The engine's whole step (its thread: prefill, decode, sampling, bookkeeping) at each batch size."""
    from rl360cli.inference.protocol import parse_generate

    out = {}
    engine.start()
    try:
        for batch in plan.batches:
            body = {"input_ids": [list(range(1, plan.prompt_tokens + 1))] * batch,
                    "sampling_params": {"max_new_tokens": plan.new_tokens, "ignore_eos": True, "temperature": 1.0},
                    "return_logprob": True}
            # Paused while the batch is queued, so that it is prefilled as one and decodes at one size
            # (else the first arrivals start alone and the step passes through the smaller buckets).
            engine.call(lambda: engine.pause("in_place")).result()
            futures = [engine.submit(item) for item in parse_generate(body)[0]]
            first = engine.num_forward_steps
            began = time.perf_counter()
            engine.call(engine.resume)
            for future in futures:
                future.result()
            out[f"batch_{batch}_{label}_ms"] = round(
                (time.perf_counter() - began) / (engine.num_forward_steps - first) * 1000, 2)
    finally:
        engine.stop()
    return out


def handoff(plan: Plan, work: Path) -> dict:
    import torch
    from transformers import AutoModelForCausalLM

    from rl360cli.trainer.handoff import TensorHandoff

    model_dir, _ = qwen3_model(plan, work / "qwen3-handoff")
    server = EngineServer(model_dir, plan, max_batch_size=8, log=work / "engine-handoff.log")
    try:
        trainer_model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=getattr(torch, plan.dtype))
        trainer_model.to(plan.device)
        named = list(trainer_model.named_parameters())
        nbytes = sum(p.numel() * p.element_size() for _, p in named)
        sync = TensorHandoff([server.url], bucket_mb=512)
        sync.connect()
        sync.broadcast(named, version=1)  # warm-up: the engine maps the trainer's memory once
        stats = sync.broadcast(named, version=2)
        # The floor: the same bytes copied device to device within one process.
        copies = [torch.empty_like(p) for _, p in named]
        device_sync(plan)
        began = time.perf_counter()
        for dst, (_, src) in zip(copies, named):
            dst.copy_(src.detach())
        device_sync(plan)
        raw = time.perf_counter() - began
        served = served_version(server.url)
    finally:
        server.stop()
    return {"bytes": nbytes, "handoff_s": round(stats.seconds, 4), "raw_copy_s": round(raw, 4),
            "handoff_over_raw": round(stats.seconds / max(raw, 1e-9), 1), "engine_serves_version": served}


def loop(plan: Plan, work: Path) -> dict:
    """GRPO steps on local-smoke's tasks: engine on the device (static cache, captured on a GPU), torch
    trainer on the device in bf16, the hand-over into the engine's parameters (its graphs kept)."""
    from transformers import AutoTokenizer

    from rl360cli.config import load_recipe
    from rl360cli.rl.batch import build_batch
    from rl360cli.demo.arith_rollout import load_tasks
    from rl360cli.trainer.handoff import TensorHandoff
    from rl360cli.run.policy import prepare_policy
    from rl360cli.trainer.torch_trainer import TorchTrainer

    recipe = load_recipe(REPO / "recipes" / "local-smoke.toml")
    tasks = load_tasks(Path(recipe.tasks.path))[:plan.loop_tasks]
    policy = prepare_policy(recipe.model, tasks_dir=Path(recipe.tasks.path), out_dir=work / "policy-v0",
                            seed=recipe.policy_seed)
    tokenizer = AutoTokenizer.from_pretrained(policy)
    server = EngineServer(policy, plan, max_batch_size=plan.loop_tasks * plan.loop_samples,
                          log=work / "engine-loop.log", dtype="float32", flags=("--static-kv",))
    steps = []
    try:
        trainer = TorchTrainer(policy, dataclasses.replace(recipe.trainer, precision="bf16"), recipe.grpo,
                               device=plan.device)
        sync = TensorHandoff([server.url])
        sync.connect()
        for step in range(plan.loop_steps):
            began = time.perf_counter()
            trajectories = asyncio.run(_rollouts(server.url, tokenizer, tasks, plan, recipe.rollout, step))
            generated = time.perf_counter()
            batch, report = build_batch(trajectories, current_version=trainer.version, **recipe.grpo.batch_kwargs())
            stats = trainer.train_step(batch) if batch is not None else {}
            trained = time.perf_counter()
            sync_stats = sync.broadcast(trainer.named_tensors(), trainer.version)
            steps.append({"step": step, "reward": round(sum(t.reward for t in trajectories) / len(trajectories), 3),
                          "kept": report.kept,
                          "generation_s": round(generated - began, 2), "train_s": round(trained - generated, 2),
                          "handoff_s": round(sync_stats.seconds, 3), "loss": stats.get("loss")})
            print(f"  step {step}: {steps[-1]}", flush=True)
        served = served_version(server.url)
        decode = server_info(server.url)["decode"]
    finally:
        server.stop()
    exact_float32_matmuls()
    return {"steps": steps, "engine_serves_version": served, "trainer_version": trainer.version,
            "engine_decode": decode, "trainer_precision": "bf16",
            "stand_ins": "arith_rollout.emulate_command for the sandbox shell; no Ray, router or sandboxes"}


async def _rollouts(url: str, tokenizer, tasks, plan: Plan, rollout, step: int):
    """Every task `loop_samples` times, through the engine, as the real session converses."""
    from rl360cli.inference.client import EngineClient

    async with EngineClient(url) as client:
        return await asyncio.gather(*(_session(client, tokenizer, task, rollout, f"s{step}-{task.name}", k)
                                      for task in tasks for k in range(plan.loop_samples)))


async def _session(client, tokenizer, task, rollout, group_id: str, sample_index: int):
    import numpy as np

    from rl360cli.agent.conversation import ConversationTokens, format_observation, parse_action
    from rl360cli.outcome import Outcome
    from rl360cli.rl.trajectory import Trajectory
    from rl360cli.demo import arith
    from rl360cli.demo.arith_rollout import emulate_command

    conversation = ConversationTokens(tokenizer, [{"role": "user", "content": task.instruction}])
    answer = None
    versions = []
    for _ in range(rollout.max_turns):
        budget = min(rollout.max_new_tokens, rollout.max_total_tokens - len(conversation))
        if budget <= 0:
            break
        reply = await client.generate(conversation.token_ids, {"max_new_tokens": budget,
                                                               "temperature": rollout.temperature})
        conversation.add_generated(reply.output_ids, reply.logprobs, reply.weight_version)
        versions.append(reply.weight_version)
        action = parse_action(reply.text)
        if action.kind == "submit":
            break
        code, output, written = emulate_command(action.command)
        answer = written if written is not None else answer
        conversation.add_observation(format_observation(code, output))
    reward = float(answer is not None and arith.check_answer(answer, task.cases))
    return Trajectory(task_id=task.name, group_id=group_id, sample_index=sample_index,
                      token_ids=np.asarray(conversation.token_ids, dtype=np.int32),
                      loss_mask=np.asarray(conversation.loss_mask, dtype=np.uint8),
                      logprobs=np.asarray(conversation.logprobs, dtype=np.float32), versions=tuple(versions),
                      num_prompt_tokens=conversation.num_prompt_tokens, reward=reward, outcome=Outcome.OK)


# ----------------------------------------------------------------------------- helpers


PARTS = {"env": env, "engine": engine_throughput, "trainer": trainer_steps, "logprobs": logprob_agreement,
         "engine_step": engine_step, "loop": loop, "handoff": handoff, "trainer_profile": trainer_profile}
# What a plain run measures (issue 40's before and after), the most wanted first: a run cut by the time
# limit keeps the parts that finished. handoff and trainer_profile ran on 2026-12-04 (--parts runs them).
DEFAULT_PARTS = ("env", "engine", "trainer", "logprobs", "engine_step", "loop")

if __name__ == "__main__":
    sys.exit(main())
