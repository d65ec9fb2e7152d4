"""`bench/gpu/check.sh --dry-run`: the prepared GPU check runs end to end on the CPU, tiny, so that the
first GPU lent runs a script that has already worked (issue 14). Every part must succeed and report
its figures; the loop's engine must end on the trainer's version (the hand-over reached it)."""

from __future__ import annotations

import json
import subprocess

import pytest

from tests.conftest import REPO


@pytest.mark.slow
def test_the_gpu_check_runs_dry_on_the_cpu(tmp_path):
    out = tmp_path / "gpu-check.json"
    proc = subprocess.run(["bash", str(REPO / "bench" / "gpu" / "check.sh"), "--dry-run", "--out", str(out)],
                          capture_output=True, text=True, timeout=600, cwd=REPO)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "plan (dry run: tiny, on the CPU)" in proc.stdout
    report = json.loads(out.read_text())
    parts = report["parts"]
    assert report["dry_run"] and set(parts) == {"env", "engine", "engine_step", "trainer", "trainer_profile", "handoff",
                                                "loop"}
    assert all(p["ok"] for p in parts.values()), {k: p.get("error") for k, p in parts.items()}
    assert parts["engine"]["batch_1_tokens_per_s"] > 0 and parts["engine"]["batch_4_tokens_per_s"] > 0
    assert all(parts["engine_step"][f"batch_{b}_{what}_ms"] > 0
               for b in (1, 4) for what in ("forward", "sampling", "engine_step"))
    assert "aten::" in proc.stdout  # the profiler's table of operators
    assert parts["trainer"]["torch_step_s"] > 0 and parts["trainer"]["megatron_step_s"] > 0
    profiled = parts["trainer_profile"]
    assert profiled["step_s_profiled"] > 0 and profiled["host_busy_s"] > 0 and profiled["device_busy_s"] == 0  # CPU
    assert parts["handoff"]["engine_serves_version"] == 2 and parts["handoff"]["bytes"] > 0
    loop = parts["loop"]
    assert [s["step"] for s in loop["steps"]] == [0, 1]
    assert loop["engine_serves_version"] == loop["trainer_version"] >= 1
    assert all(0.0 <= s["reward"] <= 1.0 and s["kept"] >= 0 for s in loop["steps"])
