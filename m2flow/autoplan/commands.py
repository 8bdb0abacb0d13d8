"""The planner's commands: ``m2flow plan show|search`` and ``m2flow profile`` (their code imported when run)."""

from __future__ import annotations

from m2flow.commands import register_command


def _register() -> None:
    from m2flow.autoplan import plan_command, profile_command

    register_command("plan", "show the plan of a config, or rank plans from a profile (starts nothing)",
                     plan_command.configure, plan_command.run)
    register_command("profile", "measure each component of a config through its workers and write a profile",
                     profile_command.configure, profile_command.run)


_register()
