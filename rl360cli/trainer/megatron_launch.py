"""The torchrun command line of the megatron trainer component (no heavy imports: stages call it).

    argv = trainer_argv(["--state", state_path, "--run", run_id], nproc_per_node=2, master_port=29510)
    # python -m torch.distributed.run --nproc-per-node=2 --nnodes=1 --node-rank=0
    #     --master-addr=127.0.0.1 --master-port=29510 -m rl360cli.loop.driver -- --state ... --run ...

Rank 0 of that world runs the driver (the loop, the state file, the weight broadcast); ranks > 0
follow it (rl360cli.loop.driver.main -> follow_run -> MegatronTrainer.serve). See docs/trainer.md.
Tested by tests/trainer/test_megatron_trainer.py and test_megatron_driver.py.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence


def trainer_argv(driver_args: Sequence[str], *, nproc_per_node: int, nnodes: int = 1, master_addr: str = "127.0.0.1",
                 master_port: int = 29500, rdzv_id: str = "rl360-trainer", python: str | None = None,
                 module: str = "rl360cli.loop.driver") -> tuple[str, ...]:  # fmt: skip
    """The command line that starts the megatron trainer component: torchrun over `module`.

    One node: a static rendezvous on `master_addr:master_port`. Several nodes (one launch per
    node, e.g. one Slurm task per node): torchrun's c10d rendezvous at that address, so no node
    needs to know its rank. World size = nproc_per_node x nnodes = tensor_parallel x DP.
    """
    if nproc_per_node < 1 or nnodes < 1:
        raise ValueError(f"nproc_per_node and nnodes must be >= 1 (got {nproc_per_node}, {nnodes})")
    argv = [python or sys.executable, "-m", "torch.distributed.run", f"--nproc-per-node={nproc_per_node}",
            f"--nnodes={nnodes}"]  # fmt: skip
    if nnodes == 1:
        argv += ["--node-rank=0", f"--master-addr={master_addr}", f"--master-port={master_port}"]
    else:
        argv += ["--rdzv-backend=c10d", f"--rdzv-endpoint={master_addr}:{master_port}", f"--rdzv-id={rdzv_id}"]
    # "--": without it torchrun's own parser takes the driver's `--run` for an abbreviation of `--run-path`.
    return (*argv, "-m", module, "--", *driver_args)
