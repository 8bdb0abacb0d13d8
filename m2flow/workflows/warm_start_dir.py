"""Where every workflow keeps its warm start, and when a saved one is reused.

A warm start (supervised fine-tuning of a language model, behaviour cloning of a VLA) runs once in the
driver, before any worker starts, and is kept in ``run_dir/warm_start`` with the settings that made it
(``warm_start_settings.json``). A later start with the same settings (a resumed run, a rerun in the same
directory, ``m2flow train`` after ``m2flow warm-start``) reuses it; any change trains it again. A file the
settings name (a user's demonstrations) enters them by the digest of its bytes, so an edited file is noticed
under the same name.
"""

from __future__ import annotations

import hashlib
import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

from m2flow.config.errors import InputError

WARM_START_DIR = "warm_start"
SETTINGS_FILE = "warm_start_settings.json"


def reusable(run_dir: Path, settings: dict[str, Any], needs: str | None = None) -> Path | None:
    """``run_dir/warm_start`` when it holds a finished warm start made with ``settings`` (and the file ``needs``
    inside it), else None."""
    path = Path(run_dir) / WARM_START_DIR
    marker = path / SETTINGS_FILE
    if needs is not None and not (path / needs).is_file():
        return None
    if marker.is_file() and json.loads(marker.read_text()) == json.loads(json.dumps(settings)):
        return path
    return None


def keep(run_dir: Path, settings: dict[str, Any], write: Callable[[Path], None]) -> Path:
    """Save a warm start: ``write(directory)`` fills a sibling directory, whose settings file is written last,
    and the sibling is renamed into place, so a crash mid-way never leaves a half warm start that a later start
    would take for a finished one. Returns ``run_dir/warm_start``."""
    path = Path(run_dir) / WARM_START_DIR
    tmp = path.with_name(path.name + ".partial")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    write(tmp)
    (tmp / SETTINGS_FILE).write_text(json.dumps(settings, indent=1))
    shutil.rmtree(path, ignore_errors=True)
    tmp.rename(path)
    return path


def file_digest(path: str | Path, key: str) -> str:
    """The SHA-256 of a file's bytes; a file that cannot be read is one error naming config key ``key``."""
    try:
        return hashlib.sha256(Path(path).read_bytes()).hexdigest()
    except OSError as e:
        raise InputError(f"{key}: cannot read {path} ({e.strerror or e})") from None
