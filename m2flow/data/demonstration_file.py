"""A file of your own demonstrations for an agentic warm start: JSONL, one episode a line.

Each line is an object ``{"prompt": ..., "turns": [model turn, observation, model turn, ...]}``, written
as the environment speaks (the prompt is its first observation, the observations its own); the rollout's
templates are applied to them as to a teacher's. ``turns`` has an odd length: it ends with a model turn.
Optional: ``"kind"`` (a label, 'file' by default) and ``"correct"`` (whether the episode was solved, true by
default). Blank lines are skipped. Any other problem stops the read with one line naming the file and line.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from m2flow.config.errors import InputError
from m2flow.data.teachers import Demonstration

FIELDS = {"prompt", "turns", "kind", "correct"}


def _demonstration(record: Any) -> Demonstration:
    """The episode of one parsed line; a wrong shape raises ValueError saying what is wrong."""
    if not isinstance(record, dict):
        raise ValueError(f"expected an object with 'prompt' and 'turns', got {type(record).__name__}")
    missing = [k for k in ("prompt", "turns") if k not in record]
    if missing:
        raise ValueError(f"missing field {missing[0]!r}")
    unknown = sorted(set(record) - FIELDS)
    if unknown:
        raise ValueError(f"unknown field {unknown[0]!r} (fields: {', '.join(sorted(FIELDS))})")
    prompt, turns = record["prompt"], record["turns"]
    if not isinstance(prompt, str):
        raise ValueError("'prompt' must be a string")
    if not isinstance(turns, list) or not all(isinstance(t, str) for t in turns):
        raise ValueError("'turns' must be a list of strings")
    if len(turns) % 2 != 1:
        raise ValueError(f"'turns' must have an odd length (model turn, observation, ..., model turn), got "
                         f"{len(turns)}")
    kind, correct = record.get("kind", "file"), record.get("correct", True)
    if not isinstance(kind, str) or not isinstance(correct, bool):
        raise ValueError("'kind' must be a string and 'correct' a boolean")
    return Demonstration(prompt, tuple(turns), kind, correct)


def read_demonstrations(path: str | Path) -> list[Demonstration]:
    """Every episode of the JSONL file at ``path``; a missing file, a bad line or an empty file raises an
    ``InputError`` naming the file (and the line)."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise InputError(f"model.warm_start.demonstrations: cannot read {path}: {e}") from None
    demos = []
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            demos.append(_demonstration(json.loads(line)))
        except ValueError as e:  # json.JSONDecodeError is a ValueError
            raise InputError(f"{path}:{number}: {e}") from None
    if not demos:
        raise InputError(f"{path}: no demonstrations (one JSON object a line)")
    return demos
