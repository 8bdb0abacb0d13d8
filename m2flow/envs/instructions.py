"""One instruction sentence per MetaWorld task, and the offline word tokenizer that turns them into ids.

MetaWorld ships no language: the sentences below are the project's own. The tokenizer's vocabulary
is every word of this table (sorted, after ``<pad>`` and ``<unk>``), so it is fixed by the table and
needs nothing downloaded; adding a sentence with new words changes the ids, which is why a policy
stores ``vocab_size`` and the packed observation stores ids, not words.
"""

from __future__ import annotations

import re

import numpy as np

INSTRUCTIONS: dict[str, str] = {
    "reach-v3": "move the gripper to the red goal point",
    "push-v3": "push the puck across the table to the goal",
    "pick-place-v3": "pick up the puck and place it at the goal",
    "door-open-v3": "pull the door open by its handle",
    "drawer-open-v3": "grab the drawer handle and pull the drawer open",
    "drawer-close-v3": "push the drawer closed",
    "button-press-topdown-v3": "press the button down from above",
    "peg-insert-side-v3": "pick up the peg and insert it into the hole from the side",
    "window-open-v3": "slide the window open to the left",
    "window-close-v3": "slide the window closed to the right",
}
"""Task name -> the instruction the policy reads (lower case, words separated by spaces)."""

PAD_ID, UNK_ID = 0, 1
_WORD = re.compile(r"[a-z]+")


def instruction(task: str) -> str:
    """The instruction sentence of ``task``; an unknown task raises listing the known ones."""
    try:
        return INSTRUCTIONS[task]
    except KeyError:
        raise ValueError(f"task: no instruction for {task!r}; known: {sorted(INSTRUCTIONS)}") from None


def words(text: str) -> list[str]:
    """Lower-cased words of ``text`` (punctuation dropped)."""
    return _WORD.findall(text.lower())


class WordTokenizer:
    """Words -> ids over a fixed vocabulary: 0 is padding, 1 unknown, then the sorted words."""

    def __init__(self, vocabulary: list[str]) -> None:
        self.vocabulary = ["<pad>", "<unk>", *sorted(set(vocabulary))]
        self._ids = {w: i for i, w in enumerate(self.vocabulary)}

    @classmethod
    def from_instructions(cls) -> WordTokenizer:
        """The tokenizer over every word of ``INSTRUCTIONS``."""
        return cls([w for text in INSTRUCTIONS.values() for w in words(text)])

    @property
    def vocab_size(self) -> int:
        return len(self.vocabulary)

    def encode(self, text: str, length: int) -> np.ndarray:
        """``text`` -> (length,) int64 ids, padded with 0; a sentence longer than ``length`` raises."""
        ids = [self._ids.get(w, UNK_ID) for w in words(text)]
        if len(ids) > length:
            raise ValueError(f"instruction of {len(ids)} words does not fit {length} tokens: {text!r}")
        out = np.zeros(length, dtype=np.int64)
        out[: len(ids)] = ids
        return out

    def decode(self, ids: np.ndarray) -> str:
        """Ids (padding skipped) -> the space-joined words."""
        return " ".join(self.vocabulary[int(i)] for i in ids if int(i) != PAD_ID)
