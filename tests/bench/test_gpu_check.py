"""`bench/gpu/check.sh --dry-run`: the prepared GPU check runs end to end on the CPU, tiny, so that the
first GPU lent runs a script that has already worked (issue 14). Every part must succeed and report
its figures, issue 40's new paths included (the static KV cache's decode step, uncaptured on the CPU;
the torch trainer under bf16 autocast); the loop's engine must end on the trainer's version (the
hand-over reached it)."""

from __future__ import annotations

import json
import subprocess

import pytest

from tests.conftest import REPO


@pytest.mark.slow
def test_the_gpu_check_runs_dry_on_the_cpu(tmp_path):
    out = tmp_path / "gpu-check.json"
    # The default parts, then those a plain run leaves out (issue 14's hand-over, the trainer's profile),
    # in one run: each part's process starts once.
    every = "env,engine,trainer,logprobs,engine_step,loop,handoff,trainer_profile"
    proc = subprocess.run(["bash", str(REPO / "bench" / "gpu" / "check.sh"), "--dry-run", "--out", str(out),
                           "--parts", every], capture_output=True, text=True, timeout=600, cwd=REPO)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "plan (dry run: tiny, on the CPU)" in proc.stdout
    report = json.loads(out.read_text())
    parts = report["parts"]
    assert report["dry_run"] and list(parts) == every.split(",")
    assert all(p["ok"] for p in parts.values()), {k: p.get("error") for k, p in parts.items()}
    # Before and after in one run: the dynamic cache and the static one (uncaptured on the CPU).
    engine = parts["engine"]
    assert all(engine[f"{kind}_batch_{b}_tokens_per_s"] > 0 for kind in ("dynamic", "static") for b in (1, 4))
    assert not engine["dynamic_decode"]["static_kv"]
    assert engine["static_decode"]["static_kv"] and engine["static_decode"]["slots"] == 4
    assert engine["static_decode"]["capture_error"] is None and not engine["static_decode"]["cuda_graphs"]
    step = parts["engine_step"]
    assert all(step[f"batch_{b}_{what}_ms"] > 0 for b in (1, 4)
               for what in ("forward", "sampling", "engine_step", "static_forward", "captured_forward",
                            "captured_engine_step"))
    assert step["batch_1_dynamic_kernel_launches_per_step"] == step["batch_1_captured_graph_launches_per_step"] == 0
    assert "aten::" in proc.stdout  # the profiler's table of operators
    # The trainer in float32 and under bf16 autocast (the CPU's), and megatron beside them.
    trainer = parts["trainer"]
    assert trainer["torch_fp32_step_s"] > 0 and trainer["torch_bf16_step_s"] > 0 and trainer["megatron_step_s"] > 0
    logprobs = parts["logprobs"]
    assert logprobs["engine_float32_trainer_fp32"]["max"] < 1e-4  # the dry run's engine is float32
    assert 0 < logprobs["engine_float32_trainer_bf16"]["mean"] < 0.08
    assert logprobs["static_vs_dynamic_greedy"]["identical_sequences"] == 16
    loop = parts["loop"]
    assert [s["step"] for s in loop["steps"]] == [0, 1]
    assert loop["engine_serves_version"] == loop["trainer_version"] >= 1  # the hand-over reached the static engine
    assert loop["engine_decode"]["static_kv"] and loop["trainer_precision"] == "bf16"
    assert all(0.0 <= s["reward"] <= 1.0 and s["kept"] >= 0 for s in loop["steps"])
    assert parts["handoff"]["engine_serves_version"] == 2 and parts["handoff"]["bytes"] > 0
    profiled = parts["trainer_profile"]
    assert profiled["step_s_profiled"] > 0 and profiled["host_busy_s"] > 0 and profiled["device_busy_s"] == 0  # CPU
