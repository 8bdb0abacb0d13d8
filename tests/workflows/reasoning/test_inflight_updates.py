"""Weights that land while a rollout rank generates (``rollout.inflight_updates``): the actor's weights of
version j reach the rollout between decoding steps of iteration j's generation, the rows go on under them,
every token's recorded log-prob is that of its recorded version's weights, and every prompt put is still
trained once or carried, the staleness bound kept."""

from __future__ import annotations

import contextlib
import logging
import time
from pathlib import Path

import pytest
import torch

from m2flow.config import ConfigError, from_dict
from m2flow.models.causal_lm import load_causal_lm, response_logprobs
from m2flow.workers.actor import ActorWorker
from m2flow.workers.rollout import RolloutWorker
from m2flow.workflows.reasoning.config import ReasoningConfig
from tests.workflows.reasoning.setup import improved, toy_config, train_partial

pytestmark = pytest.mark.timeout(600)
logger = logging.getLogger(__name__)


def _config(root: Path, placement: str = "local", **overrides) -> ReasoningConfig:
    """Partial rollouts at staleness 2 (generation runs an iteration ahead of training), updates in flight; two
    groups decoding at once, so that a generation takes several waves of decoding steps to fill its quota."""
    return toy_config(root, placement, algorithm={"max_staleness": 2, "old_logprobs": "rollout"},
                      rollout={"backend": "lean", "partial": True, "inflight_updates": True, "fuse_with_actor": False,
                               "max_running": 16, "sampling": {"n": 8, "max_new_tokens": 12}}, **overrides)


def _instrument(monkeypatch, land_at: int) -> tuple[dict[int, dict], list[tuple]]:
    """In-process hooks: the weights the actor sends, by version; the groups it takes (iteration, slot, index,
    their batch); and, once, in iteration ``land_at``'s generation, a second poll that waits until the actor's
    weights have arrived, so that an update lands after a decoding step whatever the machine's speed.

    The local placement puts every component on one device, where the rollout holds the device lock for its
    whole generation and the actor cannot train meanwhile (nothing could land): the rollout's turns are
    bypassed, as if it had a device of its own (what a disaggregated placement on Ray gives it)."""
    sent: dict[int, dict] = {}
    taken: list[tuple] = []
    send, accept, generate, poll = (ActorWorker.send_weights, ActorWorker._accept, RolloutWorker.generate,
                                    RolloutWorker.poll_weights)

    def sending(self, targets, version=None):
        sent[version] = {k: v.detach().clone() for k, v in self.policy.full_state_dict().items()}
        return send(self, targets, version)

    def accepting(self, step, groups):
        taken.extend((g.step, g.slot, g.index, g.batch) for g in groups)
        return accept(self, step, groups)

    polls = {"step": -1, "count": 0}

    def generating(self, step, *args):
        polls.update(step=step, count=0)
        return generate(self, step, *args)

    def polling(self):
        polls["count"] += 1
        if polls["step"] == land_at and polls["count"] == 2 and self.policy_version < land_at:
            deadline = time.monotonic() + 120
            while not self.comm.pending(*self._weights_from) and time.monotonic() < deadline:
                time.sleep(0.005)
        return poll(self)

    monkeypatch.setattr(RolloutWorker, "turn", lambda self, last=True: contextlib.nullcontext())
    for cls, name, fn in ((ActorWorker, "send_weights", sending), (ActorWorker, "_accept", accepting),
                          (RolloutWorker, "generate", generating), (RolloutWorker, "poll_weights", polling)):
        monkeypatch.setattr(cls, name, fn)
    return sent, taken


def test_inflight_updates_need_partial_rollouts():
    with pytest.raises(ConfigError) as info:
        from_dict(ReasoningConfig, {"rollout": {"backend": "lean", "inflight_updates": True}})
    assert "rollout.inflight_updates" in str(info.value) and "rollout.partial" in str(info.value)


def test_weights_land_mid_generation_and_every_token_keeps_its_versions_log_prob(tmp_path, monkeypatch):
    cfg = _config(tmp_path, steps=3)
    sent, taken = _instrument(monkeypatch, land_at=1)
    history, _, put, carried = train_partial(cfg)
    assert len(history) == 3
    # Generation of iteration j starts with version j - 1 (one ahead); version j's weights landed in it.
    assert history[1]["rollout/inflight_updates_count"] >= 1
    landed = [(s, b) for s, _, _, b in taken
              if (b.token_versions[b.response_mask.bool()] == s).any()]  # only an update in flight makes these
    assert any(s == 1 for s, _ in landed)
    crossing = [(s, b) for s, b in landed if len(b.token_versions[b.response_mask.bool()].unique()) > 1]
    assert crossing  # groups with tokens of the version the generation began with and of the one that landed
    # Every token's log-prob is its own version's, recomputed by a plain forward of its whole context.
    model = load_causal_lm(cfg.model.path)
    checked = 0
    for _, b in crossing[:4]:
        mask = b.response_mask.bool()
        for v in b.token_versions[mask].unique().tolist():
            model.load_state_dict(sent[v])
            with torch.no_grad():
                want, _ = response_logprobs(model, b.prompt_ids, b.prompt_mask, b.response_ids, b.response_mask,
                                            temperature=cfg.rollout.sampling.temperature)
            at = mask & (b.token_versions == v)
            assert b.rollout_logprobs[at] == pytest.approx(want[at], abs=1e-4), v
            checked += int(at.sum())
    assert checked > 0
    # Nothing lost or twice: every prompt put is trained once or still carried, none too old.
    trained = [index for _, _, index, _ in taken]
    assert len(trained) == 3 * 8 == len(set(trained)) and not set(trained) & set(carried)
    assert sorted(trained + carried) == sorted(put) and len(put) == 32 == len(set(put))
    assert sorted((s, k) for s, k, _, _ in taken) == [(s, k) for s in range(3) for k in range(8)]
    for s, _, _, b in taken:  # the per-token bound: no token older than s - 2, none newer than s
        versions = b.token_versions[b.response_mask.bool()]
        assert versions.min() >= s - 2 and versions.max() <= s
    assert all(h["async/dropped_samples"] == 0 and h["async/staleness_max"] <= 2 for h in history)


