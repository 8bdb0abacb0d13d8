"""Behaviour cloning of a token policy: cross-entropy on the binned action tokens of demonstrations.

The warm start the VLA systems run before RL (OpenVLA fine-tuning is the same loss on its action
tokens). Images are augmented with random shifts (pad by ``shift`` pixels, crop back at a random
offset; DrQ, Kostrikov et al. 2020), which matters with a few hundred episodes.

A policy of action chunks (``VLAConfig.chunk`` K > 1) learns from each demo frame the expert's next K
actions (``chunk_targets``), all 4K tokens scored as the actor's update scores them (``VLAPolicy.scored``:
one pass, the expert's tokens fed in when decoding is autoregressive).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

from m2flow.config import option
from m2flow.models.vla import VLAPolicy

logger = logging.getLogger(__name__)


@dataclass
class BCConfig:
    """Behaviour-cloning settings."""

    epochs: int = option(10, "passes over the demonstrations")
    batch_size: int = option(128, "samples per gradient step")
    lr: float = option(3e-4, "AdamW learning rate (cosine-decayed to 10% over the run)")
    weight_decay: float = option(0.01, "AdamW weight decay")
    grad_clip: float = option(1.0, "gradient norm clip")
    shift: int = option(4, "random-shift augmentation in pixels (0: off)")
    standardize_proprio: bool = option(
        True, "standardise the policy's proprioception by the demonstrations' mean and standard deviation "
        "(kept with its weights); off: read unscaled, as before, and a policy cloned from one task's "
        "demonstrations learns one action distribution for every frame")
    seed: int = option(0, "seed of the shuffling and the augmentation")

    def validate(self) -> None:
        """Raise ValueError naming the field for impossible values."""
        for name in ("epochs", "batch_size"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name}: must be >= 1, got {getattr(self, name)}")
        if self.lr <= 0:
            raise ValueError(f"lr: must be > 0, got {self.lr}")
        if self.shift < 0:
            raise ValueError(f"shift: must be >= 0, got {self.shift}")


@dataclass
class BCProgress:
    """What the progress callback sees after each epoch."""

    epoch: int
    steps: int
    loss: float
    """Mean cross-entropy per action token over the epoch."""
    token_accuracy: float
    """Fraction of action tokens whose most likely bin is the expert's."""


def random_shift(images: Tensor, pad: int, generator: torch.Generator) -> Tensor:
    """(B, H, W, C) uint8 images shifted by up to ``pad`` pixels each way (edge pixels repeat)."""
    b, h, w, _ = images.shape
    x = F.pad(images.permute(0, 3, 1, 2).float(), (pad, pad, pad, pad), mode="replicate")
    dy = torch.randint(0, 2 * pad + 1, (b,), generator=generator)
    dx = torch.randint(0, 2 * pad + 1, (b,), generator=generator)
    rows = (dy[:, None] + torch.arange(h)[None]).view(b, 1, h, 1).expand(b, x.shape[1], h, w + 2 * pad)
    x = x.gather(2, rows)
    cols = (dx[:, None] + torch.arange(w)[None]).view(b, 1, 1, w).expand(b, x.shape[1], h, w)
    return x.gather(3, cols).permute(0, 2, 3, 1).to(torch.uint8)


def chunk_targets(actions: np.ndarray, episode: np.ndarray, chunk: int) -> np.ndarray:
    """(N, A) actions of episodes stored one after another -> (N, chunk, A): each step's action and the
    expert's next ``chunk - 1``, the episode's last action repeated past its end.

    An episode is a run of equal ``episode`` ids. Repeating rather than dropping the last ``chunk - 1``
    frames of each episode keeps the frames nearest the goal (the final grasp or press), and the repeats
    are never executed: an episode that ends inside a chunk ends the chunk (``EnvGroup.step_chunk``).
    """
    n = len(actions)
    if episode.shape != (n,):
        raise ValueError(f"episode must be (N={n},), got {episode.shape}")
    new_run = np.r_[False, episode[1:] != episode[:-1]]
    run = np.cumsum(new_run)
    last = np.r_[np.flatnonzero(new_run) - 1, n - 1]  # each run's last row
    rows = np.minimum(np.arange(n)[:, None] + np.arange(chunk)[None, :], last[run][:, None])
    return actions[rows]


def behaviour_clone(
    policy: VLAPolicy,
    obs: np.ndarray,
    actions: np.ndarray,
    config: BCConfig | None = None,
    progress: Callable[[BCProgress], None] | None = None,
    episode: np.ndarray | None = None,
) -> list[BCProgress]:
    """Train ``policy`` on packed observations (N, size) uint8 and actions (N, A); one record per epoch.

    ``episode`` (N,): each step's episode, needed when the policy emits chunks (``policy.chunk > 1``) to
    know where each step's next actions end (:func:`chunk_targets`); unused otherwise."""
    config = config if config is not None else BCConfig()
    config.validate()
    if len(obs) != len(actions) or len(obs) == 0:
        raise ValueError(f"obs and actions must be non-empty and of equal length, got {len(obs)} and {len(actions)}")
    if policy.chunk > 1:
        if episode is None:
            raise ValueError(f"a policy of chunk {policy.chunk} needs each step's episode to build its targets")
        actions = chunk_targets(np.asarray(actions), np.asarray(episode), policy.chunk).reshape(len(obs), -1)
    generator = torch.Generator().manual_seed(config.seed)
    obs_t = torch.from_numpy(np.ascontiguousarray(obs))
    if config.standardize_proprio and policy.proprio is not None:
        policy.set_proprio_stats(policy.layout.unpack_torch(obs_t)[2])
    tokens = policy.bins.to_tokens(torch.as_tensor(actions, dtype=torch.float32))  # [N, K * A]
    layout = policy.layout
    steps_per_epoch = -(-len(obs) // config.batch_size)
    total = config.epochs * steps_per_epoch
    optimizer = torch.optim.AdamW(policy.parameters(), lr=config.lr, weight_decay=config.weight_decay)
    schedule = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda step: 0.1 + 0.9 * 0.5 * (1.0 + np.cos(np.pi * min(step, total) / total))
    )
    policy.train()
    history, step = [], 0
    for epoch in range(config.epochs):
        order = torch.randperm(len(obs), generator=generator)
        loss_sum, hits, count = 0.0, 0, 0
        for start in range(0, len(obs), config.batch_size):
            idx = order[start : start + config.batch_size]
            batch = obs_t[idx]
            if config.shift:
                batch = batch.clone()
                images = batch[:, : layout.image_bytes].view(-1, layout.height, layout.width, layout.channels)
                batch[:, : layout.image_bytes] = random_shift(images, config.shift, generator).reshape(len(idx), -1)
            target = tokens[idx]
            logits, _ = policy.scored(batch, target)
            loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), target.reshape(-1))
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(policy.parameters(), config.grad_clip)
            optimizer.step()
            schedule.step()
            step += 1
            loss_sum += loss.item() * target.numel()
            hits += int((logits.argmax(-1) == target).sum())
            count += target.numel()
        record = BCProgress(epoch + 1, step, loss_sum / count, hits / count)
        history.append(record)
        logger.info("bc epoch %d: loss %.4f, token accuracy %.3f", record.epoch, record.loss, record.token_accuracy)
        if progress is not None:
            progress(record)
    policy.eval()
    return history
