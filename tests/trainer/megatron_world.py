"""The one torchrun world that the megatron trainer's multi-rank tests share: four ranks over gloo.

Starting four processes and importing megatron-core in each is most of what a multi-rank check
costs on two cores, so test_megatron_trainer.py and test_megatron_pipeline.py run in one launch:

    world = megatron_world(tmp_root)   # pytest process: prepares both files' models, runs torchrun once
    world["root"] / "trainer", world["root"] / "pipeline"   # each file's results; world["seconds"]

`python -m tests.trainer.megatron_world ROOT` (under torchrun) is the ranks' side: each file's
`run_ranks(folder)` in turn. The session fixture `megatron_world` (tests/trainer/conftest.py) calls
`launch` once per test session.
"""

from __future__ import annotations

import importlib.util
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
WORLD = 4


def launch(root: Path) -> dict:
    """Prepare both test files' inputs under `root`, run the torchrun world, return where and how long."""
    from rl360cli.trainer.megatron_launch import trainer_argv
    from tests.conftest import need
    from tests.trainer import test_megatron_pipeline, test_megatron_trainer

    # find_spec, not import: megatron.core takes seconds to import and the pytest process needs none of it.
    need(importlib.util.find_spec("megatron") is not None and importlib.util.find_spec("megatron.core") is not None,
         "megatron-core is not installed; pip install -e '.[megatron]'")
    test_megatron_trainer.prepare(root / "trainer")
    test_megatron_pipeline.prepare(root / "pipeline")
    argv = trainer_argv([str(root)], nproc_per_node=WORLD, master_port=_free_port(), module="tests.trainer.megatron_world",
                        python=sys.executable)
    env = {**os.environ, "GLOO_SOCKET_IFNAME": "lo", "PYTHONWARNINGS": "ignore", "OMP_NUM_THREADS": "1"}
    started = time.monotonic()
    proc = subprocess.run(argv, cwd=REPO, env=env, capture_output=True, text=True, timeout=400)
    seconds = time.monotonic() - started
    (root / "torchrun.log").write_text(proc.stdout + proc.stderr)
    assert proc.returncode == 0, f"torchrun failed ({proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-6000:]}"
    return {"root": root, "seconds": seconds}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _ranks(root: Path) -> None:
    import torch.distributed as dist

    from tests.trainer import test_megatron_pipeline, test_megatron_trainer

    test_megatron_trainer.run_ranks(root / "trainer")
    test_megatron_pipeline.run_ranks(root / "pipeline")
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    sys.path.insert(0, str(REPO))
    _ranks(Path(sys.argv[1]))
