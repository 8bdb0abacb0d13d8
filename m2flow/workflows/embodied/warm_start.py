"""The behaviour-cloning warm start of an embodied VLA run, once in the driver before any worker starts.

``warm_start_policy`` clones the demonstrations of ``policy.warm_start.demos`` (a file of ``m2flow
demos``) into a fresh VLA of ``policy.vla``'s sizes (or into ``policy.init_from``'s weights when set),
with the loss of ``m2flow.models.bc``: cross-entropy on the expert's binned action tokens (with
``vla.chunk`` K > 1, each frame's next K actions). The result,
``run_dir/warm_start/policy.pt``, is saved with the settings that made it (the warm-start options, the
VLA's sizes, the seed, the identity of the demos and init files); a later start with the same settings
reuses it, any change trains again. The workers then start from it as from ``policy.init_from``.
Progress goes to a console bar and to ``run_dir/warm_start.jsonl``, one row per epoch.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any

from m2flow.config.convert import to_dict
from m2flow.config.errors import InputError
from m2flow.workflows.embodied.config import EmbodiedConfig
from m2flow.workflows.warm_start_dir import SETTINGS_FILE, WARM_START_DIR, keep, reusable

log = logging.getLogger(__name__)

POLICY_FILE = "policy.pt"
METRICS_FILE = "warm_start.jsonl"


def _identity(path: str | None) -> dict[str, Any] | None:
    """Where a file is and which version of it (size and modification time): a rewritten file trains again."""
    if path is None:
        return None
    p = Path(path).resolve()
    stat = p.stat()
    return {"path": str(p), "bytes": stat.st_size, "mtime_ns": stat.st_mtime_ns}


def settings(cfg: EmbodiedConfig) -> dict[str, Any]:
    """Everything the cloned weights depend on; a saved warm start is reused only when this matches."""
    ws = to_dict(cfg.policy.warm_start)
    ws.pop("threads")  # how fast, not what
    return {"format": 1, "warm_start": ws, "demos": _identity(cfg.policy.warm_start.demos),
            "init_from": _identity(cfg.policy.init_from), "vla": to_dict(cfg.policy.vla), "seed": cfg.seed}


def saved_warm_start(cfg: EmbodiedConfig, run_dir: Path) -> Path | None:
    """``run_dir/warm_start/policy.pt`` when it holds a finished warm start made with this run's settings."""
    path = reusable(run_dir, settings(cfg), needs=POLICY_FILE)
    return None if path is None else path / POLICY_FILE


def load_demos(path: str) -> Any:
    """The demonstrations of ``path``; a missing or malformed file is one InputError naming it."""
    from m2flow.envs.metaworld_demos import Demos

    if not Path(path).is_file():
        raise InputError(f"policy.warm_start.demos: {path}: no such file (write one with `m2flow demos TASK -o {path}`)")
    try:
        return Demos.load(path)
    except ValueError as error:
        raise InputError(f"policy.warm_start.demos: {error}") from None


def _check_fit(cfg: EmbodiedConfig, demos: Any, path: str) -> None:
    """Demonstrations the policy cannot read fail here, naming the file; tasks the run does not train are logged."""
    layout = cfg.policy.vla.layout()
    if demos.obs.shape[1] != layout.size:
        raise InputError(
            f"policy.warm_start.demos: {path}: observations of {demos.obs.shape[1]} bytes, but the policy reads "
            f"{layout.size} ({layout.height}x{layout.width} images, {layout.text_len} instruction tokens, "
            f"{layout.proprio_dim} proprio); write the demos with the run's image size (m2flow demos --image-size)")
    if cfg.env.backend == "metaworld":
        from m2flow.envs.metaworld import expand_tasks

        others = sorted(set(demos.tasks.tolist()) - set(expand_tasks(cfg.env.env_id,
                                                                      cfg.env.env_kwargs.get("instruction"))))
        if others:
            log.warning("warm start: %s holds tasks this run does not train: %s", path, others)


def warm_start_policy(cfg: EmbodiedConfig, run_dir: Path) -> Path:
    """The cloned policy's file: reused from ``run_dir/warm_start`` when its settings match, else trained here."""
    ws = cfg.policy.warm_start
    assert ws.demos is not None, "warm_start_policy needs policy.warm_start.demos"
    demos = load_demos(ws.demos)
    _check_fit(cfg, demos, ws.demos)
    saved = saved_warm_start(cfg, run_dir)
    if saved is not None:
        log.info("warm start: reusing %s (same settings)", saved)
        return saved
    import torch

    from m2flow.metrics import ConsoleSink, JsonlSink, MetricsLogger
    from m2flow.models.bc import BCConfig, behaviour_clone
    from m2flow.models.vla import VLAPolicy, save_policy

    if ws.threads:
        torch.set_num_threads(ws.threads)
    torch.manual_seed(cfg.seed)
    policy = VLAPolicy(cfg.policy.vla, action_dim=demos.actions.shape[1])
    if cfg.policy.init_from is not None:
        from m2flow.models.init_weights import load_policy_weights

        load_policy_weights(policy, cfg.policy.init_from)
    bc = BCConfig(epochs=ws.epochs, batch_size=ws.batch_size, lr=ws.lr, weight_decay=ws.weight_decay, shift=ws.shift,
                  standardize_proprio=ws.standardize_proprio, seed=cfg.seed)
    log.info("warm start: behaviour cloning on %d steps of %d episodes (%s), %d epochs", len(demos),
             len(demos.tasks), ws.demos, ws.epochs)
    (run_dir / METRICS_FILE).unlink(missing_ok=True)
    sinks: list[Any] = [JsonlSink(run_dir, filename=METRICS_FILE)]
    if "console" in cfg.metrics.sinks:
        sinks.append(ConsoleSink(ws.epochs, "warm start", ["warm_start/loss", "warm_start/token_accuracy"]))
    start = time.perf_counter()
    with MetricsLogger(run_dir, is_main=True, sinks=sinks, extra_prefixes=("warm_start",)) as metrics:
        history = behaviour_clone(policy, demos.obs, demos.actions, bc, progress=lambda p: metrics.log(
            {"warm_start/loss": p.loss, "warm_start/token_accuracy": p.token_accuracy}, p.epoch),
            episode=demos.episode)
    path = keep(run_dir, settings(cfg), lambda tmp: save_policy(policy, tmp / POLICY_FILE))
    log.info("warm start: %d epochs in %.1f s, loss %.3f -> %.3f, token accuracy %.3f; saved %s", ws.epochs,
             time.perf_counter() - start, history[0].loss, history[-1].loss, history[-1].token_accuracy, path)
    return path / POLICY_FILE
