"""Messages of the reasoning workflow: what travels on its channels, one prompt (group) per item."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from m2flow.data.batch import RolloutBatch


@dataclass
class PromptTask:
    """One prompt of an iteration, on its way to a rollout rank."""

    step: int
    """The iteration it belongs to."""
    slot: int
    """Position in the iteration's prompts (0..G-1): routes its group downstream and is its group id."""
    index: int
    """Position in the dataset (to trace results back to the data)."""
    prompt_ids: list[int]
    """Token ids of the formatted prompt."""
    answer: str | None
    """Reference answer for the reward (None when the data has none)."""


@dataclass
class GroupSample:
    """One prompt's n responses, filled in along the way: rollout -> reward -> inference -> actor."""

    step: int
    slot: int
    index: int
    answer: str | None
    texts: list[str]
    """Decoded responses (stop strings and special tokens removed), what the reward reads."""
    batch: RolloutBatch
    """The n responses as a padded batch; ``group_ids`` are all ``slot``."""
    dropped: bool = False
    """Set by dynamic sampling when the group's rewards are all equal, or by the actor when the group is
    older than ``algorithm.max_staleness``: it is passed on, never trained on."""
    version: int = 0
    """The policy version that generated it: the iterations the generating weights had been trained on."""

    @property
    def size(self) -> int:
        return len(self.batch)

    @property
    def tokens(self) -> int:
        """Real tokens of its rows, prompt and response (what a micro-batch token budget counts)."""
        return int(self.batch.prompt_mask.sum()) + int(self.batch.response_mask.sum())


def group_tokens(group: GroupSample) -> int:
    """``group.tokens``, as a function (the weight of a token-budget take)."""
    return group.tokens


def join_groups(groups: Sequence[GroupSample]) -> RolloutBatch:
    """One padded batch of the groups' rows, in the given order, each row with its group's version."""
    batch = RolloutBatch.cat([g.batch for g in groups])
    batch.versions = torch.tensor([g.version for g in groups for _ in range(g.size)], dtype=torch.long)
    return batch


def scatter_rows(groups: Sequence[GroupSample], field: str, values: torch.Tensor) -> None:
    """Give each group its rows of a (B, Lr) tensor computed on ``join_groups(groups)``, at its own width."""
    row = 0
    for g in groups:
        width = g.batch.response_ids.shape[1]
        setattr(g.batch, field, values[row : row + g.size, :width].contiguous())
        row += g.size