# 4-8 s once the shared cluster's worker hosts are up. Two rollout ranks in processes of their own, on devices
# other than the actor's: the weights cross processes (the stream's version, the inbox probe). When a version
# lands depends on timing, so this checks what must hold either way, a version loaded in flight included: the
# sync queued behind that generation finds it loaded and the run goes on, nothing lost, nothing twice.
def test_two_rollout_ranks_on_ray_with_inflight_updates_lose_nothing(cluster, tmp_path):
    cfg = _config(tmp_path, "rollout,reward: 0-1, inference,actor: 2", steps=4)
    history, groups, _, carried = train_partial(cfg, cluster)
    assert len(history) == 4
    assert sorted((s, k) for s, k, _, _ in groups) == [(s, k) for s in range(4) for k in range(8)]
    trained = [index for _, _, index, ok in groups if ok]
    assert len(trained) == 32 == len(set(trained)) and not set(trained) & set(carried) and len(carried) == 8
    assert all(h["async/dropped_samples"] == 0 and h["async/staleness_max"] <= 2 for h in history)
    logger.info("weight versions loaded while generating, on Ray: %s",
                [h["rollout/inflight_updates_count"] for h in history])


@pytest.mark.slow
@pytest.mark.learning
def test_a_run_with_weights_landing_in_flight_learns_and_trains_every_prompt_once(tmp_path, monkeypatch):
    # Updates land as timing has it (no forced wait), the rollout's turns bypassed as above.
    monkeypatch.setattr(RolloutWorker, "turn", lambda self, last=True: contextlib.nullcontext())
    history, groups, _, carried = train_partial(_config(tmp_path, steps=7))
    trained = [index for _, _, index, ok in groups if ok]
    # 7 iterations of 8 and one extra batch: the data's 64 items, one epoch, each trained once or carried.
    assert len(trained) == 7 * 8 and sorted(trained + carried) == list(range(64))
    assert all(h["async/dropped_samples"] == 0 and h["async/staleness_max"] <= 2 for h in history)
    logger.info("weight versions loaded while generating: %s", [h["rollout/inflight_updates_count"] for h in history])
    assert improved(history), [h["reward/mean"] for h in history]


def test_a_run_with_weights_landing_in_flight_checkpoints_and_resumes_with_nothing_lost_or_twice(tmp_path, monkeypatch):
    # Version 1's weights land in iteration 1's generation before the checkpoint after iteration 2, and version 4's
    # in the resumed run's iteration 4 (nothing is in flight across a checkpoint: the iteration before one syncs
    # only after it, so no update can land in it). When a version lands depends on timing, so this checks what
    # must hold either way: every prompt trained once or carried, every token within the staleness bound.
    from m2flow.driver.checkpoints import CHECKPOINTS
    from m2flow.workers.partial import PARTIAL_FILE
    from m2flow.workers.state_file import load_state

    _, taken = _instrument(monkeypatch, land_at=1)
    history, _, put, _ = train_partial(_config(tmp_path, steps=6, checkpoint_every=3))
    assert history[1]["rollout/inflight_updates_count"] >= 1
    before = [index for s, _, index, _ in taken if s < 3]
    checkpoint = tmp_path / "run" / CHECKPOINTS / "step_000003"
    saved = [c["task"]["index"] for rank in load_state(checkpoint / PARTIAL_FILE)["ranks"] for c in rank]
    assert len(saved) == 8  # the carried prompts, with their rows' tokens and versions

    monkeypatch.undo()
    _, taken = _instrument(monkeypatch, land_at=4)
    resumed, _, resumed_put, carried = train_partial(
        _config(tmp_path, steps=6, checkpoint_every=3, run_dir=str(tmp_path / "resumed"), resume=str(checkpoint)))
    assert len(resumed) == 3 and resumed[1]["rollout/inflight_updates_count"] >= 1
    # The data goes on where it stopped (24 + 8 prompts put before the checkpoint, no extra batch), and every
    # prompt put is trained once, before or after the resume, or still carried at the end: none lost, none twice.
    assert len(put) == 56 and resumed_put == put[32:]
    assert sorted((s, k) for s, k, _, _ in taken) == [(s, k) for s in (3, 4, 5) for k in range(8)]
    after = [index for _, _, index, _ in taken]
    everything = before + after + carried
    assert len(everything) == len(set(everything)) == 56 and sorted(everything) == sorted(put[:32] + resumed_put)
    assert set(saved) <= set(after + carried)  # what the checkpoint carried went on in the resumed run
    for s, _, _, b in taken:  # the per-token bound: no token older than s - 2, none newer than s
        versions = b.token_versions[b.response_mask.bool()]
        assert versions.min() >= s - 2 and versions.max() <= s
    assert all(h["async/dropped_samples"] == 0 and h["async/staleness_max"] <= 2 for h in resumed)
