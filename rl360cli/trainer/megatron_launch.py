"""The torchrun command line of the megatron trainer component (no heavy imports: stages call it).

    argv = trainer_argv(["--state", state_path, "--run", run_id], nproc_per_node=2, master_port=29510,
                        python="/shared/venv/bin/python")
    # /shared/venv/bin/python -m torch.distributed.run --nproc-per-node=2 --nnodes=1 --node-rank=0
    #     --master-addr=127.0.0.1 --master-port=29510 -m rl360cli.run.driver -- --state ... --run ...

    layout = TrainerLayout.of(tensor_parallel=4, pipeline_parallel=1, nodes=8, ranks_per_node=8)
    layout.describe()       # '64 ranks = TP 4 x PP 1 x DP 16 (8 nodes x 8)'
    argv = cluster_trainer_argv(driver_args, layout, rendezvous_host="<training[0] address>", port=29510,
                                run_id="r1", python=backend.python)   # one per training node (an srun task each)

`python` is the interpreter on the node that runs the command (the backend's, `Backend.python`), never
simply this one: the command is rendered where `rl360 train` runs.

Rank 0 of that world runs the driver (the loop, the state file, the weight broadcast); ranks > 0
follow it (rl360cli.run.driver.main -> follow_run -> MegatronTrainer.serve). See docs/trainer.md.
Tested by tests/trainer/test_megatron_trainer.py, test_megatron_launch.py and test_megatron_driver.py.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from rl360cli.errors import Rl360Error


@dataclass(frozen=True, kw_only=True, slots=True)
class TrainerLayout:
    """How a megatron trainer's ranks split: TP x PP x DP over `nodes` nodes of `ranks_per_node`."""

    tensor_parallel: int
    pipeline_parallel: int
    data_parallel: int
    nodes: int
    ranks_per_node: int

    @classmethod
    def of(cls, *, tensor_parallel: int, pipeline_parallel: int, nodes: int, ranks_per_node: int) -> TrainerLayout:
        """The layout of nodes x ranks_per_node ranks; a one-line error unless TP x PP divides them."""
        ranks = nodes * ranks_per_node
        if min(tensor_parallel, pipeline_parallel, nodes, ranks_per_node) < 1 or ranks % (tensor_parallel *
                                                                                            pipeline_parallel):
            raise Rl360Error(f"{ranks} trainer ranks cannot be split into tensor_parallel = {tensor_parallel} x "
                             f"pipeline_parallel = {pipeline_parallel} groups",
                             fix="choose [trainer] tensor_parallel x pipeline_parallel that divides the training GPUs")  # fmt: skip
        return cls(tensor_parallel=tensor_parallel, pipeline_parallel=pipeline_parallel,
                   data_parallel=ranks // (tensor_parallel * pipeline_parallel), nodes=nodes,
                   ranks_per_node=ranks_per_node)  # fmt: skip

    @property
    def world_size(self) -> int:
        return self.nodes * self.ranks_per_node

    def describe(self) -> str:
        return (f"{self.world_size} ranks = TP {self.tensor_parallel} x PP {self.pipeline_parallel} x "
                f"DP {self.data_parallel} ({self.nodes} node{'s' if self.nodes > 1 else ''} x {self.ranks_per_node})")


def cluster_trainer_argv(driver_args: Sequence[str], layout: TrainerLayout, *, rendezvous_host: str, port: int,
                         run_id: str, python: str) -> tuple[str, ...]:  # fmt: skip
    """The torchrun that each of `layout.nodes` training nodes runs: `ranks_per_node` ranks, meeting at
    `rendezvous_host:port` (the first training node); world = TP x PP x DP of `layout`."""
    return trainer_argv(driver_args, nproc_per_node=layout.ranks_per_node, nnodes=layout.nodes,
                        master_addr=rendezvous_host, master_port=port, rdzv_id=f"rl360-{run_id}", python=python)  # fmt: skip


def trainer_argv(driver_args: Sequence[str], *, nproc_per_node: int, nnodes: int = 1, master_addr: str = "127.0.0.1",
                 master_port: int = 29500, rdzv_id: str = "rl360-trainer", python: str,
                 module: str = "rl360cli.run.driver") -> tuple[str, ...]:  # fmt: skip
    """The command line that starts the megatron trainer component: torchrun over `module`.

    One node: a static rendezvous on `master_addr:master_port`. Several nodes (one launch per
    node, e.g. one Slurm task per node): torchrun's c10d rendezvous at that address, so no node
    needs to know its rank. World size = nproc_per_node x nnodes = tensor_parallel x DP.
    """
    if nproc_per_node < 1 or nnodes < 1:
        raise ValueError(f"nproc_per_node and nnodes must be >= 1 (got {nproc_per_node}, {nnodes})")
    argv = [python, "-m", "torch.distributed.run", f"--nproc-per-node={nproc_per_node}",
            f"--nnodes={nnodes}"]  # fmt: skip
    if nnodes == 1:
        argv += ["--node-rank=0", f"--master-addr={master_addr}", f"--master-port={master_port}"]
    else:
        argv += ["--rdzv-backend=c10d", f"--rdzv-endpoint={master_addr}:{master_port}", f"--rdzv-id={rdzv_id}"]
    # "--": without it torchrun's own parser takes the driver's `--run` for an abbreviation of `--run-path`.
    return (*argv, "-m", module, "--", *driver_args)
