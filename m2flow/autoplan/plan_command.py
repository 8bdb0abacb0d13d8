"""``m2flow plan show|search|profile-template CONFIG [KEY=VALUE ...]``.

``show`` prints the workflow graph and the plan a config runs, without starting anything;
``search`` and ``profile-template`` are in ``search_command.py``.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from m2flow.commands import CommandError, register_command, say


def configure(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="plan_command", required=True, metavar="ACTION")
    show = sub.add_parser("show", help="print the workflow graph and the plan of a config")
    show.add_argument("config", type=Path, help="YAML file with a top-level 'workflow:' key")
    show.add_argument("--json", action="store_true", help="print the plan as JSON (as saved in run_dir/plan.json)")
    show.add_argument("overrides", nargs="*", metavar="KEY=VALUE", help="config overrides, e.g. placement=local")
    from m2flow.autoplan import search_command

    search_command.configure(sub)


def run(args: argparse.Namespace) -> int:
    from m2flow.autoplan import search_command

    if args.plan_command == "search":
        return search_command.run_search(args)
    if args.plan_command == "profile-template":
        return search_command.run_template(args)
    return _show(args)


def _show(args: argparse.Namespace) -> int:
    from m2flow.runtime.placement import PlacementError
    from m2flow.driver.registry import load_workflow_config

    spec, cfg = load_workflow_config(args.config, args.overrides)
    from m2flow.autoplan.search_command import layout_of

    try:
        plan = spec.plan(cfg, layout_of(cfg))
    except (PlacementError, ValueError) as e:
        raise CommandError(f"plan: {e}") from None
    if args.json:
        say(plan.to_json())
        return 0
    if spec.graph is not None:
        say(spec.graph.table())
        say("")
    say(plan.table())
    return 0


register_command("plan", "show the plan of a config, or rank plans from a profile (starts nothing)", configure, run)
