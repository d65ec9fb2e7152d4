"""The live view of `rl360 up` shows the last step's scale figures (rl360cli/commands/watch.py `scale_text`),
as rl360cli/rollout/gauges.py `merge` writes them into a metrics.jsonl row."""

from __future__ import annotations

from rich.console import Console

from rl360cli.commands.watch import live_view
from rl360cli.metrics import Histogram, Level
from rl360cli.rollout.gauges import merge


def actor_take(in_flight: int, waits: list[float], *, warm: int, cold: int, pulls: int) -> dict:
    """One actor's `take_gauges()`, made with the real counters."""
    sessions, queue, wait = Level(), Level(), Histogram()
    sessions.add(in_flight)
    queue.add(len(waits))
    for seconds in waits:
        wait.add(seconds)
    return {"sessions": sessions.take(), "sessions_done": in_flight, "generate_requests": 4 * in_flight,
            "cpu_s": in_flight / 1000 * 12.5, "memory_peak_mb": 600.0, "memory_peak_is_lifetime": False,
            "pulls_in_flight_max": pulls, "pull_cap": 4, "router_url": "http://127.0.0.1:32000",
            "admission": {"queue": queue.take(), "queue_wait_s": wait.take(), "sandboxes": sessions.take(),
                          "warm_starts": warm, "cold_starts": cold, "failed_starts": 0}}


def frame(rows: list[dict]) -> str:
    console = Console(record=True, width=400)
    console.print(live_view("r1", {"status": "running", "num_steps": 3, "step": len(rows)}, rows, 12.0, now=0.0))
    return console.export_text()


def test_the_live_view_shows_the_last_steps_scale_figures():
    figures = merge([actor_take(4096, [0.5] * 99 + [3.0], warm=3900, cold=196, pulls=4),
                     actor_take(4096, [0.5] * 100, warm=4000, cold=96, pulls=3)], seconds=64.0)
    figures.update(router_requests_per_s=1024.0, router_rps_source="router")
    row = {"step": 0, "reward_mean": 0.5, "samples": 8192, "batch": {}, **figures}
    text = frame([row])
    assert "scale, step 1: sessions in flight max 8,192" in text
    # The p99 is its bucket's upper edge (within 5%); the one 3 s wait is past it.
    assert "admission queue max 200, wait mean 0.51s p99 0.52s" in text
    assert "pulls in flight 7/8" in text and "warm starts 96%" in text
    assert "actors 12.5 CPU s/1k sessions, 146 MB/1k in flight" in text
    assert "router 1,024 req/s (router)" in text


def test_a_small_run_shows_the_actors_rss_not_a_figure_per_1000_sessions():
    """64 sessions in flight: the actors' fixed memory per 1,000 of them would read as a leak."""
    row = {"step": 0, "reward_mean": 0.5, "samples": 64, "batch": {},
           **merge([actor_take(32, [], warm=32, cold=0, pulls=0), actor_take(32, [], warm=32, cold=0, pulls=0)],
                   seconds=10.0)}
    text = frame([row])
    assert "actors 12.5 CPU s/1k sessions, 1,200 MB RSS" in text and "MB/1k in flight" not in text


def test_a_row_without_scale_figures_shows_no_scale_line():
    assert "scale" not in frame([{"step": 0, "reward_mean": 0.5, "samples": 8, "batch": {}}])
