"""Benchmark: the README's first command, `rl360 up` on recipes/local-smoke.toml, end to end.

Runs the recipe as the README does (its own profile, cluster/local.toml), once clean and once with
`--inject-failures 0.2` (and with `--slurm` once more with its tiers on the dev Slurm, three fake
nodes), each in a fresh state file, and records the wall time of the whole command (policy preparation
included), the reward curve, and for the faulty run that every injected failure was masked (never a
reward of 0) — the acceptance figures of the local loop. With `--seeds`, the clean run once per run
seed (`--set run.seed=N`), kept seed by seed in bench/results/local_smoke_seeds.json: does the recipe
hold on seeds it was not tuned on (start, first step >= 0.90, worst dip, wall time)?

    .venv/bin/python bench/bench_local_smoke.py [--inject 0.2] [--slurm]   # the "Local smoke" section
    .venv/bin/python bench/bench_local_smoke.py --seeds 11 23 42 57 91      # "Local smoke: any seed"
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.report import write_section  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
RECIPE = REPO / "recipes" / "local-smoke.toml"
SEEDS_JSON = REPO / "bench" / "results" / "local_smoke_seeds.json"


def policy_v0() -> str:
    """The sha256 of the recipe's policy v0 weights (its build record), so a result says which policy it ran."""
    from rl360cli.config import load_recipe

    record = Path(load_recipe(RECIPE).model.path) / "built.json"
    return json.loads(record.read_text())["files"]["model.safetensors"][:16]


