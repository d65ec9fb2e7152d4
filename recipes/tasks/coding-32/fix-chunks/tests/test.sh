#!/bin/bash
# Verifier of rl360/fix-chunks (the same in every coding-32 task but for the id and the test count).
# Runs the hidden tests against /app and writes /logs/verifier/reward.json:
#   reward         1 when all 7 tests pass, else 0 (what GRPO trains on)
#   pass_fraction  tests passed / 7 (reported only)
# The agent's code runs inside pytest, so pytest is bounded here (10 s, 256 MiB of address
# space): a hang or a memory blow-up scores 0 as a model failure, not an infrastructure failure.
# pytest's transcript goes to /logs/verifier/pytest.log, not to this script's output, where a
# MemoryError of the agent's code would read as the verifier itself running out of memory.
# Only pytest's JUnit report counts (an exit status can be forged with os._exit(0)), and no
# conftest.py or pytest.ini from outside /tests is loaded.
mkdir -p /logs/verifier
echo '{"reward": 0.0, "pass_fraction": 0.0}' > /logs/verifier/reward.json
report="$(mktemp -d)/junit.xml"
cd /app 2>/dev/null || cd /
(
    ulimit -v 262144
    exec timeout -k 1 10 python3 -I -m pytest -q -p no:cacheprovider -c /tests/pytest.ini \
        --rootdir=/tests --noconftest --junitxml="$report" /tests/test_*.py
) > /logs/verifier/pytest.log 2>&1
status=$?
python3 -I - "$report" "$status" 7 <<'PY'
import json
import sys
import xml.etree.ElementTree as ET

report, status, expected = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
tests = bad = 0
failed = []
try:
    root = ET.parse(report).getroot()
    for suite in root.iter("testsuite"):
        tests += int(suite.get("tests", 0))
        bad += sum(int(suite.get(key, 0)) for key in ("failures", "errors", "skipped"))
    failed = [case.get("name", "?") for case in root.iter("testcase")
              if any(child.tag in ("failure", "error", "skipped") for child in case)]
except (OSError, ET.ParseError, ValueError):
    why = "ran past 10 s" if status in (124, 137) else f"exited {status} without a report"
    print(f"pytest {why}")
passed = max(0, min(tests - bad, expected))
reward = 1.0 if status == 0 and tests == expected and bad == 0 else 0.0
with open("/logs/verifier/reward.json", "w") as f:
    json.dump({"reward": reward, "pass_fraction": round(passed / expected, 4)}, f)
summary = f"{passed}/{expected} tests passed, reward {reward:g}"
print(summary + (f"; not passed: {', '.join(failed[:8])}" if failed else ""))
print("pytest's output: /logs/verifier/pytest.log")
PY
