"""The agent loop on arith tasks, in process: for warm-up checks, tuning and tests, not for training runs.

It follows the real loop's conversation exactly (`rl360cli.agent.conversation`: the instruction as the
one user message, the model's tokens kept as sampled, observations from `format_observation`
appended through `ConversationTokens`, a reply without a fenced block submits, at most
`max_turns` turns), but samples with the model directly (`rl360cli.demo.sampling`) and
stands in for the sandbox with `emulate_command`, which understands only
`echo '<expr>' > answer.py` — an honest stand-in for what the policy writes, never a shell.
The reward is `arith.check_answer`, the code tests/test.sh runs.

    results = run_tasks(model, tok, load_tasks(Path("recipes/tasks/arith-32")), num_samples=8, seed=0)
    print(sum(r.reward for r in results) / len(results))
"""

from __future__ import annotations

import re
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rl360cli.agent.conversation import ConversationTokens, format_observation, parse_action
from rl360cli.demo import arith
from rl360cli.demo.sampling import sample

_ECHO = re.compile(r"""^echo\s+(?:'([^'\n]*)'|"([^"\n]*)")\s*>\s*(\S+)$""")


@dataclass(frozen=True, kw_only=True, slots=True)
class ArithTask:
    name: str
    instruction: str
    cases: tuple[tuple[int, int], ...]


@dataclass(frozen=True, kw_only=True, slots=True)
class Attempt:
    task: str
    sample_index: int
    token_ids: list[int]
    loss_mask: list[int]
    logprobs: list[float]
    num_prompt_tokens: int
    num_turns: int
    answer: str | None
    reward: float


def load_tasks(tasks_dir: Path) -> list[ArithTask]:
    """The arith tasks of a folder (sorted by name), their cases read from task.toml's program."""
    tasks = []
    for folder in sorted(p for p in Path(tasks_dir).iterdir() if (p / "instruction.md").is_file()):
        meta = tomllib.loads((folder / "task.toml").read_text()).get("metadata", {})
        if "program" not in meta:
            raise ValueError(f"{folder}/task.toml has no [metadata] program; it is not an arith task")
        program = arith.parse_program(meta["program"])
        tasks.append(ArithTask(name=folder.name, instruction=(folder / "instruction.md").read_text(),
                               cases=tuple(arith.cases(program))))  # fmt: skip
    return tasks


def emulate_command(command: str) -> tuple[int, str, str | None]:
    """(exit code, output, text written to answer.py or None) of what bash would do with `command`."""
    m = _ECHO.match(command.strip())
    if m is None:
        return 127, "emulated shell: only echo '<expr>' > answer.py is understood", None
    text = m.group(1) if m.group(1) is not None else m.group(2)
    target = m.group(3)
    if target not in (arith.ANSWER_FILE, f"/app/{arith.ANSWER_FILE}", f"./{arith.ANSWER_FILE}"):
        return 0, "", None
    return 0, "", text + "\n"


def run_tasks(
    model: Any,
    tokenizer: Any,
    tasks: list[ArithTask],
    *,
    num_samples: int,
    seed: int = 0,
    temperature: float = 1.0,
    max_new_tokens: int = 48,
    max_turns: int = 4,
    version: int = 0,
    generator: Any = None,
) -> list[Attempt]:
    """`num_samples` attempts at every task (task-major order), all sampled together turn by turn."""
    import torch

    if generator is None:
        generator = torch.Generator().manual_seed(seed)
    eos = tokenizer.eos_token_id
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else eos
    jobs = [(task, k) for task in tasks for k in range(num_samples)]
    convs = [ConversationTokens(tokenizer, [{"role": "user", "content": task.instruction}]) for task, _ in jobs]
    answers: list[str | None] = [None] * len(jobs)
    turns = [0] * len(jobs)
    active = list(range(len(jobs)))
    for turn in range(max_turns):
        if not active:
            break
        outs = sample(model, [convs[i].token_ids for i in active], max_new_tokens=max_new_tokens,
                      eos_token_id=eos, temperature=temperature, pad_token_id=pad, generator=generator)  # fmt: skip
        still = []
        for i, out in zip(active, outs):
            convs[i].add_generated(out.token_ids, out.logprobs, version)
            turns[i] = turn + 1
            act = parse_action(tokenizer.decode(out.token_ids, skip_special_tokens=True))
            if act.kind == "submit":
                continue
            code, output, written = emulate_command(act.command)
            if written is not None:
                answers[i] = written
            if turn + 1 < max_turns:
                convs[i].add_observation(format_observation(code, output))
                still.append(i)
        active = still
    return [
        Attempt(task=task.name, sample_index=k, token_ids=conv.token_ids, loss_mask=conv.loss_mask,
                logprobs=conv.logprobs, num_prompt_tokens=conv.num_prompt_tokens, num_turns=turns[i],
                answer=answers[i],
                reward=float(answers[i] is not None and arith.check_answer(answers[i], task.cases)))
        for i, ((task, k), conv) in enumerate(zip(jobs, convs))
    ]  # fmt: skip


def pass_rate(attempts: list[Attempt]) -> float:
    return sum(a.reward for a in attempts) / max(len(attempts), 1)
