"""What Harbor's task format decides beyond one agent and one verifier: a multi-step task's reward, a
step's early stop, and where a task may be placed (the artifacts handed to a separate verifier: artifacts.py).

    rewards = task_rewards(task.reward_strategy, [step_1_rewards, step_2_rewards])
    if below_min_reward(step, step_rewards): ...  # the remaining steps do not run
    problem = placement_problem(task, provider.nodes())  # None, or the one-line reason

Harbor's rules, as its multi-step trial applies them (harbor-framework/harbor,
src/harbor/trial/multi_step.py, `harbor.trial.multi_step`) and its task reference states them
(docs/content/docs/tasks/index.mdx, `multi_step_reward_strategy`): "mean" (the default) is the
per-key mean over the steps that have a verifier result, a key missing from a step counting 0;
"final" is the last such step's result verbatim. A step whose reward is below its `min_reward`
(a number, or a minimum per key) ends the trial: the steps after it do not run, so they have no
verifier result and are left out of the mean.

Test: tests/sandbox/test_harbor_format.py.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from rl360cli.sandbox.provider import NodeCapacity
from rl360cli.sandbox.sidecars import missing_mcp_host
from rl360cli.sandbox.task import MAIN_SERVICE, Step, Task


def task_rewards(strategy: str, per_step: Sequence[Mapping[str, float]]) -> dict[str, float]:
    """The task's rewards from those of the steps that were verified, in order (Harbor's rule)."""
    verified = [dict(r) for r in per_step if r]
    if not verified:
        return {}
    if strategy == "final":
        return verified[-1]
    keys = list(dict.fromkeys(k for r in verified for k in r))
    return {k: sum(r.get(k, 0.0) for r in verified) / len(verified) for k in keys}


def below_min_reward(step: Step, rewards: Mapping[str, float], reward: float) -> bool:
    """Whether the step's reward misses its `min_reward`, so the task stops after it."""
    if step.min_reward is None:
        return False
    if isinstance(step.min_reward, dict):
        return any(rewards.get(key, 0.0) < floor for key, floor in step.min_reward.items())
    return reward < step.min_reward


def placement_problem(task: Task, nodes: Sequence[NodeCapacity], provider: str = "", *,
                      sidecars: bool = False, service_ops: bool = False) -> str | None:
    """Why no node of the provider can hold the task (one line), or None when one can. `sidecars`: whether
    the provider starts Harbor's sidecar services; `service_ops`: whether it runs commands in them and copies
    files out of them (collect hooks and artifacts of a service)."""
    where = f"the {provider} provider" if provider else "this provider"
    if task.gpus:
        kinds = f" ({' or '.join(task.gpu_types)})" if task.gpu_types else ""
        best = max((n.gpus for n in nodes), default=0)
        if best < task.gpus:
            return (f"task {task.id} needs {task.gpus} GPU(s){kinds} and no node of {where} has "
                    f"{'any' if best == 0 else f'more than {best}'}: run it on nodes with GPUs")
        if task.gpu_types and not any(n.gpus >= task.gpus and gpu_type_fits(n.gpu_type, task.gpu_types)
                                      for n in nodes):
            have = sorted({n.gpu_type for n in nodes if n.gpus >= task.gpus})
            return (f"task {task.id} needs {task.gpus} GPU(s){kinds} and the nodes of {where} with enough GPUs "
                    f"have {', '.join(have)}: run it on nodes with one of its gpu_types")
    if task.sidecars and not sidecars:
        names = ", ".join(s.name for s in task.sidecars)
        return (f"task {task.id} needs sidecar services ({names}), which {where} does not start: "
                "run it with the docker provider (or the process provider, as root with bubblewrap)")
    used = services_used(task)
    if used and sidecars and not service_ops:
        return (f"task {task.id} runs collect hooks in, or takes artifacts from, its sidecars ({', '.join(used)}), "
                f"which {where} cannot reach: run it with the docker provider")
    missing = missing_mcp_host(task.mcp_servers, task.sidecars)
    if missing is not None:
        return f"task {task.id}: {missing}"
    return None


def gpu_type_fits(node_type: str, wanted: Sequence[str]) -> bool:
    """A node whose GPU model is unknown ("") takes any; else its model must be one of `wanted`
    (case and a vendor prefix aside: "H100" fits "nvidia-h100")."""
    if not node_type:
        return True
    have = node_type.lower()
    return any(w.lower() == have or have.endswith(w.lower()) or w.lower().endswith(have) for w in wanted)


def services_used(task: Task) -> tuple[str, ...]:
    """The sidecars the task's (and its steps') collect hooks and artifacts name, sorted."""
    named = {x.service for of in (task, *task.steps) for x in (*of.artifacts, *of.collect)}
    return tuple(sorted(named - {MAIN_SERVICE}))
