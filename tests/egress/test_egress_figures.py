"""A step's egress figures (rl360cli/loop/egress_figures.py) from the attempts' reports in their sessions'
metadata, as rl360cli/agent/session.py puts them there: per host, summed over the step, a session once."""

from __future__ import annotations

from rl360cli.egress.client import EgressReport
from rl360cli.loop.egress_figures import egress_figures
from rl360cli.outcome import Outcome
from rl360cli.rl.trajectory import Trajectory


def session(report: EgressReport | None, *, sample: int, segment: int = 0) -> Trajectory:
    return Trajectory(task_id="t", group_id="g", sample_index=sample, segment=segment, token_ids=[1, 2],
                      loss_mask=[0, 1], logprobs=[0.0, -0.5], versions=(0,), num_prompt_tokens=1, reward=1.0,
                      outcome=Outcome.OK, metadata={"egress": report.to_json() if report else None})


def test_bytes_denials_failures_per_host_and_cache_hits_add_up_over_the_step():
    a = EgressReport(bytes={"pypi.org": 100, "deb.debian.org": 10}, denied={"evil.test": 1}, cache_hits=2)
    b = EgressReport(bytes={"pypi.org": 50}, failed={"files.pythonhosted.org": 1}, cache_hits=1)
    figures = egress_figures([session(a, sample=0), session(a, sample=0, segment=1), session(b, sample=1),
                              session(None, sample=2)])
    assert figures == {"egress/bytes/deb.debian.org": 10, "egress/bytes/pypi.org": 150, "egress/denied/evil.test": 1,
                       "egress/failed/files.pythonhosted.org": 1, "egress/cache_hits": 3}


def test_a_step_without_a_proxy_has_no_egress_figures():
    assert egress_figures([session(None, sample=0)]) == {}
    # [egress] mode = "none": a task that wanted the internet has its one line, and nothing to count.
    told = EgressReport(lines=("rl360 egress: the task wants the internet and its sandbox has none",))
    assert egress_figures([session(told, sample=0), session(None, sample=1)]) == {}
