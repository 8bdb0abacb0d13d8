"""A small vision-language-action policy: image, instruction and proprio in, action tokens out.

Layout (sizes at the defaults, ~1M parameters):

- image encoder: a conv stem (64x64x3 -> 4x4 grid of ``dim`` channels) whose grid cells are the
  image tokens, plus learned position embeddings;
- instruction: word ids (``m2flow.envs.instructions``) embedded, with position embeddings;
  padding is masked out of attention;
- proprio: one token from a linear map of the proprio vector;
- ``S = chunk * A`` learned action query slots (a chunk of ``chunk`` actions of ``A`` dimensions
  each) and one value query; a pre-norm transformer encoder runs over
  ``[image | instruction | proprio | action slots | value query]``;
- action head: each action slot's output -> ``num_bins`` logits (one shared linear layer);
- value head: the value query's output -> V(s), for PPO.

Decoding (``VLAConfig.decoding``):

- ``parallel`` (the default): every slot attends to every position, so all ``S`` tokens come from
  one forward pass and are independent given the observation (as OpenVLA-OFT);
- ``autoregressive``: slot j also reads the embedding of token j - 1 and attends to the prompt and
  slots <= j only (the prompt and the value query do not see the slots), so token j is conditioned
  on tokens < j. Sampling takes ``S`` forward passes; scoring given tokens (the update) one, with
  the sampled tokens fed in (teacher forcing), which gives the same log-probs.

Either way the log-probability of a decision is the sum of its ``S`` token log-probabilities.

The policy reads packed uint8 observations (:class:`~m2flow.envs.packed.PackedLayout`) and
implements the embodied ``Policy`` interface (``act``/``evaluate``/``value``) over continuous
actions, the bin centres of its tokens (:mod:`m2flow.models.action_tokens`): (B, A) with
``chunk == 1``, (B, chunk, A) otherwise. Token-level losses use ``token_outputs``, whose (B, S)
log-probs feed the registered losses of ``m2flow.algorithms``.
"""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path
from typing import NamedTuple

import gymnasium as gym
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from m2flow.envs.instructions import PAD_ID, WordTokenizer
from m2flow.envs.packed import PackedLayout
from m2flow.models.action_tokens import ActionBins
from m2flow.models.policy_config import VLAConfig
from m2flow.models.policy_types import ActOutput, EvalOutput


class TokenOutput(NamedTuple):
    logprobs: Tensor
    """(B, S): log-probability of each action token (S = chunk * A)."""
    entropy: Tensor
    """(B, S): entropy of each token's distribution (given the tokens before it, when autoregressive)."""
    values: Tensor
    """(B,): critic estimate of each observation."""


class ConvStem(nn.Module):
    """Images (B, H, W, 3) uint8 -> tokens (B, grid * grid, dim)."""

    def __init__(self, channels: list[int], dim: int, grid: int) -> None:
        super().__init__()
        layers: list[nn.Module] = []
        in_ch = 3
        for out_ch in channels:
            layers += [nn.Conv2d(in_ch, out_ch, 3, stride=2, padding=1), nn.GELU()]
            in_ch = out_ch
        layers += [nn.AdaptiveAvgPool2d(grid), nn.Conv2d(in_ch, dim, 1)]
        self.net = nn.Sequential(*layers)

    def forward(self, images: Tensor) -> Tensor:
        x = images.permute(0, 3, 1, 2).float() * (1.0 / 255.0) - 0.5  # [B, H, W, C] -> [B, C, H, W]
        return self.net(x).flatten(2).transpose(1, 2)  # [B, dim, g, g] -> [B, g * g, dim]


