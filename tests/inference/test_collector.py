"""The garbage collector's settings for processes with thousands of requests in flight
(rl360cli/inference/collector.py), in a fresh interpreter so that this test process keeps its own."""

from __future__ import annotations

import json
import subprocess
import sys

from tests.conftest import REPO

PROBE = """
import gc, json
from rl360cli.inference.collector import THRESHOLDS, collect_for_many_requests
before = (gc.get_threshold(), gc.get_freeze_count())
collect_for_many_requests()
cycle = []
cycle.append(cycle)  # garbage only the cyclic collector can free
del cycle
print(json.dumps({"before": before, "after": [gc.get_threshold(), gc.get_freeze_count()], "want": THRESHOLDS,
                  "collected": gc.collect() >= 1}))
"""


def test_what_is_loaded_is_frozen_out_of_the_scans_and_cycles_are_still_collected():
    out = subprocess.run([sys.executable, "-c", PROBE], cwd=REPO, capture_output=True, text=True, check=True,
                         timeout=60)
    seen = json.loads(out.stdout)
    assert seen["before"] == [[700, 10, 10], 0]  # Python's defaults
    thresholds, frozen = seen["after"]
    assert thresholds == list(seen["want"]) and thresholds[0] > 700
    assert frozen > 1000  # the interpreter's and rl360's modules at least
    assert seen["collected"]
