"""A generation backend that writes scripted turns, and a character tokenizer, for the episode engine's tests."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from m2flow.backends.generation.base import SamplingParams
from m2flow.data.batch import Response, ResponseGroup
from m2flow.models.tokenizer import train_char_tokenizer

ALPHABET = "0123456789*+-=<>/:_ abcdefghijklmnopqrstuvwxyz?"


def char_tokenizer():
    return train_char_tokenizer(ALPHABET)


class ScriptedBackend:
    """Each turn's text is ``script(context_text)`` (then end-of-sequence, unless it ends at a stop string);
    each token's log-prob is -(its position in the turn + 1) / 100, so tests can tell tokens apart."""

    in_process = True
    compiles = False
    continuous = False

    def __init__(self, tokenizer, script: Callable[[str], str]) -> None:
        self.tokenizer, self.script = tokenizer, script
        self.calls: list[SamplingParams] = []

    @property
    def module(self):
        return None

    @property
    def pad_id(self) -> int:
        return self.tokenizer.pad_token_id

    def generate(self, prompt_ids: Sequence[Sequence[int]], params: SamplingParams) -> list[ResponseGroup]:
        self.calls.append(params)
        groups = []
        for p, ids in enumerate(prompt_ids):
            text = self.script(self.tokenizer.decode(list(ids), skip_special_tokens=True))
            tokens = self.tokenizer(text, add_special_tokens=False)["input_ids"]
            if not any(text.endswith(s) for s in params.stop):
                tokens = tokens + [self.tokenizer.eos_token_id]
            reason = "stop"
            if len(tokens) > params.max_new_tokens:
                tokens, reason = tokens[: params.max_new_tokens], "length"
            logprobs = [-(k + 1) / 100 for k in range(len(tokens))]
            groups.append(ResponseGroup(p, list(ids), [Response(tokens, logprobs, reason, text)]))
        return groups
