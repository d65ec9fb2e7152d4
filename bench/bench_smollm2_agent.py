"""Benchmark: recipes/smollm2-agent.toml, SmolLM2-135M-Instruct as a tool-calling agent, does it learn?

Runs `rl360 up --recipe recipes/smollm2-agent.toml` (in a fresh state file, on a copy of cluster/local.toml
on free ports) and, while it runs, rewrites the "SmolLM2 agent" section of docs/benchmarks.md after every
step: the training reward (mean of the step's first round) and pass rate, held-out pass@1 before training and
at each evaluation, the step's time split (generation, update, weight sync, the rest) and generated tokens/s.
A run cut short leaves the table of the steps it finished. The goal it measures (issue 38): the training
reward rises by at least 0.25 from its start, and held-out pass@1 rises, within 90 minutes on 2 cores.

    .venv/bin/python bench/bench_smollm2_agent.py                      # the recipe as it is (~90 min)
    .venv/bin/python bench/bench_smollm2_agent.py --manifest recipes/smollm2-agent-manifest.json
    .venv/bin/python bench/bench_smollm2_agent.py --full-finetune     # the same recipe, every weight trained
    .venv/bin/python bench/bench_smollm2_agent.py --steps 2 --doc /tmp/b.md   # a check of the bench itself
    .venv/bin/python bench/bench_smollm2_agent.py --seeds 0 1 2       # one run a seed (~90 min each), then
                                                                      # the mean and spread over them

With `--seeds`, each seed's rows are kept in bench/results/smollm2_agent_seed<N>_<settings>.json as its run ends
(`<settings>`: a digest of the overrides but the seed, so that runs of other settings never mix), a seed already
kept with the same settings is not run again (`--again` runs it), and the section "SmolLM2 agent, N seeds" gives per step
the mean and the range of the reward, per held-out tag the mean before and after training with the range, and
the issue-49 goal: held-out `hint-command` pass@1 up by at least 0.25 (mean over the seeds), `hint-call` kept.

"Start" is the mean of the first two steps' rewards (one step of 8 tasks is noisy); the rise is the best
mean of three steps in a row after them, less the start (tests/loop/test_learning.py's rule).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.report import BENCHMARKS, write_section

REPO = Path(__file__).resolve().parents[1]
RECIPE = REPO / "recipes" / "smollm2-agent.toml"
TITLE = "SmolLM2 agent"
GOAL_RISE, GOAL_MINUTES = 0.25, 90
# Issue 49: commands the instruction does not show, learned (the mean rise over the seeds).
GOAL_HINT_COMMAND_RISE = 0.25
TAG_PREFIX = "eval/pass@1/domain/"
RESULTS = REPO / "bench" / "results"
# Full fine-tuning's rate: smollm2-local's (the recipe's 2e-4 is LoRA's, for an adapter whose B starts at 0).
FULL_FINETUNE_LR = 1e-5


def full_finetune_recipe(folder: Path) -> tuple[Path, list[str]]:
    """The recipe without its `lora` line, in `folder`, and the overrides that keep its relative paths (read
    against the recipe's own folder) pointing where they did: `--set` cannot remove a key."""
    text = RECIPE.read_text()
    kept = [line for line in text.splitlines() if not line.startswith("lora = ")]
    if len(kept) != len(text.splitlines()) - 1:
        raise SystemExit(f"{RECIPE}: expected one `lora = ...` line to remove")
    path = folder / "recipe-full-finetune.toml"
    path.write_text("\n".join(kept) + "\n")
    here = RECIPE.parent
    return path, [f"trainer.lr={FULL_FINETUNE_LR}", f"tasks.path={here / 'tasks' / 'shell-train'}",
                  f"tasks.manifest={here / 'smollm2-agent-manifest.json'}", f"eval.path={here / 'tasks' / 'shell-heldout'}"]


def profile_on_free_ports(folder: Path) -> Path:
    """cluster/local.toml with its ports moved to a free block: another run may hold the default ones."""
    from rl360cli.ports import free_port_block

    base = free_port_block(20)
    text = (REPO / "cluster" / "local.toml").read_text()
    text = text.replace("base_port = 31000", f"base_port = {base}").replace("sync_port = 29600",
                                                                            f"sync_port = {base + 15}")
    path = folder / "profile.toml"
    path.write_text(text)
    return path


def read_rows(state: Path) -> list[dict]:
    try:
        doc = json.loads(state.read_text())
        path = Path(doc["runs"][doc["current_run"]]["metrics_path"])
        return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    except (OSError, KeyError, ValueError):
        return []  # the run has not written its first row yet


def _f(value, spec: str = ".3f") -> str:
    return "-" if value is None else format(value, spec)


def _mib(nbytes) -> str:
    return "-" if not nbytes else f"{nbytes / 2**20:.1f}"


def rise(rewards: list[float]) -> float | None:
    """Best mean of three steps in a row after the first two, less the first two's mean."""
    if len(rewards) < 5:
        return None
    start = statistics.mean(rewards[:2])
    return max(statistics.mean(rewards[i:i + 3]) for i in range(2, len(rewards) - 2)) - start


def section(rows: list[dict], *, command: str, wall_s: float, done: bool, ended: str = "", update: str = "LoRA step") -> str:
    """The section's text; `ended`: why a run that did not finish stopped (its last line), else ""."""
    steps = [row for row in rows if "reward_mean" in row]
    evals = {row["step"]: row["eval/pass@1"] for row in rows if "eval/pass@1" in row}
    eval_s = {row["step"]: row.get("eval/s") for row in rows if "eval/pass@1" in row}
    before = evals.get(-1)
    rewards = [row["reward_mean"] for row in steps if row["reward_mean"] is not None]
    lines = [
        (f"`{command}` in a fresh state file (`bench/bench_smollm2_agent.py`), rewritten after every step. "
         f"Goal (issue 38): training reward +{GOAL_RISE} from its start and held-out pass@1 up, within "
         f"{GOAL_MINUTES} minutes on 2 cores. Steps counted from 0; reward: mean of the step's first round; "
         f"time split: generation, update ({update}), weight sync, and the rest of the step (the batch, "
         "logging); eval s: the held-out evaluation after the step, outside the step's time; tokens/s: "
         "generated tokens over the whole step; RSS: the trainer's peak; sync MiB: bytes sent to the engine."),
        "",
        f"Held-out pass@1 before training (policy v0): {_f(before)} ({_f(eval_s.get(-1), '.1f')} s).",
        "",
        ("| step | reward | pass rate | held-out pass@1 | generation s | update s | sync s | other s | step s "
         "| tokens/s | RSS MiB | sync MiB | eval s |"),
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for row in steps:
        parts = [row.get("generation_s") or 0.0, row.get("train_s") or 0.0, row.get("weight_sync_s") or 0.0]
        other = row["step_s"] - sum(parts)
        lines.append(f"| {row['step']} | {_f(row['reward_mean'])} | {_f(row.get('pass_rate'))} | "
                     f"{_f(evals.get(row['step']))} | {parts[0]:.1f} | {parts[1]:.1f} | {parts[2]:.1f} | "
                     f"{other:.1f} | {row['step_s']:.1f} | {_f(row.get('tokens_per_s'), '.1f')} | "
                     f"{_f(row.get('trainer_peak_rss_mb'), '.0f')} | {_mib(row.get('weight_sync_bytes'))} | "
                     f"{_f(eval_s.get(row['step']), '.1f')} |")
    lines += by_kind([row for row in rows if "eval/pass@1" in row])
    minutes = wall_s / 60
    gained = rise(rewards)
    after = [v for s, v in sorted(evals.items()) if s >= 0]
    state = "Finished" if done else f"Ended early ({ended})" if ended else "Running"
    lines += ["", (f"{state}: {len(steps)} steps in {minutes:.1f} minutes "
                   f"(15-minute load average {os.getloadavg()[2]:.1f} on {os.cpu_count()} cores).")]
    if rewards:
        lines.append(f"Reward: start {statistics.mean(rewards[:2]):.3f}, best {max(rewards):.3f}, last "
                     f"{rewards[-1]:.3f}; rise (best 3 in a row less the start): {_f(gained)}.")
    if done or ended:
        met = (gained is not None and gained >= GOAL_RISE and before is not None and bool(after)
               and after[-1] > before and minutes <= GOAL_MINUTES)
        lines.append(f"Goal {'met' if met else 'not met'}{' in the steps it ran' if ended else ''}: held-out pass@1 {_f(before)} -> "
                     f"{_f(after[-1] if after else None)}.")
    lines += ["", f"Measured {time.strftime('%Y-%m-%d')}."]
    return "\n".join(lines)


def by_kind(evaluated: list[dict]) -> list[str]:
    """Held-out pass@1 per task tag at each evaluation (the tags of shell-heldout: its kind, and `hint-call` for
    a task whose instruction shows the whole call): whether a rise is the call format carrying over."""
    prefix = TAG_PREFIX
    tags = sorted({key[len(prefix):] for row in evaluated for key in row if key.startswith(prefix)})
    if not tags:
        return []
    lines = ["", "Held-out pass@1 by tag (`hint-call`: the instruction shows the whole call):", "",
             "| tag | " + " | ".join("before" if row["step"] < 0 else f"after step {row['step']}" for row in evaluated)
             + " |", "|---|" + "---|" * len(evaluated)]
    for tag in tags:
        lines.append(f"| {tag} | " + " | ".join(_f(row.get(prefix + tag)) for row in evaluated) + " |")
    return lines


def kept_path(seed: int, sets: list[str]) -> Path:
    """Where seed `seed`'s result with overrides `sets` is kept: named by a digest of the overrides (paths
    relative to the repository, so that another clone finds it)."""
    settings = sorted(s.replace(f"{REPO}/", "") for s in sets if not s.startswith("run.seed="))
    digest = hashlib.sha256("\n".join(settings).encode()).hexdigest()[:8]
    return RESULTS / f"smollm2_agent_seed{seed}_{digest}.json"


def seed_result(seed: int, rows: list[dict], *, wall_s: float, returncode: int) -> dict:
    """What one seed's run leaves for the seeds' section (kept at `kept_path`)."""
    return {"seed": seed, "rows": rows, "wall_s": round(wall_s, 1), "returncode": returncode,
            "load_15m": round(os.getloadavg()[2], 1), "measured": time.strftime("%Y-%m-%d")}


def _spread(values: list[float]) -> str:
    """Mean and range of `values` ("-" for none)."""
    if not values:
        return "-"
    if len(values) == 1:
        return f"{values[0]:.3f}"
    return f"{statistics.mean(values):.3f} ({min(values):.3f}-{max(values):.3f})"


def _before_after(result: dict, key: str) -> tuple[float | None, float | None]:
    """Held-out `key` before training and at the run's last evaluation."""
    evals = sorted((row["step"], row.get(key)) for row in result["rows"] if "eval/pass@1" in row)
    before = next((v for s, v in evals if s < 0), None)
    after = [v for s, v in evals if s >= 0]
    return before, (after[-1] if after else None)


def seeds_section(results: list[dict], *, command: str) -> str:
    """The mean and spread over seeds: the reward per step, held-out pass@1 per tag, and the issue-49 goal."""
    lines = [(f"`{command}` once per seed (`bench/bench_smollm2_agent.py --seeds ...`), one after the other; each "
              "seed's own table is its section \"SmolLM2 agent, seed N\". Values: the mean over the seeds, the "
              "range in brackets; a step or tag counts the seeds that reached it."), "",
             "| seed | steps | minutes | exit | 15-min load | held-out pass@1 before -> after | hint-command | hint-call |",
             "|---|---|---|---|---|---|---|---|"]
    for r in results:
        steps = [row for row in r["rows"] if "reward_mean" in row]
        cells = [" -> ".join(_f(v) for v in _before_after(r, key))
                 for key in ("eval/pass@1", TAG_PREFIX + "hint-command", TAG_PREFIX + "hint-call")]
        lines.append(f"| {r['seed']} | {len(steps)} | {r['wall_s'] / 60:.1f} | {r['returncode']} | {r['load_15m']} | "
                     + " | ".join(cells) + " |")
    by_step: dict[int, list[float]] = {}
    for r in results:
        for row in r["rows"]:
            if row.get("reward_mean") is not None:
                by_step.setdefault(row["step"], []).append(row["reward_mean"])
    lines += ["", "| step | seeds | reward |", "|---|---|---|"]
    lines += [f"| {step} | {len(v)} | {_spread(v)} |" for step, v in sorted(by_step.items())]
    tags = sorted({k[len(TAG_PREFIX):] for r in results for row in r["rows"] for k in row if k.startswith(TAG_PREFIX)})
    lines += ["", "| held-out tag | before | after | change |", "|---|---|---|---|"]
    change: dict[str, list[float]] = {}
    for tag in tags:
        pairs = [_before_after(r, TAG_PREFIX + tag) for r in results]
        pairs = [(b, a) for b, a in pairs if b is not None and a is not None]
        change[tag] = [a - b for b, a in pairs]
        lines.append(f"| {tag} | {_spread([b for b, _ in pairs])} | {_spread([a for _, a in pairs])} | "
                     f"{_spread(change[tag])} |")
    command_rise = statistics.mean(change["hint-command"]) if change.get("hint-command") else None
    call_kept = bool(change.get("hint-call")) and statistics.mean(change["hint-call"]) >= 0
    met = command_rise is not None and command_rise >= GOAL_HINT_COMMAND_RISE and call_kept
    lines += ["", (f"Goal (issue 49: held-out hint-command pass@1 up by at least {GOAL_HINT_COMMAND_RISE} over the "
                   f"seeds, hint-call kept): {'met' if met else 'not met'}; hint-command rise {_f(command_rise)}, "
                   f"hint-call {'kept' if call_kept else 'not kept'}.")]
    return "\n".join(lines)


def run_once(recipe: Path, sets: list[str], *, title: str, command: str, update: str, doc: Path,
             poll_s: float) -> tuple[list[dict], int, float]:
    """One `rl360 up` in a fresh state file, its section rewritten after every step; (rows, exit code, wall s)."""
    folder = Path(tempfile.mkdtemp(prefix="rl360-smollm2-agent-"))
    state = folder / "state.json"
    extra = ["--profile", str(profile_on_free_ports(folder))] + [a for s in sets for a in ("--set", s)]
    env = {**os.environ, "RL360_STATE": str(state)}
    rl360 = [sys.executable, "-m", "rl360cli"]
    started = time.monotonic()
    log = (folder / "up.log").open("w")
    proc = subprocess.Popen([*rl360, "up", "--recipe", str(recipe), *extra], cwd=folder, env=env, stdout=log,
                            stderr=subprocess.STDOUT)
    written = 0
    try:
        while proc.poll() is None:
            time.sleep(poll_s)
            rows = read_rows(state)
            if len(rows) > written:  # a new step (or evaluation) row: the section as it stands
                written = len(rows)
                write_section(title, section(rows, command=command, wall_s=time.monotonic() - started, done=False,
                                             update=update), path=doc)
    finally:
        if proc.poll() is None:
            proc.terminate()
            proc.wait(60)
        subprocess.run([*rl360, "down"], cwd=folder, env=env, capture_output=True, check=False)
    wall_s = time.monotonic() - started
    rows = read_rows(state)
    if proc.returncode != 0:
        print(f"rl360 up failed ({proc.returncode}); its output: {folder / 'up.log'}", file=sys.stderr)
        print((folder / "up.log").read_text()[-3000:], file=sys.stderr)
    last_line = next((line for line in reversed((folder / "up.log").read_text().splitlines()) if line.strip()), "")
    text = section(rows, command=command, wall_s=wall_s, done=proc.returncode == 0,
                   ended="" if proc.returncode == 0 else f"rl360 up exited {proc.returncode}: {last_line.strip()}",
                   update=update)
    write_section(title, text, path=doc)
    print(text)
    return rows, proc.returncode, wall_s


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=None, help="loop.num_steps (default: the recipe's)")
    parser.add_argument("--manifest", type=Path, default=None, help="tasks.manifest: the calibrated training tasks")
    parser.add_argument("--set", dest="sets", action="append", default=[], help="more recipe overrides (K=V)")
    parser.add_argument("--full-finetune", action="store_true",
                        help=f"train every weight (no [trainer] lora; lr {FULL_FINETUNE_LR}): LoRA's comparison")
    parser.add_argument("--seeds", type=int, nargs="+", default=None,
                        help="one run per seed (run.seed), then the mean and spread over them")
    parser.add_argument("--again", action="store_true", help="with --seeds: run seeds already kept again")
    parser.add_argument("--doc", type=Path, default=BENCHMARKS, help="where the section goes")
    parser.add_argument("--poll-s", type=float, default=10.0)
    args = parser.parse_args()

    recipe, sets = RECIPE, []
    if args.full_finetune:
        recipe, sets = full_finetune_recipe(Path(tempfile.mkdtemp(prefix="rl360-smollm2-recipe-")))
    title = f"{TITLE}, full fine-tuning" if args.full_finetune else TITLE
    update = "full fine-tuning step" if args.full_finetune else "LoRA step"
    sets += args.sets
    if args.steps is not None:
        sets.append(f"loop.num_steps={args.steps}")
    if args.manifest is not None:
        sets.append(f"tasks.manifest={args.manifest.resolve()}")
    shown = [s for s in sets if not s.startswith(("tasks.path=", "tasks.manifest=", "eval.path="))]
    command = " ".join(["rl360 up --recipe recipes/smollm2-agent.toml", *(["(without lora)"] if args.full_finetune
                                                                          else []), *(f"--set {s}" for s in shown)])
    if args.seeds is None:
        return run_once(recipe, sets, title=title, command=command, update=update, doc=args.doc,
                        poll_s=args.poll_s)[1]
    results = []
    for seed in args.seeds:
        kept = kept_path(seed, sets)
        if kept.exists() and not args.again:
            results.append(json.loads(kept.read_text()))
            continue
        rows, code, wall_s = run_once(recipe, [*sets, f"run.seed={seed}"], title=f"{title}, seed {seed}",
                                      command=f"{command} --set run.seed={seed}", update=update, doc=args.doc,
                                      poll_s=args.poll_s)
        results.append(seed_result(seed, rows, wall_s=wall_s, returncode=code))
        kept.write_text(json.dumps(results[-1]) + "\n")
    write_section(f"{title}, {len(results)} seeds", seeds_section(results, command=command), path=args.doc)
    return max(r["returncode"] for r in results)


if __name__ == "__main__":
    sys.exit(main())
