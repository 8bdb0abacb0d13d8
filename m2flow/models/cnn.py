"""A small convolutional encoder for pixel observations (Nature-DQN shaped by default)."""

from __future__ import annotations

import torch
from torch import nn


def is_channels_last(obs_shape: tuple[int, ...]) -> bool:
    """True for (H, W, C) images, the gymnasium convention; False for (C, H, W)."""
    if len(obs_shape) != 3:
        raise ValueError(f"pixel observations must be 3-D images, got shape {obs_shape}")
    return obs_shape[-1] in (1, 3, 4) and obs_shape[0] not in (1, 3, 4)


class CNNEncoder(nn.Module):
    """Images (B, H, W, C) or (B, C, H, W) -> features (B, features); uint8 inputs are scaled to [0, 1]."""

    def __init__(
        self,
        obs_shape: tuple[int, ...],
        channels: list[int],
        kernels: list[int],
        strides: list[int],
        features: int,
        activation: type[nn.Module] = nn.ReLU,
        scale: float = 1.0,
    ) -> None:
        super().__init__()
        if not len(channels) == len(kernels) == len(strides):
            raise ValueError("cnn_channels, cnn_kernels and cnn_strides must have the same length")
        self.channels_last = is_channels_last(obs_shape)
        self.scale = scale
        in_ch = obs_shape[-1] if self.channels_last else obs_shape[0]
        layers: list[nn.Module] = []
        for out_ch, k, s in zip(channels, kernels, strides):
            layers += [nn.Conv2d(in_ch, out_ch, k, s), activation()]
            in_ch = out_ch
        self.convs = nn.Sequential(*layers, nn.Flatten())
        chw = (obs_shape[-1], *obs_shape[:2]) if self.channels_last else tuple(obs_shape)
        try:
            with torch.no_grad():
                flat = self.convs(torch.zeros(1, *chw)).shape[1]
        except RuntimeError as error:  # a kernel larger than what is left of the image
            flat, reason = 0, str(error).splitlines()[0]
        else:
            reason = "no pixels left"
        if flat == 0:
            raise ValueError(
                f"cnn_kernels: the convolutions do not fit an image of shape {obs_shape} ({reason}); "
                "use smaller kernels / strides"
            )
        self.head = nn.Sequential(nn.Linear(flat, features), activation())
        self.out_dim = features

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        """(B, *obs_shape) -> (B, features)."""
        x = obs.float()
        if self.scale != 1.0:
            x = x * self.scale
        if self.channels_last:
            x = x.permute(0, 3, 1, 2)  # [B, H, W, C] -> [B, C, H, W]
        return self.head(self.convs(x))
