"""Evaluation during training on held-out tasks (`[eval]`, rl360cli/loop/eval.py): the table is checked
at load time, local-smoke's held-out set is outside everything its policy v0 was built from, the figures
are unbiased pass@1/pass@k with infra failures left out of n, they land in a row of their own before the
first step (policy v0) and in the rows of the steps they follow, and no eval sample ever reaches the trainer.

The loop tests run `train_loop` in this process on the real torch trainer with the stand-in rollouts of
tests/loop/loop_standins.py; the CI-sized local-smoke (tests/loop/test_learning.py) evaluates for real
through `rl360 up` (engines behind the real router, Ray session actors, process sandboxes, gloo).
"""

from __future__ import annotations

import dataclasses
import importlib.util
import itertools
import json
import re
import shutil
import textwrap
import tomllib
from pathlib import Path

import numpy as np
import pytest

from rl360cli.config import load_recipe
from rl360cli.configload import ConfigError
from rl360cli.demo import arith, warmup
from rl360cli.loop.config import EvalConfig
from rl360cli.loop.eval import Evaluation, eval_metrics
from rl360cli.loop.ledger import read_ledger
from rl360cli.loop.train_loop import train_loop
from rl360cli.metrics import BEFORE_TRAINING_STEP
from rl360cli.outcome import InfraCause, Outcome
from rl360cli.rl.trajectory import Trajectory
from tests.conftest import REPO
from tests.loop.conftest import TASKS
from tests.loop.loop_standins import (
    TASK_IDS,
    StandInGeneration,
    SyntheticRolloutsStandIn,
    loop_parts,
    make_tiny_model,
    tiny_trainer,
)

HELDOUT = REPO / "recipes" / "tasks" / "arith-heldout"
POLICY_V0 = REPO / "recipes" / "models" / "local-smoke-v0"
EVAL_KEYS = {"eval/pass@1", "eval/pass@k", "eval/k", "eval/step", "eval/infra_failures",
             "eval/infra_failures_by_cause", "eval/num_tasks"}


# ----------------------------------------------------------------------------- the table, at load time


def recipe_with(tmp_path: Path, eval_table: str, *, tasks: Path = TASKS) -> Path:
    path = tmp_path / "recipe.toml"
    path.write_text(textwrap.dedent(f"""
        [run]
        name = "evaltest"
        [tasks]
        path = "{tasks}"
        [eval]
    """) + textwrap.dedent(eval_table))
    return path


def test_local_smoke_evaluates_its_held_out_set():
    recipe = load_recipe(REPO / "recipes" / "local-smoke.toml")
    assert recipe.eval.active and Path(recipe.eval.path) == HELDOUT
    evaluation = Evaluation.from_config(recipe.eval)
    assert len(evaluation.task_ids) == 16
    assert not set(evaluation.task_ids) & {p.name for p in TASKS.iterdir()}
    # Without an [eval] table there is no evaluation.
    assert Evaluation.from_config(EvalConfig()) is None


@pytest.mark.parametrize("table, message", [
    ('path = "{held}"\nk = 0', "k must be at least 1"),
    ('path = "{held}"\nk = 4\nnum_samples_per_task = 2', "num_samples_per_task must be at least k=4"),
    ('path = "{held}"\nevery = -1', "every must be >= 0"),
    ('path = "{held}"\nk = "4"', "k"),
    ('path = "{missing}"', "no such folder"),
    ('path = "{held}"\ninclude = ["arith-heldout-99"]', "include names no task folder"),
    ('path = "{train}"', "shares 32 task(s) with [tasks] path"),
])
def test_a_bad_table_is_one_line_naming_the_fix(tmp_path, table, message):
    path = recipe_with(tmp_path, table.format(held=HELDOUT, train=TASKS, missing=tmp_path / "nope"))
    with pytest.raises(ConfigError) as error:
        load_recipe(path)
    text = str(error.value)
    assert message in text and "\n" not in text


def test_a_copied_training_task_under_another_name_is_refused(tmp_path):
    """The same instruction under a new folder name is the same task: it names both sets and the pair."""
    held = tmp_path / "held"
    shutil.copytree(HELDOUT / "arith-heldout-00", held / "fresh-00")
    shutil.copytree(TASKS / "arith-05", held / "renamed")
    with pytest.raises(ConfigError) as error:
        load_recipe(recipe_with(tmp_path, f'path = "{held}"'))
    text = str(error.value)
    assert f"[eval] path {held} shares 1 task(s) with [tasks] path {TASKS}: renamed (= arith-05)" in text
    # Turned off, or with the copy left out, the same table loads.
    assert not load_recipe(recipe_with(tmp_path, f'path = "{held}"\nenabled = false')).eval.active
    assert load_recipe(recipe_with(tmp_path, f'path = "{held}"\ninclude = ["fresh-00"]')).eval.active


