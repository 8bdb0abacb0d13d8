"""One instruction sentence per MetaWorld v3 task, the task lists MT10 / MT50, and the offline word tokenizer.

MetaWorld ships no language: the sentences below are the project's own. A user may give the sentence
of any task instead (``env.env_kwargs.instruction``).

The vocabulary is versioned and append-only (``VOCABULARIES``): version 1 is the words of the first
ten sentences (MT10), version 2 appends the words the other forty brought. Appending keeps every id
a word ever had, so a policy trained on version 1 reads MT10's sentences exactly as before; only its
embedding table is shorter, and loading it pads the new rows (``VLAPolicy.upgrade_state``). A word
outside the vocabulary (a user's own sentence) becomes ``<unk>``. Adding a sentence with new words
means adding a version, never re-sorting an old one.
"""

from __future__ import annotations

import logging
import re

import numpy as np

from m2flow.config.errors import InputError

logger = logging.getLogger(__name__)

INSTRUCTIONS: dict[str, str] = {
    # MT10
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
    # the other forty of MT50
    "assembly-v3": "pick up the ring and put it over the peg",
    "basketball-v3": "pick up the ball and drop it into the hoop",
    "bin-picking-v3": "pick up the puck and place it in the other bin",
    "box-close-v3": "pick up the lid and put it on the box",
    "button-press-topdown-wall-v3": "press the button down from above behind the wall",
    "button-press-v3": "push the button in from the front",
    "button-press-wall-v3": "push the button in from the front behind the wall",
    "coffee-button-v3": "press the button on the coffee machine",
    "coffee-pull-v3": "pull the mug away from the coffee machine",
    "coffee-push-v3": "push the mug under the coffee machine",
    "dial-turn-v3": "turn the dial around",
    "disassemble-v3": "pick the ring up off the peg",
    "door-close-v3": "push the door closed",
    "door-lock-v3": "turn the door lock down",
    "door-unlock-v3": "turn the door lock up",
    "hand-insert-v3": "put the gripper into the hole in the table",
    "faucet-open-v3": "turn the faucet on",
    "faucet-close-v3": "turn the faucet off",
    "hammer-v3": "pick up the hammer and hit the nail into the wall",
    "handle-press-side-v3": "press the handle down from the side",
    "handle-press-v3": "press the handle down",
    "handle-pull-side-v3": "pull the handle up from the side",
    "handle-pull-v3": "pull the handle up",
    "lever-pull-v3": "pull the lever up",
    "pick-place-wall-v3": "pick up the puck and place it at the goal behind the wall",
    "pick-out-of-hole-v3": "pick the peg up out of the hole",
    "plate-slide-v3": "slide the plate into the goal",
    "plate-slide-side-v3": "slide the plate into the goal from the side",
    "plate-slide-back-v3": "slide the plate back out of the goal",
    "plate-slide-back-side-v3": "slide the plate back out of the goal to the side",
    "peg-unplug-side-v3": "pull the peg out of the hole to the side",
    "soccer-v3": "kick the ball into the goal",
    "stick-push-v3": "use the stick to push the bottle to the goal",
    "stick-pull-v3": "use the stick to pull the bottle to the goal",
    "push-wall-v3": "push the puck around the wall to the goal",
    "push-back-v3": "pull the puck back to the goal",
    "reach-wall-v3": "move the gripper over the wall to the red goal point",
    "shelf-place-v3": "pick up the puck and place it on the shelf",
    "sweep-into-v3": "sweep the puck into the hole",
    "sweep-v3": "sweep the puck off the edge of the table",
}
"""Task name -> the instruction the policy reads (lower case, words separated by spaces)."""

MT10: tuple[str, ...] = (
    "reach-v3", "push-v3", "pick-place-v3", "door-open-v3", "drawer-open-v3", "drawer-close-v3",
    "button-press-topdown-v3", "peg-insert-side-v3", "window-open-v3", "window-close-v3",
)
"""MetaWorld's MT10 task set."""

