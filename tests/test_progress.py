"""The run folder's generation.json: written atomically and sparingly, read back or refused when malformed."""

from __future__ import annotations

import json

from rl360cli.progress import FILE, GenerationProgress, read_generation


def test_progress_is_written_at_most_once_an_interval_and_always_when_the_step_is_done(tmp_path):
    progress = GenerationProgress(tmp_path, min_interval_s=3600)
    assert read_generation(tmp_path) is None
    progress(step=2, sessions_done=8, sessions_total=64)
    first = read_generation(tmp_path)
    assert (first["step"], first["sessions_done"], first["sessions_total"]) == (2, 8, 64)
    progress(step=2, sessions_done=16, sessions_total=64)  # within the interval: not written
    assert read_generation(tmp_path)["sessions_done"] == 8
    progress(step=2, sessions_done=64, sessions_total=64)  # the step's groups are all in: written anyway
    assert read_generation(tmp_path)["sessions_done"] == 64
    assert [p.name for p in tmp_path.iterdir()] == [FILE]  # no partial file left beside it


def test_a_malformed_or_missing_progress_file_reads_as_none(tmp_path):
    assert read_generation(None) is None and read_generation(tmp_path / "gone") is None
    for text in ("{", "[]", '{"step": 1}', json.dumps({"step": -1, "sessions_done": 0, "sessions_total": 8}),
                 json.dumps({"step": 1, "sessions_done": True, "sessions_total": 8})):
        (tmp_path / FILE).write_text(text)
        assert read_generation(tmp_path) is None, text


def test_a_run_folder_that_is_gone_does_not_stop_the_loop(tmp_path):
    progress = GenerationProgress(tmp_path / "removed")
    progress(step=0, sessions_done=1, sessions_total=2)  # no error: the view is a convenience
    assert not (tmp_path / "removed").exists()