def run(extra: list[str], *, cache: Path) -> dict:
    folder = Path(tempfile.mkdtemp(prefix="rl360-local-smoke-"))
    env = {**os.environ, "RL360_STATE": str(folder / "state.json"), "RL360_CACHE_DIR": str(cache)}
    rl360 = [sys.executable, "-m", "rl360cli"]
    started = time.monotonic()
    proc = subprocess.run([*rl360, "up", "--recipe", str(RECIPE), *extra], cwd=folder, env=env,
                          capture_output=True, text=True)  # fmt: skip
    wall_s = time.monotonic() - started
    # The 15-minute load average as the run ends: a wall time taken beside other work says so.
    load = os.getloadavg()[2]
    subprocess.run([*rl360, "down"], cwd=folder, env=env, capture_output=True)
    if proc.returncode != 0:
        raise SystemExit(f"rl360 up {' '.join(extra)} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    doc = json.loads((folder / "state.json").read_text())
    rows = [json.loads(line) for line in Path(doc["runs"][doc["current_run"]]["metrics_path"]).read_text().splitlines()]
    # A step's row has its reward; an evaluation may have a row of its own (policy v0's, before the first step).
    return {"wall_s": wall_s, "rows": [row for row in rows if "reward_mean" in row], "load": load,
            "policy_v0": policy_v0(), "eval_rows": [row for row in rows if "reward_mean" not in row]}


def worst_dip(rewards: list[float]) -> float:
    """How far the reward fell below its own running best, at its lowest (0 for a run that never fell)."""
    best, dip = float("-inf"), 0.0
    for reward in rewards:
        best = max(best, reward)
        dip = max(dip, best - reward)
    return dip


def _minutes(seconds: float) -> str:
    minutes, seconds = divmod(round(seconds), 60)
    return f"{minutes}m{seconds:02d}s"


def describe_seed(seed: int, result: dict) -> str:
    """One row of the seeds table: seed, start, first step >= 0.90, best, last, worst dip, wall time, load."""
    rewards = [row["reward_mean"] for row in result["rows"]]
    first_090 = next((i for i, r in enumerate(rewards) if r >= 0.90), None)
    return (f"| {seed} | {len(rewards)} | {rewards[0]:.3f} | {first_090 if first_090 is not None else 'never'} | "
            f"{max(rewards):.3f} | {rewards[-1]:.3f} | {worst_dip(rewards):.3f} | {_minutes(result['wall_s'])} | "
            f"{result['load']:.1f} |")


def describe(name: str, result: dict) -> list[str]:
    rows = result["rows"]
    rewards = [row["reward_mean"] for row in rows]
    first_090 = next((i for i, r in enumerate(rewards) if r >= 0.90), None)
    injected = sum(row["injected_failures"] for row in rows)
    masked = sum(row["batch"].get("masked/injected", 0) for row in rows)
    minutes, seconds = divmod(round(result["wall_s"]), 60)
    line = (f"| {name} | {minutes}m{seconds:02d}s | {len(rows)} | {rewards[0]:.3f} | {max(rewards):.3f} | "
            f"{rewards[-1]:.3f} | {first_090 if first_090 is not None else '-'} | ")
    line += f"{injected} / {masked} |" if injected else "- |"
    return [line]


def seeds_section(results: dict[str, dict]) -> str:
    """The acceptance table of issue 12: one row per run seed, then the median wall time."""
    rows = [describe_seed(int(seed), results[seed]) for seed in sorted(results, key=int)]
    by_length: dict[int, list[float]] = {}
    for result in results.values():
        by_length.setdefault(len(result["rows"]), []).append(result["wall_s"])
    medians = "; ".join(f"{steps} steps: {_minutes(statistics.median(walls))} over {len(walls)} run(s)"
                        for steps, walls in sorted(by_length.items()))
    policies = sorted({result.get("policy_v0", "?") for result in results.values()})
    lines = [
        "`rl360 up --recipe recipes/local-smoke.toml --set run.seed=N`, each in a fresh state file, whole command "
        "timed (`bench/bench_local_smoke.py --seeds ...`), from policy v0 "
        f"{', '.join(policies)} (sha256 of recipes/models/local-smoke-v0/model.safetensors). "
        "None of these run seeds was used while tuning. "
        "Steps are counted from 0, as metrics.jsonl's `step` (first step >= 0.90: 14 is the 15th step). "
        "Worst dip: the largest fall below the run's own best so far. Load: the 15-minute load average as the run "
        "ended (2 cores: above 2, other work shared them).",
        "",
        "| run seed | steps | start | first step >= 0.90 | best | last | worst dip | wall time | load |",
        "|---|---|---|---|---|---|---|---|---|",
        *rows,
        "",
        f"Median wall time, by the runs' length: {medians}. Mean reward per step:",
        "",
    ]
    for seed in sorted(results, key=int):
        lines.append(f"- seed {seed}: " + " ".join(f"{row['reward_mean']:.2f}" for row in results[seed]["rows"]))
    lines += ["", f"Measured {time.strftime('%Y-%m-%d')} on {os.cpu_count()} cores."]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--inject", type=float, default=0.2, help="failure rate of the second run (0: no second run)")
    parser.add_argument("--slurm", action="store_true",
                        help="a third run with the tiers on the dev Slurm (start it: bash cluster/dev/slurm.sh up)")
    parser.add_argument("--seeds", type=int, nargs="+", default=None,
                        help="clean runs with these run seeds (from the recipe's policy v0 whatever the seed), "
                             "added to bench/results/local_smoke_seeds.json; writes 'Local smoke: any seed'")
    parser.add_argument("--from-json", action="store_true", help="only render the seeds section from the JSON")
    args = parser.parse_args()
    if args.seeds or args.from_json:
        results = json.loads(SEEDS_JSON.read_text()) if SEEDS_JSON.exists() else {}
        cache = Path(tempfile.mkdtemp(prefix="rl360-cache-"))
        for seed in args.seeds or []:
            results[str(seed)] = run(["--set", f"run.seed={seed}"], cache=cache)
            SEEDS_JSON.write_text(json.dumps(results, indent=1))  # kept run by run: a later failure loses none
        section = seeds_section(results)
        write_section("Local smoke: any seed", section)
        print(section)
        return
    # An empty cache for the first run: it pays for the policy's warm-up, as on a fresh machine.
    cache = Path(tempfile.mkdtemp(prefix="rl360-cache-"))
    runs = {"clean": run([], cache=cache)}
    if args.inject > 0:
        runs[f"{args.inject:.0%} injected failures"] = run(["--inject-failures", str(args.inject)], cache=cache)
    if args.slurm:
        runs["tiers on the dev Slurm"] = run(["--profile", str(REPO / "cluster" / "dev-slurm.toml")], cache=cache)
    lines = [
        "`rl360 up --recipe recipes/local-smoke.toml` (the README's first command after installing), "
        "whole command timed, in a fresh state file (`bench/bench_local_smoke.py`).",
        "",
        "| run | wall time | steps | reward at step 0 | best | last | first step >= 0.90 | injected / masked |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for name, result in runs.items():
        lines += describe(name, result)
    lines += ["", "Mean reward per step (first generation round):", ""]
    for name, result in runs.items():
        lines.append(f"- {name}: " + " ".join(f"{row['reward_mean']:.2f}" for row in result["rows"]))
    lines += ["", f"Measured {time.strftime('%Y-%m-%d')} on {os.cpu_count()} cores. The clean run starts from an "
              "empty cache and pays for the policy's warm-up, as on a fresh machine; the second reuses it "
              "(`rl360cli/trainer/cache.py`)."]
    write_section("Local smoke", "\n".join(lines))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
