"""Helpers of the GPU check (bench/gpu/check.py): the engine server it drives, device bookkeeping, the
profiler's launch counts. `plan` is check.py's `Plan` (its `device`, `dtype`)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


class EngineServer:
    """`python -m rl360cli.inference.server` on 127.0.0.1, on the plan's device; stopped by its PID."""

    def __init__(self, model: Path, plan, *, max_batch_size: int, log: Path, dtype: str | None = None,
                 flags: tuple[str, ...] = ()):
        from rl360cli.ports import free_port

        port = free_port()
        self.url = f"http://127.0.0.1:{port}"
        argv = [sys.executable, "-m", "rl360cli.inference.server", "--model", str(model), "--port", str(port),
                "--device", plan.device, "--dtype", dtype or plan.dtype, "--max-batch-size", str(max_batch_size),
                "--max-wait-ms", "20", *flags]
        self.log = log
        self.proc = subprocess.Popen(argv, stdout=open(log, "wb"), stderr=subprocess.STDOUT, cwd=REPO,
                                     env={**os.environ, "PYTHONPATH": str(REPO)})
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"the engine exited: {log.read_text()[-2000:]}")
            try:
                with urllib.request.urlopen(self.url + "/health", timeout=2):
                    return
            except OSError:
                time.sleep(0.3)
        self.stop()
        raise RuntimeError(f"the engine did not become healthy in 300 s: {log.read_text()[-2000:]}")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def served_version(url: str) -> int:
    with urllib.request.urlopen(url + "/model_info", timeout=10) as answer:
        return int(json.load(answer)["weight_version"])


def server_info(url: str) -> dict:
    with urllib.request.urlopen(url + "/server_info", timeout=10) as answer:
        return json.load(answer)


def device_sync(plan) -> None:
    if plan.device == "cuda":
        import torch

        torch.cuda.synchronize()


def exact_float32_matmuls() -> None:
    """Undo what a bf16 torch trainer turned on for the process (TF32), so what runs next in float32
    (the megatron trainer, an fp32 trainer's logprobs) is measured as float32."""
    import torch

    torch.backends.cuda.matmul.allow_tf32 = False
    torch.set_float32_matmul_precision("highest")


def free_device_memory(plan) -> None:
    """Give back what the objects just dropped held on the device (and reset the peak memory figure)."""
    import gc

    gc.collect()
    if plan.device == "cuda":
        import torch

        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()


def launch_counts(events, steps: int) -> dict:
    """Kernel launches, graph launches and kernels' device time a step, from the profiler's table."""
    import torch

    kernels = [e for e in events if e.device_type != torch.autograd.DeviceType.CPU]
    return {"kernel_launches_per_step": round(sum(e.count for e in events if "LaunchKernel" in e.key) / steps, 1),
            "graph_launches_per_step": round(sum(e.count for e in events if "GraphLaunch" in e.key) / steps, 1),
            "device_ms_per_step": round(sum(e.self_device_time_total for e in kernels) / 1000 / steps, 3)}
