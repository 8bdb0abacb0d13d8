"""What a continuous-batching stream is told, and tells back, about weights that change under it and
rows that outlive it: the messages of interruptible generation (`continuous.stream_groups`).

* Weight updates in flight: `InFlight.poll` is called between decoding steps. It may load newer weights
  into the backend's model (in place, e.g. `backend.load_weights`) and then returns their version.
  Rows in flight continue under the new weights; every token records the version and the log-prob it
  was sampled with (`Response.versions`, `Response.logprobs`).
* Partial rows: closing the stream (`close()` on the generator) pauses it; the rows of every prompt
  admitted but not yet handed out are put in `InFlight.paused`. Given back in `InFlight.started`, a
  prompt's rows continue from their tokens (with the same per-prompt seed, each row draws the same
  uniforms it would have drawn uninterrupted).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from m2flow.data.batch import FinishReason

__all__ = ["InFlight", "PartialResponse"]


@dataclass
class PartialResponse:
    """The tokens one row sampled so far, each with the log-prob and the weight version it was sampled with."""

    token_ids: list[int]
    logprobs: list[float]
    versions: list[int]
    finish_reason: FinishReason | None = None
    """Set when the row had ended (its group had not: another row was still going); None: still going."""

    def __post_init__(self) -> None:
        if not len(self.token_ids) == len(self.logprobs) == len(self.versions):
            raise ValueError(f"a partial response needs one log-prob and one version per token: {len(self.token_ids)} "
                             f"tokens, {len(self.logprobs)} log-probs, {len(self.versions)} versions")


@dataclass
class InFlight:
    """The in-flight side of one `stream_groups` call."""

    version: int = 0
    """The version of the weights the stream starts with (recorded on every token until `poll` says otherwise)."""
    poll: Callable[[], int | None] | None = None
    """Called before each decoding step: loads newer weights into the model and returns their version, or None
    when there are none. After an update the running rows' contexts are run again under the new weights (the
    KV cache of the old ones is dropped: see `continuous.py`)."""
    started: Sequence[list[PartialResponse] | None] | None = None
    """Per prompt: its n rows begun by an earlier stream (`paused` of that one), or None for a fresh prompt."""
    paused: dict[int, list[PartialResponse]] = field(default_factory=dict)
    """Filled when the stream is closed before its end: prompt index -> its n rows so far, for every prompt
    admitted but not handed out (prompts never admitted have no tokens and are not listed)."""
    updates: int = 0
    """Weight updates the stream took in flight (counted by the stream)."""
