"""The spinning guard: a run whose steps have no trainable group for `[loop] max_steps_without_signal`
steps in a row stops, failed, with a reason that names the setting; a step with signal resets the count.
Steps that trained nothing because every sample passed are a solved pool: the run ends there, finished.

The loop runs in this process on the real torch trainer (tiny Llama) with the stand-ins of
tests/loop/loop_standins.py; steps in `flat_steps` give every sample of a group the same reward,
so dynamic filtering leaves nothing to train on.
"""

from __future__ import annotations

import dataclasses

import pytest

from rl360cli.configload import ConfigError, from_mapping
from rl360cli.run import driver
from rl360cli.loop.config import LoopConfig
from rl360cli.loop.ledger import StepLedger, read_ledger
from rl360cli.loop.train_loop import NoTrainableGroups, guard_against_spinning, train_loop
from rl360cli.state.schema import RunStatus
from rl360cli.state.store import StateFile
from tests.loop.loop_standins import loop_parts, make_tiny_model, tiny_trainer


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return make_tiny_model(tmp_path_factory.mktemp("tiny") / "model")


def test_three_empty_steps_in_a_row_stop_the_run(model_dir, tmp_path):
    trainer = tiny_trainer(model_dir)
    logged = []
    parts = loop_parts(tmp_path, trainer, steps=10, checkpoint_every=10, max_steps_without_signal=3,
                       flat_steps=frozenset({0, 1, 3, 4, 5, 6}))
    parts = dataclasses.replace(parts, log=lambda step, values: logged.append((step, values)))
    with pytest.raises(NoTrainableGroups, match=r"no trainable group in 3 steps in a row \(steps 3-5.*"
                                                r"raise \[loop\] max_steps_without_signal"):
        train_loop(parts, start_step=0)
    # Steps 0-1 were empty, step 2 trained (the count starts over), 3-5 were empty: it stopped after 5.
    ledger = read_ledger(tmp_path / "ledger.jsonl")
    assert [bool(e["groups"]) for e in ledger] == [False, False, True, False, False, False]
    assert trainer.version == 1
    assert [values["steps_without_signal"] for _, values in logged] == [1, 2, 0, 1, 2, 3]


def test_a_solved_pool_ends_the_run_finished_with_its_last_checkpoint(model_dir, tmp_path):
    trainer = tiny_trainer(model_dir)
    parts = loop_parts(tmp_path, trainer, steps=10, checkpoint_every=10, max_steps_without_signal=3,
                       flat_steps=frozenset(range(2, 10)), flat_reward=1.0)
    last = train_loop(parts, start_step=0)
    assert last["ended_early"] == "every sample of the last 3 steps passed (steps 2-4): the task pool is solved"
    assert [bool(e["groups"]) for e in read_ledger(tmp_path / "ledger.jsonl")] == [True, True, False, False, False]
    # What it learnt is kept: a checkpoint at the step it ended on, though checkpoint_every is 10.
    assert [p.name for p in (tmp_path / "checkpoints").iterdir()] == ["step_000005"] and trainer.version == 2


def test_steps_that_all_failed_are_no_solved_pool(model_dir, tmp_path):
    trainer = tiny_trainer(model_dir)
    parts = loop_parts(tmp_path, trainer, steps=10, checkpoint_every=10, max_steps_without_signal=3,
                       flat_steps=frozenset(range(10)), flat_reward=0.0)
    with pytest.raises(NoTrainableGroups, match=r"steps 0-2"):
        train_loop(parts, start_step=0)


def test_the_guard_off_lets_every_step_run(model_dir, tmp_path):
    trainer = tiny_trainer(model_dir)
    train_loop(loop_parts(tmp_path, trainer, steps=4, checkpoint_every=4, max_steps_without_signal=0,
                          flat_steps=frozenset(range(4))), start_step=0)
    assert len(read_ledger(tmp_path / "ledger.jsonl")) == 4 and trainer.version == 0


def test_the_run_record_says_why_it_stopped(tmp_path, monkeypatch):
    """driver.main records what train_loop raised; `run` (engines, Ray, the loop) is replaced by the
    guard's error here, the state file is real."""
    state = StateFile(tmp_path / "state.json")
    with state.update() as doc:
        doc["runs"]["r1"] = {"name": "r", "status": RunStatus.RUNNING, "step": 0}

    ledger = StepLedger(tmp_path / "ledger.jsonl")
    ledger.entries = [{"step": step, "groups": []} for step in range(99_995, 100_000)]

    def spinning(*args, **kwargs):  # what train_loop raises at step 99,999 of a long run
        guard_against_spinning(ledger, 5, step=99_999)

    monkeypatch.setattr(driver, "run", spinning)
    assert driver.main(["--state", str(state.path), "--run", "r1"]) == 3
    record = state.read()["runs"]["r1"]
    assert record["status"] == RunStatus.FAILED
    assert record["reason"].startswith("NoTrainableGroups: no trainable group in 5 steps in a row "
                                       "(steps 99995-99999")
    assert record["reason"].endswith("raise [loop] max_steps_without_signal (0: off) or max_generation_rounds")


def test_a_bad_limit_is_refused_at_load_time():
    assert LoopConfig().max_steps_without_signal == 5
    for value, problem in ((-1, "must be >= 0 (got -1); 0 turns the guard off"), ("5", "")):
        with pytest.raises(ConfigError, match="max_steps_without_signal") as error:
            from_mapping(LoopConfig, {"max_steps_without_signal": value}, where="recipe.toml", table="loop")
        assert problem in str(error.value) and "\n" not in str(error.value)
