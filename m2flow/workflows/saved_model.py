"""The policy model a training checkpoint holds, as a directory a generation backend loads (``m2flow eval``).

A checkpoint keeps the actor's model under ``actor/``: whole weights in Hugging Face format, or, written by
a sharded strategy, each rank's shards, which are put together here in a scratch copy.
"""

from __future__ import annotations

import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


def model_dir(checkpoint: Path) -> Path:
    """The model directory inside a training checkpoint, or the path itself."""
    from m2flow.workers.actor_files import ACTOR_DIR

    return checkpoint / ACTOR_DIR if (checkpoint / ACTOR_DIR / "config.json").is_file() else checkpoint


@contextmanager
def loadable_model(path: Path) -> Iterator[Path]:
    """A model directory with whole weights for the model directory ``path``: itself, or (sharded) a scratch
    copy with the shards put together, removed on exit."""
    from m2flow.workers.actor_files import SHARDS, whole_model_dir

    if not (path / SHARDS).is_dir():
        yield path
        return
    with tempfile.TemporaryDirectory(prefix="m2flow-eval-") as scratch:
        yield whole_model_dir(path, Path(scratch))
