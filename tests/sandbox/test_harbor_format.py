"""Harbor's task format beyond one agent and one verifier: every Linux example of Harbor's loads;
multi-step tasks run their steps in order in one sandbox with their own budgets and Harbor's reward
rule; a separate verifier runs in a second sandbox that gets only the artifacts; GPU and MCP tasks
are refused at placement where no node holds them; the rollout session makes a multi-step task one trajectory.

Real parts: the process provider (bubblewrap), Harbor's own task.toml files, the shipped example
tasks, the session's real tokenizer path (a byte-level tokenizer and a ChatML template). Stand-in:
`ScriptedStepsEngineStandIn`, for an engine that replies from a fixed script.
"""

from __future__ import annotations

import shutil
import tomllib
from dataclasses import replace
from pathlib import Path

import pytest

from rl360cli.agent.config import AgentConfig, RolloutConfig
from rl360cli.agent.session import SessionSpec
from rl360cli.inference.client import GenerateResult
from rl360cli.outcome import InfraCause, Outcome
from rl360cli.sandbox.attempt import noop_agent, oracle_agent, run_attempt
from rl360cli.sandbox.check import check_tasks
from rl360cli.sandbox.provider import NodeCapacity
from rl360cli.sandbox.steps import below_min_reward, placement_problem, task_rewards
from rl360cli.sandbox.task_loader import TaskError, load_task
from rl360cli.sandbox.waves import AdmissionController
from tests.conftest import need
from tests.agent.sessions import builtin_session
from tests.agent.test_conversation import CHATML, byte_tokenizer
from tests.sandbox.conftest import EXAMPLES, run, write_task
from tests.sandbox.test_task import HARBOR, HARBOR_VERDICTS

MULTI = EXAMPLES / "multi-step-notes"
SEPARATE = EXAMPLES / "separate-verifier"


def complete(folder: Path) -> Path:
    """Harbor's fixtures hold only task.toml and instruction.md: give each the rest of a task folder."""
    (folder / "tests").mkdir(exist_ok=True)
    (folder / "tests" / "test.sh").write_text("echo 1 > /logs/verifier/reward.txt\n")
    (folder / "environment").mkdir(exist_ok=True)
    (folder / "environment" / "Dockerfile").write_text("FROM 127.0.0.1:5000/rl360/busybox:latest\n")
    for step in tomllib.loads((folder / "task.toml").read_text()).get("steps", []):
        (folder / "steps" / step["name"]).mkdir(parents=True, exist_ok=True)
        (folder / "steps" / step["name"] / "instruction.md").write_text(f"Do {step['name']}.\n")
    return folder


@pytest.fixture
def harbor_tasks(tmp_path):
    need(HARBOR.is_dir(), f"Harbor's example tasks are not at {HARBOR}")
    out = {}
    for source in sorted(p for p in HARBOR.iterdir() if p.is_dir()):
        folder = complete(Path(shutil.copytree(source, tmp_path / source.name)))
        try:
            out[source.name] = load_task(folder)
        except TaskError as e:
            out[source.name] = e
    return out


# ----------------------------------------------------------------------------- loading


def test_every_linux_harbor_example_loads_and_only_windows_is_refused(harbor_tasks):
    assert sorted(harbor_tasks) == sorted(HARBOR_VERDICTS)
    refused = {name: str(e) for name, e in harbor_tasks.items() if isinstance(e, TaskError)}
    assert sorted(refused) == ["hello-multi-step-bat", "hello-world-bat"]
    assert all("Windows tasks need a Windows node" in m and "\n" not in m for m in refused.values())