def test_due_after_every_nth_step_and_after_the_last():
    def due(every, num_steps):
        config = EvalConfig(path="x", every=every)
        return [s for s in range(num_steps) if config.due(s, num_steps)]

    assert due(10, 30) == [9, 19, 29]
    assert due(4, 10) == [3, 7, 9]
    assert due(0, 5) == [4]
    assert not EvalConfig(path="x", enabled=False).due(4, 5) and not EvalConfig().due(4, 5)
    # Before the first step too, by default, but only for a run that starts there (a resumed one has its row).
    assert EvalConfig(path="x").due_at_start(0) and not EvalConfig(path="x").due_at_start(3)
    assert not EvalConfig(path="x", at_start=False).due_at_start(0)
    assert not EvalConfig(path="x", enabled=False).due_at_start(0) and not EvalConfig().due_at_start(0)
    assert load_recipe(REPO / "recipes" / "local-smoke.toml").eval.at_start


def test_the_held_out_set_is_what_the_generator_writes():
    spec = importlib.util.spec_from_file_location("generate_arith", REPO / "recipes" / "tasks" / "generate_arith.py")
    generator = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(generator)
    files = generator.heldout_files()
    assert {str(p.relative_to(HELDOUT)) for p in HELDOUT.rglob("*") if p.is_file()} == set(files)
    assert all((HELDOUT / rel).read_text() == text for rel, text in files.items())
    # None of the 16 is one of the 32 as a function on the verifier's inputs.
    outputs = {tuple(y for _, y in arith.cases(p)) for p in generator.programs()}
    assert not outputs & {tuple(y for _, y in arith.cases(p)) for p in generator.heldout_programs()}


def test_no_held_out_task_is_a_training_task_or_in_what_policy_v0_was_built_from():
    """local-smoke's held-out set, read from its folder, against policy v0's warm-up stream reproduced here
    from built.json (the first warmup_steps x warmup_batch_size programs of `warmup.example_programs`, the
    stream `warmup.examples` trains on, from the build's seed, the training tasks skipped) and its
    tokenizer's corpus: no held-out canonical answer, described program or function is in either, and no
    held-out task is one of the 32 (instruction or function)."""
    built = json.loads((POLICY_V0 / "built.json").read_text())
    model, seed = built["model"], built["seed"]
    assert model["warmup_seed"] in (None, seed)
    assert REPO / "recipes" / built["tasks"]["path"] == TASKS
    training = {p.parent.name: p.read_text() for p in sorted(TASKS.glob("*/instruction.md"))}
    num_examples = model["warmup_steps"] * model["warmup_batch_size"]
    stream = [program for program, _ in itertools.islice(warmup.example_programs(seed, training.values()), num_examples)]
    corpus = list(warmup.corpus_programs(seed))
    assert len(stream) == num_examples == 140 * 32 and len(corpus) == warmup.CORPUS_PROGRAMS

    def outputs(program):
        return tuple(y for _, y in arith.cases(program))

    def program_of(folder: Path):
        return arith.parse_program(tomllib.loads((folder / "task.toml").read_text())["metadata"]["program"])

    seen_answers = {arith.expression(p) for p in stream + corpus}
    seen_descriptions = {arith.describe(p) for p in stream + corpus}
    seen_functions = {outputs(p) for p in stream + corpus}
    training_functions = {outputs(program_of(TASKS / name)) for name in training}
    held = sorted(p for p in HELDOUT.iterdir() if (p / "task.toml").is_file())
    assert len(held) == 16
    for folder in held:
        answer = re.fullmatch(r"echo '(.+)' > answer\.py", (folder / "solution" / "solve.sh").read_text().splitlines()[-1])
        instruction = (folder / "instruction.md").read_text()
        description = instruction.removeprefix(arith.TASK_PREFIX).split(".\n", 1)[0]
        program = program_of(folder)
        assert answer and answer.group(1) == arith.expression(program) and instruction == arith.instruction(program)
        assert answer.group(1) not in seen_answers, folder.name
        assert description not in seen_descriptions, folder.name
        assert outputs(program) not in seen_functions, folder.name  # not even under another name
        assert instruction not in training.values() and outputs(program) not in training_functions, folder.name
    # The reproduction is what the build read: its tokenizer, retrained from this corpus and the training
    # instructions, is the committed one, and `examples` is the stream's conversations.
    from transformers import AutoTokenizer

    from rl360cli.demo import tokenizer as tiny_tokenizer

    committed = AutoTokenizer.from_pretrained(POLICY_V0)
    retrained = tiny_tokenizer.train_tokenizer([*warmup.synthetic_corpus(seed), *training.values()],
                                               vocab_size=model["vocab_size"])
    assert retrained.get_vocab() == committed.get_vocab()
    first = list(itertools.islice(warmup.examples(committed, seed, training.values()), 64))
    assert first == [warmup.conversation(committed, text, arith.expression(program))
                     for program, text in itertools.islice(warmup.example_programs(seed, training.values()), 64)]


