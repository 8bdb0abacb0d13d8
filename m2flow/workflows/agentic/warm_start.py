"""The model of an agentic run: a tiny one built when asked, then a supervised warm start on the task, once,
before any worker starts.

``prepare_model`` builds a tiny random causal LM at ``model.path`` when it is missing, with a tokenizer that
can write the task's text (``tokenizer.py``). ``warm_start_model`` trains it for ``model.warm_start.steps``
steps on demonstrations of the task: a registered teacher's (``m2flow.data.teachers``; by default the one
named like the environment: ``calculator`` skips the tool in ``skip_rate`` of its episodes and copies the
result wrong in ``copy_error_rate``, ``guess_number`` bisects and guesses at random in ``mistake_rate`` of its
turns), or a JSONL file of your own (``model.warm_start.demonstrations``, ``demonstration_file.py``). The
loss is on the model's turns only; the prompt and observations are written with the rollout's templates, as
the episodes will be. Progress goes to ``run_dir/warm_start.jsonl`` (and a console bar when the console sink
is on). The result is saved in ``run_dir/warm_start`` with the settings that made it (a file's content hash
among them); a later start with the same settings reuses it.
"""

from __future__ import annotations

import logging
import shutil
import time
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from m2flow.config.convert import to_dict
from m2flow.config.errors import InputError
from m2flow.data.teachers import Demonstration
from m2flow.workflows.agentic.config import AgenticConfig, ModelConfig
from m2flow.workflows.warm_start_dir import SETTINGS_FILE, WARM_START_DIR, file_digest, keep, reusable

log = logging.getLogger(__name__)

METRICS_FILE = "warm_start.jsonl"
ALPHABET_DEMOS = 64
"""Teacher demonstrations whose characters a new tiny model's char tokenizer covers (beyond printable ASCII)."""


def prepare_model(model: ModelConfig, texts: Sequence[str] | None = None) -> Path:
    """The model directory, built first (tiny random model and its tokenizer over ``texts``; None: the shipped
    environments' alphabet) when asked and missing."""
    path = Path(model.path)
    if path.is_dir():
        return path
    if not model.create_tiny:
        raise InputError(f"model.path: {path} does not exist (set model.create_tiny to build a tiny model)")
    from m2flow.models.tiny import TinyModelConfig, build_tiny_model, save_checkpoint
    from m2flow.workflows.agentic.tokenizer import SHIPPED_ALPHABET, build_tokenizer

    spec = model.tiny
    tokenizer = build_tokenizer(spec.tokenizer, [SHIPPED_ALPHABET] if texts is None else texts)
    lm = build_tiny_model(TinyModelConfig(
        hidden_size=spec.hidden_size, num_layers=spec.num_layers, num_heads=spec.num_heads,
        num_kv_heads=spec.num_kv_heads, intermediate_size=spec.intermediate_size,
        max_position_embeddings=spec.max_position_embeddings, seed=spec.seed), tokenizer)
    # Written to a sibling first, then renamed: a crash mid-way never leaves a half model at path.
    tmp = path.with_name(path.name + ".partial")
    shutil.rmtree(tmp, ignore_errors=True)
    save_checkpoint(lm, tokenizer, tmp)
    tmp.rename(path)
    log.info("built a tiny model at %s (%s tokenizer, %d tokens)", path, spec.tokenizer, len(tokenizer))
    return path


def prepare_task_model(cfg: AgenticConfig) -> Path:
    """``prepare_model`` for ``cfg``'s task: its tokenizer covers the text of the task (``tokenizer.py``)."""
    from m2flow.workflows.agentic.tokenizer import task_texts, uses_shipped_alphabet

    if Path(cfg.model.path).is_dir() or not cfg.model.create_tiny or uses_shipped_alphabet(cfg):
        return prepare_model(cfg.model)
    demos = raw_demonstrations(cfg, ALPHABET_DEMOS) if cfg.model.warm_start.steps else []
    return prepare_model(cfg.model, task_texts(cfg, demos))


def teacher_name(cfg: AgenticConfig) -> str:
    """The registered teacher of the warm start: ``model.warm_start.teacher``, else the environment's name."""
    return cfg.model.warm_start.teacher or cfg.env.name


