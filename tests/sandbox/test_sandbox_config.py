"""The [sandbox] table of a recipe: its keys load from TOML and bad values name the field and the fix."""

from __future__ import annotations

import pytest

from rl360cli.configload import ConfigError, from_mapping
from rl360cli.sandbox.config import SandboxConfig


def test_a_sandbox_table_loads():
    config = from_mapping(SandboxConfig, {"provider": "docker", "cpus": 0.25, "memory_mb": 256, "wave_size": 4,
                                          "wave_interval_s": 0.5, "adaptive_waves": True, "max_wave_size": 32,
                                          "network": "none", "inject_failure_rate": 0.1, "inject_seed": 7},
                          where="recipe.toml", table="sandbox")
    assert (config.provider, config.cpus, config.network, config.inject_seed) == ("docker", 0.25, "none", 7)


@pytest.mark.parametrize("table, message", [
    ({"cpus": 0}, "cpus must be positive"),
    ({"memory_mb": 8}, "memory_mb must be at least 16"),
    ({"wave_size": 0}, "wave_size must be at least 1"),
    ({"retry_backoff_s": -1}, "retry_backoff_s must be >= 0"),
    ({"exec_timeout_s": 0}, "exec_timeout_s must be positive"),
    ({"inject_failure_rate": 1.0}, "inject_failure_rate must be in [0, 1)"),
    ({"process_uid_base": 0}, "process_uid_base must be at least 1000"),
    ({"network": "host"}, "'host' is not allowed"),
    ({"wave_sise": 4}, "did you mean 'wave_size'?"),
])
def test_bad_values_are_refused(table, message):
    with pytest.raises(ConfigError) as caught:
        from_mapping(SandboxConfig, table, where="recipe.toml", table="sandbox")
    assert message in str(caught.value) and "recipe.toml" in str(caught.value)
