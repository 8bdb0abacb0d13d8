"""A saved embodied checkpoint evaluated in this process (``m2flow eval``): the policy's whole episodes with
deterministic (greedy) actions, then the same held-out episodes with sampled actions, under the run's own env
config and normalisation statistics; no workers."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from m2flow.driver.checkpoints import CheckpointError
from m2flow.workflows.embodied.config import EmbodiedConfig

DEFAULT_EPISODES = 10
"""Episodes ``m2flow eval`` averages over when ``--episodes`` is not given."""


def evaluate_checkpoint(path: str | Path, episodes: int = DEFAULT_EPISODES, overrides: Sequence[str] = (),
                        sampled: bool = True) -> dict[str, float]:
    """Greedy episodes of a saved checkpoint's policy, in this process (no workers): ``eval/return``,
    ``eval/length``, ``eval/success`` (where the env reports it) ...; with ``sampled`` the same held-out
    episodes (the same env seeds) again with actions sampled from the policy, as ``eval/sampled_...``. A
    VLA's greedy and sampled success often differ widely (docs/vla.md), so both are reported.

    The run's config is read from the checkpoint; ``overrides`` (``key=value``) change it, e.g.
    ``env.num_envs=1`` or ``env.env_kwargs.render_mode=human``.
    """
    from m2flow.config.loader import load_config
    from m2flow.driver.checkpoints import verify_checkpoint
    from m2flow.driver.run import CONFIG_FILE
    from m2flow.workers.embodied.evaluate import evaluate_policy, load_checkpoint_parts

    path = Path(path)
    if verify_checkpoint(path).get("workflow") != "embodied":
        raise CheckpointError(f"{path} is not an embodied checkpoint")
    cfg = load_config(EmbodiedConfig, path / CONFIG_FILE, list(overrides))
    weights, norm = load_checkpoint_parts(path)
    results = evaluate_policy(cfg.env, cfg.policy, weights, norm, episodes, seed=cfg.seed, deterministic=True)
    if sampled and results.get("eval/episodes"):
        other = evaluate_policy(cfg.env, cfg.policy, weights, norm, episodes, seed=cfg.seed, deterministic=False)
        results |= {f"eval/sampled_{k.removeprefix('eval/')}": v for k, v in other.items()}
    return results


def summary(path: Path, results: dict[str, float]) -> str:
    """The one line ``m2flow eval`` prints."""
    line = (f"{path}: mean return {results['eval/return']:.2f} (std {results['eval/return_std']:.2f}), "
            f"mean length {results['eval/length']:.1f} over {int(results['eval/episodes'])} episodes")
    if "eval/success" in results:
        line += f", success {results['eval/success']:.2f}"
    if "eval/sampled_return" in results:
        line += f"; sampled actions: mean return {results['eval/sampled_return']:.2f}"
        if "eval/sampled_success" in results:
            line += f", success {results['eval/sampled_success']:.2f}"
    return line