def raw_demonstrations(cfg: AgenticConfig, count: int) -> list[Demonstration]:
    """The demonstrations as the environment speaks: every episode of ``model.warm_start.demonstrations``, or
    ``count`` of the teacher's."""
    from m2flow.data.teachers import TEACHERS, TeachRequest, teach

    ws = cfg.model.warm_start
    if ws.demonstrations is not None:
        from m2flow.data.demonstration_file import read_demonstrations

        return read_demonstrations(ws.demonstrations)
    name = teacher_name(cfg)
    if name not in TEACHERS:
        raise InputError(f"model.warm_start: no teacher demonstrates {name!r}; teachers: {', '.join(TEACHERS)}")
    # A turn ends as generation ends it: at the first stop string (end-of-sequence when there is none).
    end = cfg.rollout.stop[0] if cfg.rollout.stop else ""
    return teach(name, TeachRequest(count=count, seed=cfg.seed, env_kwargs=dict(cfg.env.kwargs), turn_end=end,
                                    warm_start=ws, options=dict(ws.teacher_kwargs)))


def demonstrations(cfg: AgenticConfig, count: int) -> list[Demonstration]:
    """The warm start's demonstrations (``raw_demonstrations``), written with the rollout's templates."""
    demos = raw_demonstrations(cfg, count)
    r = cfg.rollout
    if (r.prompt_template, r.observation_template) == ("{observation}", "{observation}"):
        return demos
    return [replace(d, prompt=r.prompt_template.format(observation=d.prompt),
                    turns=tuple(t if k % 2 == 0 else r.observation_template.format(observation=t)
                                for k, t in enumerate(d.turns))) for d in demos]


def settings(cfg: AgenticConfig, base: Path) -> dict[str, Any]:
    """Everything the warm-started weights depend on; a saved warm start is reused only when this matches."""
    ws = cfg.model.warm_start
    if ws.demonstrations is not None:

        source: dict[str, Any] = {"file_sha256": file_digest(ws.demonstrations, "model.warm_start.demonstrations")}
    else:
        source = {"teacher": teacher_name(cfg)}
    # format 2: saved with the tokenizer built here (before, a reload beside the model dropped every space)
    return {"format": 2, "base": str(base.resolve()), "tiny": to_dict(cfg.model.tiny) if cfg.model.create_tiny else None,
            "warm_start": to_dict(ws), **source, "seed": cfg.seed, "env": cfg.env.name,
            "env_kwargs": cfg.env.kwargs, "stop": cfg.rollout.stop,
            "templates": [cfg.rollout.prompt_template, cfg.rollout.observation_template]}


def saved_warm_start(cfg: AgenticConfig, base: Path) -> Path | None:
    """``run_dir/warm_start`` when it holds a finished warm start made with this run's settings."""
    return reusable(Path(cfg.run_dir), settings(cfg, base))


def warm_start_model(cfg: AgenticConfig, base: Path) -> Path:
    """The warm-started model's directory: reused from run_dir when its settings match, else trained here."""
    from m2flow.data.calculator_demos import sft_pairs
    from m2flow.metrics import ConsoleSink, JsonlSink, MetricsLogger
    from m2flow.models.causal_lm import load_model_and_tokenizer
    from m2flow.models.sft import sft_steps
    from m2flow.models.tiny import save_checkpoint

    ws = cfg.model.warm_start
    saved = saved_warm_start(cfg, base)
    if saved is not None:
        log.info("warm start: reusing %s (same settings)", saved)
        return saved
    import torch

    if ws.threads:
        torch.set_num_threads(ws.threads)
    demos = demonstrations(cfg, ws.steps * ws.batch_size)  # first: a bad file fails before the model loads
    model, tokenizer = load_model_and_tokenizer(str(base))
    pairs = sft_pairs(demos)
    source = ws.demonstrations or f"teacher {teacher_name(cfg)!r}"
    log.info("warm start: %d supervised steps on %d demonstrations (%d model turns) from %s", ws.steps,
             len(demos), len(pairs), source)
    run_dir = Path(cfg.run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / METRICS_FILE).unlink(missing_ok=True)
    sinks: list[Any] = [JsonlSink(run_dir, filename=METRICS_FILE)]
    if "console" in cfg.metrics.sinks:
        sinks.append(ConsoleSink(ws.steps, "warm start", ["warm_start/loss"]))
    start = time.perf_counter()
    with MetricsLogger(run_dir, is_main=True, sinks=sinks, extra_prefixes=("warm_start",)) as metrics:
        losses = sft_steps(model, tokenizer, pairs, steps=ws.steps, lr=ws.lr, batch_size=ws.batch_size,
                           seed=cfg.seed, warmup_steps=ws.warmup_steps,
                           on_step=lambda step, loss: metrics.log({"warm_start/loss": loss}, step))
    path = keep(run_dir, settings(cfg, base), lambda tmp: save_checkpoint(model, tokenizer, tmp))
    log.info("warm start: %d steps in %.1f s, loss %.3f -> %.3f; saved %s", ws.steps, time.perf_counter() - start,
             losses[0], losses[-1], path)
    return path