class VLAPolicy(nn.Module):
    """Packed observations (B, size) uint8 -> action-token logits for a chunk of actions, and a value."""

    def __init__(self, config: VLAConfig, action_dim: int) -> None:
        super().__init__()
        config.validate()
        self.config = config
        self.layout = config.layout()
        self.action_dim = action_dim
        self.chunk = config.chunk
        self.slots = config.chunk * action_dim
        self.autoregressive = config.decoding == "autoregressive"
        self.bins = ActionBins(config.num_bins, config.action_low, config.action_high)
        vocab = config.vocab_size or WordTokenizer.versioned().vocab_size
        dim, n_img = config.dim, config.grid * config.grid
        self.stem = ConvStem(config.stem_channels, dim, config.grid)
        self.image_pos = nn.Parameter(torch.zeros(1, n_img, dim))
        self.word = nn.Embedding(vocab, dim, padding_idx=PAD_ID)
        self.text_pos = nn.Parameter(torch.zeros(1, config.text_len, dim))
        self.proprio = nn.Linear(config.proprio_dim, dim) if config.proprio_dim else None
        # Proprioception is standardised before its token (``set_proprio_stats``; identity until set): the
        # arm moves a few centimetres within a task, and unscaled, those differences are too small for the
        # cloning's gradients to find, so the policy learns one action distribution for every frame.
        self.register_buffer("proprio_mean", torch.zeros(config.proprio_dim))
        self.register_buffer("proprio_std", torch.ones(config.proprio_dim))
        self.queries = nn.Parameter(torch.zeros(1, self.slots + 1, dim))  # S action slots, then the value query
        layer = nn.TransformerEncoderLayer(
            dim, config.heads, config.mlp_ratio * dim, dropout=0.0, activation="gelu", batch_first=True, norm_first=True
        )
        self.encoder = nn.TransformerEncoder(layer, config.depth, norm=nn.LayerNorm(dim), enable_nested_tensor=False)
        self.action_head = nn.Linear(dim, config.num_bins)
        self.value_head = nn.Linear(dim, 1)
        for p in (self.image_pos, self.text_pos, self.queries):
            nn.init.normal_(p, std=0.02)
        nn.init.normal_(self.action_head.weight, std=0.01)  # start near the uniform token distribution
        nn.init.zeros_(self.action_head.bias)
        # Autoregressive only (made last, so the parallel policy's parameters and their initial draws are
        # those of a policy without it): the previous token's embedding, id num_bins before the first slot.
        self.token_embed = nn.Embedding(config.num_bins + 1, dim) if self.autoregressive else None
        if self.token_embed is not None:
            nn.init.normal_(self.token_embed.weight, std=0.02)

    def upgrade_state(self, state: dict[str, Tensor]) -> dict[str, Tensor]:
        """``state`` with a word embedding of an older, shorter vocabulary padded to this policy's rows.

        The vocabulary is append-only (``m2flow.envs.instructions``): an old policy's rows keep their ids,
        and the words added since take this policy's own initial rows. Any other mismatch is left as is.
        """
        state = self._with_proprio_stats(state)
        key = "word.weight"
        old, own = state.get(key), self.word.weight
        if old is None or old.ndim != 2 or old.shape[1] != own.shape[1] or old.shape[0] >= own.shape[0]:
            return state
        padded = own.detach().clone().to(old.dtype)
        padded[: old.shape[0]] = old
        return {**state, key: padded}

    def _with_proprio_stats(self, state: dict[str, Tensor]) -> dict[str, Tensor]:
        """A state of a policy from before proprioception was standardised reads it unscaled, as it did."""
        if "word.weight" not in state or "proprio_mean" in state:
            return state
        return {**state, "proprio_mean": torch.zeros_like(self.proprio_mean),
                "proprio_std": torch.ones_like(self.proprio_std)}

    @torch.no_grad()
    def set_proprio_stats(self, proprio: Tensor, min_std: float = 1e-3) -> None:
        """Standardise proprioception by the mean and standard deviation of ``proprio`` (N, proprio_dim), e.g.
        the demonstrations' (behaviour cloning sets them); a dimension that hardly varies (std below
        ``min_std``) is only centred. Saved and synced with the weights (buffers of the state dict)."""
        proprio = torch.as_tensor(proprio, dtype=torch.float32)
        if proprio.ndim != 2 or proprio.shape[1] != self.proprio_mean.shape[0] or len(proprio) < 2:
            raise ValueError(f"proprio stats need (N >= 2, {self.proprio_mean.shape[0]}) values, got "
                             f"{tuple(proprio.shape)}")
        std = proprio.std(0)
        self.proprio_mean.copy_(proprio.mean(0))
        self.proprio_std.copy_(torch.where(std < min_std, torch.ones_like(std), std))

    def load_state_dict(self, state_dict, strict: bool = True, assign: bool = False):  # type: ignore[override]
        """``nn.Module.load_state_dict`` after :meth:`upgrade_state` (a checkpoint of an older vocabulary loads)."""
        return super().load_state_dict(self.upgrade_state(dict(state_dict)), strict=strict, assign=assign)

    def forward(self, obs: Tensor, tokens: Tensor | None = None) -> tuple[Tensor, Tensor]:
        """(B, size) uint8 -> action-token logits (B, S, num_bins), values (B,).

        ``tokens`` (B, S): autoregressive decoding only, the tokens fed to the slots after them (slot j
        reads token j - 1; only tokens before a slot change its logits); None: none known yet."""
        images, ids, proprio = self.layout.unpack_torch(torch.as_tensor(obs))
        b = images.shape[0]
        ids, text_pos = self._trim_padding(ids)
        parts = [self.stem(images) + self.image_pos, self.word(ids) + text_pos]
        pad = [torch.zeros(b, parts[0].shape[1], dtype=torch.bool, device=images.device), ids == PAD_ID]
        if self.proprio is not None:
            parts.append(self.proprio((proprio - self.proprio_mean) / self.proprio_std).unsqueeze(1))
            pad.append(pad[0][:, :1])
        prefix = sum(p.shape[1] for p in parts)
        queries = self.queries.expand(b, -1, -1)
        mask = None
        if self.token_embed is not None:
            queries = queries + self._previous_tokens(tokens, b, images.device)
            mask = self._causal_mask(prefix, images.device)
        parts.append(queries)
        pad.append(torch.zeros(b, self.queries.shape[1], dtype=torch.bool, device=images.device))
        key_pad = torch.cat(pad, dim=1)
        # No padded key left (one task's instruction, its padding cut above): no mask, the same outputs.
        out = self._encode(torch.cat(parts, dim=1), mask, key_pad if bool(key_pad.any()) else None)
        return self.action_head(out[:, :-1]), self.value_head(out[:, -1]).squeeze(-1)

    def _encode(self, x: Tensor, mask: Tensor | None, key_pad: Tensor | None) -> Tensor:
        """Sequence (B, L, dim) -> the final-normed outputs of the S + 1 query slots (B, S + 1, dim).

        The encoder's layers, the last one computed for the query rows alone: nothing reads the other
        rows' outputs of the last layer, and skipping them saves that layer's MLP and attention for ~80%
        of the sequence. The last layer is the pre-norm ``nn.TransformerEncoderLayer`` written out
        (its dropout is 0, so its dropout modules are the identity)."""
        q = self.queries.shape[1]
        *layers, last = self.encoder.layers
        for layer in layers:
            x = layer(x, src_mask=mask, src_key_padding_mask=key_pad)
        h = last.norm1(x)
        rows_mask = None if mask is None else mask[-q:]  # [q, L]: the query rows of the attention mask
        attn = last.self_attn(h[:, -q:], h, h, attn_mask=rows_mask, key_padding_mask=key_pad, need_weights=False)[0]
        y = x[:, -q:] + attn
        y = y + last.linear2(last.activation(last.linear1(last.norm2(y))))
        return self.encoder.norm(y)

    def _previous_tokens(self, tokens: Tensor | None, b: int, device: torch.device) -> Tensor:
        """(B, S + 1, dim): slot j's embedding of token j - 1 (the start id for slot 0), zeros on the value query."""
        start = self.config.num_bins
        prev = torch.full((b, self.slots), start, dtype=torch.long, device=device)
        if tokens is not None:
            prev[:, 1:] = tokens[:, :-1].long()
        emb = self.token_embed(prev)
        return torch.cat([emb, emb.new_zeros(b, 1, emb.shape[-1])], dim=1)

    def _causal_mask(self, prefix: int, device: torch.device) -> Tensor:
        """(L, L) bool, True where attention is blocked: the prompt and the value query see the prompt (and
        themselves) only, action slot j the prompt and slots <= j; so no output depends on a later token."""
        n = prefix + self.slots + 1
        blocked = torch.zeros(n, n, dtype=torch.bool, device=device)
        slots = slice(prefix, prefix + self.slots)
        blocked[:prefix, prefix:] = True  # the prompt never reads a token
        blocked[slots, slots] = torch.ones(self.slots, self.slots, dtype=torch.bool, device=device).triu(1)
        blocked[-1, prefix:-1] = True  # V(s): the value query reads no token either
        return blocked

    def _trim_padding(self, ids: Tensor) -> tuple[Tensor, Tensor]:
        """Drop the instruction columns that are padding in every row: no query attends to a padded key, so
        the outputs are the same and the transformer's sequence is shorter (instructions are ~4-10 of 16)."""
        used = (ids != PAD_ID).any(0).nonzero()
        width = int(used[-1]) + 1 if used.numel() else 1
        return ids[:, :width], self.text_pos[:, :width]

    def scored(self, obs: Tensor, tokens: Tensor) -> tuple[Tensor, Tensor]:
        """(B, size), given tokens (B, S) -> the logits each token is scored under (B, S, num_bins), values (B,).

        One forward pass in either decoding (autoregressive: the tokens are fed in, teacher forcing). The
        actor's update (``token_outputs``) and behaviour cloning both score tokens this way, so the
        distribution cloning trains is the one PPO's ratios are taken under."""
        return self(obs, tokens if self.autoregressive else None)

    def token_outputs(self, obs: Tensor, tokens: Tensor) -> TokenOutput:
        """(B, size), tokens (B, S) -> per-token log-probs (B, S), entropies (B, S), values (B,); one forward
        pass in either decoding (autoregressive: the tokens are fed in, teacher forcing)."""
        logits, values = self.scored(obs, tokens)
        log_p = F.log_softmax(logits.float(), dim=-1)
        logprobs = log_p.gather(-1, tokens.long().unsqueeze(-1)).squeeze(-1)
        entropy = -(log_p.exp() * log_p).sum(-1)
        return TokenOutput(logprobs, entropy, values)

    @torch.no_grad()
    def act_tokens(
        self, obs: Tensor, deterministic: bool = False, generator: torch.Generator | None = None
    ) -> tuple[Tensor, Tensor, Tensor]:
        """(B, size) -> sampled (or most likely) tokens (B, S), their log-probs (B, S), values (B,).

        Parallel decoding: one forward pass. Autoregressive: one per token, token j drawn given tokens < j."""
        if not self.autoregressive:
            logits, values = self(obs)
            return (*self._draw(logits, deterministic, generator), values)
        b = torch.as_tensor(obs).shape[0]
        tokens = torch.zeros(b, self.slots, dtype=torch.long, device=self.queries.device)
        logprobs = torch.zeros(b, self.slots, device=self.queries.device)
        for j in range(self.slots):  # slot j reads tokens < j only: what is still unset there does not matter
            logits, values = self(obs, tokens)
            token, logprob = self._draw(logits[:, j : j + 1], deterministic, generator)
            tokens[:, j], logprobs[:, j] = token[:, 0], logprob[:, 0]
        return tokens, logprobs, values

    @staticmethod
    def _draw(logits: Tensor, deterministic: bool, generator: torch.Generator | None) -> tuple[Tensor, Tensor]:
        """Logits (B, n, bins) -> tokens (B, n) sampled (or most likely) and their log-probs (B, n)."""
        log_p = F.log_softmax(logits.float(), dim=-1)
        if deterministic:
            tokens = log_p.argmax(-1)
        else:
            probs = log_p.exp().reshape(-1, log_p.shape[-1])
            tokens = torch.multinomial(probs, 1, generator=generator).reshape(log_p.shape[:-1])
        return tokens, log_p.gather(-1, tokens.unsqueeze(-1)).squeeze(-1)

    # ------------------------------------------------------------- the embodied Policy interface

    @torch.no_grad()
    def act(self, obs: Tensor, deterministic: bool = False, generator: torch.Generator | None = None) -> ActOutput:
        """(B, size) -> continuous actions (bin centres) (B, A), or (B, chunk, A) with ``chunk > 1``;
        log-probs (B, S) per token or (B,) joint (``config.logprob``); values (B,)."""
        tokens, logprobs, values = self.act_tokens(obs, deterministic, generator)
        actions = self.bins.to_actions(tokens)
        if self.chunk > 1:
            actions = actions.view(-1, self.chunk, self.action_dim)  # [B, S] -> [B, K, A]
        return ActOutput(actions, self._shaped(logprobs), values)

    def evaluate(self, obs: Tensor, actions: Tensor) -> EvalOutput:
        """(B, size), continuous actions (B, A) or (B, chunk, A) -> log-probs (B, S) per token or (B,) joint
        (``config.logprob``), summed entropies (B,), values (B,)."""
        actions = torch.as_tensor(actions)
        tokens = self.bins.to_tokens(actions.reshape(actions.shape[0], -1))  # [B, K, A] -> [B, S]
        out = self.token_outputs(obs, tokens)
        return EvalOutput(self._shaped(out.logprobs), out.entropy.sum(-1), out.values)

    def _shaped(self, token_logprobs: Tensor) -> Tensor:
        return token_logprobs if self.config.logprob == "token" else token_logprobs.sum(-1)

    def critic_parameters(self) -> list[nn.Parameter]:
        """The parameters only the value depends on: the value head (the transformer is shared)."""
        return list(self.value_head.parameters())

    def value(self, obs: Tensor) -> Tensor:
        """(B, size) -> values (B,)."""
        return self(obs)[1]


