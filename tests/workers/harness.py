"""Reasoning workers in the test process: an in-memory stream and workers built without Ray.

Calling the workers' step methods one after the other (rollout, reward, inference, actor) runs a
whole iteration in one process: the streams just hold every item until the next stage takes it.
"""

from __future__ import annotations

import atexit
import uuid
from collections import deque
from typing import Any

import torch

from m2flow.runtime.device_lock import remove_lock_dir
from m2flow.runtime.worker import Worker, WorkerContext


class MemoryStream:
    """The ``GroupStream`` interface over in-memory queues (one per consumer rank)."""

    def __init__(self, consumers: int = 1) -> None:
        self.consumers = consumers
        self.queues: dict[int, deque] = {r: deque() for r in range(consumers)}
        self.taken: list[int] = []  # size of every take, to check micro-batch sizing

    def key(self, slot: int) -> int:
        return slot % self.consumers

    def expected(self, rank: int, num_slots: int) -> int:
        return len(range(rank, num_slots, self.consumers))

    def put(self, item: Any) -> None:
        self.queues[self.key(item.slot)].append(item)

    def put_many(self, items: Any) -> None:
        for item in items:
            self.put(item)

    def take(self, rank: int, count: int, step: int | None = None) -> list[Any]:  # one lane: step unused
        q = self.queues[rank]
        assert len(q) >= count, f"stream has {len(q)} items for rank {rank}, {count} wanted (would block)"
        out = [q.popleft() for _ in range(count)]
        self.taken.append(len(out))
        return out

    def take_ready(self, rank: int, limit: int, step: int | None = None) -> list[Any]:
        q = self.queues[rank]
        assert q, f"stream is empty for rank {rank} (would block)"
        return self.take(rank, min(limit, len(q)))

    def take_tokens(self, rank: int, limit: int, budget: int, weigh: Any, *, wait: bool = False,
                    step: int | None = None) -> list[Any]:  # one lane: step unused
        q = self.queues[rank]
        assert q, f"stream is empty for rank {rank} (would block)"
        count, used = 0, 0
        while count < min(limit, len(q)) and (not count or used + weigh(q[count]) <= budget):
            used += weigh(q[count])
            count += 1
        return self.take(rank, count)


def local_worker(cls: type[Worker], *args: Any, group: str = "local", rank: int = 0, world_size: int = 1,
                 **kwargs: Any) -> Any:
    """Construct a worker here, with the identity a ``WorkerGroup`` would have given it."""
    tag = uuid.uuid4().hex[:8]
    ctx = WorkerContext(
        group_name=f"{group}-{tag}", rank=rank, world_size=world_size, node_rank=0, node_id="local",
        node_ip="127.0.0.1", devices=(0,), device_type="cpu", local_rank=rank, local_world_size=world_size,
        namespace=f"test-{tag}", cluster_id=f"test-{tag}", num_threads=1,
    )
    # No Cluster shuts this identity down: its device-lock directory goes when the tests end.
    atexit.register(remove_lock_dir, ctx.cluster_id)
    worker = cls.__new__(cls)
    worker._m2flow_ctx = ctx
    worker.__init__(*args, **kwargs)
    return worker


def rollout_settings(ckpt: str, cfg: Any, prompts: Any, responses: Any, **kwargs: Any) -> Any:
    """A rollout's settings with the generation mode and chunking its config section asks for (what the
    plan decides from it when nothing else changes them)."""
    from m2flow.workers.config import batching_mode
    from m2flow.workers.generation import RolloutSettings

    return RolloutSettings(model_path=ckpt, backend=cfg.backend, dtype=cfg.dtype, compile=cfg.compile,
                           sampling=cfg.sampling, prompts=prompts, responses=responses, batching=batching_mode(cfg),
                           max_running=cfg.max_running, prompts_per_chunk=cfg.prompts_per_chunk, **kwargs)


def inference_settings(ckpt: str, cfg: Any, algo: Any, temperature: float, group_size: int, scored: Any,
                       ready: Any, **kwargs: Any) -> Any:
    """An inference rank's settings with the micro-batches of its config section."""
    from m2flow.workers.inference import InferenceSettings

    return InferenceSettings(model_path=ckpt, inference=cfg, algo=algo, temperature=temperature,
                             group_size=group_size, scored=scored, ready=ready, micro_batch_size=cfg.micro_batch_size,
                             micro_batch_tokens=cfg.micro_batch_tokens, **kwargs)


