"""The exact command line of the real SGLang server for one engine on a GPU node.

Built from the recipe's `[engine]` table and the launch template
`stages/sglang-server.toml`; the recipe's `extra_args` come last and win.
SGLang itself is installed only on GPU nodes (`pip install 'rl360[gpu]'`),
so nothing here imports it: the command is built wherever `rl360 serve` runs, with the interpreter
of the node it runs on (`python`, the backend's: `Backend.python`).

    cmd = sglang_server_command(engine, model_path="/models/k2", host="10.0.0.5", port=31001,
                                python="/shared/venv/bin/python")
    cmd.argv  # ("/shared/venv/bin/python", "-m", "sglang.launch_server", "--model-path", "/models/k2", ...)
    cmd.env   # {"NCCL_SOCKET_IFNAME": ..., ...}

With `api_key_file`, the command runs behind `rl360cli.inference.keyed_launch`,
which puts the key from that file where the argv says `--api-key <api-key file>`
(and the node's address where it says `<node address>`): the rendered command,
which plans and the state file show, never holds the key.

Tested by tests/inference/test_launch.py (golden strings).
"""

from __future__ import annotations

from rl360cli.inference.apikey import KEY_PLACEHOLDER
from rl360cli.inference.config import EngineConfig
from rl360cli.inference.keyed_launch import keyed_command
from rl360cli.inference.templates import LaunchCommand, render


def sglang_server_command(engine: EngineConfig, *, model_path: str, host: str, port: int, python: str,
                          weight_version: int = 0, api_key_file: str | None = None, dtype: str | None = None,
                          seed: int | None = None, nccl_ifname: str | None = None) -> LaunchCommand:
    """The real SGLang server serving `model_path` on host:port, starting at policy version `weight_version`."""
    values = {
        "python": python,
        "model_path": model_path,
        "host": host,
        "port": port,
        "tp_size": engine.tp_size,
        "mem_fraction_static": engine.mem_fraction_static,
        "max_batch_size": engine.max_batch_size,
        "dtype": dtype,
        "seed": seed,
        "weight_version": weight_version,
        "api_key": KEY_PLACEHOLDER if api_key_file else None,
        "nccl_ifname": nccl_ifname,
    }
    cmd = render("sglang-server", values, extra_args=engine.extra_args)
    return keyed_command(cmd, api_key_file=api_key_file, python=python)