# ----------------------------------------------------------------------------- the figures


def sample(task_id: str, reward: float | None, *, cause: InfraCause | None = None, tags: tuple = ()) -> Trajectory:
    return Trajectory(task_id=task_id, group_id=f"eval0-{task_id}", sample_index=0,
                      token_ids=np.array([1, 2, 3], np.int32), loss_mask=np.array([0, 1, 1], np.uint8),
                      logprobs=np.array([0, -1, -1], np.float32), versions=(0,), num_prompt_tokens=1,
                      reward=reward, outcome=Outcome.INFRA_FAILURE if cause else Outcome.OK, cause=cause,
                      metadata={"tags": list(tags)} if tags else {})


def test_infra_failures_leave_n_and_are_counted_by_cause():
    timeout = InfraCause.SANDBOX_START
    trajectories = ([sample("a", 1.0), sample("a", 0.0), sample("a", 0.0), sample("a", 1.0)]
                    + [sample("b", 1.0), sample("b", None, cause=timeout), sample("b", None, cause=timeout),
                       sample("b", 0.0)]
                    + [sample("c", None, cause=timeout)] * 4)
    figures = eval_metrics(trajectories, k=4, step=7, policy_version=8)
    # a: n=4, c=2 -> pass@1 0.5, pass@4 1. b: n=2, c=1 -> pass@1 0.5, too few for pass@4. c: no verdict.
    assert figures["eval/pass@1"] == pytest.approx(0.5)
    assert figures["eval/pass@k"] == pytest.approx(1.0)
    assert figures["eval/tasks_short_of_k"] == 2 and figures["eval/num_tasks"] == 3
    assert figures["eval/infra_failures"] == 6
    assert figures["eval/infra_failures_by_cause"] == {timeout.value: 6}
    assert (figures["eval/step"], figures["eval/policy_version"], figures["eval/k"]) == (7, 8, 4)
    # A pass is a reward of at least [grpo] pass_threshold, as the training pass rate counts it.
    partial = [sample("d", 0.5), sample("d", 0.2)]
    assert eval_metrics(partial, k=1, step=0, policy_version=0)["eval/pass@1"] == 0.0
    assert eval_metrics(partial, k=1, step=0, policy_version=0, pass_threshold=0.5)["eval/pass@1"] == 0.5


def test_pass_at_1_per_tag_is_over_that_tags_tasks():
    hint, bare = ("copy-file", "hint-call"), ("copy-file",)
    trajectories = ([sample("shown", 1.0, tags=hint), sample("shown", 1.0, tags=hint)]
                    + [sample("unshown", 0.0, tags=bare), sample("unshown", 1.0, tags=bare)]
                    + [sample("failed", None, cause=InfraCause.SANDBOX_START, tags=bare)] * 2)
    figures = eval_metrics(trajectories, k=1, step=0, policy_version=1)
    # hint-call: "shown" alone (1.0); copy-file: "shown" and "unshown" (1.0 and 0.5); "failed" has no verdict.
    assert figures["eval/pass@1/domain/hint-call"] == pytest.approx(1.0)
    assert figures["eval/pass@1/domain/copy-file"] == pytest.approx(0.75)
    assert figures["eval/pass@1"] == pytest.approx(0.75)
    assert not any("/domain/" in key for key in eval_metrics([sample("a", 1.0)], k=1, step=0, policy_version=0))


# ----------------------------------------------------------------------------- in the loop (stand-ins)

EVAL_IDS = [f"held{i:02d}" for i in range(5)]


class EvalRolloutsStandIn(SyntheticRolloutsStandIn):
    """The loop's stand-in rollouts (tests/loop/loop_standins.py) plus the eval path of `Rollouts`:
    each held-out group's samples are synthetic (sample i passes when i < its task's index), tagged
    with the trainer's version when submitted. It runs no engines, sandboxes or Ray."""

    def __init__(self, trainer):
        super().__init__(trainer)
        self.eval_versions: list[int] = []
        self.eval_steps: list[int] = []

    def submit_eval(self, step: int, task_ids: list[str], num_samples: int) -> StandInGeneration:
        self.eval_versions.append(self.trainer.version)
        self.eval_steps.append(step)
        generation = StandInGeneration(step=step)
        for index, task_id in enumerate(task_ids):
            for i in range(num_samples):
                t = self._sample(task_id, f"eval{step}-{task_id}", i, flat=False)
                generation.trajectories.append(dataclasses.replace(t, reward=float(i < index)))
        return generation

    def collect_eval(self, generation: StandInGeneration) -> list[Trajectory]:
        return generation.trajectories


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return make_tiny_model(tmp_path_factory.mktemp("tiny") / "model")


