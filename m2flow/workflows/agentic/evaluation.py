"""A saved agentic checkpoint evaluated in this process (``m2flow eval``): the run's held-out evaluation.

The policy saved in the checkpoint plays the held-out episodes the run evaluates on (seeds from
``flow.EVAL_SEED``, the environment under ``env.eval_kwargs``, sampled at ``rollout.eval_temperature``) with
the run's own generation backend and episode budgets, read from the config saved with the checkpoint;
the same function plays them (``workers/agentic/episode.held_out_metrics``), so with the same episodes a
checkpoint scores what the run logged when it wrote it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

from m2flow.driver.checkpoints import CheckpointError
from m2flow.workflows.agentic.config import AgenticConfig


def saved_config(path: Path, overrides: Sequence[str] = ()) -> AgenticConfig:
    """The config of the run that wrote checkpoint ``path`` (checked whole), under ``overrides``."""
    from m2flow.config.loader import load_config
    from m2flow.driver.checkpoints import verify_checkpoint
    from m2flow.driver.run import CONFIG_FILE

    if verify_checkpoint(path).get("workflow") != "agentic":
        raise CheckpointError(f"{path} is not an agentic checkpoint")
    return load_config(AgenticConfig, path / CONFIG_FILE, list(overrides))


def evaluate_checkpoint(path: str | Path, episodes: int | None = None, overrides: Sequence[str] = ()) -> dict[str, float]:
    """The held-out metrics (``eval/...``) of a saved checkpoint's policy over ``episodes`` held-out episodes
    (None: the run's ``eval_episodes``); ``overrides`` (``key=value``) change the run's config, e.g.
    ``env.eval_kwargs.high=16`` or ``rollout.max_turns=8``."""
    return evaluate_saved(Path(path), saved_config(Path(path), overrides), episodes)


def evaluate_saved(path: Path, cfg: AgenticConfig, episodes: int | None = None) -> dict[str, float]:
    """``evaluate_checkpoint`` with the run's config ``cfg`` read already."""
    import torch

    from m2flow.backends.generation import GenerationOptions, create_generation_backend
    from m2flow.models.tokenizer import load_tokenizer
    from m2flow.workers.agentic.episode import held_out_metrics
    from m2flow.workflows.agentic.flow import EVAL_SEED
    from m2flow.workflows.agentic.settings import env_settings, episode_config
    from m2flow.workflows.saved_model import loadable_model, model_dir

    count = cfg.eval_episodes if episodes is None else episodes
    seeds = list(range(EVAL_SEED, EVAL_SEED + count))
    env = env_settings(cfg, 1, {**cfg.env.kwargs, **cfg.env.eval_kwargs})
    r = cfg.rollout
    options = GenerationOptions(device="cuda" if torch.cuda.is_available() else "cpu", dtype=r.dtype, seed=cfg.seed,
                                compile=r.compile)
    with loadable_model(model_dir(path)) as whole:
        backend = create_generation_backend(r.backend, str(whole), options)
        tokenizer = load_tokenizer(str(whole))
        return held_out_metrics(backend, tokenizer, env, seeds, replace(episode_config(cfg), temperature=r.eval_temperature))


def summary(path: Path, env: str, episodes: int, results: dict[str, float]) -> str:
    """The one line ``m2flow eval`` prints."""
    return (f"{path}: mean return {results['eval/return_mean']:.3f}, success {results['eval/success']:.3f}, "
            f"{results['eval/turns_mean']:.2f} turns and {results['eval/tool_calls']:.2f} tool calls per episode "
            f"over {episodes} held-out episodes ({env})")
