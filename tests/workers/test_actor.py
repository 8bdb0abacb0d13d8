"""The actor's update does not depend on how the batch was cut: micro-batches, streaming or not."""

from __future__ import annotations

import pytest
import torch

from m2flow.backends.training import OptimConfig
from m2flow.data.batch import RolloutBatch
from m2flow.workers.config import ActorConfig, AlgorithmConfig
from m2flow.workers.messages import GroupSample
from tests.workers.harness import Pipeline


def _params(pipe: Pipeline) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in pipe.actor.policy.module.state_dict().items()}


def _max_diff(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    return max(float((a[k] - b[k]).abs().max()) for k in a)


@pytest.mark.parametrize("agg", ["token-mean", "seq-mean-token-mean"])
def test_streamed_micro_batches_and_one_gathered_batch_give_the_same_update(tiny_ckpt, agg):
    # Plain SGD without clipping: the parameter change is lr x the gradient, nothing hides a difference.
    algo = AlgorithmConfig(adv_estimator="grpo", loss_agg=agg, old_logprobs="rollout")
    opt = OptimConfig(name="sgd", lr=0.5, grad_clip=None)
    small = Pipeline(tiny_ckpt, algo, actor=ActorConfig(micro_batch_size=4, optim=opt), micro_batch_size=4)
    whole = Pipeline(tiny_ckpt, algo, actor=ActorConfig(micro_batch_size=64, optim=opt), micro_batch_size=64)
    whole.actor.streaming = False  # one gathered batch, one forward/backward
    assert small.actor.streaming
    before = _params(small)
    m_small, m_whole = small.step(0), whole.step(0)
    assert small.streams[3].taken == [1, 1, 1, 1]  # four micro-batches of one group each
    assert m_small["actor/pg_loss"] == pytest.approx(m_whole["actor/pg_loss"], abs=1e-6)
    assert _max_diff(_params(small), before) > 1e-4  # the step did something
    assert _max_diff(_params(small), _params(whole)) < 1e-6


@pytest.mark.parametrize("agg", ["token-mean", "seq-mean-token-sum"])
def test_token_budget_micro_batches_give_the_full_batch_update(tiny_ckpt, agg):
    algo = AlgorithmConfig(adv_estimator="grpo", loss_agg=agg, old_logprobs="rollout")
    opt = OptimConfig(name="sgd", lr=0.5, grad_clip=None)
    budget = 70  # a group here is 4 x (prompt + response) = 40-60 tokens: one group per micro-batch mostly
    streamed = Pipeline(tiny_ckpt, algo, actor=ActorConfig(micro_batch_tokens=budget, optim=opt), micro_batch_size=64)
    rows = Pipeline(tiny_ckpt, algo, actor=ActorConfig(micro_batch_tokens=budget // 4, optim=opt), micro_batch_size=64)
    rows.actor.streaming = False  # gathered: the batch cut into row micro-batches by tokens
    whole = Pipeline(tiny_ckpt, algo, actor=ActorConfig(micro_batch_size=64, optim=opt), micro_batch_size=64)
    whole.actor.streaming = False
    before = _params(streamed)
    m_streamed, m_rows, m_whole = streamed.step(0), rows.step(0), whole.step(0)
    takes = streamed.streams[3].taken
    assert sum(takes) == 4 and len(takes) > 1  # every group once, in several micro-batches
    assert sorted(g[1] for g in streamed.actor.received) == [0, 1, 2, 3]
    for m in (m_streamed, m_rows):
        assert m["actor/pg_loss"] == pytest.approx(m_whole["actor/pg_loss"], abs=1e-6)
    assert _max_diff(_params(streamed), before) > 1e-4
    assert _max_diff(_params(streamed), _params(whole)) < 1e-6
    assert _max_diff(_params(rows), _params(whole)) < 1e-6


def test_split_tokens_cuts_rows_by_budget_and_keeps_every_row():
    batch = RolloutBatch(
        prompt_ids=torch.ones(5, 3, dtype=torch.long), prompt_mask=torch.tensor([[1, 1, 1]] * 5),
        response_ids=torch.ones(5, 4, dtype=torch.long),
        response_mask=torch.tensor([[1, 0, 0, 0], [1, 1, 1, 1], [1, 1, 0, 0], [1, 1, 1, 1], [1, 1, 1, 0]]),
        group_ids=torch.arange(5), truncated=torch.zeros(5, dtype=torch.bool))
    parts = batch.split_tokens(9)  # rows weigh 4, 7, 5, 7, 6
    assert [len(p) for p in parts] == [1, 1, 1, 1, 1]
    assert [len(p) for p in batch.split_tokens(11)] == [2, 1, 1, 1]
    assert [len(p) for p in batch.split_tokens(3)] == [1] * 5  # a row above the budget goes alone
    assert sum(len(p) for p in batch.split_tokens(1000)) == 5 and len(batch.split_tokens(1000)) == 1


def test_the_packed_training_forward_gives_the_hf_forwards_update(tiny_ckpt):
    algo = AlgorithmConfig(adv_estimator="grpo", old_logprobs="rollout", entropy_coef=0.01)
    opt = OptimConfig(name="sgd", lr=0.5, grad_clip=None)
    hf = Pipeline(tiny_ckpt, algo, actor=ActorConfig(micro_batch_size=8, optim=opt), micro_batch_size=8)
    packed = Pipeline(tiny_ckpt, algo, actor=ActorConfig(micro_batch_size=8, optim=opt, forward="packed"),
                    micro_batch_size=8)
    before = _params(hf)
    m_hf, m_packed = hf.step(0), packed.step(0)
    assert _max_diff(_params(hf), before) > 1e-4
    assert m_packed["actor/pg_loss"] == pytest.approx(m_hf["actor/pg_loss"], abs=1e-6)
    assert m_packed["actor/entropy"] == pytest.approx(m_hf["actor/entropy"], abs=1e-6)
    assert _max_diff(_params(hf), _params(packed)) < 1e-6


def test_the_packed_forward_is_refused_with_fsdp():
    with pytest.raises(ValueError, match="forward 'packed' needs strategy 'ddp', got 'fsdp'"):
        ActorConfig(forward="packed", strategy="fsdp").validate()


def test_groups_of_another_iteration_are_refused(tiny_ckpt):
    pipe = Pipeline(tiny_ckpt, AlgorithmConfig(adv_estimator="grpo"))
    pipe.step(0)
    batch = RolloutBatch(
        prompt_ids=torch.tensor([[5, 6]]), prompt_mask=torch.ones(1, 2, dtype=torch.long),
        response_ids=torch.tensor([[7]]), response_mask=torch.ones(1, 1, dtype=torch.long),
        group_ids=torch.tensor([0]), truncated=torch.tensor([False]), rewards=torch.tensor([1.0]))
    pipe.streams[3].put(GroupSample(step=0, slot=0, index=0, answer="1", texts=["x"], batch=batch))
    with pytest.raises(RuntimeError, match="iteration 0 during 1"):
        pipe.actor.train(1, 1)


def test_a_checkpoint_restores_policy_critic_optimizer_and_schedule(tiny_ckpt, tmp_path):
    from m2flow.workers.actor import ActorWorker
    from tests.workers.harness import MemoryStream, actor_settings, local_worker

    algo = AlgorithmConfig(adv_estimator="gae", lam=0.9)
    cfg = ActorConfig(micro_batch_size=8, optim=OptimConfig(lr=1e-3, schedule="linear"))
    pipe = Pipeline(tiny_ckpt, algo, actor=cfg)
    pipe.step(0)
    pipe.actor.save_checkpoint(str(tmp_path / "ckpt"))
    restored = local_worker(ActorWorker, settings=actor_settings(tiny_ckpt, cfg, algo, 1.0, 4, MemoryStream(),
                                                                 total_steps=10, resume_dir=str(tmp_path / "ckpt")))
    for old, new in ((pipe.actor.policy, restored.policy), (pipe.actor.critic, restored.critic)):
        a, b = old.module.state_dict(), new.module.state_dict()
        assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
        sa, sb = old.optimizer.state_dict(), new.optimizer.state_dict()
        assert all(torch.equal(sa["state"][i]["exp_avg"], sb["state"][i]["exp_avg"]) for i in sa["state"])
        assert new.scheduler.last_epoch == old.scheduler.last_epoch == 1


@pytest.mark.parametrize("where", ["loss", "metric"])
def test_a_nan_loss_skips_the_update_and_too_many_in_a_row_stop_the_run(tiny_ckpt, monkeypatch, where):
    import m2flow.workers.actor as actor_module
    from m2flow.runtime.errors import RunHealthError

    algo = AlgorithmConfig(adv_estimator="grpo", old_logprobs="rollout")
    pipe = Pipeline(tiny_ckpt, algo, actor=ActorConfig(micro_batch_size=8, max_skipped_updates=2))
    original = actor_module.policy_objective
    poisoned = {"on": True}

    def nan_objective(*args, **kwargs):
        obj = original(*args, **kwargs)
        if poisoned["on"]:
            if where == "loss":  # the gradient becomes NaN too
                obj.loss = obj.loss * float("nan")
            else:  # only the summed loss is NaN: the gradient alone would not tell
                obj.metrics["actor/pg_loss"] = float("nan")
        return obj

    monkeypatch.setattr(actor_module, "policy_objective", nan_objective)
    before = _params(pipe)
    m = pipe.step(0)
    assert m["actor/skipped_updates_count"] == 1.0 and pipe.actor.skipped_in_row == 1
    assert all(torch.equal(v, before[k]) for k, v in _params(pipe).items())  # weights untouched
    poisoned["on"] = False
    m = pipe.step(1)  # a finite step resets the count of skips in a row
    assert m["actor/skipped_updates_count"] == 0.0 and pipe.actor.skipped_in_row == 0
    assert _max_diff(_params(pipe), before) > 0
    poisoned["on"] = True
    pipe.step(2)
    with pytest.raises(RunHealthError, match=r"2 optimizer steps in a row skipped .*actor.max_skipped_updates=2"):
        pipe.step(3)