def test_the_loop_evaluates_at_the_right_steps_and_trains_on_none_of_it(model_dir, tmp_path):
    trainer = tiny_trainer(model_dir)
    rows = {}
    parts = loop_parts(tmp_path, trainer, steps=5, checkpoint_every=5)
    rollouts = EvalRolloutsStandIn(trainer)
    parts = dataclasses.replace(parts, rollouts=rollouts, log=lambda step, values: rows.update({step: values}),
                                evaluation=Evaluation(EvalConfig(path="held", every=2, k=2), tuple(EVAL_IDS)))
    last = train_loop(parts, start_step=0)
    assert [s for s, row in rows.items() if EVAL_KEYS <= row.keys()] == [BEFORE_TRAINING_STEP, 1, 3, 4]
    assert not any(key.startswith("eval/") for s in (0, 2) for key in rows[s])
    assert last["eval/step"] == 4
    # Policy v0 first, in a row of its own (no step's figures), then the policy of the step each follows,
    # the version its row reports.
    before = rows[BEFORE_TRAINING_STEP]
    assert before["eval/step"] == -1 and before["eval/policy_version"] == 0 and "reward_mean" not in before
    assert next(iter(rows)) == BEFORE_TRAINING_STEP and rollouts.eval_steps[0] == BEFORE_TRAINING_STEP
    assert rollouts.eval_versions == [0] + [rows[s]["policy_version"] for s in (1, 3, 4)] == [0, 2, 4, 5]
    # 4 samples per task, task i passes i of them: pass@1 = mean(i/4), pass@2 = mean(1 - C(4-i,2)/C(4,2)).
    assert rows[1]["eval/pass@1"] == pytest.approx(sum(min(i, 4) / 4 for i in range(5)) / 5)
    assert rows[1]["eval/pass@k"] == pytest.approx((0 + 0.5 + 5 / 6 + 1 + 1) / 5)
    ledger = read_ledger(tmp_path / "ledger.jsonl")
    assert len(ledger) == 5 and all(e["tasks"] for e in ledger)
    for entry in ledger:
        assert set(entry["tasks"]) <= set(TASK_IDS)
        assert not [g for g in entry["groups"] + entry["generated"] if g.startswith("eval")]


def test_with_at_start_off_policy_v0_is_not_evaluated(model_dir, tmp_path):
    trainer = tiny_trainer(model_dir)
    rows = {}
    parts = loop_parts(tmp_path, trainer, steps=2, checkpoint_every=2)
    rollouts = EvalRolloutsStandIn(trainer)
    parts = dataclasses.replace(parts, rollouts=rollouts, log=lambda step, values: rows.update({step: values}),
                                evaluation=Evaluation(EvalConfig(path="held", k=2, at_start=False), tuple(EVAL_IDS)))
    train_loop(parts, start_step=0)
    assert list(rows) == [0, 1] and rollouts.eval_steps == [1]


def test_without_overlap_the_next_step_is_generated_after_the_evaluation(model_dir, tmp_path):
    """The held-out evaluation has the engines alone, so the next step's time is its own (a step after an
    evaluation once reported its generation beside the evaluation: 226,262 tokens/s)."""
    trainer = tiny_trainer(model_dir)
    events = []

    class Recording(EvalRolloutsStandIn):
        def submit(self, step, **kwargs):
            events.append(("generate", step))
            return super().submit(step, **kwargs)

        def submit_eval(self, step, task_ids, num_samples):
            events.append(("evaluate", step))
            return super().submit_eval(step, task_ids, num_samples)

    parts = loop_parts(tmp_path, trainer, steps=3, checkpoint_every=3)
    parts = dataclasses.replace(parts, rollouts=Recording(trainer), loop=dataclasses.replace(parts.loop, overlap=False),
                                evaluation=Evaluation(EvalConfig(path="held", every=1, k=2, at_start=False),
                                                      tuple(EVAL_IDS)))
    train_loop(parts, start_step=0)
    assert events == [("generate", 0), ("evaluate", 0), ("generate", 1), ("evaluate", 1), ("generate", 2),
                      ("evaluate", 2)]
