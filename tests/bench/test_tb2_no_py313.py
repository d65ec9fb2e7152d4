"""The Terminal-Bench 2.0 table's paragraph on the tasks checked without CPython 3.13 in the base
(bench/bench_terminal_bench.py `no_py313_paragraph`, over bench/bench_tb2_no_py313.py's rows): the counts, each
task's time beside the whole-dataset row's, and the causes of the rows that did not pass, the last row of a task
counting."""

from __future__ import annotations

import json

import bench.bench_terminal_bench as tb2


def test_the_paragraph_counts_the_last_row_of_each_task(tmp_path, monkeypatch):
    rows = [{"task": "a", "status": "failed", "seconds": 5.0, "cause": "oracle egress: the proxy went away"},
            {"task": "a", "status": "passed", "seconds": 30.4, "oracle_github_bytes": 39418611},
            {"task": "b", "status": "passed", "seconds": 12.0, "oracle_github_bytes": 523},
            {"task": "c", "status": "failed", "seconds": 9.0, "cause": "oracle scored 0: verifier: x"}]
    results = tmp_path / "rows.jsonl"
    results.write_text("".join(json.dumps(r) + "\n" for r in rows))
    monkeypatch.setattr(tb2, "NO_PY313", results)
    text, blank = tb2.no_py313_paragraph({"a": {"seconds": 17.1}})
    assert blank == ""
    assert "**2 of 3 passed**: a (30 s, 17 s above), b (12 s)" in text
    assert "; not passed: c (oracle scored 0: verifier: x)." in text
    assert ("In 1 of the 2 passed the oracle's sandbox got the stand-in's CPython archive from github.com's URL "
            "through the proxy (its egress report); in b only the list") in text


def test_no_rows_no_paragraph(tmp_path, monkeypatch):
    monkeypatch.setattr(tb2, "NO_PY313", tmp_path / "absent.jsonl")
    assert tb2.no_py313_paragraph({}) == []