def test_harbor_multi_step_fields_are_read_as_harbor_defines_them(harbor_tasks):
    advanced = harbor_tasks["hello-multi-step-advanced"]
    assert [s.name for s in advanced.steps] == ["scaffold", "implement", "document"]
    assert advanced.reward_strategy == "mean" and advanced.instruction == "Do scaffold.\n"
    scaffold, implement, document = advanced.steps
    assert [s.agent_timeout_s for s in advanced.steps] == [60.0, 90.0, 60.0]
    assert [s.min_reward for s in advanced.steps] == [1.0, 0.5, None]
    assert implement.verifier_env == {"EXPECTED_NAME": "Harbor", "EXPECTED_GREETING": "Hello, Harbor!"}
    assert implement.healthcheck is not None and implement.healthcheck.command == "test -x /app/greet.sh"
    # Step artifacts are appended to the task's.
    assert [a.source for a in document.artifacts] == ["/app/greet.sh", "/app/README.md"]
    assert [a.source for a in scaffold.artifacts] == ["/app/greet.sh"]
    simple = harbor_tasks["hello-multi-step-simple"]
    assert [(s.agent_timeout_s, s.verifier_timeout_s) for s in simple.steps] == [(30.0, 30.0), (30.0, 30.0)]


def test_harbor_separate_verifier_environments_resolve_as_harbor_does(harbor_tasks):
    single = harbor_tasks["separate-verifier-environment"]
    assert single.verifier_task is not None and not single.steps
    assert [a.source for a in single.artifacts] == ["/tmp/configured-artifact.txt"]
    assert (single.verifier_task.memory_mb, single.verifier_task.network) == (2048, False)
    # No tests/Dockerfile in the fixture: rl360 falls back to the agent's image and uploads the tests.
    assert single.verifier_uploads_tests and single.verifier_task.docker_image == single.docker_image == "ubuntu:24.04"
    mixed = harbor_tasks["separate-verifier-multi-step"]
    shared, separate = mixed.steps
    assert shared.verifier_task is None  # environment_mode = "shared" on the step
    assert separate.verifier_task is not None and separate.verifier_task.workdir == "/workspace"
    assert [a.source for a in separate.artifacts] == ["/tmp/task-configured.txt", "/tmp/step-two-configured.txt"]


def test_gpu_and_mcp_tasks_load_and_are_refused_only_at_placement(harbor_tasks):
    cuda, mcp = harbor_tasks["hello-cuda"], harbor_tasks["hello-mcp"]
    assert (cuda.gpus, cuda.gpu_types) == (1, ("A100", "H100"))
    assert [s.name for s in mcp.mcp_servers] == ["mcp-server"] and mcp.mcp_servers[0].transport == "streamable-http"
    cpu_only = [NodeCapacity(name="n1", cpus=8, memory_mb=8192)]
    problem = placement_problem(cuda, cpu_only, "docker")
    assert problem is not None and "1 GPU(s) (A100 or H100)" in problem and "\n" not in problem
    assert placement_problem(cuda, [NodeCapacity(name="g", cpus=8, memory_mb=8192, gpus=2)]) is None
    assert "needs sidecar services" not in (placement_problem(mcp, cpu_only) or "")  # it declares none itself
    assert "no sidecar named 'mcp-server'" in placement_problem(mcp, cpu_only, sidecars=True)
    assert placement_problem(harbor_tasks["hello-world"], cpu_only) is None


@pytest.mark.parametrize("toml, files, problem", [
    ("[[steps]]\nname = 'a'\n[[steps]]\nname = 'a'\n", {"steps/a/instruction.md": "x"}, "declared twice"),
    ("[[steps]]\nname = '../up'\n", {}, "needs a name of letters"),
    ("[[steps]]\nname = 'a'\nmin_reward = 'high'\n", {"steps/a/instruction.md": "x"}, "min_reward must be a number"),
    ('multi_step_reward_strategy = "max"\n', {}, 'must be "mean" or "final"'),
    ('artifacts = ["/app/../etc/shadow"]\n', {}, "must not contain '..'"),  # a relative path is below /
    ('[verifier]\nenvironment_mode = "shared"\n[verifier.environment]\ncpus = 1\n', {}, "cannot have a"),
    ('[verifier]\nenvironment_mode = "elsewhere"\n', {}, 'must be "shared" or "separate"'),
    ("[environment]\ngpus = 1.5\n", {}, "gpus must be a non-negative integer"),
])
def test_bad_harbor_format_is_refused_in_one_line(tmp_path, toml, files, problem):
    folder = write_task(tmp_path, "bad", toml=toml, files=files)
    with pytest.raises(TaskError) as caught:
        load_task(folder)
    assert "task bad" in str(caught.value) and problem in str(caught.value) and "\n" not in str(caught.value)


