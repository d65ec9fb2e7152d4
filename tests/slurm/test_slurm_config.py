"""Slurm options and the parsers of Slurm's output: validated at load time, read the way Slurm writes."""

from __future__ import annotations

import sys

import pytest

from rl360cli.backends import slurm_cmd
from rl360cli.backends.config import SlurmOptions, time_limit_minutes
from rl360cli.backends.local import LocalBackend
from rl360cli.backends.slurm import SlurmBackend
from rl360cli.backends.slurm_preflight import parse_cluster_info
from rl360cli.config import load_profile
from rl360cli.configload import ConfigError
from rl360cli.state.store import StateFile
from tests.conftest import REPO
from tests.slurm.conftest import write_profile


@pytest.mark.parametrize("text, minutes", [("5", 5), ("5:30", 6), ("01:00:00", 60), ("1-0", 1440),
                                           ("1-02:03", 1563), ("2-00:00:01", 2881), ("infinite", None)])
def test_time_limits_read_like_slurm(text, minutes):
    assert time_limit_minutes(text) == minutes


@pytest.mark.parametrize("bad", ["1h", "01:00:00:00", "-5", ""])
def test_a_malformed_time_limit_is_refused_at_load(tmp_path, bad):
    path = write_profile(tmp_path, "bad-time", slurm={"time_limit": bad})
    with pytest.raises(ConfigError, match="time_limit"):
        load_profile(path)


def test_a_tier_time_limit_is_checked_too(tmp_path):
    path = write_profile(tmp_path, "bad-tier", tiers={"rollout": {"num_nodes": 1, "time_limit": "soon"}})
    with pytest.raises(ConfigError, match=r"tiers\.rollout.*time_limit"):
        load_profile(path)


def test_option_bounds():
    with pytest.raises(ValueError, match="max_poll_interval_s"):
        SlurmOptions(poll_interval_s=10, max_poll_interval_s=5)
    with pytest.raises(ValueError, match="heartbeat_s"):
        SlurmOptions(heartbeat_s=0)
    with pytest.raises(ValueError, match="extra_sbatch key"):
        SlurmOptions(extra_sbatch={"--reservation": "x"})


@pytest.mark.parametrize("bad", ["/shared/venv/bin/python -X dev", "'/shared/venv/bin/python"])
def test_the_nodes_python_is_one_interpreter(tmp_path, bad):
    """It is the first word of every component's command, as well as the holder's and the steps'."""
    path = write_profile(tmp_path, "bad-python", slurm={"python": bad})
    with pytest.raises(ConfigError, match="python must be one interpreter"):
        load_profile(path)
    assert SlurmOptions(python="'/shared/my venv/bin/python'").python


def test_components_start_with_the_profiles_python_and_without_it_with_this_one(tmp_path):
    """The same interpreter as the allocation's holder (the sbatch script's default when the profile has none)."""
    reference = load_profile(REPO / "cluster/reference-33-nodes.toml")
    assert SlurmBackend(reference, StateFile(tmp_path / "state.json")).python == "/shared/rl360/venv/bin/python"
    spaced = write_profile(tmp_path, "spaced", slurm={"python": "'/shared/my venv/bin/python'"})
    assert SlurmBackend(load_profile(spaced), StateFile(tmp_path / "state.json")).python == \
        "/shared/my venv/bin/python"
    dev = load_profile(REPO / "cluster/dev-slurm.toml")
    assert SlurmBackend(dev, StateFile(tmp_path / "state.json")).python == sys.executable
    assert LocalBackend(load_profile(REPO / "cluster/local.toml")).python == sys.executable


def test_reference_profile_is_33_nodes_of_8_gpus():
    profile = load_profile(REPO / "cluster/reference-33-nodes.toml")
    sizes = {name: (t.num_nodes, t.gpus_per_node) for name, t in profile.tiers.items()}
    assert sizes == {"service": (1, 8), "training": (8, 8), "rollout": (24, 8)}
    assert sum(n for n, _ in sizes.values()) == 33
    assert profile.backend == "slurm" and profile.slurm.exclusive and profile.slurm.mode == "per-tier"


