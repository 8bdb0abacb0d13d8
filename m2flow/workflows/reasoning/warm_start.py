"""The supervised warm start of a reasoning run: a model-preparation step before any worker starts.

``warm_start_model`` trains the model at ``model.path`` for ``model.warm_start.steps`` supervised
steps on demonstrations (the training split's reference answers, a synthetic task's imperfect
teacher, or a JSONL file of the user's own prompt/response pairs) and saves it in ``run_dir/warm_start``
together with the settings that made it (a file's settings include a hash of its content). A later
start with the same settings (a resumed run, a rerun in the same directory) loads that model instead
of training again. Progress goes to a console bar (the driver is the main process) and to
``run_dir/warm_start.jsonl``, one row per step.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any

from m2flow.config.convert import to_dict
from m2flow.metrics import ConsoleSink, JsonlSink, MetricsLogger
from m2flow.workflows.reasoning.config import ReasoningConfig
from m2flow.workflows.warm_start_dir import SETTINGS_FILE, WARM_START_DIR, file_digest, keep, reusable
from m2flow.workflows.reasoning.data import (
    file_demonstrations,
    raw_records,
    synthetic_settings,
    synthetic_task,
    warm_start_pairs,
)

log = logging.getLogger(__name__)

METRICS_FILE = "warm_start.jsonl"


def demonstrations(cfg: ReasoningConfig, tokenizer: Any) -> list[tuple[str, str]]:
    """(formatted prompt, target) pairs of the configured source, as the rollout will see the prompts."""
    ws = cfg.model.warm_start
    if ws.source == "file":
        assert ws.file is not None
        return file_demonstrations(ws.file, cfg.data, tokenizer)
    if ws.source == "teacher":
        # A fresh draw for every demonstration shown (steps x batch), as a teacher answering on demand
        # would give; each slips or not independently, so a problem seen twice may get both answers.
        records: list[Any] = synthetic_task(cfg.data).teacher_demonstrations(
            max(1, ws.steps) * ws.batch_size, synthetic_settings(cfg.data).teacher_slip_rate, seed=cfg.seed)
    else:
        records = raw_records(cfg.data, "train") or []
    return warm_start_pairs(cfg.data, records, tokenizer)


def settings(cfg: ReasoningConfig, base: Path) -> dict[str, Any]:
    """Everything the warm-started weights depend on; a saved warm start is reused only when this matches."""
    out = {"base": str(base.resolve()), "tiny": to_dict(cfg.model.tiny) if cfg.model.create_tiny else None,
           "warm_start": to_dict(cfg.model.warm_start), "data": to_dict(cfg.data), "seed": cfg.seed}
    if cfg.model.warm_start.source == "file":  # the same name with other lines in it is another warm start
        out["file_sha256"] = file_hash(cfg.model.warm_start.file or "")
    return out


def file_hash(path: str) -> str:
    """The SHA-256 of a demonstrations file's bytes."""
    return file_digest(path, "model.warm_start.file")


def saved_warm_start(cfg: ReasoningConfig, base: Path) -> Path | None:
    """``run_dir/warm_start`` when it holds a finished warm start made with this run's settings."""
    return reusable(Path(cfg.run_dir), settings(cfg, base))


def warm_start_model(cfg: ReasoningConfig, base: Path) -> Path:
    """The warm-started model's directory: reused from run_dir when its settings match, else trained here."""
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
    model, tokenizer = load_model_and_tokenizer(str(base))
    pairs = demonstrations(cfg, tokenizer)
    log.info("warm start: %d supervised steps on %d demonstrations (%s)", ws.steps, len(pairs), ws.source)
    run_dir = Path(cfg.run_dir)
    (run_dir / METRICS_FILE).unlink(missing_ok=True)
    sinks: list[Any] = [JsonlSink(run_dir, filename=METRICS_FILE)]
    if "console" in cfg.metrics.sinks:
        sinks.append(ConsoleSink(ws.steps, "warm start", ["warm_start/loss"]))
    start = time.perf_counter()
    with MetricsLogger(run_dir, is_main=True, sinks=sinks, extra_prefixes=("warm_start",)) as metrics:
        losses = sft_steps(model, tokenizer, pairs, steps=ws.steps, lr=ws.lr, batch_size=ws.batch_size,
                           seed=cfg.seed, warmup_steps=ws.warmup_steps,
                           on_step=lambda step, loss: metrics.log({"warm_start/loss": loss}, step))
    seconds = time.perf_counter() - start
    path = keep(run_dir, settings(cfg, base), lambda tmp: save_checkpoint(model, tokenizer, tmp))
    log.info("warm start: %d steps in %.1f s, last loss %.4f; saved %s", ws.steps, seconds, losses[-1], path)
    return path
