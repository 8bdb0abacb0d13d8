"""Model files checked before and while loading, so a bad one fails naming the file (or the key).

A model directory comes from the user: its ``*.safetensors`` files may be truncated or have a broken
header, and a ``pytorch_model.bin`` is a pickle that may carry code. ``check_safetensors`` opens
each safetensors header first (cheap: the header only, the tensors are memory-mapped, not read);
``readable_weights`` wraps a ``from_pretrained`` call and turns a refused pickle (torch loads model
pickles with ``weights_only=True``) into a ``ModelFileError`` naming the file. Neither message
repeats torch's advice to load the file with ``weights_only=False``: that is what must not happen.
``check_max_new_tokens`` refuses a response length the model's positions cannot hold.
"""

from __future__ import annotations

import pickle
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from m2flow.config.errors import ConfigError, InputError

PICKLE_SUFFIXES = (".bin", ".pt", ".pth")


class ModelFileError(InputError):
    """A weights file of a model directory cannot be loaded (truncated, corrupted, or code in a pickle)."""


def refusal_reason(exc: BaseException) -> str:
    """The line of a refused ``torch.load(weights_only=True)`` that says what was refused
    (``Unsupported global: GLOBAL posix.system ...``), without torch's advice around it."""
    lines = [line.strip() for line in str(exc).splitlines() if "unsupported" in line.lower()]
    return lines[0] if lines else type(exc).__name__


def check_safetensors(path: Path) -> None:
    """Raise ``ModelFileError`` naming the first ``*.safetensors`` file of directory ``path`` (or the
    file ``path``) whose header cannot be read or that is shorter than its header says."""
    from safetensors import SafetensorError, safe_open

    files = [path] if path.is_file() else sorted(path.glob("*.safetensors"))
    for file in files:
        try:
            with safe_open(str(file), framework="pt"):
                pass
        except (SafetensorError, OSError) as exc:
            raise ModelFileError(f"{file}: not a readable safetensors file ({exc}); the file is truncated or "
                                 "corrupted: copy it again") from None


@contextmanager
def readable_weights(path: Path) -> Iterator[None]:
    """Around a load of the model directory ``path``: a pickled weights file torch refused becomes a
    ``ModelFileError`` naming the file(s)."""
    try:
        yield
    except pickle.UnpicklingError as exc:
        files = sorted(p for p in path.iterdir() if p.suffix in PICKLE_SUFFIXES) if path.is_dir() else [path]
        named = ", ".join(str(f) for f in files) or str(path)
        raise ModelFileError(f"{named}: refused to load: the pickled weights hold objects other than tensors, "
                             f"which could run code ({refusal_reason(exc)}); use a model saved as safetensors "
                             "from a source you trust") from None


_POSITION_KEYS = ("max_position_embeddings", "n_positions", "max_seq_len", "seq_length")


def max_positions(config: object) -> int | None:
    """The most positions (prompt + response tokens) a model config allows, or None when it names none."""
    for key in _POSITION_KEYS:
        value = getattr(config, key, None)
        if isinstance(value, int) and value > 0:
            return value
    return None


def check_max_new_tokens(key: str, max_new_tokens: int, model: object) -> None:
    """Raise ``ConfigError(key)`` when ``max_new_tokens`` leaves no room for a prompt in ``model``'s
    positions (its ``config``); a model that names no limit (or None: an engine of its own) passes."""
    limit = max_positions(getattr(model, "config", None))
    if limit is not None and max_new_tokens >= limit:
        name = getattr(getattr(model, "config", None), "name_or_path", "") or "the model"
        raise ConfigError(key, f"{max_new_tokens} tokens do not fit in the {limit} positions of {name} "
                               f"(prompt + response, its config.json); use at most {limit - 1}, less the "
                               "longest prompt")