MT50: tuple[str, ...] = (
    "assembly-v3", "basketball-v3", "bin-picking-v3", "box-close-v3", "button-press-topdown-v3",
    "button-press-topdown-wall-v3", "button-press-v3", "button-press-wall-v3", "coffee-button-v3",
    "coffee-pull-v3", "coffee-push-v3", "dial-turn-v3", "disassemble-v3", "door-close-v3", "door-lock-v3",
    "door-open-v3", "door-unlock-v3", "hand-insert-v3", "drawer-close-v3", "drawer-open-v3", "faucet-open-v3",
    "faucet-close-v3", "hammer-v3", "handle-press-side-v3", "handle-press-v3", "handle-pull-side-v3",
    "handle-pull-v3", "lever-pull-v3", "pick-place-wall-v3", "pick-out-of-hole-v3", "pick-place-v3",
    "plate-slide-v3", "plate-slide-side-v3", "plate-slide-back-v3", "plate-slide-back-side-v3",
    "peg-insert-side-v3", "peg-unplug-side-v3", "soccer-v3", "stick-push-v3", "stick-pull-v3", "push-v3",
    "push-wall-v3", "push-back-v3", "reach-v3", "reach-wall-v3", "shelf-place-v3", "sweep-into-v3", "sweep-v3",
    "window-open-v3", "window-close-v3",
)
"""MetaWorld's MT50 task set: every v3 task, in MetaWorld's own order."""

_V1 = ("above", "across", "and", "at", "button", "by", "closed", "door", "down", "drawer", "from", "goal", "grab",
       "gripper", "handle", "hole", "insert", "into", "it", "its", "left", "move", "open", "peg", "pick", "place",
       "point", "press", "puck", "pull", "push", "red", "right", "side", "slide", "table", "the", "to", "up",
       "window")
_V2_ADDED = ("around", "away", "back", "ball", "behind", "bin", "bottle", "box", "coffee", "dial", "drop", "edge",
             "faucet", "front", "hammer", "hit", "hoop", "in", "kick", "lever", "lid", "lock", "machine", "mug",
             "nail", "of", "off", "on", "other", "out", "over", "plate", "put", "ring", "shelf", "stick", "sweep",
             "turn", "under", "use", "wall")
VOCABULARIES: dict[int, tuple[str, ...]] = {1: _V1, 2: _V1 + _V2_ADDED}
"""Version -> the words of the vocabulary in id order (after ``<pad>`` and ``<unk>``); append-only."""

VOCABULARY_VERSION = max(VOCABULARIES)
"""The version envs encode with and new policies are sized for."""

PAD_ID, UNK_ID = 0, 1
_WORD = re.compile(r"[a-z]+")


def instruction(task: str, given: str | None = None) -> str:
    """The instruction of ``task``: ``given`` when set, else the table's; a task without one raises InputError."""
    if given is not None:
        if not words(given):
            raise InputError(f"env.env_kwargs.instruction: {given!r} has no words")
        return given
    try:
        return INSTRUCTIONS[task]
    except KeyError:
        raise InputError(
            f"env.env_id: no instruction for task {task!r}; give one (env.env_kwargs.instruction=\"...\" in a run's "
            f"config, --instruction \"...\" for m2flow demos; one task at a time), or name a task that has one: "
            f"{', '.join(sorted(INSTRUCTIONS))}") from None


def words(text: str) -> list[str]:
    """Lower-cased words of ``text`` (punctuation dropped)."""
    return _WORD.findall(text.lower())


class WordTokenizer:
    """Words -> ids over a fixed, ordered vocabulary: 0 is padding, 1 unknown, then the words in order."""

    def __init__(self, vocabulary: tuple[str, ...] | list[str]) -> None:
        if len(set(vocabulary)) != len(vocabulary):
            raise ValueError("vocabulary: words repeat")
        self.vocabulary = ["<pad>", "<unk>", *vocabulary]
        self._ids = {w: i for i, w in enumerate(self.vocabulary)}

    @classmethod
    def versioned(cls, version: int = VOCABULARY_VERSION) -> WordTokenizer:
        """The tokenizer over vocabulary ``version`` (default: the newest)."""
        if version not in VOCABULARIES:
            raise ValueError(f"vocabulary version {version} is unknown; versions: {sorted(VOCABULARIES)}")
        return cls(VOCABULARIES[version])

    @property
    def vocab_size(self) -> int:
        return len(self.vocabulary)

    def unknown(self, text: str) -> list[str]:
        """The words of ``text`` outside the vocabulary (each read as ``<unk>``)."""
        return [w for w in words(text) if w not in self._ids]

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
