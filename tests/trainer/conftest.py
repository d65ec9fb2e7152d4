"""The megatron tests' shared torchrun world (tests/trainer/megatron_world.py), started once per session."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def megatron_world(tmp_path_factory):
    from tests.trainer.megatron_world import launch

    return launch(tmp_path_factory.mktemp("megatron-world"))