def actor_settings(ckpt: str, cfg: Any, algo: Any, temperature: float, group_size: int, ready: Any,
                   **kwargs: Any) -> Any:
    """An actor rank's settings with the micro-batches of its config section and the staleness bound of
    ``algo`` (what the plan decides from them when nothing else changes them)."""
    from m2flow.workers.actor import ActorSettings

    return ActorSettings(model_path=ckpt, actor=cfg, algo=algo, temperature=temperature, group_size=group_size,
                         ready=ready, max_staleness=algo.max_staleness, micro_batch_size=cfg.micro_batch_size,
                         micro_batch_tokens=cfg.micro_batch_tokens, **kwargs)


def copy_weights(actor: Any, *targets: torch.nn.Module) -> None:
    """In-process weight sync: the actor's full state dict copied into each target module."""
    state = actor.policy.full_state_dict()
    for module in targets:
        module.load_state_dict(state)


class Pipeline:
    """Rollout, reward, inference and actor workers of one iteration, called in turn in this process."""

    def __init__(self, ckpt: str, algo: Any, *, actor: Any = None, reward: Any = None, inference: Any = None,
                 n: int = 4, prompts: int = 4, max_new_tokens: int = 6, micro_batch_size: int = 8,
                 seed: int = 0) -> None:
        from m2flow.data import ArithmeticTask
        from m2flow.models.tokenizer import load_tokenizer
        from m2flow.workers.actor import ActorWorker
        from m2flow.workers.config import ActorConfig, InferenceConfig, RewardConfig, RolloutConfig, SamplingConfig
        from m2flow.workers.inference import InferenceWorker
        from m2flow.workers.reward import RewardSettings, RewardWorker
        from m2flow.workers.rollout import RolloutWorker

        tok = load_tokenizer(ckpt)
        problems = ArithmeticTask().sample("train", prompts, seed=seed)
        self.prompt_ids = [tok(p["prompt"])["input_ids"] for p in problems]
        self.answers = [p["answer"] for p in problems]
        self.streams = [MemoryStream() for _ in range(4)]
        prompts_s, responses, scored, ready = self.streams
        sampling = SamplingConfig(n=n, max_new_tokens=max_new_tokens)
        self.rollout = local_worker(RolloutWorker, group="rollout", settings=rollout_settings(
            ckpt, RolloutConfig(sampling=sampling), prompts_s, responses, seed=seed))
        reward = reward or RewardConfig(fn="tests.workflows.toy_reward:target_fraction")
        self.reward = local_worker(RewardWorker, group="reward", settings=RewardSettings(
            reward=reward, max_new_tokens=max_new_tokens, dynamic_sampling=algo.dynamic_sampling, responses=responses,
            scored=scored))
        inference = inference or InferenceConfig(micro_batch_size=micro_batch_size)
        self.inference = local_worker(InferenceWorker, group="inference", settings=inference_settings(
            ckpt, inference, algo, 1.0, n, scored, ready))
        actor = actor or ActorConfig(micro_batch_size=micro_batch_size)
        self.actor = local_worker(ActorWorker, group="actor", settings=actor_settings(
            ckpt, actor, algo, 1.0, n, ready, total_steps=10, seed=seed))

    def step(self, step: int) -> dict[str, float]:
        """One iteration: weights to the copies, then generate, score, log-probs, train."""
        from m2flow.workers.messages import PromptTask

        copy_weights(self.actor, self.rollout.backend.model,
                     *[m for m in (self.inference.policy,) if m is not None])
        for slot, (ids, answer) in enumerate(zip(self.prompt_ids, self.answers)):
            self.streams[0].put(PromptTask(step, slot, slot, ids, answer))
        slots = len(self.prompt_ids)
        metrics: dict[str, float] = {}
        for call in (self.rollout.generate, self.reward.score, self.inference.compute, self.actor.train):
            metrics.update(call(step, slots))
        return metrics
