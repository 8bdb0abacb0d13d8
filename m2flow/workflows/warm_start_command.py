"""The workflows' warm-start command: ``m2flow warm-start CONFIG [KEY=VALUE ...]``.

Runs only what a run does once before any worker starts (``Workflow.prepare``): the model built when asked,
then its supervised warm start (``model.warm_start``), saved in ``RUN_DIR/warm_start``. A ``m2flow train`` of
the same config in the same run directory then reuses it (same settings) instead of training it again; so a
warm start can be made, evaluated or inspected on its own first. A workflow without a warm start is refused
in one line.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from m2flow.commands import CommandError, register_command, say


def _configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("config", type=Path, help="YAML file with a top-level 'workflow:' key")
    parser.add_argument("overrides", nargs="*", metavar="KEY=VALUE",
                        help="config overrides, e.g. model.warm_start.steps=300")


def _run(args: argparse.Namespace) -> int:
    from m2flow.driver.registry import load_workflow_config

    spec, cfg = load_workflow_config(args.config, args.overrides)
    warm_start = getattr(getattr(cfg, "model", None), "warm_start", None)
    if warm_start is None:
        raise CommandError(f"workflow {spec.name!r} has no warm start (its config has no model.warm_start)")
    if not getattr(warm_start, "steps", 0):
        raise CommandError(f"model.warm_start.steps is 0 in {args.config}: nothing to warm-start (set it, e.g. "
                           "model.warm_start.steps=300)")
    run_dir = Path(cfg.run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    prepared = spec.prepare(cfg, run_dir)
    path = getattr(prepared, "model_path", None)
    if path is None:
        raise CommandError(f"workflow {spec.name!r} prepared no model to warm-start")
    say(f"warm-started model ({spec.name}): {path}")
    return 0


register_command("warm-start", "run only a config's supervised warm start (model.warm_start) and say where the "
                               "model is; train then reuses it", _configure, _run)
