"""How a task attempt ended: the failure taxonomy shared by the sandbox layer and the RL core.

Every attempt ends as exactly one `Outcome`. An `infra_failure` also carries an `InfraCause`;
the RL core masks such attempts out of the group statistics and the loss, because a crashed
container says nothing about the policy. This module imports nothing beyond the standard
library so that the sandbox, inference and CLI layers can use it without pulling in torch.
"""

from enum import StrEnum


class Outcome(StrEnum):
    """How one task attempt ended."""

    OK = "ok"
    """The verifier ran and produced a reward; trained on."""
    MODEL_FAILURE = "model_failure"
    """The policy's fault (its code crashed, it ran out of its agent budget, it gave no answer).
    The reward stands and the attempt is trained on."""
    INFRA_FAILURE = "infra_failure"
    """The infrastructure's fault; the attempt is masked from training and counted by cause."""


class InfraCause(StrEnum):
    """Why an attempt failed for a reason that is not the policy's."""

    IMAGE_PULL = "image_pull"
    """The sandbox image could not be pulled onto the node."""
    IMAGE_BUILD = "image_build"
    """The task's environment image failed to build."""
    SANDBOX_START = "sandbox_start"
    """The sandbox (container or process) did not start."""
    SANDBOX_LOST = "sandbox_lost"
    """The sandbox was killed or removed from outside while the attempt ran (a crash, a janitor)."""
    OOM_KILLED = "oom_killed"
    """The sandbox was OOM-killed at its memory limit for a reason the sandbox layer lays at the
    infrastructure's door (a reservation too small for the task's own services, say)."""
    OOM_NODE = "oom_node"
    """The node ran out of memory and the kernel killed the sandbox."""
    NODE_LOST = "node_lost"
    """The node went away (reboot, network partition, Slurm node failure)."""
    ENGINE_ERROR = "engine_error"
    """The inference engine failed the request (crash, HTTP error, aborted generation)."""
    VERIFIER_ERROR = "verifier_error"
    """The verifier itself failed to run or wrote no reward."""
    TIMEOUT_INFRA = "timeout_infra"
    """A timeout outside the agent's budget (start, upload, verifier wall clock)."""
    SESSION_TIMEOUT = "session_timeout"
    """The whole session (sandbox start to stop, every generation and command) ran past
    `[rollout] session_timeout_s`: cut so that the step does not wait on it (a hung daemon, engine
    or command)."""
    HARNESS_ERROR = "harness_error"
    """The agent's harness (its own code: mini-swe-agent, a user's function) raised instead of returning."""
    HARNESS_TIMEOUT = "harness_timeout"
    """The harness did not return within the agent's budget (`[agent] harness_timeout_s`, else the task's)."""
    ENDPOINT_ERROR = "endpoint_error"
    """The session endpoint failed a request for a reason of its own (a bug of rl360's, not the model's)."""
    TITO_BREAK = "tito_break"
    """The harness rewrote its conversation's history, and the recipe masks such sessions
    (`[agent] on_tito_break = "mask"`) instead of training each segment."""
    PROMPT_TOO_LONG = "prompt_too_long"
    """The task's first prompt alone is past the session's token budget (`[rollout] max_total_tokens`): the
    policy never saw the task, so there is nothing to score it on (a recipe and task set that do not fit)."""
    NO_REPLY_IN_BUDGET = "no_reply_in_budget"
    """The agent's budget ran out while the model's first reply was still being generated: not one token to
    train on or score. The engines serve more sessions than the tasks' budgets allow for (fewer sessions in
    flight, more engines, or a larger `[agent] timeout_multiplier`)."""
    EGRESS = "egress"
    """The sandbox's way out failed it: a host the profile's `[egress]` lets the task reach could not be reached
    (the egress proxy found no answer, a broken one, or an address of the node's own networks), or the proxy
    itself failed. A host off the allow-list is not this: trying it is the model's own doing."""
    PROVIDER_ERROR = "provider_error"
    """The sandbox provider (Docker daemon, remote API) returned an error."""
    INJECTED = "injected"
    """A failure injected on purpose by a fault-injection test."""
    UNKNOWN = "unknown"
    """An infrastructure error the layer could not classify; a non-zero rate needs a look."""
