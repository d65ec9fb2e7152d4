"""The prepared GPU check: rl360's GPU path on one GPU, measured in one run of a few minutes.

    python3 bench/gpu/check.py [--out FILE]      # on a GPU machine (bench/gpu/check.sh wraps it)
    python3 bench/gpu/check.py --dry-run         # prints the plan, then runs it all on the CPU, tiny

Seven parts, each timed, all figures into one JSON file (default: $OUT/gpu-check.json, else
bench/gpu/gpu-check.json):
1. engine: rl360's engine (`python -m rl360cli.inference.server --device cuda --dtype bfloat16`, a
   real server process driven over HTTP by the rollouts' `EngineClient`) serving a randomly
   initialised Qwen3-architecture model of ~0.6 B parameters (no download): generated tokens/s at
   batch 1, 32 and 256.
2. trainer: the torch trainer's step time on one GRPO batch; the megatron trainer's on the same
   batch when megatron-core is importable (it travels as a wheel; else the part says why not).
3. hand-over: the trainer's weights to the engine on the same GPU by CUDA IPC handles
   (`rl360cli.trainer.handoff`), in seconds, against a raw device-to-device copy of the same bytes.
4. engine_step: where one decode step of that engine goes, at each batch size, without HTTP: the
   model's forward alone (launched back to back, one sync at the end), the sampling alone
   (`sample_next` on logits of the vocabulary's width), and the engine's whole step; then the
   torch profiler's top operators by host time over 8 steps (forward and sampling) at batch 1 (printed).
5. trainer_profile: where the torch trainer's step goes (the profiler's top operators by device and
   host time, printed; the step's device and host totals).
6. loop: 5 GRPO steps on local-smoke's 32 tasks and its policy: rollouts through the engine on the
   GPU (the arith conversation of `rl360cli.demo.arith_rollout`, its emulated shell standing in for
   sandboxes: the GPU machine has no bubblewrap, Ray or router), `build_batch`, the torch trainer on
   the GPU, the hand-over; reward and seconds per step.
7. env: the machine, torch, CUDA and transformers versions.

A part that fails records its error and the others still run; the exit code is 1 if any failed.
`--dry-run` runs the same code with tiny sizes on the CPU (float32, gloo-free), so CI checks that
the script works end to end before a GPU is ever lent (tests/bench/test_gpu_check.py).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
import traceback
import urllib.request
from dataclasses import asdict, dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))


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
    parser.add_argument("--parts", default=",".join(PARTS), help=f"comma-separated, of: {', '.join(PARTS)}")
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


def qwen3_model(plan: Plan, folder: Path) -> tuple[Path, int]:
    """A randomly initialised Qwen3 (QK-norm, GQA, tied embeddings) saved as a Hugging Face folder."""
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM

    config = Qwen3Config(hidden_size=plan.hidden_size, num_hidden_layers=plan.num_layers,
                         num_attention_heads=plan.num_heads, num_key_value_heads=plan.num_kv_heads,
                         head_dim=plan.hidden_size // plan.num_heads, intermediate_size=plan.intermediate_size,
                         vocab_size=plan.vocab_size, max_position_embeddings=4096, tie_word_embeddings=True)
    torch.manual_seed(0)
    model = Qwen3ForCausalLM(config).to(getattr(torch, plan.dtype))
    model.save_pretrained(folder)
    return folder, sum(p.numel() for p in model.parameters())


def engine_throughput(plan: Plan, work: Path) -> dict:
    model, params = qwen3_model(plan, work / "qwen3")
    server = EngineServer(model, plan, max_batch_size=max(plan.batches), log=work / "engine.log")
    try:
        rates = {f"batch_{b}_tokens_per_s": round(asyncio.run(_generate_rate(server.url, plan, b)), 1)
                 for b in plan.batches}
    finally:
        server.stop()
    return {"parameters": params, **rates}


async def _generate_rate(url: str, plan: Plan, batch: int) -> float:
    from rl360cli.inference.client import EngineClient

    params = {"temperature": 1.0, "max_new_tokens": plan.new_tokens, "ignore_eos": True}
    prompt = list(range(1, plan.prompt_tokens + 1))
    async with EngineClient(url) as client:
        await client.generate(prompt, {**params, "max_new_tokens": 2})  # warm-up: kernels, allocator
        began = time.perf_counter()
        answers = await asyncio.gather(*(client.generate(prompt, params) for _ in range(batch)))
        seconds = time.perf_counter() - began
    return sum(len(a.output_ids) for a in answers) / seconds


def trainer_steps(plan: Plan, work: Path) -> dict:
    import torch

    from rl360cli.rl.config import GRPOConfig
    from rl360cli.trainer.torch_trainer import TorchTrainer

    model, config, batch = _trainer_inputs(plan, work / "qwen3-train")
    trainer = TorchTrainer(model, config, GRPOConfig(), device=plan.device)
    out = {"torch_step_s": _timed_steps(trainer, batch, plan)}
    if plan.device == "cuda":  # the engine turns cuDNN's attention off (it re-plans per length): the trainer?
        torch.backends.cuda.enable_cudnn_sdp(False)
        out["torch_step_s_without_cudnn_attention"] = _timed_steps(trainer, batch, plan)
        torch.backends.cuda.enable_cudnn_sdp(True)
    del trainer
    if plan.device == "cuda":
        torch.cuda.empty_cache()
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
    _sync(plan)
    began = time.perf_counter()
    with torch.profiler.profile() as profiler:
        trainer.train_step(batch)
        _sync(plan)
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


def engine_step(plan: Plan, work: Path) -> dict:
    """Milliseconds per decode step: forward alone, sampling alone, the engine's whole step."""
    import torch
    from transformers import DynamicCache

    from rl360cli.inference.engine import Engine
    from rl360cli.inference.protocol import SamplingParams, parse_generate
    from rl360cli.inference.sampling import sample_next

    model_dir, _ = qwen3_model(plan, work / "qwen3-step")
    engine = Engine.load(model_dir, dtype=plan.dtype, device=plan.device, max_batch_size=max(plan.batches),
                         max_wait_ms=0)
    steps = plan.new_tokens
    out: dict = {}
    for batch in plan.batches:
        ids = torch.ones(batch, plan.prompt_tokens, dtype=torch.long, device=plan.device)
        cache = DynamicCache(config=engine.config)

        def decode():  # one token for every row, on the cache so far
            return engine.model(input_ids=ids[:, :1], **{engine._cache_kw: cache}, use_cache=True).logits

        with torch.no_grad():
            engine.model(input_ids=ids, **{engine._cache_kw: cache}, use_cache=True, logits_to_keep=1)
            _sync(plan)
            began = time.perf_counter()
            for _ in range(steps):
                logits = decode()
            _sync(plan)
        out[f"batch_{batch}_forward_ms"] = round((time.perf_counter() - began) / steps * 1000, 2)
        params = [SamplingParams(temperature=1.0)] * batch
        generator = torch.Generator(device=plan.device).manual_seed(0)
        began = time.perf_counter()
        for _ in range(steps):
            sample_next(logits[:, -1, :], params, [None] * batch, generator)
        out[f"batch_{batch}_sampling_ms"] = round((time.perf_counter() - began) / steps * 1000, 2)
        if batch == plan.batches[0]:  # what the host spends a step on, operator by operator
            with torch.no_grad(), torch.profiler.profile() as profiler:
                for _ in range(8):
                    logits = decode()
                    sample_next(logits[:, -1, :], params, [None] * batch, generator)
            print(profiler.key_averages().table(sort_by="self_cpu_time_total", row_limit=20), flush=True)
        del cache, logits
    engine.start()
    try:
        for batch in plan.batches:
            body = {"input_ids": [list(range(1, plan.prompt_tokens + 1))] * batch,
                    "sampling_params": {"max_new_tokens": steps, "ignore_eos": True, "temperature": 1.0},
                    "return_logprob": True}
            first = engine.num_forward_steps
            began = time.perf_counter()
            for future in [engine.submit(item) for item in parse_generate(body)[0]]:
                future.result()
            out[f"batch_{batch}_engine_step_ms"] = round(
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
        _sync(plan)
        began = time.perf_counter()
        for dst, (_, src) in zip(copies, named):
            dst.copy_(src.detach())
        _sync(plan)
        raw = time.perf_counter() - began
        served = _served_version(server.url)
    finally:
        server.stop()
    return {"bytes": nbytes, "handoff_s": round(stats.seconds, 4), "raw_copy_s": round(raw, 4),
            "handoff_over_raw": round(stats.seconds / max(raw, 1e-9), 1), "engine_serves_version": served}


def loop(plan: Plan, work: Path) -> dict:
    """GRPO steps on local-smoke's tasks: engine on the device, torch trainer on the device, hand-over."""
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
                          log=work / "engine-loop.log", dtype="float32")
    steps = []
    try:
        trainer = TorchTrainer(policy, recipe.trainer, recipe.grpo, device=plan.device)
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
        served = _served_version(server.url)
    finally:
        server.stop()
    return {"steps": steps, "engine_serves_version": served, "trainer_version": trainer.version,
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
        conversation.add_observation(format_observation(code, output), finished_turn=reply.finish_reason == "stop")
    reward = float(answer is not None and arith.check_answer(answer, task.cases))
    return Trajectory(task_id=task.name, group_id=group_id, sample_index=sample_index,
                      token_ids=np.asarray(conversation.token_ids, dtype=np.int32),
                      loss_mask=np.asarray(conversation.loss_mask, dtype=np.uint8),
                      logprobs=np.asarray(conversation.logprobs, dtype=np.float32), versions=tuple(versions),
                      num_prompt_tokens=conversation.num_prompt_tokens, reward=reward, outcome=Outcome.OK)


# ----------------------------------------------------------------------------- helpers


class EngineServer:
    """`python -m rl360cli.inference.server` on 127.0.0.1, on the plan's device; stopped by its PID."""

    def __init__(self, model: Path, plan: Plan, *, max_batch_size: int, log: Path, dtype: str | None = None):
        from rl360cli.ports import free_port

        port = free_port()
        self.url = f"http://127.0.0.1:{port}"
        argv = [sys.executable, "-m", "rl360cli.inference.server", "--model", str(model), "--port", str(port),
                "--device", plan.device, "--dtype", dtype or plan.dtype, "--max-batch-size", str(max_batch_size),
                "--max-wait-ms", "20"]
        self.log = log
        self.proc = subprocess.Popen(argv, stdout=open(log, "wb"), stderr=subprocess.STDOUT, cwd=REPO,
                                     env={**os.environ, "PYTHONPATH": str(REPO)})
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"the engine exited: {log.read_text()[-2000:]}")
            try:
                with urllib.request.urlopen(self.url + "/health", timeout=2):
                    return
            except OSError:
                time.sleep(0.3)
        self.stop()
        raise RuntimeError(f"the engine did not become healthy in 300 s: {log.read_text()[-2000:]}")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def _served_version(url: str) -> int:
    with urllib.request.urlopen(url + "/model_info", timeout=10) as answer:
        return int(json.load(answer)["weight_version"])


def _sync(plan: Plan) -> None:
    if plan.device == "cuda":
        import torch

        torch.cuda.synchronize()


PARTS = {"env": env, "engine": engine_throughput, "engine_step": engine_step, "trainer": trainer_steps,
         "trainer_profile": trainer_profile, "handoff": handoff, "loop": loop}

if __name__ == "__main__":
    sys.exit(main())
