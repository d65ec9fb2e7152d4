"""build_batch: masking, filtering, staleness, the accounting of every sample, and the tensors."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from rl360cli.rl.batch import build_batch
from rl360cli.rl.grpo import policy_loss
from rl360cli.outcome import InfraCause, Outcome
from tests.rl.factories import make_trajectory

FAST = settings(max_examples=60, deadline=None)
AGGREGATIONS = ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm"]


def group(group_id, rewards, *, failed=(), causes=None, versions=None, start_seed=0):
    """Trajectories of one group; positions in `failed` are infra failures."""
    out = []
    failures = sorted(failed)
    for i, reward in enumerate(rewards):
        cause = (causes[failures.index(i)] if causes else InfraCause.SANDBOX_START) if i in failed else None
        out.append(
            make_trajectory(
                group_id=group_id, sample_index=i, reward=None if cause else reward, cause=cause,
                turns=((2 + (i + start_seed) % 5, 1 + i % 3), (1 + i % 4, 0)),
                versions=(versions[i], versions[i]) if versions else None, seed=start_seed + i,
            )  # fmt: skip
        )
    return out


def gathered_logprobs(leaves, micro):
    """What a trainer's forward pass gives, prediction-aligned: each sequence's leaf shifted by one."""
    rows = []
    width = micro.loss_mask.shape[1]
    for index, length in zip(micro.indices.tolist(), micro.lengths.tolist()):
        shifted = leaves[index][1:length]
        rows.append(torch.cat([shifted, torch.zeros(width - shifted.shape[0], dtype=shifted.dtype)]))
    return torch.stack(rows)


def test_half_infra_failed_group_matches_its_valid_subset_and_failures_get_no_gradient():
    causes = [InfraCause.OOM_NODE, InfraCause.IMAGE_PULL, InfraCause.ENGINE_ERROR, InfraCause.OOM_NODE]
    # Samples 1, 3, 5, 7 fail; the valid ones have rewards [1, 0, 0, 1].
    mixed = group("mixed", [1.0, 0.3, 0.0, 0.7, 0.0, 0.9, 1.0, 0.2], failed={1, 3, 5, 7}, causes=causes)
    other = group("other", [1.0, 0.0, 0.0, 0.0], start_seed=20)
    trajectories = mixed + other
    batch, report = build_batch(trajectories)

    assert report.kept == 8 and report.masked_by_cause == {"oom_node": 2, "image_pull": 1, "engine_error": 1}
    by_index = dict(zip(batch.indices.tolist(), batch.advantages.tolist()))
    # Exactly the advantages of the valid subset alone, [1, 0, 0, 1]: +-0.866024.
    assert [by_index[i] for i in (0, 2, 4, 6)] == pytest.approx([0.866024, -0.866024, -0.866024, 0.866024], abs=1e-6)
    assert [by_index[i] for i in (8, 9, 10, 11)] == pytest.approx([1.499997, -0.499999, -0.499999, -0.499999], abs=1e-6)
    assert not {1, 3, 5, 7} & set(by_index)

    # Autograd from per-trajectory logprob leaves through the trainer's gather to the loss.
    leaves = [
        (torch.from_numpy(t.logprobs.astype("float64")) + 0.01).requires_grad_(True) for t in trajectories
    ]
    total = 0.0
    for micro in batch.split(max_tokens=40):
        loss, _ = policy_loss(
            gathered_logprobs(leaves, micro), micro.old_logprobs.double(), micro.advantages, micro.loss_mask,
            denominator=micro.loss_denominator("token-mean"),
        )  # fmt: skip
        total = total + loss
    total.backward()
    for i in (1, 3, 5, 7):
        assert leaves[i].grad is None or (leaves[i].grad == 0).all()
    for i in (0, 2, 4, 6, 8, 9):
        generated = torch.tensor(trajectories[i].loss_mask).bool()
        assert (leaves[i].grad[generated] != 0).all() and (leaves[i].grad[~generated] == 0).all()


def test_dynamic_filtering_and_too_few_valid():
    trajectories = (
        group("solved", [1.0, 1.0, 1.0])  # zero variance
        + group("lonely", [1.0, 0.0, 0.0], failed={1, 2})  # one valid sample left
        + group("useful", [1.0, 0.0, 0.5], start_seed=5)
    )
    batch, report = build_batch(trajectories)
    assert (report.kept, report.filtered_zero_std, report.dropped_too_few_valid, report.masked) == (3, 3, 1, 2)
    assert batch.indices.tolist() == [6, 7, 8] and report.num_groups == 3 and report.num_groups_kept == 1

    batch, report = build_batch(trajectories, filter_zero_std=False)
    assert report.kept == 6 and report.filtered_zero_std == 0
    assert batch.advantages[:3].tolist() == [0.0, 0.0, 0.0]


def test_staleness_uses_the_oldest_turn():
    trajectories = [
        make_trajectory(group_id="g", sample_index=0, reward=1.0, versions=(8, 10)),
        make_trajectory(group_id="g", sample_index=1, reward=0.0, versions=(10, 10)),
        make_trajectory(group_id="g", sample_index=2, reward=0.0, versions=(7, 10)),  # 3 behind: stale
        make_trajectory(group_id="h", sample_index=0, reward=1.0, versions=(6, 6)),
        make_trajectory(group_id="h", sample_index=1, reward=0.0, versions=(9, 9)),
    ]
    batch, report = build_batch(trajectories, max_staleness=2, current_version=10)
    assert report.dropped_stale == 2 and report.dropped_too_few_valid == 1 and report.kept == 2
    assert batch.indices.tolist() == [0, 1] and batch.versions.tolist() == [8, 10]
    # The stale sample left its group before the statistics: [1, 0] gives +-0.707106.
    assert batch.advantages.tolist() == pytest.approx([0.707106, -0.707106], abs=1e-6)
    assert report.staleness_mean == 1.0 and report.staleness_max == 2


def test_report_figures():
    trajectories = group("a", [1.0, 0.0, 0.5, 1.0, 0.2], failed={4}, causes=[InfraCause.VERIFIER_ERROR])
    batch, report = build_batch(trajectories, pass_threshold=1.0)
    assert report.reward_mean == pytest.approx(0.625) and report.pass_rate == 0.5
    assert report.reward_std == pytest.approx((((0.375**2) * 2 + 0.625**2 + 0.125**2) / 4) ** 0.5)
    assert report.num_loss_tokens == batch.num_loss_tokens == sum(t.num_generated_tokens for t in trajectories[:4])
    metrics = report.to_dict()
    assert metrics["masked"] == 1 and metrics["masked/verifier_error"] == 1 and metrics["kept"] == 4
    assert "staleness_mean" not in metrics  # no current_version, no staleness


def test_nothing_kept_gives_no_batch():
    batch, report = build_batch(group("a", [0.0, 0.0, 0.0]) + group("b", [1.0, 0.0], failed={0, 1}))
    assert batch is None and report.kept == 0 and report.total == 5 and report.num_loss_tokens == 0


def test_refusals():
    with pytest.raises(ValueError, match="given twice"):
        build_batch(group("a", [1.0, 0.0]) + group("a", [1.0]))
    with pytest.raises(ValueError, match="newer than current_version"):
        build_batch(group("a", [1.0, 0.0], versions=[5, 3]), current_version=4)
    with pytest.raises(ValueError, match="current_version"):
        build_batch(group("a", [1.0, 0.0]), max_staleness=1)
    # A bad min_valid is GRPOConfig's to refuse: test_rl_config.py.


def test_the_denominator_of_an_unknown_aggregation_is_a_key_error_never_another_mode():
    batch, _ = build_batch(group("a", [1.0, 0.0]))
    with pytest.raises(KeyError):
        batch.loss_denominator("sum")


def test_padded_tensors_follow_the_shift_convention():
    trajectories = group("a", [1.0, 0.0, 0.5]) + group("b", [0.0, 1.0], start_seed=3)
    batch, _ = build_batch(trajectories)
    micro = batch.padded()
    width = int(batch.lengths.max())
    assert micro.input_ids.shape == (5, width) and micro.input_ids.dtype == torch.int64
    assert micro.loss_mask.shape == micro.old_logprobs.shape == micro.token_advantages.shape == (5, width - 1)
    for row, trajectory in enumerate(trajectories):
        n = trajectory.num_tokens
        assert micro.input_ids[row, :n].tolist() == trajectory.token_ids.tolist()
        assert micro.input_ids[row, n:].eq(0).all() and micro.attention_mask[row].tolist() == [1] * n + [0] * (width - n)
        # Position t predicts token t + 1: the mask and logprobs of tokens 1..n-1.
        assert micro.loss_mask[row, : n - 1].tolist() == trajectory.loss_mask[1:].tolist()
        assert micro.old_logprobs[row, : n - 1].tolist() == trajectory.logprobs[1:].tolist()
        assert micro.loss_mask[row, n - 1 :].eq(0).all()
        expected = micro.advantages[row] * torch.tensor(trajectory.loss_mask[1:]).float()
        assert micro.token_advantages[row, : n - 1].tolist() == expected.tolist()
    assert batch.input_ids is micro.input_ids  # the padded attributes are padded()'s, computed once
    # Packed tensors are token-aligned.
    assert batch.packed_input_ids.tolist() == [tok for t in trajectories for tok in t.token_ids.tolist()]
    assert batch.packed_loss_mask.tolist() == [bool(m) for t in trajectories for m in t.loss_mask.tolist()]


@pytest.mark.parametrize("world", [1, 2, 3, 7])
def test_data_parallel_shards_deal_every_micro_batch_once(world):
    trajectories = [t for g in range(4) for t in group(f"g{g}", [1.0, 0.0, 0.25, 0.5], start_seed=g * 7)]
    batch, _ = build_batch(trajectories)
    parts = batch.split(30)
    shards = [parts.shard(rank, world) for rank in range(world)]
    assert [p.indices.tolist() for rank in range(world) for p in shards[rank]] == \
        [parts[i].indices.tolist() for rank in range(world) for i in range(rank, len(parts), world)]
    assert sum(len(shard) for shard in shards) == len(parts)


@pytest.mark.parametrize("max_tokens", [1, 30, 64, 10_000])
def test_split_respects_the_budget_and_sums_to_the_whole_loss(max_tokens):
    trajectories = [t for g in range(4) for t in group(f"g{g}", [1.0, 0.0, 0.25, 0.5], start_seed=g * 7)]
    batch, _ = build_batch(trajectories)
    parts = batch.split(max_tokens)
    assert sorted(i for part in parts for i in part.indices.tolist()) == list(range(16))
    # A sequence padded on access: indexing, slicing and iterating give the same micro-batches.
    assert len(parts) == len(list(parts)) and [p.indices.tolist() for p in parts[:2]] == [
        p.indices.tolist() for p in list(parts)[:2]
    ]
    assert parts[-1].indices.tolist() == list(parts)[-1].indices.tolist()
    for part in parts:
        assert part.num_tokens <= max_tokens or part.input_ids.shape[0] == 1
    whole = batch.padded()
    for aggregation in AGGREGATIONS:
        # "Current" logprobs: a fixed function of the behaviour ones, the same row in both layouts.
        full, _ = policy_loss(
            whole.old_logprobs * 0.9, whole.old_logprobs, whole.advantages, whole.loss_mask, aggregation=aggregation
        )
        pieces = sum(
            policy_loss(
                part.old_logprobs * 0.9, part.old_logprobs, part.advantages, part.loss_mask,
                aggregation=aggregation, denominator=part.loss_denominator(aggregation),
            )[0]  # fmt: skip
            for part in parts
        )
        assert pieces.item() == pytest.approx(full.item(), rel=1e-5), aggregation


specs = st.lists(
    st.tuples(
        st.integers(0, 4),  # group
        st.sampled_from(["ok", "model_failure", "infra_failure"]),
        st.sampled_from([0.0, 0.5, 1.0]),  # reward
        st.integers(0, 5),  # policy version
        st.sampled_from(list(InfraCause)),
    ),
    max_size=30,
)


def trajectories_from(spec):
    counters: dict[int, int] = {}
    out = []
    for g, outcome, reward, version, cause in spec:
        index = counters[g] = counters.get(g, -1) + 1
        infra = outcome == "infra_failure"
        out.append(
            make_trajectory(
                group_id=f"g{g}", sample_index=index, reward=None if infra else reward,
                outcome=Outcome(outcome), cause=cause if infra else None, versions=(version, 5), seed=len(out),
            )  # fmt: skip
        )
    return out


def expected_buckets(trajectories, min_valid, filter_zero_std, max_staleness, current_version):
    """The rules, one sample at a time."""
    bucket = {}
    for i, t in enumerate(trajectories):
        if t.outcome is Outcome.INFRA_FAILURE:
            bucket[i] = "masked"
        elif max_staleness is not None and current_version - min(t.versions) > max_staleness:
            bucket[i] = "stale"
    for g in {t.group_id for t in trajectories}:
        members = [i for i, t in enumerate(trajectories) if t.group_id == g and i not in bucket]
        rewards = {trajectories[i].reward for i in members}
        for i in members:
            if len(members) < min_valid:
                bucket[i] = "too_few"
            elif filter_zero_std and len(rewards) == 1:
                bucket[i] = "filtered"
            else:
                bucket[i] = "kept"
    return bucket


@FAST
@given(specs, st.integers(2, 4), st.booleans(), st.none() | st.integers(0, 5))
def test_every_sample_is_counted_in_exactly_one_bucket(spec, min_valid, filter_zero_std, max_staleness):
    trajectories = trajectories_from(spec)
    current = 5
    batch, report = build_batch(
        trajectories, min_valid=min_valid, filter_zero_std=filter_zero_std,
        max_staleness=max_staleness, current_version=current,
    )  # fmt: skip
    bucket = expected_buckets(trajectories, min_valid, filter_zero_std, max_staleness, current)
    counts = {name: sum(1 for b in bucket.values() if b == name) for name in ("masked", "stale", "too_few", "filtered", "kept")}
    assert report.total == len(trajectories) == sum(counts.values())
    assert report.kept + report.masked + report.filtered_zero_std + report.dropped_stale + report.dropped_too_few_valid == report.total
    assert (report.kept, report.masked, report.filtered_zero_std, report.dropped_stale, report.dropped_too_few_valid) == (
        counts["kept"], counts["masked"], counts["filtered"], counts["stale"], counts["too_few"],
    )  # fmt: skip
    causes = {}
    for t in trajectories:
        if t.cause is not None:
            causes[t.cause.value] = causes.get(t.cause.value, 0) + 1
    assert report.masked_by_cause == causes
    kept = sorted(i for i, b in bucket.items() if b == "kept")
    assert (batch.indices.tolist() if batch is not None else []) == kept


@FAST
@given(specs, st.data())
def test_masking_a_sample_never_changes_another_group(spec, data):
    trajectories = trajectories_from(spec)
    valid = [i for i, t in enumerate(trajectories) if t.is_valid]
    if not valid:
        return
    victim = data.draw(st.sampled_from(valid))
    failed = list(trajectories)
    t = trajectories[victim]
    failed[victim] = make_trajectory(
        group_id=t.group_id, sample_index=t.sample_index, reward=None, cause=InfraCause.NODE_LOST, seed=victim
    )
    before, _ = build_batch(trajectories)
    after, report = build_batch(failed)
    assert report.masked_by_cause.get("node_lost", 0) >= 1

    def others(batch):
        if batch is None:
            return {}
        return {
            i: a
            for i, a in zip(batch.indices.tolist(), batch.advantages.tolist())
            if trajectories[i].group_id != t.group_id
        }

    assert others(after) == others(before)
