"""The egress bench in small (bench/bench_egress.py, as it measures the docs' figures): a few process sandboxes
fetching one file at once, twice, through the real proxy process, cost one GET at the loopback stand-in, and
the sandboxes' own reports count the cache hits the proxy counted."""

from __future__ import annotations

import argparse
import asyncio
import os

import pytest

from bench.bench_egress import main_async, render
from tests.conftest import need
from tests.sandbox.conftest import bwrap  # noqa: F401 - bubblewrap and the host's python3, a fixture

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]


def test_n_process_sandboxes_fetching_one_file_cost_one_upstream_fetch(bwrap):
    need(os.geteuid() == 0, "the egress proxy enters sandboxes' network namespaces: run as root")
    args = argparse.Namespace(sandboxes=8, docker_sandboxes=0, mb=1, port=3128, no_write=True)
    data = asyncio.run(main_async(args))
    row = data["rows"]["process"]
    assert (row["attached"], row["upstream_gets"], row["upstream_fetches"]) == (8, 1, 1)
    assert row["cache_hits"] == row["report_cache_hits"] == 2 * 8 - 1
    assert row["bytes_to_sandboxes"] == 2 * 8 * row["file_bytes"]
    assert "| process | 8 | 1 / 1 | 1 | 15 / 15 |" in render(data, args)
