"""Every backend implements the whole `Backend` protocol (rl360cli/backends/base.py), so the stages call its
methods directly instead of asking `getattr` whether one is there: `heal` (stages/status.py), `python_note` and
`placement_plan` (stages/provision.py) included, the local backend saying what it does (nothing to heal, no
placement rows).

    python -m pytest tests/cli/test_backend_protocol.py
"""

from __future__ import annotations

import inspect

import pytest

from rl360cli.backends.base import Backend
from rl360cli.backends.local import LocalBackend
from rl360cli.backends.slurm import SlurmBackend
from rl360cli.config import load_profile, load_recipe
from rl360cli.stages import provision, status
from rl360cli.stages.base import Context
from rl360cli.state.store import StateFile
from tests.conftest import REPO

LOCAL = REPO / "cluster" / "local.toml"
SMOKE = REPO / "recipes" / "local-smoke.toml"


def protocol_members() -> dict[str, object]:
    """The protocol's methods and properties by name (its own, not `Protocol`'s)."""
    return {name: value for name, value in vars(Backend).items()
            if not name.startswith("_") and (inspect.isfunction(value) or isinstance(value, property))}


def test_the_protocol_names_every_method_the_stages_call():
    assert {"heal", "placement_plan", "launch", "observe", "stop", "python", "provision_plan", "python_note",
            "provision", "tiers_alive", "release"} <= set(protocol_members())


@pytest.mark.parametrize("backend", [LocalBackend, SlurmBackend])
def test_each_backend_implements_every_method_of_the_protocol_with_its_parameters(backend):
    for name, member in protocol_members().items():
        implemented = inspect.getattr_static(backend, name, None)
        assert implemented is not None, f"{backend.__name__} lacks {name}"
        if isinstance(member, property):
            assert isinstance(implemented, property), f"{backend.__name__}.{name} is not a property"
        else:
            assert list(inspect.signature(implemented).parameters) == list(inspect.signature(member).parameters), \
                f"{backend.__name__}.{name}"
    for field in Backend.__annotations__:
        assert hasattr(backend, field), f"{backend.__name__} lacks {field}"


def test_the_local_backend_has_nothing_to_heal_and_no_placement_rows(state_path):
    backend = LocalBackend(load_profile(LOCAL))
    assert backend.heal() == []
    assert backend.placement_plan(load_recipe(SMOKE)) == []
    said: list[str] = []
    ctx = Context(state=StateFile(state_path), profile=load_profile(LOCAL), profile_path=LOCAL,
                  recipe=load_recipe(SMOKE), say=said.append)
    # The plan asks the backend for its placement rows: none here.
    assert [a for a in provision.plan(ctx) if a.verb == "place"] == []
    provision.apply(ctx)
    said.clear()
    # `rl360 status` asks every backend of the recorded tiers to heal: the local one takes no step, says nothing.
    status.reconcile(ctx)
    assert said == []
