"""``AgenticRolloutWorker``: model turns for the episodes routed to this rank, finished groups streamed on.

Per iteration the flow calls ``begin`` (the rank's episodes); the turn loop (``turn_loop.play_turns``) then
calls ``start_episodes`` (their first observations) and rounds of ``play_turn`` (one model turn for every
running episode) and ``observe`` (what the environments answered) until every episode has ended; ``end``
closes the iteration. A GRPO group (the ``group_size`` episodes of one seed, all on this rank) is put into
the trajectories stream as a ``GroupSample`` the moment its last episode ends, so the actor trains on it
while the long episodes of other groups still run.
Observation tokens are in the response but out of the loss (``action_mask``); the return is the sum of
the turn rewards. When the plan fuses ``env`` into ``rollout`` this worker hosts the environments too
(``TextEnvs``): the flow then calls them as ``env/<method>`` on this group, or, when every episode's
environment is here (one rollout rank), plays the whole iteration with one call (``play_iteration``: the
turn loop of ``turn_loop.py`` run in this process, with this worker as its policy side).
"""

from __future__ import annotations

from collections import defaultdict, deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import NamedTuple
import torch

from m2flow.backends.generation import GenerationOptions, create_generation_backend
from m2flow.data.batch import RolloutBatch
from m2flow.envs.text.batch import EnvStep
from m2flow.models.tokenizer import load_tokenizer
from m2flow.runtime.trace import trace_category
from m2flow.workers.agentic.env_worker import EnvSettings, EnvsInProcess, TextEnvs
from m2flow.workers.agentic.episode import EpisodeConfig, held_out_metrics
from m2flow.workers.agentic.partial_episodes import PartialEpisodes
from m2flow.workers.agentic.trajectory import Trajectory, to_rollout_batch
from m2flow.workers.agentic.turn_loop import Rounds, play_turns
from m2flow.workers.agentic.turns import EpisodeSpec, EpisodeStats, TurnEngine
from m2flow.workers.common import ReasoningWorker, derive_seed, state_digest
from m2flow.workers.messages import GroupSample
from m2flow.runtime.streams import GroupStream


EMITTED_LOG = 1 << 16


@dataclass(frozen=True, kw_only=True)
class AgenticRolloutSettings:
    """An agentic rollout rank: the model and backend it plays with, how episodes are played, where groups go."""

    model_path: str
    backend: str
    dtype: str
    episode: EpisodeConfig
    trajectories: GroupStream
    """where finished groups go (the actor's stream)"""
    seed: int = 0
    compile: bool = False
    """run the lean backend's decoding steps ``torch.compile``d"""
    shares_devices: bool = False
    offload: bool = False
    partial: bool = False
    """partial rollouts (``partial_episodes.py``): an iteration hands out the groups that finish first, the
    episodes still running go on in the next (``begin_partial`` .. ``end_partial``, or ``play_iteration``)"""
    max_staleness: int = 0
    """partial: the bound on every trained model token's age (a held group with an older one starts over)"""


def empty_batch(pad_id: int) -> RolloutBatch:
    """A batch of no rows (a group whose every episode failed before the model spoke)."""
    z = torch.zeros((0, 1), dtype=torch.long)
    return RolloutBatch(prompt_ids=z, prompt_mask=z, response_ids=z, response_mask=z,
                        group_ids=torch.zeros(0, dtype=torch.long), truncated=torch.zeros(0, dtype=torch.bool),
                        pad_id=pad_id, action_mask=z, rewards=torch.zeros(0),
                        rollout_logprobs=torch.zeros((0, 1)))


def group_sample(step: int, slot: int, trajs: Sequence[Trajectory], pad_id: int, version: int,
                 per_token_versions: bool = False) -> GroupSample:
    """The finished episodes of one group as the actor's message; dropped when none holds a model token.
    ``per_token_versions`` (partial rollouts): each token keeps its own version, and the group is as old as
    its oldest model token (what the actor's staleness bound checks)."""
    live = [t for t in trajs if t.model_tokens > 0]
    batch = to_rollout_batch(live, pad_id, per_token_versions) if live else empty_batch(pad_id)
    if per_token_versions and live:
        version = min(v for t in live for v in t.model_versions)
    return GroupSample(step, slot, trajs[0].seed, None, ["".join(t.turn_texts) for t in live], batch,
                       dropped=not live, version=version)


