"""The ``m2flow`` command: a small registry of subcommands, each parsing its own arguments.

``demo``, ``train``, ``config`` and ``version`` are defined here; every other subcommand lives with the
package it drives, in the module ``COMMAND_MODULES`` names (``m2flow/<package>/<command>_command.py``),
which registers it with ``m2flow.commands.register_command`` when ``build_parser`` imports it. An
installed package adds commands through a ``m2flow.commands`` entry point. The registry is a leaf
module, so nothing imports this one.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Sequence
from pathlib import Path

from m2flow import __version__
from m2flow.errors import UserInputError
from m2flow.commands import COMMANDS, CommandError, load_plugins, register_command, registered_commands, say

# ----------------------------------------------------------------------------- built-in commands


def _add_overrides(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "overrides", nargs="*", metavar="KEY=VALUE", help="config overrides, e.g. cluster.num_cpus=4"
    )


def _run_version(args: argparse.Namespace) -> int:
    print(f"m2flow {__version__}")
    return 0


def _configure_demo(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "overrides", nargs="*", metavar="KEY=VALUE",
        help="overrides of the demo's reasoning config (m2flow/workflows/reasoning/demo.yaml), e.g. seed=1 "
             "steps=30 placement=\"rollout,reward: 0, inference,actor: 1\"; `m2flow config docs reasoning` lists every key",
    )


def _run_demo(args: argparse.Namespace) -> int:
    from m2flow.workflows.reasoning.demo import run_demo

    run_demo(list(args.overrides), say=say)
    return 0


def _configure_train(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("config", type=Path, help="YAML file with a top-level 'workflow:' key")
    _add_overrides(parser)


def _run_train(args: argparse.Namespace) -> int:
    from m2flow.driver.registry import load_workflow_config

    from m2flow.autoplan.entry import run

    spec, cfg = load_workflow_config(args.config, args.overrides)
    logging.getLogger("m2flow").info("running workflow %r from %s", spec.name, args.config)
    return run(spec, cfg)


def _configure_config(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="config_command", metavar="{show,docs}", required=True)
    show = sub.add_parser("show", help="print the resolved config (defaults, overrides, interpolations)")
    show.add_argument("config", type=Path, help="YAML file with a top-level 'workflow:' key")
    _add_overrides(show)
    docs = sub.add_parser("docs", help="list every field of a workflow's config with type, default, doc")
    docs.add_argument("workflow", nargs="?", help="workflow name (omit to list the workflows)")


def _run_config(args: argparse.Namespace) -> int:
    from m2flow.config import describe, to_dict, to_yaml
    from m2flow.driver.registry import available_workflows, get_workflow, load_workflow_config
    from m2flow.config.schema import MISSING
    from m2flow.config.yaml_io import dump_inline

    if args.config_command == "show":
        spec, cfg = load_workflow_config(args.config, args.overrides)
        sys.stdout.write(to_yaml(cfg, workflow=spec.name))
        return 0
    if args.workflow is None:
        for name in available_workflows():
            print(f"{name:<16} {get_workflow(name).help}")
        return 0
    spec = get_workflow(args.workflow)
    print(f"# workflow {spec.name}: {spec.schema.__module__}.{spec.schema.__qualname__}")
    for info in describe(spec.schema):
        if info.section:
            print(f"\n{info.key}: {info.type}\n    {info.doc}")
            continue
        default = "(required)" if info.default is MISSING else dump_inline(to_dict(info.default))
        print(f"{info.key}: {info.type} = {default}")
        if info.doc:
            print(f"    {info.doc}")
    return 0


register_command("version", "print the m2flow version", lambda parser: None, _run_version)
register_command(
    "demo", "train a tiny transformer on arithmetic on CPU: a short warm start, then GRPO",
    _configure_demo, _run_demo,
)
register_command("train", "run the workflow a YAML config names", _configure_train, _run_train)
register_command(
    "config", "show a resolved config or document a workflow's fields", _configure_config, _run_config
)


# ----------------------------------------------------------------------------- the other packages' commands

COMMAND_MODULES = (
    "m2flow.workflows.eval_command",  # m2flow eval CHECKPOINT
    "m2flow.workflows.warm_start_command",  # m2flow warm-start CONFIG
    "m2flow.autoplan.plan_command",  # m2flow plan show|search|profile-template CONFIG
    "m2flow.autoplan.profile_command",  # m2flow profile CONFIG
    "m2flow.report.report_command",  # m2flow report RUN_DIR
    "m2flow.data.data_command",  # m2flow data gsm8k --from FILE...
    "m2flow.envs.demos_command",  # m2flow demos TASKS --episodes N --output FILE
)
"""The modules that define the rest of the subcommands, each registering its own when imported."""


# ----------------------------------------------------------------------------- entry point


def build_parser() -> argparse.ArgumentParser:
    """The top-level parser with every registered subcommand."""
    load_plugins(COMMAND_MODULES)
    parser = argparse.ArgumentParser(
        prog="m2flow",
        description="Flexible and efficient RL training via macro-to-micro flow transformation.",
    )
    parser.add_argument("--version", action="version", version=f"m2flow {__version__}")
    parser.add_argument(
        "--log-level",
        default="INFO",
        choices=["DEBUG", "INFO", "WARNING", "ERROR"],
        help="logging level (default: INFO)",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in registered_commands():
        command = COMMANDS[name]
        command.configure_parser(sub.add_parser(name, help=command.help, description=command.help))
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``m2flow`` with ``argv`` (default: sys.argv[1:]); returns the exit code."""
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exit_:  # --help, --version and usage errors; keep main() returning
        return int(exit_.code or 0) if not isinstance(exit_.code, str) else 2
    if args.command is None:
        parser.print_help()
        return 2
    logging.basicConfig(
        level=args.log_level, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    # Imported here, not at the top, so the parser is built without loading the config stack.
    from m2flow.driver.stop import EXIT_TERMINATED, Terminated

    try:
        return COMMANDS[args.command].run(args)
    except Terminated as error:
        print(f"stopped: {error}", file=sys.stderr)
        return EXIT_TERMINATED
    except CommandError as error:
        print(f"error: {error}", file=sys.stderr)
        return error.code
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        # The reader went away (`m2flow config docs x | head`); silence the flush at exit.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except Exception as error:  # noqa: BLE001 - bad input is one line; anything else is re-raised
        health = sys.modules.get("m2flow.runtime.errors")
        if health is not None and health.health_stop(error):
            # A limit of the run's own health (reward.max_error_rate...): one line, the traceback only when asked.
            logging.getLogger("m2flow").debug("traceback of the error below", exc_info=True)
            where = f"{error.group}[rank {error.rank}]: " if isinstance(error, health.WorkerError) else ""
            message = error.message if isinstance(error, health.WorkerError) else str(error)
            print(f"error: {where}{message}", file=sys.stderr)
            return 1
        # Bad input met inside a worker (a model file, a checkpoint, a reward's output) comes back wrapped.
        in_worker = health is not None and isinstance(error, health.WorkerError) and error.raised(
            f"{UserInputError.__module__}.{UserInputError.__qualname__}")
        if not in_worker and not isinstance(error, UserInputError):
            raise
        # Input the user can fix: one line naming the key, file or line; the traceback only when asked.
        logging.getLogger("m2flow").debug("traceback of the error below", exc_info=True)
        print(f"error: {error.message if in_worker else error}", file=sys.stderr)
        return 2
