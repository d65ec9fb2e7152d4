"""Tune the local-smoke recipe: an in-process simulation of its GRPO loop, seconds per step on a CPU.

    .venv/bin/python bench/tune_local_smoke.py --seeds 0 1 2            # the recipe's policy and settings
    .venv/bin/python bench/tune_local_smoke.py --seeds 0 1 2 3 4 5 --stop-after 2 --num-epochs 3  # a search
    .venv/bin/python bench/tune_local_smoke.py --build --warmup-steps 150 --policy-seed 3 --lr 2e-3 --out /tmp/t.json

What it keeps from the real loop: the recipe's policy v0 (recipes/models/local-smoke-v0), or with
`--build` a tiny policy from `prepare_policy` with the builder's settings as defaults (tokenizer, tiny
Llama, warm-up; unlike recipes/models/build_local_smoke_v0.py, its warm-up may show held-out
instructions), the agent conversation of `rl360cli.agent.conversation`, `build_batch` (dynamic filtering,
GRPO advantages) and the trainer's update (`policy_loss` over micro-batches, AdamW, gradient
clipping, as `rl360cli.trainer.torch_trainer` does it), with the recipe's [model], [trainer],
[grpo], [loop] and [rollout] values as defaults. What it replaces: the engine (sampling with the
model directly), the sandbox (`emulate_command` understands `echo '<expr>' > answer.py`) and
test.sh (its own function, `arith.check_answer`, called in process). `--staleness 1` trains each
batch one policy version late, as the overlapped loop does.

It prints one line per step and, at the end, the per-seed reward curves and whether each run
went from <= 0.45 to >= 0.90; `--out` writes them as JSON, with each run's first step at or above 0.90
and the sessions sampled up to it. `--stop-after K` ends a run K steps after that step.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import json
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from rl360cli.config import load_recipe  # noqa: E402

BUILT = importlib.import_module("recipes.models.build_local_smoke_v0")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    recipe = load_recipe(REPO / "recipes" / "local-smoke.toml")
    m, t, g, loop, r = BUILT.MODEL, recipe.trainer, recipe.grpo, recipe.loop, recipe.rollout
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seeds", type=int, nargs="+", default=[recipe.run.seed], help="sampling seeds")
    p.add_argument("--build", action="store_true",
                   help="build policy v0 with the settings below instead of loading the recipe's")
    p.add_argument("--policy-seed", type=int, default=None,
                   help="with --build: the warm-up's seed for every run (default: each run's sampling seed)")
    p.add_argument("--tasks", type=Path, default=Path(recipe.tasks.path))
    p.add_argument("--hidden", type=int, default=m.hidden_size)
    p.add_argument("--layers", type=int, default=m.num_layers)
    p.add_argument("--heads", type=int, default=m.num_heads)
    p.add_argument("--warmup-steps", type=int, default=m.warmup_steps)
    p.add_argument("--warmup-lr", type=float, default=m.warmup_lr)
    p.add_argument("--from-policy", type=Path, default=Path(recipe.model.path), help="start from this saved policy")
    p.add_argument("--lr", type=float, default=t.lr)
    p.add_argument("--lr-schedule", choices=("constant", "cosine"), default=t.lr_schedule)
    p.add_argument("--lr-warmup-steps", type=int, default=t.lr_warmup_steps)
    p.add_argument("--lr-decay-steps", type=int, default=t.lr_decay_steps)
    p.add_argument("--lr-min-ratio", type=float, default=t.lr_min_ratio)
    p.add_argument("--clip-high", type=float, default=g.clip_high, help="DAPO's upper clip (clip_low stays)")
    p.add_argument("--grad-clip", type=float, default=t.grad_clip)
    p.add_argument("--num-epochs", type=int, default=t.num_epochs)
    p.add_argument("--temperature", type=float, default=r.temperature)
    p.add_argument("--max-new-tokens", type=int, default=r.max_new_tokens)
    p.add_argument("--max-turns", type=int, default=r.max_turns)
    p.add_argument("--num-steps", type=int, default=loop.num_steps)
    p.add_argument("--samples", type=int, default=loop.num_samples_per_task)
    p.add_argument("--staleness", type=int, default=1 if loop.overlap else 0,
                   help="train each batch this many versions late (the overlapped loop: 1)")
    p.add_argument("--rounds", type=int, default=loop.max_generation_rounds,
                   help="generation rounds per step: later rounds resample the tasks whose group had no signal")
    p.add_argument("--resample-from-step", type=int, default=loop.resample_from_step,
                   help="the steps before this one run their first round only, as the loop's [loop] resample_from_step")
    p.add_argument("--no-filter", action="store_true", help="keep zero-variance groups in the batch")
    p.add_argument("--threads", type=int, default=1, help="torch threads (2 cores are shared with others)")
    p.add_argument("--policy-root", type=Path, default=None, help="keep prepared policies here (reused)")
    p.add_argument("--stop-after", type=int, default=None,
                   help="end a run this many steps after its first reward >= 0.90 (what a search needs)")
    p.add_argument("--out", type=Path, default=None)
    args = p.parse_args(argv)
    args.grpo = dataclasses.replace(g, clip_high=args.clip_high)
    args.trainer = dataclasses.replace(
        t, lr=args.lr, lr_schedule=args.lr_schedule, lr_warmup_steps=args.lr_warmup_steps,
        lr_decay_steps=args.lr_decay_steps, lr_min_ratio=args.lr_min_ratio, grad_clip=args.grad_clip, num_epochs=args.num_epochs)
    return args


def token_logprobs(model, micro):
    """log pi(token t+1 | tokens <= t), [B, T-1], as TorchTrainer.logprobs computes it."""
    import torch

    logits = model(input_ids=micro.input_ids, attention_mask=micro.attention_mask).logits
    return torch.log_softmax(logits[:, :-1].float(), -1).gather(-1, micro.input_ids[:, 1:, None])[..., 0]


def run_seed(args: argparse.Namespace, seed: int, root: Path) -> dict:
    import copy

    import torch

    from rl360cli.outcome import Outcome
    from rl360cli.rl.batch import build_batch
    from rl360cli.rl.trajectory import Trajectory
    from rl360cli.demo.arith_rollout import load_tasks, run_tasks
    from rl360cli.trainer.config import ModelConfig
    from rl360cli.run.policy import prepare_policy
    from rl360cli.trainer.model import load_policy
    from rl360cli.trainer.step import train_step

    config = ModelConfig(kind="tiny", hidden_size=args.hidden, num_layers=args.layers, num_heads=args.heads,
                         warmup_steps=args.warmup_steps, warmup_lr=args.warmup_lr)  # fmt: skip
    started = time.perf_counter()
    policy_seed = seed if args.policy_seed is None else args.policy_seed
    name = f"h{args.hidden}-l{args.layers}-w{args.warmup_steps}-wlr{args.warmup_lr:g}-s{policy_seed}"
    path = prepare_policy(config, tasks_dir=args.tasks, out_dir=root / name, seed=policy_seed) if args.build \
        else args.from_policy
    prepare_s = time.perf_counter() - started
    model, tok = load_policy(path)
    tasks = load_tasks(args.tasks)
    trainer = args.trainer
    optimizer = torch.optim.AdamW(model.parameters(), lr=trainer.lr, betas=tuple(trainer.betas),
                                  weight_decay=trainer.weight_decay)  # fmt: skip
    generator = torch.Generator().manual_seed(1000 + seed)
    grpo = args.grpo
    batch_kwargs = grpo.batch_kwargs() | {"max_staleness": None}
    if args.no_filter:
        batch_kwargs["filter_zero_std"] = False
    behaviour = model if args.staleness == 0 else copy.deepcopy(model)

    def generate(step: int, policy, version: int) -> tuple[list[Trajectory], float, float]:
        """The step's samples (with the loop's extra rounds for tasks whose group had no signal),
        the first round's mean reward (what the loop reports) and the seconds taken."""
        t0 = time.perf_counter()
        policy.eval()
        trajectories: list[Trajectory] = []
        todo, first = tasks, None
        for round_index in range(args.rounds if step >= args.resample_from_step else 1):
            attempts = run_tasks(policy, tok, todo, num_samples=args.samples, temperature=args.temperature,
                                 max_new_tokens=args.max_new_tokens, max_turns=args.max_turns, version=version,
                                 generator=generator)  # fmt: skip
            trajectories += [
                Trajectory(task_id=a.task, group_id=f"s{step}-r{round_index}-{a.task}", sample_index=a.sample_index,
                           token_ids=a.token_ids, loss_mask=a.loss_mask, logprobs=a.logprobs,
                           versions=(version,) * a.num_turns, num_prompt_tokens=a.num_prompt_tokens,
                           reward=a.reward, outcome=Outcome.OK)
                for a in attempts
            ]  # fmt: skip
            if first is None:
                first = sum(a.reward for a in attempts) / len(attempts)
            rewards: dict[str, set[float]] = {}
            for a in attempts:
                rewards.setdefault(a.task, set()).add(a.reward)
            done_now = {name for name, values in rewards.items() if len(values) > 1}
            todo = [t for t in todo if t.name not in done_now]
            if not todo:
                break
        return trajectories, first, time.perf_counter() - t0

    rows = []
    pending = generate(0, model, 0)
    for step in range(args.num_steps):
        trajectories, reward, gen_s = pending
        if args.staleness and step + 1 < args.num_steps:
            # Overlap: the next batch is sampled by this version while this one trains.
            behaviour.load_state_dict(model.state_dict())
            pending = generate(step + 1, behaviour, step)
        batch, report = build_batch(trajectories, current_version=step, **batch_kwargs)
        t0 = time.perf_counter()
        figures = {"grad_norm": 0.0, "clip_frac": 0.0, "approx_kl": 0.0, "lr": trainer.lr_at(step), "update": 0.0}
        if batch is not None:
            model.train()
            before = torch.cat([p.detach().flatten() for p in model.parameters()])
            clip = trainer.grad_clip if trainer.grad_clip > 0 else float("inf")
            stats = train_step(  # what TorchTrainer.train_step runs
                batch.split(max_tokens=trainer.micro_batch_tokens), grpo=grpo, num_epochs=trainer.num_epochs,
                optimizer=optimizer, lr=trainer.lr_at(step),
                logprobs=lambda micro: token_logprobs(model, micro),
                clip_grads=lambda: float(torch.nn.utils.clip_grad_norm_(model.parameters(), clip)),
            )
            after = torch.cat([p.detach().flatten() for p in model.parameters()])
            # How far the update moved the weights, relative to their size.
            stats["update"] = float((after - before).norm() / before.norm())
            figures = {name: stats[name] for name in figures}
        train_s = time.perf_counter() - t0
        first_090 = next((i for i, r in enumerate([*(row["reward"] for row in rows), reward]) if r >= 0.9), None)
        stopping = args.stop_after is not None and first_090 is not None and step >= first_090 + args.stop_after
        if not args.staleness and step + 1 < args.num_steps and not stopping:
            pending = generate(step + 1, model, step + 1)
        row = {"step": step, "reward": reward, "groups_kept": report.num_groups_kept,
               "samples": len(trajectories), "tokens": int(sum(t.num_tokens for t in trajectories)), "generate_s": round(gen_s, 2),
               "train_s": round(train_s, 2), **{k: round(v, 6) for k, v in figures.items()}}  # fmt: skip
        rows.append(row)
        print(f"seed {seed} step {step:2d} reward {row['reward']:.3f} groups {row['groups_kept']:2d} "
              f"samples {row['samples']:3d} "
              f"gen {gen_s:5.2f}s train {train_s:5.2f}s grad {figures['grad_norm']:.3f} "
              f"kl {figures['approx_kl']:.4f} clip {figures['clip_frac']:.3f} update {figures['update']:.2e}", flush=True)  # fmt: skip
        if stopping:
            break
    curve = [row["reward"] for row in rows]
    return {
        "seed": seed, "policy_seed": policy_seed, "prepare_s": round(prepare_s, 1),
        "warmup": json.loads((path / "warmup.json").read_text()) if (path / "warmup.json").is_file() else None,
        "curve": curve, "rows": rows, "start": curve[0], "best": max(curve), "final": curve[-1],
        "steps_to_090": next((i for i, r in enumerate(curve) if r >= 0.9), None),
        # Sessions sampled up to and including the step of the first reward >= 0.90 (all rounds).
        "sessions_to_090": next((sum(row["samples"] for row in rows[: i + 1]) for i, r in enumerate(curve) if r >= 0.9), None),
        "ok": curve[0] <= 0.45 and max(curve[-3:]) >= 0.9,
    }


def main(argv: list[str] | None = None) -> int:
    import torch

    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    settings = {k: v for k, v in vars(args).items() if k not in ("grpo", "trainer", "out", "policy_root", "tasks")}
    print("settings:", json.dumps(settings, default=str))
    with tempfile.TemporaryDirectory() as tmp:
        root = args.policy_root or Path(tmp)
        results = [run_seed(args, seed, root) for seed in args.seeds]
    print("\nseed  ok    start  final  steps->0.90  sessions->0.90  gen s/step  train s/step  curve")
    for r in results:
        gen = sum(row["generate_s"] for row in r["rows"]) / len(r["rows"])
        train = sum(row["train_s"] for row in r["rows"]) / len(r["rows"])
        print(f"{r['seed']:4d}  {str(r['ok']):5s} {r['start']:.3f}  {r['final']:.3f}  {str(r['steps_to_090']):>11s}  {str(r['sessions_to_090']):>14s}"
              f"  {gen:10.2f}  {train:12.2f}  {' '.join(f'{c:.2f}' for c in r['curve'])}")  # fmt: skip
    if args.out:
        args.out.write_text(json.dumps({"settings": settings, "results": results}, indent=2, default=str) + "\n")
    return 0 if all(r["ok"] for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
