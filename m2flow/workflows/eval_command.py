"""The workflows' command: ``m2flow eval CHECKPOINT``.

``eval`` evaluates a saved checkpoint, whichever workflow wrote it: the workflow the checkpoint records
(``trainer_state.json``) is looked up in the registry and evaluates it (``Workflow.evaluate_checkpoint``); a
model directory without a trainer state is evaluated as a reasoning model.

A reasoning checkpoint (or model directory): greedy accuracy and mean response length on a dataset.
An embodied checkpoint (``runs/.../checkpoints/step_N``): mean raw return (and success rate, where the env
reports it) of the policy over whole episodes with greedy actions, then with sampled actions on the same
held-out env seeds, under the run's own env config and normalisation statistics.
An agentic checkpoint: the run's held-out evaluation (mean return, success, turns and tool calls per
episode) of the saved policy on held-out episodes of the run's own environment config.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from m2flow.commands import CommandError, register_command, say

MODEL_DIRECTORY = "reasoning"
"""The workflow that evaluates a model directory with no trainer state (a Hugging Face model)."""


def _configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("checkpoint", type=Path,
                        help="a training checkpoint (runs/.../checkpoints/step_N) of any workflow, or a "
                             "model directory (evaluated as a reasoning model)")
    parser.add_argument("--config", type=Path, default=None,
                        help="reasoning only: a training YAML whose data, reward and sampling lengths are the defaults")
    parser.add_argument("--episodes", type=int, default=None,
                        help="embodied and agentic checkpoints: episodes to average over (default: embodied 10, "
                             "agentic the run's eval_episodes)")
    parser.add_argument("--output", type=Path, default=None, help="also write the results to this JSON file")
    parser.add_argument("overrides", nargs="*", metavar="KEY=VALUE",
                        help="reasoning: eval config overrides, e.g. data.kind=gsm8k data.path=DIR limit=100; "
                             "embodied and agentic: overrides of the run's saved config, e.g. env.num_envs=1")


def _write(results: dict[str, float], output: Path | None) -> None:
    if output is not None:
        output.parent.mkdir(parents=True, exist_ok=True)
        output.write_text(json.dumps(results, indent=1))


def checkpoint_workflow(checkpoint: Path) -> str:
    """The name of the workflow whose run wrote ``checkpoint``; a directory without a trainer state is a model."""
    from m2flow.driver.checkpoints import TRAINER_STATE, read_state

    if not (checkpoint / TRAINER_STATE).is_file():
        return MODEL_DIRECTORY
    name = read_state(checkpoint).get("workflow")
    if not isinstance(name, str) or not name:
        raise CommandError(f"{checkpoint / TRAINER_STATE} names no workflow")
    return name


def _run(args: argparse.Namespace) -> int:
    from m2flow.config.errors import ConfigError
    from m2flow.driver.registry import get_workflow
    from m2flow.driver.workflow import EvalOptions, Workflow

    if not args.checkpoint.is_dir():
        raise CommandError(f"{args.checkpoint} is not a directory (a checkpoint or a model directory)")
    name = checkpoint_workflow(args.checkpoint)
    try:
        workflow = get_workflow(name)
    except ConfigError as e:
        raise CommandError(f"{args.checkpoint} was written by a workflow not found here: {e.reason}") from None
    if type(workflow).evaluate_checkpoint is Workflow.evaluate_checkpoint:
        raise CommandError(f"workflow {name!r} cannot evaluate a checkpoint ({args.checkpoint})")
    if args.config is not None and not workflow.takes_eval_config:
        raise CommandError(f"--config is for reasoning checkpoints; this {name} checkpoint carries its own config "
                           "(change it with KEY=VALUE overrides)")
    if args.episodes is not None and args.episodes < 1:
        raise CommandError(f"--episodes must be >= 1, got {args.episodes}")
    options = EvalOptions(episodes=args.episodes, overrides=tuple(args.overrides), config=args.config)
    evaluated = workflow.evaluate_checkpoint(args.checkpoint, options)
    say(evaluated.summary)
    _write(evaluated.metrics, args.output)
    return 0


register_command("eval", "evaluate a checkpoint of any workflow: accuracy on a dataset (reasoning), mean return "
                         "(embodied), held-out episodes (agentic)", _configure, _run)
