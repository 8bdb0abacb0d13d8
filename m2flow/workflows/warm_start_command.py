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
    section = spec.warm_start(cfg)
    if section is None:
        raise CommandError(f"{args.config} declares no warm start (reasoning and agentic: model.warm_start.steps "
                           "> 0; embodied: policy.warm_start.demos)")
    run_dir = Path(cfg.run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    path = spec.warm_started(spec.prepare(cfg, run_dir))
    say(f"warm-started {'policy' if section.startswith('policy') else 'model'} ({spec.name}, {section}): {path}")
    return 0


register_command("warm-start", "run only a config's supervised warm start (model.warm_start) and say where the "
                               "model is; train then reuses it", _configure, _run)
