"""A rollout node's reaper: what a run's sandboxes left on the node's own daemon past their deadline, removed.

A session's containers carry its deadline (`rl360.deadline`, epoch seconds: the session's start plus
`[rollout] session_timeout_s`, set by the session actor; rl360cli/sandbox/docker/provider.py keeps it out of a pool's
spec). A session ends its sandbox itself, at its deadline at the latest; one whose actor died (its process killed
by the kernel, say) never does. So every session actor on a node with its own daemon (`[sandbox] docker_host`) runs
`reap_expired` every `[sandbox] reap_every_s`: each container of the run whose deadline plus `[sandbox]
reap_grace_s` has passed is removed, whoever started it. A container without a deadline (a warm pool's, not yet
taken) is left to `rl360 down`'s cleanup step, as is everything on a node that is itself lost (nothing runs there).

Test: tests/sandbox/test_reaper.py (the dev Docker nodes).
"""

from __future__ import annotations

import time

DEADLINE_LABEL = "rl360.deadline"


def reap_expired(api, run_id: str, *, grace_s: float, now: float | None = None) -> list[str]:
    """Remove the containers of run `run_id` on the daemon behind `api` (the docker SDK's `APIClient`) whose
    deadline plus `grace_s` has passed, running or not, with their anonymous volumes; the ids removed. One that
    went meanwhile (its session stopped it, another actor's reaper took it) is no error."""
    import docker

    now = time.time() if now is None else now
    removed = []
    for found in api.containers(all=True, filters={"label": [f"rl360.run={run_id}", DEADLINE_LABEL]}):
        try:
            deadline = float((found.get("Labels") or {})[DEADLINE_LABEL])
        except (KeyError, ValueError):
            continue  # not a deadline rl360 wrote
        if deadline + grace_s >= now:
            continue
        try:
            api.remove_container(found["Id"], force=True, v=True)
        except docker.errors.NotFound:
            continue
        removed.append(found["Id"])
    return removed
