"""The megatron trainer's cluster launch (megatron_launch): its TP x PP x DP layout and per-node torchrun.

Pure functions, no processes: the torchrun they build runs in test_megatron_trainer.py and
test_megatron_pipeline.py (one node); several nodes need a cluster.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from rl360cli.errors import Rl360Error
from rl360cli.trainer.megatron_launch import TrainerLayout, cluster_trainer_argv

REPO = Path(__file__).resolve().parents[2]


def test_the_reference_recipes_layouts():
    from rl360cli.config import load_profile, load_recipe

    for recipe_name, expected in (("qwen3-8b-swap", "64 ranks = TP 4 x PP 1 x DP 16 (8 nodes x 8)"),
                                  ("coding-32", "64 ranks = TP 4 x PP 1 x DP 16 (8 nodes x 8)")):  # fmt: skip
        path = REPO / "recipes" / f"{recipe_name}.toml"
        recipe = load_recipe(path)
        training = load_profile((path.parent / recipe.run.profile).resolve()).tiers["training"]
        layout = TrainerLayout.of(tensor_parallel=recipe.trainer.tensor_parallel,
                                  pipeline_parallel=recipe.trainer.pipeline_parallel, nodes=training.num_nodes,
                                  ranks_per_node=training.gpus_per_node)  # fmt: skip
        assert layout.describe() == expected, recipe_name


def test_one_torchrun_per_node_meeting_at_the_first():
    layout = TrainerLayout.of(tensor_parallel=2, pipeline_parallel=2, nodes=8, ranks_per_node=8)
    assert (layout.data_parallel, layout.world_size) == (16, 64)
    argv = cluster_trainer_argv(["--state", "s.json", "--run", "r1"], layout, rendezvous_host="node-a", port=29510,
                                run_id="r1", python="py")  # fmt: skip
    assert argv == ("py", "-m", "torch.distributed.run", "--nproc-per-node=8", "--nnodes=8", "--rdzv-backend=c10d",
                    "--rdzv-endpoint=node-a:29510", "--rdzv-id=rl360-r1", "-m", "rl360cli.run.driver", "--",
                    "--state", "s.json", "--run", "r1")  # fmt: skip
    one = TrainerLayout.of(tensor_parallel=2, pipeline_parallel=1, nodes=1, ranks_per_node=2)
    assert one.describe() == "2 ranks = TP 2 x PP 1 x DP 1 (1 node x 2)"


def test_a_layout_that_does_not_divide_the_ranks_is_refused():
    with pytest.raises(Rl360Error, match="64 trainer ranks cannot be split into tensor_parallel = 3") as info:
        TrainerLayout.of(tensor_parallel=3, pipeline_parallel=1, nodes=8, ranks_per_node=8)
    assert "divides the training GPUs" in info.value.fix
