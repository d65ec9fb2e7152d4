"""Benchmark: what dynamic filtering's further rounds buy in a finished run (issue 45 item 6: the sessions of
groups that filtering throws away).

    .venv/bin/python bench/bench_round_yield.py RUN_FOLDER [--from-step 4]

Reads a run folder's ledger.jsonl (each step's generated groups, the kept groups and their rewards) and
metrics.jsonl (each step's first-round mean reward) and prints, per step and summed from `--from-step` on:
the first round's groups with signal, all passed and all failed (all passed = the first round's passes
outside the kept groups / samples per group; the rest failed), the groups each further round sampled and
kept, and the share kept of the further rounds' groups by how the task's first-round group fared in the
steps before: a task with no signal this step only, also the step before, or the two steps before
("solved a while": at 0.85-0.93 nearly every group without signal is all passed). Group ids are
`s{step}-r{round}-{task}` (rl360cli/rollout/rollouts.py). Prints only; docs/benchmarks.md ("Local smoke:
one step, profiled") quotes it.
"""

from __future__ import annotations

import argparse
import collections
import json
from pathlib import Path


def group_round(group_id: str) -> tuple[str, str]:
    """(round, task) of a step's group id `s{step}-r{round}-{task}` (a task's second group: `...-{task}.2`)."""
    _, round_name, task = group_id.split("-", 2)
    return round_name, task.split(".")[0]


def yields(ledger: list[dict], first_round_reward: dict[int, float], *, samples: int) -> dict:
    """Per step and in total: the first round's groups by kind, the further rounds' groups sampled and kept,
    and the further rounds' kept share by how long the task had gone without signal in the first round."""
    steps, by_history = [], collections.Counter()
    no_signal_before: list[set[str]] = []
    for row in sorted(ledger, key=lambda r: r["step"]):
        per_group: dict[str, list[float]] = collections.defaultdict(list)
        for sample, reward in zip(row["samples"], row["rewards"]):
            per_group[sample.rsplit("-", 1)[0]].append(reward)
        generated = collections.Counter(group_round(g)[0] for g in row["generated"])
        kept = collections.Counter(group_round(g)[0] for g in row["groups"])
        first_tasks = {group_round(g)[1] for g in row["generated"] if group_round(g)[0] == "r0"}
        first_kept = {group_round(g)[1] for g in row["groups"] if group_round(g)[0] == "r0"}
        kept_passes = sum(sum(v) for g, v in per_group.items() if group_round(g)[0] == "r0")
        passed = first_round_reward.get(row["step"])
        all_passed = None if passed is None else round((passed * samples * len(first_tasks) - kept_passes) / samples)
        for group in row["generated"]:
            round_name, task = group_round(group)
            if round_name == "r0":
                continue
            history = ("this step only" if not no_signal_before or task not in no_signal_before[-1] else
                       "and the step before" if len(no_signal_before) < 2 or task not in no_signal_before[-2] else
                       "and the two steps before")
            by_history[(row["step"], history, "sampled")] += 1
            by_history[(row["step"], history, "kept")] += group in row["groups"]
        no_signal_before.append(first_tasks - first_kept)
        steps.append({
            "step": row["step"], "first_round_signal": len(first_kept), "all_passed": all_passed,
            "all_failed": None if all_passed is None else len(first_tasks) - len(first_kept) - all_passed,
            "further_sampled": sum(n for r, n in generated.items() if r != "r0"),
            "further_kept": sum(n for r, n in kept.items() if r != "r0"),
        })
    return {"steps": steps, "by_history": by_history}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run", type=Path, help="a run folder (ledger.jsonl, metrics.jsonl)")
    parser.add_argument("--from-step", type=int, default=4, help="sum the steps from this one (further rounds run)")
    parser.add_argument("--samples", type=int, default=8, help="samples per group ([loop] num_samples_per_task)")
    args = parser.parse_args()
    ledger = [json.loads(line) for line in (args.run / "ledger.jsonl").read_text().splitlines()]
    metrics = [json.loads(line) for line in (args.run / "metrics.jsonl").read_text().splitlines()]
    reward = {row["step"]: row["reward_mean"] for row in metrics if row.get("reward_mean") is not None}
    result = yields(ledger, reward, samples=args.samples)
    print("step | first round: signal / all passed / all failed | further rounds: sampled / kept")
    for s in result["steps"]:
        print(f"{s['step']:4d} | {s['first_round_signal']:3d} / {s['all_passed']} / {s['all_failed']} | "
              f"{s['further_sampled']:3d} / {s['further_kept']:3d}")
    later = [s for s in result["steps"] if s["step"] >= args.from_step]
    sampled, kept = sum(s["further_sampled"] for s in later), sum(s["further_kept"] for s in later)
    failed = sum(s["all_failed"] or 0 for s in later)
    print(f"steps {args.from_step}+: further rounds sampled {sampled} groups ({sampled * args.samples} sessions), "
          f"kept {kept} ({kept / max(sampled, 1):.0%}); first rounds' all-failed groups {failed} "
          f"(each sampled again in every further round)")
    for history in ("this step only", "and the step before", "and the two steps before"):
        n = sum(v for (step, h, what), v in result["by_history"].items()
                if step >= args.from_step and h == history and what == "sampled")
        k = sum(v for (step, h, what), v in result["by_history"].items()
                if step >= args.from_step and h == history and what == "kept")
        print(f"  no first-round signal {history}: {n} groups sampled again, {k} kept ({k / max(n, 1):.0%})")


if __name__ == "__main__":
    main()
