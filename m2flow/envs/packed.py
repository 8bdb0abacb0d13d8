"""One flat uint8 observation holding an image, instruction token ids and proprioception.

Pixel-and-language observations travel as ONE array per env so that every existing piece that
moves observations (``EnvGroup`` buffers, channels, shared memory, rollout batches) carries them
unchanged: ``[image (H*W*C bytes) | token ids (L bytes) | proprio (P float32 as 4P bytes)]``.
Token ids fit a byte (vocabularies < 256); proprio floats are stored bit-exactly (native byte
order), so ``unpack(pack(x)) == x``. The policy unpacks with the same ``PackedLayout``.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch


@dataclass(frozen=True)
class PackedLayout:
    """Where each part sits in a packed observation of ``size`` bytes."""

    height: int = 64
    width: int = 64
    channels: int = 3
    text_len: int = 16
    proprio_dim: int = 4

    @property
    def image_bytes(self) -> int:
        return self.height * self.width * self.channels

    @property
    def size(self) -> int:
        """Bytes of one packed observation."""
        return self.image_bytes + self.text_len + 4 * self.proprio_dim

    def pack(self, image: np.ndarray, tokens: np.ndarray, proprio: np.ndarray) -> np.ndarray:
        """(H, W, C) uint8, (L,) ids < 256, (P,) floats -> (size,) uint8."""
        if image.shape != (self.height, self.width, self.channels) or image.dtype != np.uint8:
            raise ValueError(f"image must be uint8 {(self.height, self.width, self.channels)}, got {image.dtype} {image.shape}")
        if tokens.shape != (self.text_len,) or tokens.min(initial=0) < 0 or tokens.max(initial=0) > 255:
            raise ValueError(f"tokens must be ({self.text_len},) ids in [0, 255], got {tokens.shape}")
        if np.shape(proprio) != (self.proprio_dim,):
            raise ValueError(f"proprio must have shape ({self.proprio_dim},), got {np.shape(proprio)}")
        out = np.empty(self.size, dtype=np.uint8)
        out[: self.image_bytes] = image.reshape(-1)
        out[self.image_bytes : self.image_bytes + self.text_len] = tokens
        out[self.image_bytes + self.text_len :] = np.asarray(proprio, dtype=np.float32).view(np.uint8)
        return out

    def unpack(self, obs: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(..., size) uint8 -> images (..., H, W, C) uint8, ids (..., L) int64, proprio (..., P) float32."""
        a, b = self.image_bytes, self.image_bytes + self.text_len
        lead = obs.shape[:-1]
        image = obs[..., :a].reshape(*lead, self.height, self.width, self.channels)
        proprio = np.ascontiguousarray(obs[..., b:]).view(np.float32)
        return image, obs[..., a:b].astype(np.int64), proprio

    def unpack_torch(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(B, size) uint8 -> images (B, H, W, C) uint8, ids (B, L) int64, proprio (B, P) float32."""
        if obs.dtype != torch.uint8 or obs.shape[-1] != self.size:
            raise ValueError(f"expected packed uint8 observations of {self.size} bytes, got {obs.dtype} {tuple(obs.shape)}")
        a, b = self.image_bytes, self.image_bytes + self.text_len
        image = obs[:, :a].reshape(-1, self.height, self.width, self.channels)
        raw = obs[:, b:]
        # A fresh dense copy: its rows start at multiples of 4 bytes, as the float view needs.
        proprio = torch.empty(raw.shape, dtype=torch.uint8, device=obs.device).copy_(raw).view(torch.float32)
        return image, obs[:, a:b].long(), proprio
