"""The config of an embodied policy (``policy:``): which kind, its shape, and the names it may use.

Kept apart from the policies themselves (``policies.py``, ``vla.py``) so a config validates without
importing torch: activations and encoders are checked by name, the encoders' functions loaded on use.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from m2flow.algorithms.registry import Registry
from m2flow.config.schema import option

if TYPE_CHECKING:
    from m2flow.envs.packed import PackedLayout

__all__ = ["ACTIVATION_CLASSES", "ENCODERS", "PolicyConfig", "VLAConfig", "WarmStartConfig"]

ACTIVATION_CLASSES: dict[str, str] = {"tanh": "Tanh", "relu": "ReLU", "elu": "ELU", "gelu": "GELU", "silu": "SiLU"}
"""``activation`` name -> the ``torch.nn`` module class it builds."""

ENCODERS: Registry = Registry("encoder", {"mlp": "m2flow.models.policies", "cnn": "m2flow.models.policies"})
"""Observation encoders by name (``register_encoder`` in ``policies.py``), each a function
(obs space, PolicyConfig) -> a module (B, *obs_shape) -> (B, out_dim)."""


@dataclass
class VLAConfig:
    """Shape of the small VLA policy and of the observations it reads."""

    height: int = option(64, "image height in pixels")
    width: int = option(64, "image width in pixels")
    text_len: int = option(16, "instruction tokens per observation (padded)")
    proprio_dim: int = option(4, "proprioception floats per observation (0: none)")
    vocab_size: int = option(0, "instruction vocabulary size; 0: the word vocabulary of the instruction table")
    dim: int = option(128, "transformer width")
    depth: int = option(4, "transformer layers")
    heads: int = option(4, "attention heads")
    mlp_ratio: int = option(4, "MLP hidden width / dim")
    stem_channels: list[int] = option([32, 64, 128], "channels of the stride-2 convolutions before the grid")
    grid: int = option(4, "image tokens per side (the stem's output grid)")
    num_bins: int = option(256, "bins per action dimension")
    action_low: float = option(-1.0, "lower bound of every action dimension")
    action_high: float = option(1.0, "upper bound of every action dimension")
    logprob: Literal["token", "action"] = option(
        "token", "what act / evaluate return: 'token': one log-prob per action token (B, chunk * A), so PPO clips a "
        "ratio per token; 'action': their sum (B,), one ratio per decision (per chunk when chunk > 1; with PPO on "
        "chunks it learned level with one action per decision where a ratio per token fell below, docs/vla.md)")
    chunk: int = option(
        1, "actions per decision (K): the policy emits K consecutive actions from one observation and the env "
        "worker executes them, rendering only the frame the next decision reads; 1: one action per env step")
    decoding: Literal["parallel", "autoregressive"] = option(
        "parallel", "how the chunk * A action tokens are decoded: 'parallel': one forward pass, a learned query "
        "slot per token, the slots attending to each other both ways; 'autoregressive': token j conditioned on "
        "tokens < j (a causal mask over the slots, one forward pass per token when sampling)")

    def validate(self) -> None:
        """Raise ValueError naming the field for impossible values."""
        if self.dim % self.heads:
            raise ValueError(f"dim: {self.dim} is not divisible by heads={self.heads}")
        smallest = min(self.height, self.width) // 2 ** len(self.stem_channels)
        if not 1 <= self.grid <= smallest:
            raise ValueError(f"grid: must be in [1, {smallest}] for {self.height}x{self.width} images, got {self.grid}")
        if self.text_len < 1:
            raise ValueError(f"text_len: must be >= 1, got {self.text_len}")
        if self.logprob not in ("token", "action"):
            raise ValueError(f"logprob: must be 'token' or 'action', got {self.logprob!r}")
        if self.chunk < 1:
            raise ValueError(f"chunk: must be >= 1 (actions per decision), got {self.chunk}")
        if self.decoding not in ("parallel", "autoregressive"):
            raise ValueError(f"decoding: must be 'parallel' or 'autoregressive', got {self.decoding!r}")
        if self.vocab_size < 0 or self.vocab_size > 256:
            raise ValueError(f"vocab_size: must be in [0, 256] (ids are stored as bytes), got {self.vocab_size}")

    def layout(self) -> PackedLayout:
        """The packed observation layout this policy reads."""
        from m2flow.envs.packed import PackedLayout  # on use: numpy and torch

        return PackedLayout(self.height, self.width, 3, self.text_len, self.proprio_dim)


@dataclass
class WarmStartConfig:
    """Behaviour cloning of the VLA on demonstrations, once before RL (the embodied workflow's ``prepare``)."""

    demos: str | None = option(
        None, "demonstrations file written by `m2flow demos` (None: no warm start); cloned before any worker "
        "starts, saved in run_dir/warm_start and reused while these settings, the file and policy.vla match")
    epochs: int = option(10, "passes over the demonstrations")
    batch_size: int = option(64, "samples per gradient step")
    lr: float = option(1e-3, "AdamW learning rate (cosine-decayed to 10% over the warm start)")
    weight_decay: float = option(0.01, "AdamW weight decay")
    shift: int = option(4, "random-shift image augmentation in pixels (0: off)")
    standardize_proprio: bool = option(
        True, "standardise proprioception by the demonstrations' mean and standard deviation, kept with the "
        "weights (false: read unscaled; cloned from one task, the policy then acts the same on every frame)")
    threads: int = option(0, "torch threads of the warm start (0: torch's default)")

    def validate(self) -> None:
        """Raise ValueError naming the field for impossible values."""
        if self.demos is not None and not self.demos.strip():
            raise ValueError("demos: empty; give a file or leave it unset")
        for name in ("epochs", "batch_size"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name}: must be >= 1, got {getattr(self, name)}")
        if self.lr <= 0:
            raise ValueError(f"lr: must be > 0, got {self.lr}")
        for name in ("shift", "threads"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name}: must be >= 0, got {getattr(self, name)}")


@dataclass
class PolicyConfig:
    """Which embodied policy to build and its shape: an actor-critic (MLP / CNN) or the small VLA."""

    kind: Literal["actor_critic", "vla"] = option(
        "actor_critic", "'actor_critic': MLP or CNN trunks with a Gaussian / categorical head; 'vla': the small "
        "vision-language-action policy (packed image + instruction + proprio observations, action tokens)")
    vla: VLAConfig = option(VLAConfig(), "sizes of the VLA (kind: vla); height / width / proprio_dim must match the env")
    init_from: str | None = option(
        None, "start from the weights in this file: a behaviour-cloning file or a run's actor.pt (loaded without "
        "running code; the weights must fit the policy)")
    warm_start: WarmStartConfig = option(
        WarmStartConfig(), "behaviour cloning on demonstrations before RL (kind: vla); starts from init_from when set")
    hidden_sizes: list[int] = option([64, 64], "units of each hidden layer of the actor and critic MLPs")
    activation: str = option("tanh", "hidden activation: 'tanh', 'relu', 'elu', 'gelu' or 'silu'")
    encoder: str = option("auto", "observation encoder: 'auto' (cnn for images, else mlp), 'mlp' or 'cnn'")
    shared_critic: bool = option(False, "value head on the actor's trunk (True) or its own network (False)")
    log_std_init: float = option(0.0, "initial log standard deviation of Gaussian actions")
    ortho_init: bool = option(True, "orthogonal weight init with gains sqrt(2) / 0.01 / 1, as SB3 and CleanRL")
    cnn_channels: list[int] = option([32, 64, 64], "output channels of each convolution")
    cnn_kernels: list[int] = option([8, 4, 3], "kernel size of each convolution")
    cnn_strides: list[int] = option([4, 2, 1], "stride of each convolution")
    cnn_features: int = option(512, "width of the CNN's output feature layer")

    @property
    def action_chunk(self) -> int:
        """Env steps per decision: ``vla.chunk`` for the VLA, 1 for the actor-critics."""
        return self.vla.chunk if self.kind == "vla" else 1

    def validate(self) -> None:
        """Raise ValueError naming the field for impossible values."""
        if self.activation not in ACTIVATION_CLASSES:
            raise ValueError(f"activation: unknown {self.activation!r}; valid: {sorted(ACTIVATION_CLASSES)}")
        if self.encoder != "auto" and self.encoder not in ENCODERS:
            raise ValueError(f"encoder: unknown {self.encoder!r}; valid: {['auto', *ENCODERS.names()]}")
        if any(h < 1 for h in self.hidden_sizes):
            raise ValueError(f"hidden_sizes: every layer needs >= 1 unit, got {self.hidden_sizes}")
        if not len(self.cnn_channels) == len(self.cnn_kernels) == len(self.cnn_strides):
            raise ValueError("cnn_channels: cnn_channels, cnn_kernels and cnn_strides must have equal lengths")
        if self.kind not in ("actor_critic", "vla"):
            raise ValueError(f"kind: unknown {self.kind!r}; valid: ['actor_critic', 'vla']")
        if self.kind == "vla":
            self.vla.validate()
        if self.init_from is not None and not self.init_from.strip():
            raise ValueError("init_from: empty; give a file or leave it unset")
        if self.warm_start.demos is not None and self.kind != "vla":
            raise ValueError(f"warm_start.demos: behaviour cloning trains the VLA's action tokens; set kind: vla "
                             f"(got {self.kind!r})")