def test_a_step_needs_a_test_sh_of_its_own_or_the_tasks(tmp_path):
    folder = write_task(tmp_path, "t", toml="[[steps]]\nname = 'a'\n", files={"steps/a/instruction.md": "x"})
    (folder / "tests" / "test.sh").unlink()
    with pytest.raises(TaskError, match=r"\[\[steps\]\] 'a' has no test.sh"):
        load_task(folder)


# ----------------------------------------------------------------------------- the reward rule


def test_harbors_reward_rule_for_steps():
    # "mean": per key over the verified steps, a missing key counting 0; "final": the last verbatim.
    assert task_rewards("mean", [{"reward": 1.0, "style": 1.0}, {"reward": 0.5}]) == {"reward": 0.75, "style": 0.5}
    assert task_rewards("final", [{"reward": 1.0}, {"reward": 0.5, "x": 2.0}]) == {"reward": 0.5, "x": 2.0}
    assert task_rewards("mean", []) == {}
    task = load_task(MULTI)
    create = task.steps[0]
    assert below_min_reward(create, {"reward": 0.9}, 0.9) and not below_min_reward(create, {"reward": 1.0}, 1.0)
    per_key = replace(create, min_reward={"tests": 0.5})
    assert below_min_reward(per_key, {"reward": 1.0}, 1.0)  # a missing key is 0
    assert not below_min_reward(per_key, {"tests": 0.5}, 0.5)
    assert not below_min_reward(task.steps[1], {"reward": 0.0}, 0.0)


# ----------------------------------------------------------------------------- running (process provider)


def test_steps_run_in_order_in_one_sandbox_with_their_own_budgets(process_provider, tmp_path):
    provider = process_provider()
    task = load_task(MULTI)
    seen = {}

    async def agent(sandbox, step):
        if step.name == "create":
            await sandbox.exec("echo notes > /app/notes.txt", timeout_s=10)
        else:
            await sandbox.exec("sleep 30", timeout_s=60)  # past this step's budget, cut there

    short = replace(task, steps=(task.steps[0], replace(task.steps[1], agent_timeout_s=1.0)))
    result = run(run_attempt(provider, short, agent, attempt_id="steps-1"))
    assert [s["name"] for s in result.steps] == ["create", "greet"]
    assert [s["reward"] for s in result.steps] == [1.0, 0.5]  # greet kept step 1's line, wrote no greeting
    assert result.reward == 0.75 and result.rewards == {"reward": 0.75}  # Harbor's mean
    assert "agent_budget" in result.events and result.outcome == Outcome.MODEL_FAILURE

    async def looking(sandbox, step):
        # The previous step's tests and grading files are gone before the next agent starts.
        seen[step.name] = (await sandbox.exec("ls -A /tests /logs/verifier; cat /app/name.txt", timeout_s=10)).output
        if step.name == "create":
            await sandbox.exec("echo notes > /app/notes.txt", timeout_s=10)

    final = run(run_attempt(provider, replace(task, reward_strategy="final"), looking, attempt_id="steps-2"))
    assert final.reward == 0.5 and final.outcome == Outcome.OK  # Harbor's "final": the last step's reward
    # steps/greet/workdir/ arrived for step 2 only; /tests was empty for both agents.
    assert "Harbor" not in seen["create"] and seen["greet"].split()[-1] == "Harbor"
    assert "test.sh" not in seen["greet"] and "reward" not in seen["greet"]


def test_a_step_below_its_min_reward_ends_the_task(process_provider):
    provider = process_provider()
    task = load_task(MULTI)
    noop = run(run_attempt(provider, task, noop_agent, attempt_id="noop"))
    assert [s["name"] for s in noop.steps] == ["create"] and noop.steps[0]["stopped_task"]
    assert noop.reward == 0.0 and noop.outcome == Outcome.OK
    oracle = run(run_attempt(provider, task, oracle_agent(task), attempt_id="oracle"))
    assert oracle.reward == 1.0 and [s["reward"] for s in oracle.steps] == [1.0, 1.0]


