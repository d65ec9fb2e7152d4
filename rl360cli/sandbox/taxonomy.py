"""The failure taxonomy of an attempt: one table from what happened to how the attempt ended.

Everything the sandbox layer observes while running an attempt is an `Event`
(the verifier wrote a reward, an agent command timed out, the node's daemon
stopped answering, ...). `TABLE` maps each event to an `Outcome`, an
`InfraCause` for infrastructure failures, and whether the admission controller
may retry it on another node. `classify(events)` folds the events of one
attempt into its final outcome: any infrastructure event wins (the attempt is
masked from training), else any model event makes it a `model_failure` whose
reward stands, else `ok`.

docs/sandboxes.md renders the same table; tests/sandbox/test_taxonomy.py has
one test per row (and checks the doc lists every row).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from enum import StrEnum

from rl360cli.outcome import InfraCause, Outcome


class Event(StrEnum):
    """Something that happened during an attempt that decides how it ends."""

    REWARD = "reward"
    AGENT_EXEC_TIMEOUT = "agent_exec_timeout"
    AGENT_LIMIT = "agent_limit"
    AGENT_BUDGET = "agent_budget"
    AGENT_NO_ANSWER = "agent_no_answer"
    AGENT_INFRA = "agent_infra"
    AGENT_BUG = "agent_bug"
    IMAGE_PULL_FAILED = "image_pull_failed"
    IMAGE_NOT_FOUND = "image_not_found"
    IMAGE_BUILD_FAILED = "image_build_failed"
    START_FAILED = "start_failed"
    START_TIMEOUT = "start_timeout"
    NODE_UNREACHABLE = "node_unreachable"
    SANDBOX_KILLED = "sandbox_killed"
    SANDBOX_OOM = "sandbox_oom"
    PROVIDER_FAILED = "provider_failed"
    VERIFIER_NO_REWARD = "verifier_no_reward"
    VERIFIER_BAD_REWARD = "verifier_bad_reward"
    VERIFIER_TIMEOUT = "verifier_timeout"
    VERIFIER_OOM = "verifier_oom"
    VERIFIER_ENV_MISSING = "verifier_env_missing"
    EGRESS_FAILED = "egress_failed"
    INJECTED = "injected"


@dataclass(frozen=True, kw_only=True, slots=True)
class Rule:
    """One row of the table."""

    event: Event
    outcome: Outcome
    # The cause of an infra failure; None for ok / model_failure, and for AGENT_INFRA, whose cause the agent names.
    cause: InfraCause | None
    # May the admission controller retry the attempt on another node?
    retriable: bool
    # What happened, in words (the docs table's first column).
    meaning: str


_OK, _MODEL, _INFRA = Outcome.OK, Outcome.MODEL_FAILURE, Outcome.INFRA_FAILURE

TABLE: tuple[Rule, ...] = (
    Rule(event=Event.REWARD, outcome=_OK, cause=None, retriable=False,
         meaning="the verifier ran and wrote a reward"),
    Rule(event=Event.AGENT_EXEC_TIMEOUT, outcome=_MODEL, cause=None, retriable=False,
         meaning="an agent command ran past its own timeout (it and every child were killed)"),
    Rule(event=Event.AGENT_LIMIT, outcome=_MODEL, cause=None, retriable=False,
         meaning="an agent command hit a sandbox limit: memory (OOM), processes, file size, CPU time"),
    Rule(event=Event.AGENT_BUDGET, outcome=_MODEL, cause=None, retriable=False,
         meaning="the agent used up the task's agent time budget ([agent] timeout_sec)"),
    Rule(event=Event.AGENT_NO_ANSWER, outcome=_MODEL, cause=None, retriable=False,
         meaning="the agent gave no usable answer (it raised ModelFailure)"),
    Rule(event=Event.AGENT_INFRA, outcome=_INFRA, cause=None, retriable=False,
         meaning="the agent hit an infrastructure problem itself (raised InfraError: engine_error, ...)"),
    Rule(event=Event.AGENT_BUG, outcome=_INFRA, cause=InfraCause.UNKNOWN, retriable=False,
         meaning="the agent's own code raised an unexpected exception (a bug in rl360, not the policy)"),
    Rule(event=Event.IMAGE_PULL_FAILED, outcome=_INFRA, cause=InfraCause.IMAGE_PULL, retriable=True,
         meaning="the image could not be pulled onto the node (registry unreachable, pull error)"),
    Rule(event=Event.IMAGE_NOT_FOUND, outcome=_INFRA, cause=InfraCause.IMAGE_PULL, retriable=False,
         meaning="the image does not exist in its registry"),
    Rule(event=Event.IMAGE_BUILD_FAILED, outcome=_INFRA, cause=InfraCause.IMAGE_BUILD, retriable=False,
         meaning="the task's environment/Dockerfile failed to build"),
    Rule(event=Event.START_FAILED, outcome=_INFRA, cause=InfraCause.SANDBOX_START, retriable=True,
         meaning="the container or process sandbox did not start"),
    Rule(event=Event.START_TIMEOUT, outcome=_INFRA, cause=InfraCause.TIMEOUT_INFRA, retriable=True,
         meaning="starting the sandbox (pull, build, create) took longer than its limit"),
    Rule(event=Event.NODE_UNREACHABLE, outcome=_INFRA, cause=InfraCause.NODE_LOST, retriable=True,
         meaning="the node's Docker daemon stopped answering (stopped, crashed, unreachable)"),
    Rule(event=Event.SANDBOX_KILLED, outcome=_INFRA, cause=InfraCause.SANDBOX_LOST, retriable=True,
         meaning="the sandbox was killed or removed from outside while the attempt ran"),
    Rule(event=Event.SANDBOX_OOM, outcome=_INFRA, cause=InfraCause.OOM_KILLED, retriable=False,
         meaning="the sandbox's memory filled with what no process holds (a tmpfs): rl360's own command in "
                 "it (clearing the verifier's folders) or the container itself was OOM-killed"),
    Rule(event=Event.PROVIDER_FAILED, outcome=_INFRA, cause=InfraCause.PROVIDER_ERROR, retriable=True,
         meaning="the provider returned an error (daemon API error, upload or download failed)"),
    Rule(event=Event.VERIFIER_NO_REWARD, outcome=_INFRA, cause=InfraCause.VERIFIER_ERROR, retriable=False,
         meaning="tests/test.sh wrote neither /logs/verifier/reward.json nor reward.txt"),
    Rule(event=Event.VERIFIER_BAD_REWARD, outcome=_INFRA, cause=InfraCause.VERIFIER_ERROR, retriable=False,
         meaning="the reward file is not a number / not a flat mapping of numbers"),
    Rule(event=Event.VERIFIER_TIMEOUT, outcome=_INFRA, cause=InfraCause.TIMEOUT_INFRA, retriable=False,
         meaning="tests/test.sh ran past [verifier] timeout_sec"),
    Rule(event=Event.VERIFIER_OOM, outcome=_INFRA, cause=InfraCause.OOM_KILLED, retriable=False,
         meaning="the verifier ran out of memory: the reservation is too small for the task's tests"),
    Rule(event=Event.VERIFIER_ENV_MISSING, outcome=_INFRA, cause=InfraCause.VERIFIER_ERROR, retriable=False,
         meaning="[verifier.env] names a ${VAR} that is not set on the orchestrator"),
    Rule(event=Event.EGRESS_FAILED, outcome=_INFRA, cause=InfraCause.EGRESS, retriable=False,
         meaning="a host the profile's [egress] allows could not be reached through the node's egress proxy (no "
                 "answer, a broken one, an address of the node's own networks), or the proxy failed"),
    Rule(event=Event.INJECTED, outcome=_INFRA, cause=InfraCause.INJECTED, retriable=False,
         meaning="a failure injected on purpose ([sandbox] inject_failure_rate)"),
)

RULES: dict[Event, Rule] = {rule.event: rule for rule in TABLE}


@dataclass(frozen=True, kw_only=True, slots=True)
class Observed:
    """One event as it happened in an attempt, with its own cause (AGENT_INFRA) and a line of detail."""

    event: Event
    detail: str = ""
    cause: InfraCause | None = None


@dataclass(frozen=True, kw_only=True, slots=True)
class Classification:
    outcome: Outcome
    cause: InfraCause | None
    retriable: bool
    # The event that decided it.
    decided_by: Event | None
    detail: str


def classify(events: Iterable[Observed]) -> Classification:
    """The outcome of an attempt from everything observed in it (first infra event, else first model event)."""
    events = list(events)
    for wanted in (_INFRA, _MODEL, _OK):
        for seen in events:
            rule = RULES[seen.event]
            if rule.outcome == wanted:
                cause = (seen.cause or InfraCause.UNKNOWN) if seen.event == Event.AGENT_INFRA else rule.cause
                return Classification(outcome=wanted, cause=cause, retriable=rule.retriable,
                                      decided_by=seen.event, detail=seen.detail or rule.meaning)
    # Nothing at all happened (cannot occur in run_attempt, which always ends with a verifier event).
    return Classification(outcome=_INFRA, cause=InfraCause.UNKNOWN, retriable=False, decided_by=None,
                          detail="the attempt recorded no event")


class InfraError(Exception):
    """An infrastructure failure: the attempt ends as `infra_failure` with `cause` and is masked.

    Agents raise it for problems they hit themselves (the inference engine failed:
    `InfraError(InfraCause.ENGINE_ERROR, "HTTP 503")`); providers raise `SandboxError`.
    """

    def __init__(self, cause: InfraCause, detail: str = "", *, event: Event = Event.AGENT_INFRA,
                 injected: bool = False):
        self.cause = InfraCause(cause)
        self.detail = detail
        self.event = event
        self.injected = injected
        super().__init__(f"{self.cause.value}: {detail}" if detail else self.cause.value)

    @property
    def retriable(self) -> bool:
        return RULES[self.event].retriable

    def observed(self) -> Observed:
        return Observed(event=self.event, detail=self.detail, cause=self.cause)


class SandboxError(InfraError):
    """A provider could not start, reach or use a sandbox; `event` is its row of the table."""

    def __init__(self, event: Event, detail: str, *, node: str | None = None, injected: bool = False):
        rule = RULES[event]
        super().__init__(rule.cause or InfraCause.UNKNOWN, detail, event=event, injected=injected)
        self.node = node


class ModelFailure(Exception):
    """Raised by an agent that has no answer to give (the model produced nothing usable): a model_failure."""
