"""The model of an agentic run: a tiny one built when asked, then a supervised warm start on the task by an
imperfect teacher, once, before any worker starts.

``prepare_model`` builds a tiny random causal LM with a character tokenizer over the tasks' alphabet at
``model.path`` when it is missing. ``warm_start_model`` trains it for ``model.warm_start.steps`` steps on the
demonstrations of the environment's teacher (``TEACHERS``): ``CalculatorTeacher`` for ``calculator`` (it
skips the tool and guesses in ``skip_rate`` of them, copies the result wrong in ``copy_error_rate``),
``GuessTeacher`` for ``guess_number`` (it bisects, and guesses a random other number in ``mistake_rate`` of
its turns). The loss is on the model's turns only; the prompt and observations are written with the
rollout's templates, as the episodes will be. The result is saved in ``run_dir/warm_start`` with the
settings that made it; a later start with the same settings reuses it.
"""

from __future__ import annotations

import json
import logging
import shutil
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from m2flow.config.convert import to_dict
from m2flow.config.errors import InputError
from m2flow.data.calculator_demos import Demonstration
from m2flow.workflows.agentic.config import TEACHERS, AgenticConfig, ModelConfig

log = logging.getLogger(__name__)

WARM_START_DIR = "warm_start"
SETTINGS_FILE = "warm_start_settings.json"
EXTRA_CHARS = "?.,!"
"""Characters of the shipped environments' words beyond the calculator's alphabet ('a number?')."""


def prepare_model(model: ModelConfig) -> Path:
    """The model directory, built first (tiny random model and its character tokenizer) when asked and missing."""
    path = Path(model.path)
    if path.is_dir():
        return path
    if not model.create_tiny:
        raise InputError(f"model.path: {path} does not exist (set model.create_tiny to build a tiny model)")
    from m2flow.data.calculator_demos import CALCULATOR_ALPHABET
    from m2flow.models.tiny import TinyModelConfig, build_tiny_model, save_checkpoint
    from m2flow.models.tokenizer import train_char_tokenizer

    spec = model.tiny
    tokenizer = train_char_tokenizer(["".join(CALCULATOR_ALPHABET) + EXTRA_CHARS])
    lm = build_tiny_model(TinyModelConfig(
        hidden_size=spec.hidden_size, num_layers=spec.num_layers, num_heads=spec.num_heads,
        num_kv_heads=spec.num_kv_heads, intermediate_size=spec.intermediate_size,
        max_position_embeddings=spec.max_position_embeddings, seed=spec.seed), tokenizer)
    # Written to a sibling first, then renamed: a crash mid-way never leaves a half model at path.
    tmp = path.with_name(path.name + ".partial")
    shutil.rmtree(tmp, ignore_errors=True)
    save_checkpoint(lm, tokenizer, tmp)
    tmp.rename(path)
    log.info("built a tiny model at %s", path)
    return path


def demonstrations(cfg: AgenticConfig, count: int) -> list[Demonstration]:
    """``count`` demonstrations of ``cfg.env.name`` by its imperfect teacher, written with the rollout's templates."""
    ws, name = cfg.model.warm_start, cfg.env.name
    if name == "calculator":
        from m2flow.data.calculator_demos import CalculatorTeacher

        demos = CalculatorTeacher(skip_rate=ws.skip_rate, copy_error_rate=ws.copy_error_rate,
                                  digits=ws.digits).demonstrations(count, seed=cfg.seed)
    elif name == "guess_number":
        from m2flow.data.guess_demos import GuessTeacher

        # A turn ends as generation ends it: at the first stop string (end-of-sequence when there is none).
        end = cfg.rollout.stop[0] if cfg.rollout.stop else ""
        kwargs = {k: cfg.env.kwargs[k] for k in ("high", "max_turns") if k in cfg.env.kwargs}
        demos = GuessTeacher(mistake_rate=ws.mistake_rate, turn_end=end).demonstrations(count, seed=cfg.seed, **kwargs)
    else:
        raise InputError(f"model.warm_start: no teacher demonstrates {name!r}; teachers: {', '.join(TEACHERS)}")
    r = cfg.rollout
    if (r.prompt_template, r.observation_template) == ("{observation}", "{observation}"):
        return demos
    return [replace(d, prompt=r.prompt_template.format(observation=d.prompt),
                    turns=tuple(t if k % 2 == 0 else r.observation_template.format(observation=t)
                                for k, t in enumerate(d.turns))) for d in demos]


def settings(cfg: AgenticConfig, base: Path) -> dict[str, Any]:
    """Everything the warm-started weights depend on; a saved warm start is reused only when this matches."""
    # format 2: saved with the tokenizer built here (before, a reload beside the model dropped every space)
    return {"format": 2, "base": str(base.resolve()), "tiny": to_dict(cfg.model.tiny) if cfg.model.create_tiny else None,
            "warm_start": to_dict(cfg.model.warm_start), "seed": cfg.seed, "env": cfg.env.name,
            "env_kwargs": cfg.env.kwargs, "stop": cfg.rollout.stop,
            "templates": [cfg.rollout.prompt_template, cfg.rollout.observation_template]}


def warm_start_model(cfg: AgenticConfig, base: Path) -> Path:
    """The warm-started model's directory: reused from run_dir when its settings match, else trained here."""
    from m2flow.data.calculator_demos import sft_pairs
    from m2flow.models.causal_lm import load_model_and_tokenizer
    from m2flow.models.sft import sft_steps
    from m2flow.models.tiny import save_checkpoint

    ws = cfg.model.warm_start
    path = Path(cfg.run_dir) / WARM_START_DIR
    marker = path / SETTINGS_FILE
    wanted = json.loads(json.dumps(settings(cfg, base)))
    if marker.is_file() and json.loads(marker.read_text()) == wanted:
        log.info("warm start: reusing %s (same settings)", path)
        return path
    import torch

    if ws.threads:
        torch.set_num_threads(ws.threads)
    model, tokenizer = load_model_and_tokenizer(str(base))
    pairs = sft_pairs(demonstrations(cfg, ws.steps * ws.batch_size))
    start = time.perf_counter()
    losses = sft_steps(model, tokenizer, pairs, steps=ws.steps, lr=ws.lr, batch_size=ws.batch_size, seed=cfg.seed,
                       warmup_steps=ws.warmup_steps)
    tmp = path.with_name(path.name + ".partial")
    shutil.rmtree(tmp, ignore_errors=True)
    save_checkpoint(model, tokenizer, tmp)
    (tmp / SETTINGS_FILE).write_text(json.dumps(wanted, indent=1))
    shutil.rmtree(path, ignore_errors=True)
    tmp.rename(path)
    log.info("warm start: %d steps in %.1f s, loss %.3f -> %.3f; saved %s", ws.steps, time.perf_counter() - start,
             losses[0], losses[-1], path)
    return path
