"""GRPOConfig validation, its hand-off to build_batch and policy_loss, and import hygiene."""

import subprocess
import sys

import pytest
import torch

from rl360cli.rl.batch import build_batch
from rl360cli.rl.config import GRPOConfig
from rl360cli.rl.grpo import policy_loss
from tests.rl.factories import make_trajectory


def test_defaults_are_valid_and_frozen():
    config = GRPOConfig()
    assert (config.clip_low, config.clip_high, config.clip_c, config.aggregation) == (0.2, 0.2, None, "token-mean")
    with pytest.raises(AttributeError):
        config.eps = 1.0  # type: ignore[misc]
    with pytest.raises(TypeError):
        GRPOConfig(0.2)  # type: ignore[misc]  # keyword-only


@pytest.mark.parametrize(
    ("field", "value", "fix"),
    [
        ("eps", 0.0, "small positive"),
        ("eps", float("nan"), "small positive"),
        ("clip_low", 1.0, "e.g. 0.2"),
        ("clip_low", -0.1, "e.g. 0.2"),
        ("clip_high", -0.5, "0.28"),
        ("clip_c", 1.0, "3.0"),
        ("clip_c", True, "3.0"),
        ("aggregation", "sum", "token-mean"),
        ("norm_tokens", 0, "maximum response length"),
        ("kl_coef", -1.0, "disable"),
        ("kl_estimator", "k4", "low_var_kl"),
        ("tis_cap", 0.0, "2.0"),
        ("min_valid", 1, "baseline"),
        ("max_staleness", -1, "on-policy"),
        ("pass_threshold", "1", "solved"),
    ],
)
def test_bad_values_name_the_field_the_value_and_the_fix(field, value, fix):
    with pytest.raises(ValueError) as error:
        GRPOConfig(**{field: value})
    message = str(error.value)
    assert message.startswith(field) and repr(value).strip("'") in message and fix in message


def test_kwargs_feed_build_batch_and_policy_loss():
    config = GRPOConfig(clip_high=0.28, clip_c=3.0, aggregation="seq-mean-token-sum-norm", norm_tokens=64,
                        max_staleness=1, filter_zero_std=False)  # fmt: skip
    trajectories = [make_trajectory(group_id="g", sample_index=i, reward=float(i % 2), seed=i) for i in range(4)]
    batch, report = build_batch(trajectories, current_version=0, **config.batch_kwargs())
    assert report.kept == 4
    micro = batch.padded()
    loss, stats = policy_loss(
        micro.old_logprobs, micro.old_logprobs, micro.advantages, micro.loss_mask, **config.loss_kwargs()
    )
    # ratio 1 everywhere: the loss is -sum(A * mask) / norm_tokens.
    assert loss.item() == pytest.approx(-(micro.token_advantages.sum() / 64).item(), abs=1e-7)
    assert stats.clip_frac == 0.0 and stats.ratio_mean == 1.0
    assert set(config.loss_kwargs()) <= set(policy_loss.__kwdefaults__)
    assert set(config.batch_kwargs()) <= set(build_batch.__kwdefaults__)
    assert torch.isfinite(loss)


def test_outcome_and_config_import_neither_torch_nor_numpy():
    code = (
        "import sys, rl360cli.rl, rl360cli.outcome, rl360cli.rl.config; "
        "heavy = {'torch', 'numpy', 'msgpack'} & set(sys.modules); assert not heavy, heavy"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
