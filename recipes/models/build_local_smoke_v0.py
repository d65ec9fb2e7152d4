"""Build local-smoke's policy v0 into recipes/models/local-smoke-v0/, the folder the recipe loads.

    .venv/bin/python recipes/models/build_local_smoke_v0.py            # rebuild the committed folder
    .venv/bin/python recipes/models/build_local_smoke_v0.py --out /tmp/v0 --seed 3 --warmup-steps 150

The tiny policy's warm-up is chaotic: one rounding difference in one step changes the policy it ends
with, and the same seed built with pinned kernels still gave other weights on one machine of the
three seen (docs/recipes.md, "Policy v0 ships with the recipe"). So the recipe does not build its v0 on
each machine: the folder is committed, and every run of local-smoke, anywhere, starts from the same
bytes. This script is how that folder was made; `built.json` beside the weights records its
settings, the task set's digest, the machine and each file's sha256 (tests/recipes/test_recipes.py
checks the folder against it).

The warm-up skips the instructions of the 32 training tasks; `[eval]`'s held-out set is chosen outside
everything this build reads (recipes/tasks/generate_arith.py `programs_policy_v0_saw` reproduces it
from built.json), so rebuilding with other settings calls for regenerating that set too.
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import platform
import shutil
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[1]))

from rl360cli.demo import tiny_policy  # noqa: E402
from rl360cli.trainer.config import ModelConfig  # noqa: E402

OUT = HERE / "local-smoke-v0"
TASKS = HERE.parent / "tasks" / "arith-32"
# A 2-layer, 128-wide Llama from scratch, warmed up on random arith conversations until it solves about
# a third of the 32 tasks; chosen with bench/tune_local_smoke.py (docs/recipes.md).
MODEL = ModelConfig(kind="tiny", hidden_size=128, num_layers=2, num_heads=4, vocab_size=512,
                    warmup_steps=140, warmup_lr=3e-3, warmup_batch_size=32)
SEED = 2
RECORD = "built.json"


def sha256_of(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def record_of(model: ModelConfig, seed: int, folder: Path) -> dict:
    """What `folder` was built from and holds: the settings, the task set, the machine, each file's sha256."""
    return {
        "model": dataclasses.asdict(model),
        "seed": seed,
        "tasks": {"path": str(TASKS.relative_to(HERE.parent)), "digest": tiny_policy.tasks_digest(TASKS)},
        "code_digest": tiny_policy.code_digest(),
        "machine": {"cpu": _cpu_name(), "python": platform.python_version(), "torch": _torch_version()},
        "files": {p.name: sha256_of(p) for p in sorted(folder.iterdir()) if p.is_file() and p.name != RECORD},
    }


def _cpu_name() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.processor()


def _torch_version() -> str:
    import torch

    return torch.__version__


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, default=OUT)
    p.add_argument("--seed", type=int, default=SEED)
    p.add_argument("--warmup-steps", type=int, default=MODEL.warmup_steps)
    args = p.parse_args(argv)
    model = dataclasses.replace(MODEL, warmup_steps=args.warmup_steps)
    with tempfile.TemporaryDirectory(dir=args.out.parent) as staging:
        details = tiny_policy.build(model, tasks_dir=TASKS, out=Path(staging), seed=args.seed)
        record = record_of(model, args.seed, Path(staging))
        (Path(staging) / RECORD).write_text(json.dumps({**record, "details": details}, indent=2) + "\n")
        shutil.rmtree(args.out, ignore_errors=True)
        shutil.copytree(staging, args.out)
    print(f"{args.out}: model.safetensors {record['files']['model.safetensors'][:16]}, {details}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