def test_dev_profile_finds_the_dev_cluster_config(monkeypatch):
    profile = load_profile(REPO / "cluster/dev-slurm.toml")
    monkeypatch.setenv("RL360_DEV_ROOT", "/somewhere/else")
    assert slurm_cmd.slurm_env(profile.slurm.slurm_conf)["SLURM_CONF"] == "/somewhere/else/slurm/slurm.conf"
    monkeypatch.delenv("RL360_DEV_ROOT")
    assert slurm_cmd.slurm_env(profile.slurm.slurm_conf)["SLURM_CONF"] == "/tmp/rl360-dev/slurm/slurm.conf"


def test_hostlists_expand():
    assert slurm_cmd.expand_hostlist("n[1-3,5],gpu07") == ["n1", "n2", "n3", "n5", "gpu07"]
    assert slurm_cmd.expand_hostlist("a[01-02]-ib[1-2]") == ["a01-ib1", "a01-ib2", "a02-ib1", "a02-ib2"]
    assert slurm_cmd.expand_hostlist("(null)") == [] and slurm_cmd.expand_hostlist("None assigned") == []


@pytest.mark.parametrize("state, lost", [("idle", False), ("allocated", False), ("mixed*", True), ("down*", True),
                                         ("down", True), ("fail", True), ("failing", False), ("drained", False),
                                         ("completing*", True)])
def test_node_states(state, lost):
    assert slurm_cmd.node_is_lost(state) is lost


def test_sacct_and_squeue_output_of_a_het_job_is_read_by_raw_id():
    # As sacct -P and squeue print a three-group het job (leader 15) with a step on group 1.
    jobs, steps = slurm_cmd.parse_sacct(
        "15|15+0|RUNNING|0:0|n1|Unknown\n16|15+1|CANCELLED by 0|0:0|n2|2026-11-29T15:06:12\n"
        "16.1|15+1.1|FAILED|3:0|n2|2026-11-29T15:06:12\n16.batch|15+1.batch|CANCELLED|0:15|n2|x\n")
    assert jobs["16"]["state"] == "CANCELLED" and jobs["15"]["end"] is None
    assert steps["16.1"]["exit_code"] == 3 and steps["16.1"]["state"] == "FAILED"
    queue = slurm_cmd.parse_squeue("15|15+0|RUNNING|n1|None\n16|15+1|PENDING|(null)|Resources\n")
    assert queue["16"] == {"display_id": "15+1", "state": "PENDING", "nodes": [], "reason": "Resources"}


def test_cluster_info_reads_partitions_limits_and_nodes():
    info = parse_cluster_info("n1|debug*|idle|127.0.0.1|2|4000|(null)|1:00:00|up|(null)\n"
                              "n1|short|idle|127.0.0.1|2|4000|(null)|5:00|up|(null)\n"
                              "n2|debug*|down*|127.0.0.1|2|4000|gpu:8|1:00:00|up|h100\n")
    assert info.default_partition == "debug"
    assert info.partitions["short"].max_minutes == 5 and info.partitions["debug"].nodes == ["n1", "n2"]
    assert info.usable(["n1", "n2"]) == ["n1"]
    assert info.nodes["n2"]["gres"] == "gpu:8" and info.nodes["n2"]["lost"]


def test_a_megatron_trainer_on_slurm_is_one_torchrun_per_training_node(tmp_path):
    """`rl360 plan` on the reference profile renders the trainer as the torchrun every training node runs:
    8 nodes x 8 ranks meeting at the first training node, TP 4 x PP 1 x DP 16 in the row's detail."""
    from tests.conftest import REPO, run_cli

    proc = run_cli("plan", "--recipe", str(REPO / "recipes" / "qwen3-8b-swap.toml"), state=tmp_path / "state.json")
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    row = next(i for i, line in enumerate(lines) if line.startswith("train: start training/trainer"))
    assert "64 ranks = TP 4 x PP 1 x DP 16 (8 nodes x 8), one torchrun per training node" in lines[row]
    assert ("-m torch.distributed.run --nproc-per-node=8 --nnodes=8 --rdzv-backend=c10d "
            "--rdzv-endpoint=<training[0]>:") in lines[row + 1]
    assert "-m rl360cli.run.driver -- --state" in lines[row + 1]
