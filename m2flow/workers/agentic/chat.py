"""Episodes in a tokenizer's chat template: the prompt with the tools' schemas, and each observation as the
text the template puts after a model turn (for ``rollout.tool_format`` formats with ``chat``, e.g. ``hermes``).

The model's turns are never rendered again: a context stays the prompt's ids, the ids the model generated
and the observations' ids (``turns.py``), so what is trained is exactly what was sampled. What an
observation adds is found by rendering a fixed two-message conversation with and without it::

    closed = render([user U, assistant T])                        # ... T<eos>\\n
    after  = render([user U, assistant T, tool OBS], add_generation_prompt=True)
    observation text = closed[after T]  +  after[len(closed):]     # <eos>\\n  +  <bos>user\\n<tool_response>...

The first part closes the model's turn as the template would; when the model ended its turn with a
special token the closing starts with (its end-of-turn token, e.g. ``<eos>`` or ``<|im_end|>``), that token
is not written twice. A template that renders the earlier messages differently once another follows
cannot be rendered turn by turn, and is refused with one line.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal

Role = Literal["tool", "user"]
_USER, _TURN = "m2flow user text", "m2flow model turn"


class ChatRenderer:
    """A tokenizer's chat template, rendered for one episode's prompt and its observations."""

    def __init__(self, tokenizer: Any) -> None:
        if not getattr(tokenizer, "chat_template", None):
            raise ValueError("this tool format renders episodes with the tokenizer's chat template, and the "
                             "tokenizer has none (tiny tokenizers: train_char_tokenizer(..., chat_template="
                             "m2flow.models.chat_templates.TOOL_CHAT_TEMPLATE))")
        self.tokenizer = tokenizer
        self._base = [{"role": "user", "content": _USER}, {"role": "assistant", "content": _TURN}]
        self._closed = self._render(self._base, False)
        at = self._closed.rfind(_TURN)
        if at < 0:
            raise ValueError("the chat template does not write an assistant message's content as it is")
        self.close = self._closed[at + len(_TURN):]
        """What the template writes after a model turn's text (its end-of-turn marker, a newline)."""
        self._special = {int(tokenizer.convert_tokens_to_ids(t)): str(t) for t in tokenizer.all_special_tokens}
        """Special token id -> its text: the end-of-turn token a model may write itself."""

    def _render(self, messages: list[dict[str, Any]], generation_prompt: bool,
                tools: Sequence[dict[str, Any]] | None = None) -> str:
        return self.tokenizer.apply_chat_template(messages, tools=list(tools) if tools else None,
                                                  add_generation_prompt=generation_prompt, tokenize=False)

    def prompt(self, observation: str, tools: Sequence[dict[str, Any]] | None) -> str:
        """The first model turn's prompt: the observation as the user's message, the tools given to the template."""
        return self._render([{"role": "user", "content": observation}], True, tools)

    def observation(self, text: str, role: Role, turn_ids: Sequence[int]) -> str:
        """What follows a model turn (``turn_ids``, as generated): its closing, ``text`` as a ``role`` message,
        and the next turn's generation prompt."""
        after = self._render([*self._base, {"role": role, "content": text}], True)
        if not after.startswith(self._closed):
            raise ValueError(f"the chat template renders the earlier messages differently once a {role!r} "
                             "message follows; episodes cannot be rendered turn by turn with it")
        close = self.close
        last = self._special.get(int(turn_ids[-1])) if len(turn_ids) else None
        if last and close.startswith(last):  # the model wrote the end-of-turn token itself
            close = close[len(last):]
        return close + after[len(self._closed):]