def test_a_separate_verifier_gets_only_the_artifacts(process_provider, tmp_path):
    provider = process_provider()
    task = load_task(SEPARATE)  # its verifier image (tests/Dockerfile) holds the tests and the answer
    assert not task.verifier_uploads_tests
    oracle = run(run_attempt(provider, task, oracle_agent(task), attempt_id="sep-oracle"))
    assert oracle.outcome == Outcome.OK and oracle.reward == 1.0, oracle.detail
    assert {"verifier_start", "verifier_stop"} <= set(oracle.timings)
    assert run(run_attempt(provider, task, noop_agent, attempt_id="sep-noop")).reward == 0.0

    # Without tests/Dockerfile the verifier runs on the agent's image and is handed the tests.
    folder = write_task(tmp_path, "handed", toml='''
        artifacts = ["/app/out.txt"]
        [verifier]
        environment_mode = "separate"
        ''', test_sh='''
        # 1 only when the artifact arrived and nothing else of the agent's sandbox did.
        if [ -f /app/out.txt ] && [ ! -e /app/secret.txt ] && [ -f /logs/artifacts/log.txt ]; then
            echo 1 > /logs/verifier/reward.txt
        else
            echo 0 > /logs/verifier/reward.txt
        fi
        ''')
    handed = load_task(folder)
    assert handed.verifier_uploads_tests

    async def agent(sandbox):
        await sandbox.exec("echo out > /app/out.txt; echo s > /app/secret.txt; mkdir -p /logs/artifacts; "
                           "echo l > /logs/artifacts/log.txt", timeout_s=10)

    result = run(run_attempt(provider, handed, agent, attempt_id="handed"))
    assert result.reward == 1.0, result.verifier_output
    # The same task verified in the agent's own sandbox sees the secret: the sandboxes are two.
    shared = run(run_attempt(provider, replace(handed, verifier_task=None), agent, attempt_id="shared"))
    assert shared.reward == 0.0


@pytest.mark.timeout(60)  # a verifier queued behind its own attempt's slot would wait for ever
def test_shared_and_separate_verifier_steps_mix_in_one_task(process_provider, process_config, tmp_path):
    folder = write_task(tmp_path, "mixed", toml='''
        [[steps]]
        name = "one"
        [[steps]]
        name = "two"
        artifacts = ["/app/two.txt"]
        [steps.verifier]
        environment_mode = "separate"
        ''', files={"steps/one/instruction.md": "one", "steps/two/instruction.md": "two",
                    "steps/one/tests/test.sh": "[ -f /app/one.txt ] && echo 1 > /logs/verifier/reward.txt || "
                                               "echo 0 > /logs/verifier/reward.txt\n",
                    "steps/two/tests/test.sh": "[ -f /app/two.txt ] && [ ! -e /app/one.txt ] && "
                                               "echo 1 > /logs/verifier/reward.txt || "
                                               "echo 0 > /logs/verifier/reward.txt\n"})
    task = load_task(folder)
    assert task.steps[0].verifier_task is None and task.steps[1].verifier_task is not None

    async def agent(sandbox, step):
        await sandbox.exec(f"echo x > /app/{step.name}.txt", timeout_s=10)

    # Through an admission controller with one slot: the step's verifier starts within the attempt's.
    controller = AdmissionController(process_provider(), config=process_config(max_concurrent=1))
    result = run(controller.run_attempt(task, agent, attempt_id="mixed"))
    # Step two's verifier saw its artifact but not step one's file: it ran in its own sandbox.
    assert [s["reward"] for s in result.steps] == [1.0, 1.0] and result.reward == 1.0
    assert {"verifier_start", "verifier_stop"} <= set(result.timings)


