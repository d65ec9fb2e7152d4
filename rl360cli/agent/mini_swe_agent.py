"""mini-swe-agent, unchanged, as an rl360 harness (`[agent] harness = "mini-swe-agent"`).

The package from PyPI (the optional extra `rl360[agents]`) with its own agent class (`DefaultAgent`), loop
and prompts (its `mini.yaml`; `mini_textbased.yaml` with `[agent] action_format = "fence"`) and its own model
classes (`LitellmModel` and its bash tool; `LitellmTextbasedModel`), the model pointed at the session's
OpenAI-compatible base URL the way mini-swe-agent reaches any such server: litellm's `openai/` provider with
`api_base` and `api_key`. Its commands run in rl360's sandbox through `SandboxEnvironment`, an environment
class of rl360's with the shape of mini-swe-agent's own `LocalEnvironment`. rl360 sets only what a rollout
needs: the step limit (`[rollout] max_turns`), no cost limit (there is no price), the sampling, and litellm
kept offline (its model-cost map is read from the package, not fetched).

mini-swe-agent and litellm are heavy to import (seconds): they load when a session first runs the harness.
"""

from __future__ import annotations

import os
import platform
from collections.abc import Mapping
from typing import Any

from rl360cli.agent.config import AgentConfig, RolloutConfig
from rl360cli.agent.harness import Session, SyncSandbox

# What mini-swe-agent takes for "the agent is done": the first line of a command's output (its own rule).
SUBMIT_LINE = "COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"


class SandboxEnvironment:
    """mini-swe-agent's environment protocol (`execute`, `get_template_vars`, `serialize`) on rl360's sandbox."""

    def __init__(self, sandbox: SyncSandbox, *, cwd: str, timeout: float, env: dict[str, str] | None = None):
        self.sandbox = sandbox
        self.config = {"cwd": cwd, "timeout": timeout, "env": dict(env or {})}

    def execute(self, action: dict, cwd: str = "", *, timeout: int | None = None) -> dict[str, Any]:
        """Run the action's command; a submit raises mini-swe-agent's `Submitted`, as its own environments do."""
        from minisweagent.exceptions import Submitted

        result = self.sandbox.exec(action.get("command", ""), timeout_s=timeout or self.config["timeout"],
                                   cwd=cwd or self.config["cwd"], env=self.config["env"])
        output = {"output": result.output, "returncode": -1 if result.exit_code is None else result.exit_code,
                  "exception_info": f"the command timed out after {timeout or self.config['timeout']}s"
                  if result.timed_out else ""}
        lines = output["output"].lstrip().splitlines(keepends=True)
        if lines and lines[0].strip() == SUBMIT_LINE and output["returncode"] == 0:
            submission = "".join(lines[1:])
            raise Submitted({"role": "exit", "content": submission,
                             "extra": {"exit_status": "Submitted", "submission": submission}})
        return output

    def get_template_vars(self, **kwargs) -> dict[str, Any]:
        # The sandbox's machine is not this one; what the prompt's <system_information> asks for is kept generic.
        uname = platform.uname()._asdict()
        return {**self.config, **uname, **self.config["env"], **kwargs}

    def serialize(self) -> dict:
        return {"info": {"config": {"environment": self.config,
                                    "environment_type": f"{__name__}.{type(self).__name__}"}}}


def merged(base: dict, overrides: Mapping[str, Any]) -> dict:
    """`base` with `overrides` merged in, table by table (`[agent.harness_config.model]` over `model:`)."""
    out = dict(base)
    for key, value in overrides.items():
        out[key] = merged(out.get(key) or {}, value) if isinstance(value, Mapping) else value
    return out


def run(session: Session, *, agent: AgentConfig, rollout: RolloutConfig, exec_timeout_s: float) -> None:
    """One mini-swe-agent episode on the session's task (a sync harness: run in a thread)."""
    # Before the first import: no banner on stdout, no price look-up, no fetch of litellm's cost map.
    os.environ.setdefault("MSWEA_SILENT_STARTUP", "1")
    os.environ.setdefault("MSWEA_COST_TRACKING", "ignore_errors")
    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
    # One failed request is the session's to report (the endpoint records it), not ten with back-off.
    os.environ.setdefault("MSWEA_MODEL_RETRY_STOP_AFTER_ATTEMPT", "1")
    import yaml
    from minisweagent import package_dir
    from minisweagent.agents.default import DefaultAgent
    from minisweagent.models.litellm_model import LitellmModel
    from minisweagent.models.litellm_textbased_model import LitellmTextbasedModel

    textbased = agent.action_format == "fence"
    config = merged(yaml.safe_load((package_dir / "config" / ("mini_textbased.yaml" if textbased else "mini.yaml"))
                                   .read_text()), agent.harness_config)
    model_class = LitellmTextbasedModel if textbased else LitellmModel
    model_config = {k: v for k, v in (config.get("model") or {}).items() if k not in ("model_name", "model_kwargs")}
    model = model_class(model_name=f"openai/{session.model}", cost_tracking="ignore_errors", model_kwargs={
        "api_base": session.base_url, "api_key": session.api_key, "temperature": rollout.temperature,
        "top_p": rollout.top_p, "max_tokens": rollout.max_new_tokens}, **model_config)
    environment = SandboxEnvironment(session.sandbox, cwd=session.task.workdir, timeout=exec_timeout_s,
                                     env=(config.get("environment") or {}).get("env"))
    agent_config = {**config["agent"], "step_limit": rollout.max_turns, "cost_limit": 0.0, "output_path": None}
    agent_config.pop("mode", None)  # the interactive agent's setting; DefaultAgent takes none
    result = DefaultAgent(model, environment, **agent_config).run(session.task.instruction)
    session.log(f"mini-swe-agent ended: {result.get('exit_status')}")