def build_vla(obs_space: gym.Space, action_space: gym.Space, config: VLAConfig | None = None) -> VLAPolicy:
    """A VLA for packed observations ``obs_space`` and ``Box`` actions ``action_space``; sizes must agree."""
    config = config if config is not None else VLAConfig()
    config.validate()
    size = config.layout().size
    if not isinstance(obs_space, gym.spaces.Box) or obs_space.shape != (size,) or obs_space.dtype.name != "uint8":
        raise ValueError(
            f"the VLA reads packed uint8 observations of {size} bytes ({config.layout()}); got {obs_space}"
        )
    if not isinstance(action_space, gym.spaces.Box) or len(action_space.shape) != 1:
        raise ValueError(f"the VLA emits Box actions of shape (A,); got {action_space}")
    if (action_space.low < config.action_low).any() or (action_space.high > config.action_high).any():
        raise ValueError(
            f"action_low: the bins [{config.action_low}, {config.action_high}] do not cover the action space {action_space}"
        )
    return VLAPolicy(config, action_space.shape[0])


def save_policy(policy: VLAPolicy, path: str | Path) -> Path:
    """Write ``policy``'s weights and config to ``path`` (read by :func:`load_policy_weights`)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    state = {"policy": {k: v.detach().cpu().clone() for k, v in policy.state_dict().items()},
             "vla": asdict(policy.config)}
    torch.save(state, path)
    return path