class SpecRows(NamedTuple):
    """The held episodes an iteration of partial rollouts opens with, as rows [traj id, slot, seed, env rank]."""

    reset: list[list[int]]
    """not started: reset them"""
    running: list[list[int]]
    """mid-episode: they go on"""


class AgenticRolloutWorker(ReasoningWorker):
    """Plays the model's turns of this rank's episodes; sends each finished group to the actor."""

    def __init__(self, *, settings: AgenticRolloutSettings, hosted: Mapping[str, EnvSettings] | None = None) -> None:
        cfg = settings
        self.cfg, self.seed = cfg, cfg.seed
        self.shares_devices, self.offloads = cfg.shares_devices, cfg.offload
        self.out = cfg.trajectories
        self.tokenizer = load_tokenizer(cfg.model_path)
        options = GenerationOptions(device=self.torch_device, dtype=cfg.dtype, seed=cfg.seed, compile=cfg.compile)
        self.backend = create_generation_backend(cfg.backend, cfg.model_path, options)
        self.policy_version = 0
        self.engine: TurnEngine | None = None
        self.step = -1
        self.emitted: deque[int] = deque(maxlen=EMITTED_LOG)
        """Ids of the trajectories sent to the actor, the latest ``EMITTED_LOG`` (each once: checked by tests)."""
        self.partial = PartialEpisodes(cfg.max_staleness) if cfg.partial else None
        """With ``settings.partial``: the groups held across iterations."""
        self.handed: deque[tuple[int, int, int, tuple[int, ...]]] = deque(maxlen=EMITTED_LOG)
        """Partial rollouts: the groups handed out, the latest ``EMITTED_LOG``: (iteration, slot, seed, the policy
        versions of its model tokens)."""
        self.host_components(hosted)  # the environments, when the plan fuses env into rollout

    # -- one iteration ---------------------------------------------------------------------
    def begin(self, step: int, specs: Sequence[EpisodeSpec]) -> None:
        """Take this rank's episodes of iteration ``step``."""
        self.step = step
        self.engine = TurnEngine(self.cfg.episode, self.tokenizer, specs)
        self.engine.version = self.policy_version
        self._groups: dict[int, list[int]] = defaultdict(list)
        for s in specs:
            self._groups[s.slot].append(s.traj_id)
        self._sent: set[int] = set()

    def start_episodes(self, first: Mapping[int, EnvStep]) -> list[int]:
        """Start episodes from their first observations; the ids of those that ended at once."""
        assert self.engine is not None
        return self._send(self.engine.begin(first))

    @trace_category("generate")
    def play_turn(self, round_: int) -> tuple[dict[int, str], list[int]]:
        """One model turn of every running episode: (the actions by trajectory id, the ids of episodes the
        token budget ended)."""
        assert self.engine is not None
        with self.device_turn():
            actions, cut = self.engine.turn(self.backend, derive_seed(self.seed, self.step, self.rank, round_),
                                            seed_base=self.seed)
        return actions, self._send(cut)

    def play_iteration(self, step: int, specs: Sequence[EpisodeSpec], where: str = "",
                       weights: tuple[str, int, int] | None = None, quota: int | None = None) -> dict[str, float]:
        """Every episode of ``specs`` to its end with the environments hosted in this process (env fused into
        the rollout, every episode's environment here): the turn loop runs here, this worker its policy side,
        without a message between rounds. ``weights`` (source group, rank, version): receive them first, as
        ``receive_weights`` would (one message less). With partial rollouts, ``specs`` are the new groups'
        episodes besides those held, and the loop stops once ``quota`` groups (None: as many as ``specs``
        holds) were handed out. The rollout and env metrics of the iteration."""
        envs = self.hosted("env")
        if envs is None:
            raise RuntimeError("play_iteration needs the environments hosted in this process (env fused into rollout)")
        if weights is not None:
            self.receive_weights(*weights)
        if self.partial is not None:
            rounds, metrics = self._play_partial(step, specs, envs, range(quota if quota is not None else len(
                {s.slot for s in specs})))
        else:
            self.begin(step, specs)
            rounds = play_turns(self, EnvsInProcess(envs, {s.traj_id: s.seed for s in specs}),
                                [s.traj_id for s in specs])
            metrics = self.end()
        metrics.update(envs.env_stats(where))
        metrics.update(rounds.metrics())
        return metrics

    def _play_partial(self, step: int, specs: Sequence[EpisodeSpec], envs: TextEnvs,
                      quota: Sequence[int]) -> tuple[Rounds, dict[str, float]]:
        """Partial rollouts (``partial_episodes.py``) with the environments here: the held episodes and ``specs``
        until the ``quota`` slots are filled; the episodes still running stay as they are, here and in ``envs``."""
        opening = self.begin_partial(step, specs, quota)
        seeds = {row[0]: row[2] for row in [*opening.reset, *opening.running]}
        rounds = play_turns(self, EnvsInProcess(envs, seeds, keep_running=True), [row[0] for row in opening.reset],
                            running=[row[0] for row in opening.running], until=self.quota_met)
        return rounds, self.end_partial()

    def begin_partial(self, step: int, specs: Sequence[EpisodeSpec], quota: Sequence[int]) -> SpecRows:
        """Partial rollouts: open iteration ``step`` with the new episodes ``specs``, owing a group for each slot
        of ``quota``; hands out the groups that finished past the last quota. The held episodes to reset and
        those that go on, as rows [traj id, slot, seed, env rank] (``PartialEpisodes.state``)."""
        if self.partial is None:
            raise RuntimeError("begin_partial on a rollout without partial rollouts")
        if self.engine is None:
            self.engine = TurnEngine(self.cfg.episode, self.tokenizer, [])
        engine, self.step = self.engine, step
        engine.new_weights(self.policy_version)
        opening = self.partial.begin(step, engine, specs, quota)
        self._handed_now: list[tuple[int, int, list[int]]] = []
        self._hand_out()  # groups that finished past the last quota: they finished first

        def rows(ids: Sequence[int]) -> list[list[int]]:
            return [[t, s.slot, s.seed, s.env_rank] for t in ids for s in (engine.episodes[t].spec,)]

        return SpecRows(rows(opening.reset), rows(opening.running))

    def quota_met(self) -> bool:
        """Partial rollouts: whether this iteration's quota is filled (the turn loop may stop)."""
        return self.partial is not None and self.partial.met()

    def end_partial(self) -> dict[str, float]:
        """Partial rollouts: close the iteration (its quota filled); the metrics of the groups it handed out."""
        assert self.partial is not None and self.engine is not None
        engine = self.engine
        engine.drop_caches()  # the devices may serve other components until the carried episodes go on
        counts = self.partial.close()
        ids = [t for _, _, ids in self._handed_now for t in ids]
        trajs = [engine.trajectory(t) for t in ids]
        metrics = self._metrics(engine.close_some(ids), trajs) | counts.metrics()
        metrics.pop("rollout/inflight_updates_count")  # weights change between iterations only here
        engine.reruns = 0
        return metrics

    def _hand_out(self) -> None:
        """Send the finished groups that fill the quota's free slots (partial rollouts)."""
        assert self.partial is not None and self.engine is not None
        sent = []
        for instance, slot, ids in self.partial.hand_out():
            trajs = [self.engine.trajectory(t) for t in ids]
            sample = group_sample(self.step, slot, trajs, self.backend.pad_id, self.policy_version,
                                  per_token_versions=True)
            sent.append(sample)
            self._handed_now.append((instance, slot, ids))
            self.emitted.extend(ids)
            self.handed.append((self.step, slot, trajs[0].seed,
                                tuple(sorted({v for t in trajs for v in t.model_versions}))))
        if sent:
            self.out.put_many(sent)

    def observe(self, results: Mapping[int, EnvStep]) -> list[int]:
        """Record the environments' answers; the ids of the episodes that ended."""
        assert self.engine is not None
        return self._send(self.engine.observe(results))

    def rerun(self, traj_ids: Sequence[int]) -> None:
        """Start these episodes over (their env worker was lost)."""
        assert self.engine is not None
        self.engine.rerun(traj_ids)

    def running(self) -> int:
        """Episodes of this rank still going on (started and not ended)."""
        return len(self.engine.running()) if self.engine is not None else 0

    def end(self) -> dict[str, float]:
        """The iteration's rollout metrics (every episode has ended, every group was sent)."""
        assert self.engine is not None
        stats = self.engine.close()
        if len(self._sent) != len(self._groups):
            raise RuntimeError(f"rollout rank {self.rank}: {len(self._groups) - len(self._sent)} group(s) never sent")
        trajs = [self.engine.trajectory(t) for ids in self._groups.values() for t in ids]
        out = self._metrics(stats, trajs)
        self.engine = None
        return out

    def _metrics(self, stats: EpisodeStats, trajs: Sequence[Trajectory]) -> dict[str, float]:
        """The rollout metrics of the episodes an iteration sent (``trajs``, their ``stats``)."""
        assert self.engine is not None
        out = stats.as_metrics()
        returns = [t.reward for t in trajs]
        out["reward/mean"] = sum(returns) / max(1, len(returns))
        out["reward/success"] = sum(t.finish_reason == "terminated" and t.reward > 0 for t in trajs) / max(1, len(trajs))
        out["rollout/reruns"] = float(self.engine.reruns)
        out["rollout/responses_count"] = float(len(trajs))
        out["rollout/tokens_count"] = float(stats.model_tokens + stats.observation_tokens)
        return out

    def _send(self, ended: Sequence[int]) -> list[int]:
        """Put every group whose last episode is among ``ended`` (all its episodes done) into the stream;
        returns ``ended``."""
        assert self.engine is not None
        if self.partial is not None:  # a finished group takes a slot of the quota, or waits for the next
            for instance in sorted({self.engine.episodes[t].spec.slot for t in ended}):
                if instance in self.partial.groups and all(self.engine.done(t) for t in self.partial.groups[instance]):
                    self.partial.complete(instance)
            self._hand_out()
            return list(ended)
        sent = []
        for slot in sorted({self.engine.episodes[t].spec.slot for t in ended}):
            ids = self._groups[slot]
            if slot in self._sent or not all(self.engine.done(t) for t in ids):
                continue
            trajs = [self.engine.trajectory(t) for t in ids]
            sent.append(group_sample(self.step, slot, trajs, self.backend.pad_id, self.policy_version))
            self._sent.add(slot)
            self.emitted.extend(ids)
        if sent:
            self.out.put_many(sent)
        return list(ended)

    def emitted_ids(self) -> list[int]:
        return list(self.emitted)

    def handed_groups(self) -> list[tuple[int, int, int, tuple[int, ...]]]:
        """Partial rollouts: the groups handed out, (iteration, slot, seed, versions of its model tokens)."""
        return list(self.handed)

    def partial_state(self) -> list[list[int]]:
        """Partial rollouts: the task instances held, as a checkpoint keeps them (``PartialEpisodes.state``)."""
        if self.partial is None or self.engine is None:
            return []
        return self.partial.state(self.engine)

    def restore_partial(self, state: list[list[int]]) -> None:
        """Hold the task instances a checkpoint kept; the next iteration plays them from their resets."""
        if self.partial is None:
            raise RuntimeError("carried episodes given to a rollout without partial rollouts")
        if self.engine is None:
            self.engine = TurnEngine(self.cfg.episode, self.tokenizer, [])
        self.partial.restore(self.engine, state)

    def carried_seeds(self) -> list[int]:
        """Partial rollouts: the seeds of the task instances held (each once)."""
        if self.partial is None or self.engine is None:
            return []
        return [self.engine.episodes[ids[0]].spec.seed for ids in self.partial.groups.values()]

    # -- evaluation --------------------------------------------------------------------------
    def evaluate(self, env: EnvSettings, seeds: Sequence[int], temperature: float = 0.0) -> dict[str, float]:
        """Episodes on held-out environments (greedy at temperature 0): mean return, success rate, turns."""
        from dataclasses import replace

        cfg = replace(self.cfg.episode, temperature=temperature, seed=self.seed)
        with self.device_turn():
            return held_out_metrics(self.backend, self.tokenizer, env, seeds, cfg)

    # -- weights -----------------------------------------------------------------------------
    def offload(self) -> None:
        self.backend.offload()
        self._offloaded = True

    def onload(self) -> None:
        if getattr(self, "_offloaded", False):  # waking an engine that never slept is not free (vLLM)
            self.backend.onload()
            self._offloaded = False

    @trace_category("weight_sync")
    def receive_weights(self, src_group: str, src_rank: int = 0, version: int | None = None) -> int:
        """Load the policy weights streamed by the actor; ``version`` (iterations trained) marks the groups
        generated from them."""
        if version is not None:
            self.policy_version = version
        module = self.backend.module
        if module is not None:
            return self.receive_weights_into(module, src_group, src_rank)
        from m2flow.runtime.comm import recv_weights

        weights = recv_weights(self.comm, src_group, src_rank)
        self.backend.load_weights(weights)
        return len(weights)

    def weights_digest(self) -> str:
        module = self.backend.module
        if module is None:
            raise NotImplementedError(f"backend {self.cfg.backend!r} does not expose its weights")
        return state_digest(module.state_dict())
