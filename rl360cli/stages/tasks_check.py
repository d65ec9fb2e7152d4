"""Stage `tasks check`: run each task's oracle (solution/solve.sh) and a no-op through the verifier, in sandboxes
of the chosen provider, and say which tasks are fit to train on (rl360cli/sandbox/check.py says what each must do).

    loaded = load_tasks([Path("recipes/tasks/examples")], include=())     # before any profile is read
    report = check(ctx, loaded, provider="process", concurrency=4)
    report.rows          # a CheckRow per task, refused ones among them, by task id
    report.failed        # those that did not pass

Nothing is written to the state file but the event; the machine's egress proxy is started for the check when the
profile's `[egress]` lets sandboxes out through it, and stopped after unless something else had started it.
Tested through `rl360 tasks check` by tests/sandbox/test_cli.py, and tests/egress/test_egress_stage.py (the proxy).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from rl360cli.errors import Rl360Error
from rl360cli.sandbox.check import CheckRow, check_tasks
from rl360cli.sandbox.config import SandboxConfig, WarmPoolConfig
from rl360cli.sandbox.providers import make_provider
from rl360cli.sandbox.task import Task, resolve_env
from rl360cli.sandbox.task_loader import TaskError, load_task_set
from rl360cli.stages import egress
from rl360cli.stages.base import Context
from rl360cli.state import queries

NAME = "tasks"
PROVIDERS = ("process", "docker", "daytona")


@dataclass(frozen=True, kw_only=True, slots=True)
class LoadedTasks:
    """The tasks of the paths given, and those refused at load (task id -> why), each to get its own row."""

    tasks: tuple[Task, ...]
    refused: dict[str, Rl360Error]


@dataclass(frozen=True, kw_only=True, slots=True)
class TasksCheck:
    """What `check` found."""

    provider: str
    profile: str  # the profile's name
    rows: tuple[CheckRow, ...]  # one per task, refused ones included, by task id
    # Tasks that want the internet (Harbor's default) where the profile's `[egress] mode = "none"` gives none.
    offline: tuple[str, ...]

    @property
    def failed(self) -> list[CheckRow]:
        return [r for r in self.rows if not r.passed]

    def to_dict(self) -> dict:
        return {"provider": self.provider, "passed": not self.failed, "tasks": [r.to_dict() for r in self.rows]}


def check_options(*, provider: str, concurrency: int) -> None:
    """A one-line error for a provider or a concurrency `check` cannot take."""
    if provider not in PROVIDERS:
        raise Rl360Error(f"--provider {provider!r} is not known", "use process, docker or daytona")
    if concurrency < 1:
        raise Rl360Error(f"--concurrency must be at least 1 (got {concurrency})")


def load_tasks(paths: Sequence[Path], *, include: Sequence[str]) -> LoadedTasks:
    """The tasks of `paths` (task folders, or task set folders with `include` naming some of theirs). A task rl360
    refuses, or one whose `[environment.env]` names a variable this process lacks, is refused with its one line;
    a set that is itself wrong (no such folder, no task in it, a bad `include`) or a task id given twice is an
    error."""
    tasks: list[Task] = []
    refused: dict[str, Rl360Error] = {}
    for path in paths:
        # A task rl360 refuses gets its own row; the others are checked all the same.
        refused_here: dict[str, TaskError] = {}
        try:
            tasks += load_task_set(path, include=tuple(include) if _is_set(path) else (), refused=refused_here)
        except TaskError as e:
            if not _is_set(path):
                refused_here.setdefault(path.name, e)
            elif not refused_here:  # the set itself is wrong (no such folder, no task in it, a bad --include)
                raise
        refused.update(refused_here)
    # A task whose [environment.env] names a variable this process lacks cannot start anywhere: its own row,
    # before any image is built for it (harbor-cookbook's computer-use-windows needs DAYTONA_API_KEY).
    for task in list(tasks):
        try:
            resolve_env(task.env)
        except KeyError as e:
            tasks.remove(task)
            refused[task.id] = TaskError(f"task {task.id}: [environment.env] needs ${{{e.args[0]}}}, which is not "
                                         "set", f"set {e.args[0]} in the environment rl360 runs in (Harbor reads "
                                         "it from --env-file)")
    ids = [t.id for t in tasks] + list(refused)
    duplicates = sorted({i for i in ids if ids.count(i) > 1})
    if duplicates:
        raise Rl360Error(f"task ids appear twice: {', '.join(duplicates)}", "pass each task once")
    return LoadedTasks(tasks=tuple(tasks), refused=refused)


def check(ctx: Context, loaded: LoadedTasks, *, provider: str, concurrency: int, probe: bool = False,
          force_build: bool = False, artifacts_dir: Path | None = None) -> TasksCheck:
    """Check every task of `loaded` in sandboxes of `provider` on the profile's nodes, `concurrency` at once; with
    `probe`, each passing task's verifier is probed too (sandbox/probes.py); with `force_build`, a `docker_image`
    with its Dockerfile beside it is built from it, not pulled (Harbor's `--force-build`, `[sandbox] force_build`);
    with `artifacts_dir`, each attempt's artifacts are kept below it (`<task>/<attempt>/`, Harbor's layout)."""
    check_options(provider=provider, concurrency=concurrency)
    if provider == "docker" and not ctx.profile.nodes:
        if ctx.profile.sandbox.docker_host:
            # A rollout node's own daemon is local to that node: this machine does not reach it.
            raise Rl360Error(f"profile '{ctx.profile.name}' reaches Docker only on each rollout node "
                             f"([sandbox] docker_host), not from this machine",
                             "run the check on a node (`srun -N1 rl360 tasks check --provider docker --profile P`, "
                             "P's [[nodes]] naming that node's socket) or pass --profile cluster/dev-docker.toml")
        raise Rl360Error(f"profile '{ctx.profile.name}' lists no Docker nodes",
                         "pass --profile cluster/dev-docker.toml (or a profile with [[nodes]])")
    tasks = list(loaded.tasks)
    # Each task's oracle runs once: a warm pool would only make containers nobody takes.
    config = SandboxConfig(provider=provider, max_concurrent=2 * concurrency, wave_size=max(4, 2 * concurrency),
                           wave_interval_s=0.2, warm_pool=WarmPoolConfig(size=0), force_build=force_build)
    run_id = f"check-{time.strftime('%Y%m%d-%H%M%S')}"
    # The machine's egress proxy for the check's sandboxes and builds: one `rl360 up` started is left running.
    proxy = (egress.for_one_command(ctx, command="rl360 tasks check")
             if egress.applies(ctx) and provider != "daytona" else contextlib.nullcontext())

    async def run(sandboxes):
        try:
            return await check_tasks(sandboxes, tasks, run_id=run_id, concurrency=concurrency, probe=probe,
                                     artifacts_dir=artifacts_dir)
        finally:
            await sandboxes.close()

    with proxy:
        sandboxes = make_provider(config, nodes=ctx.profile.nodes, run_id=run_id,
                                  node_images=queries.image_digests(ctx.state.read()),
                                  registry=ctx.profile.registry, egress=egress.route(ctx))
        rows = asyncio.run(run(sandboxes)) if tasks else []
    rows = sorted(rows + [CheckRow.refused_row(name, e) for name, e in loaded.refused.items()], key=lambda r: r.task)
    report = TasksCheck(provider=provider, profile=ctx.profile.name, rows=tuple(rows),
                        offline=tuple(t.id for t in tasks if t.network) if ctx.profile.egress.mode == "none" else ())
    ctx.event(NAME, "check", f"{len(rows)} tasks", outcome="failed" if report.failed else "ok", provider=provider,
              failed=[r.task for r in report.failed])
    return report


def _is_set(path: Path) -> bool:
    return not (path / "task.toml").exists()