def test_a_gpu_task_is_refused_at_placement_with_its_reason(process_provider, tmp_path):
    task = load_task(write_task(tmp_path, "cuda", toml="[environment]\ngpus = 1\n", solve_sh="true\n"))
    provider = process_provider()
    result = run(run_attempt(provider, task, noop_agent, attempt_id="gpu"))
    assert result.outcome == Outcome.INFRA_FAILURE and result.cause == InfraCause.SANDBOX_START
    assert "needs 1 GPU(s)" in result.detail and "process provider" in result.detail
    assert "start" not in result.timings  # nothing was started
    [row] = run(check_tasks(provider, [task], run_id="gpu-check"))
    assert not row.passed and any("needs 1 GPU(s)" in p for p in row.problems)


# ----------------------------------------------------------------------------- the rollout session


class ScriptedStepsEngineStandIn:
    """Stands in for the engine: replies from a fixed script, one reply per request, with made-up
    logprobs; records each prompt. Like SGLang, it stops at the end-of-turn token, which ends its output
    ids and is left out of its text. No model, no HTTP, no sampling."""

    def __init__(self, tokenizer, replies: list[str]):
        self.tokenizer = tokenizer
        self.replies = list(replies)
        self.prompts: list[str] = []

    async def generate(self, input_ids, sampling_params=None, *, timeout_s=None, **_):
        self.prompts.append(self.tokenizer.decode(input_ids))
        reply = self.replies.pop(0)
        end = self.tokenizer.convert_tokens_to_ids("<|im_end|>")
        ids = self.tokenizer.encode(reply, add_special_tokens=False) + [end]
        return GenerateResult(output_ids=ids, logprobs=[-0.5] * len(ids), finish_reason="stop", weight_version=1,
                              text=reply, prompt_tokens=len(input_ids))


def test_a_multi_step_task_is_one_trajectory_with_each_instruction_a_user_turn(process_provider):
    task = load_task(MULTI)
    tokenizer = byte_tokenizer(CHATML)
    engine = ScriptedStepsEngineStandIn(tokenizer, [
        "```bash\necho notes > /app/notes.txt\n```", "Done.",
        '```bash\necho "Hello, $(cat /app/name.txt)!" >> /app/notes.txt\n```', "Done.",
    ])
    spec = SessionSpec(task_id=task.id, group_id="g", sample_index=0, attempt_id="session-steps")
    rollout, agent = RolloutConfig(max_turns=4, max_new_tokens=128), AgentConfig(done_words=("done.",))
    session = builtin_session(spec, task, tokenizer=tokenizer, client=engine, provider=process_provider(),
                              rollout=rollout, agent=agent, exec_timeout_s=10)
    [trajectory] = run(session)
    assert trajectory.outcome == Outcome.OK and trajectory.reward == 1.0
    assert [s["name"] for s in trajectory.metadata["steps"]] == ["create", "greet"]
    assert [t["step"] for t in trajectory.metadata["turns"]] == ["create", "create", "greet", "greet"]
    text = tokenizer.decode(trajectory.token_ids)
    second = f"<|im_start|>user\n{task.steps[1].instruction}<|im_end|>\n<|im_start|>assistant\n"
    # Step 2's instruction follows step 1's last reply as a user turn, and only once step 1 was done.
    assert f"Done.<|im_end|>\n{second}" in text
    assert task.steps[1].instruction not in engine.prompts[1] and second in engine.prompts[2]
    # The user turn is the environment's, not the policy's: loss mask 0 over it.
    ids = tokenizer.encode(second, add_special_tokens=False)
    at = next(i for i in range(len(trajectory.token_ids)) if list(trajectory.token_ids[i:i + len(ids)]) == ids)
    assert set(trajectory.loss_mask[at:at + len(ids)].tolist()) == {0}
    assert 1 in set(trajectory.loss_mask[at + len(ids):].tolist())  # the policy's step-2 replies are trained


def test_a_link_out_of_the_task_in_a_steps_folder_is_refused(tmp_path):
    folder = write_task(tmp_path, "t", toml="[[steps]]\nname = 'a'\n", files={"steps/a/instruction.md": "x"})
    (folder / "steps" / "a" / "tests").mkdir()
    (folder / "steps" / "a" / "tests" / "key").symlink_to("/etc/hostname")
    with pytest.raises(TaskError, match=r"steps/a/tests/key is a symbolic link"):
        load_task(folder)
