"""Prompt datasets: records -> formatted, tokenized prompts with their reference answers."""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, overload

from m2flow.data.records import BadRecordError, OnBadLine, Record, read_records

logger = logging.getLogger(__name__)

SIMPLE_CHAT_SYSTEM = "System: {system}\n"
SIMPLE_CHAT_TURN = "User: {prompt}\nAssistant:"
"""Fallback chat format for tokenizers without a chat template:
an optional `System: ...` line, then `User: <prompt>`, then `Assistant:` on its own line."""


def format_prompt(
    text: str,
    tokenizer: Any | None = None,
    use_chat_template: bool = False,
    system_prompt: str | None = None,
    prompt_template: str | None = None,
) -> str:
    """Format a raw prompt: `prompt_template` (with `{prompt}`) first, then the chat template if asked.

    The chat template is the tokenizer's own (`apply_chat_template`) when it has one, otherwise
    the simple `System:/User:/Assistant:` format documented in `SIMPLE_CHAT_TURN`.
    """
    if prompt_template is not None:
        text = prompt_template.format(prompt=text)
    if not use_chat_template:
        return text
    if tokenizer is not None and getattr(tokenizer, "chat_template", None):
        messages = [{"role": "user", "content": text}]
        if system_prompt:
            messages.insert(0, {"role": "system", "content": system_prompt})
        return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    head = SIMPLE_CHAT_SYSTEM.format(system=system_prompt) if system_prompt else ""
    return head + SIMPLE_CHAT_TURN.format(prompt=text)


@dataclass
class PromptItem:
    """One prompt ready for generation: formatted text, its token ids, and the reference answer."""

    index: int
    """Position in the dataset; stable across runs, used to resume and to trace results."""
    prompt: str
    """The formatted prompt text (after prompt template and chat template)."""
    prompt_ids: list[int]
    """Token ids of `prompt`."""
    answer: str | None = None
    """Reference answer the reward compares against (None when the dataset has none)."""
    source: str = ""
    """Where the example came from, as `file:line`."""
    extra: dict[str, Any] = field(default_factory=dict)
    """Other fields of the record that the reward may use."""


class PromptDataset(Sequence[PromptItem]):
    """An in-memory list of `PromptItem`s with counts of what was dropped while building it."""

    def __init__(self, items: Sequence[PromptItem], num_skipped: int = 0, num_too_long: int = 0) -> None:
        self.items = list(items)
        self.num_skipped = num_skipped
        """Bad records skipped (`on_bad_line="skip"`)."""
        self.num_too_long = num_too_long
        """Prompts dropped because they exceed `max_prompt_tokens`."""

    def __len__(self) -> int:
        return len(self.items)

    @overload
    def __getitem__(self, i: int) -> PromptItem: ...
    @overload
    def __getitem__(self, i: slice) -> list[PromptItem]: ...
    def __getitem__(self, i: int | slice) -> PromptItem | list[PromptItem]:
        return self.items[i]

    @classmethod
    def from_records(
        cls,
        records: Iterable[Record | dict[str, Any]],
        tokenizer: Any,
        *,
        prompt_key: str = "prompt",
        answer_key: str | None = "answer",
        use_chat_template: bool = False,
        system_prompt: str | None = None,
        prompt_template: str | None = None,
        max_prompt_tokens: int | None = None,
        on_bad_line: OnBadLine = "error",
        num_skipped: int = 0,
    ) -> PromptDataset:
        """Build a dataset from records; a record with an empty prompt is a bad line."""
        items: list[PromptItem] = []
        too_long = 0
        for i, rec in enumerate(records):
            if not isinstance(rec, Record):
                rec = Record(rec, "<memory>", i + 1)
            raw = rec.data.get(prompt_key)
            if raw is None or str(raw).strip() == "":
                reason = f"empty or missing prompt key {prompt_key!r}"
                if on_bad_line == "error":
                    raise BadRecordError(rec.path, rec.line, reason)
                logger.debug("skipping %s:%d: %s", rec.path, rec.line, reason)
                num_skipped += 1
                continue
            text = format_prompt(str(raw), tokenizer, use_chat_template, system_prompt, prompt_template)
            # A chat template already spells out its special tokens; plain text gets the tokenizer's own.
            ids = tokenizer(text, add_special_tokens=not use_chat_template)["input_ids"]
            if max_prompt_tokens is not None and len(ids) > max_prompt_tokens:
                too_long += 1
                continue
            answer = rec.data.get(answer_key) if answer_key else None
            extra = {k: v for k, v in rec.data.items() if k not in (prompt_key, answer_key)}
            items.append(
                PromptItem(
                    index=len(items),
                    prompt=text,
                    prompt_ids=list(ids),
                    answer=None if answer is None else str(answer),
                    source=f"{rec.path}:{rec.line}",
                    extra=extra,
                )
            )
        if too_long:
            logger.warning("dropped %d prompt(s) longer than %d tokens", too_long, max_prompt_tokens)
        return cls(items, num_skipped=num_skipped, num_too_long=too_long)

    @classmethod
    def from_file(
        cls,
        path: str | Path,
        tokenizer: Any,
        *,
        prompt_key: str = "prompt",
        answer_key: str | None = "answer",
        use_chat_template: bool = False,
        system_prompt: str | None = None,
        prompt_template: str | None = None,
        max_prompt_tokens: int | None = None,
        on_bad_line: OnBadLine = "error",
    ) -> PromptDataset:
        """Read a jsonl or parquet file of prompts; the answer key, when given, is required on every line."""
        required = (prompt_key,) + ((answer_key,) if answer_key else ())
        report = read_records(path, on_bad_line=on_bad_line, required_keys=required)
        return cls.from_records(
            report.records,
            tokenizer,
            prompt_key=prompt_key,
            answer_key=answer_key,
            use_chat_template=use_chat_template,
            system_prompt=system_prompt,
            prompt_template=prompt_template,
            max_prompt_tokens=max_prompt_tokens,
            on_bad_line=on_bad_line,
            num_skipped=report.num_skipped,
        )
