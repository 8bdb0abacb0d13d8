"""``placement: auto``: the run takes (or makes) a profile, searches the plans, runs the fastest, and
re-plans when the measured component times drift from the predicted ones.

The profile is ``auto.profile``, else ``RUN_DIR/profile.json`` (where ``m2flow profile`` writes by
default). One that is missing, or refused by the profile checks (another machine, another torch
or m2flow, another config), is made again by profiling here, saying why. The chosen plan, its
predicted time and the runner-up are logged and saved in ``RUN_DIR/auto.json``
(``selection.py``); re-planning (``replan.py``) appends each decision there.
"""

from __future__ import annotations

import logging
import tempfile
from pathlib import Path
from typing import Any

from m2flow.config.errors import ConfigError
from m2flow.autoplan import selection
from m2flow.autoplan.selection import Choice, profile_path, write_record
from m2flow.autoplan.plan_context import PlanContext

log = logging.getLogger(__name__)


def load_or_profile(ctx: PlanContext) -> tuple[Any, Path]:
    """The cost model of the config's profile, profiling first when there is none that may be used."""
    from m2flow.planner.profile_file import ProfileError, load_profile
    from m2flow.autoplan.probes import Profiler, ProfileWriteError

    cfg, name = ctx.cfg, ctx.spec.name
    path = profile_path(cfg)
    try:
        cost = load_profile(path, name, ctx.config_hash())
        log.info("auto: using the profile %s", path)
        return cost, path
    except ProfileError as e:
        if path.exists():
            log.warning("auto: %s; profiling again", e)
        else:
            log.info("auto: no profile at %s; profiling each component (a few short runs)", path)
    with tempfile.TemporaryDirectory(prefix="m2flow-profile-") as work:
        try:
            Profiler(ctx, iterations=cfg.auto.profile_iterations, max_devices=cfg.auto.profile_devices,
                     work_dir=Path(work), say=log.info).run(path)
        except ProfileWriteError as e:
            raise ConfigError("auto.profile", str(e)) from None
    return load_profile(path, name, ctx.config_hash()), path


def resolve(spec: Any, cfg: Any) -> Choice:
    """Profile (or load the profile of) ``cfg``, search, log the choice; returns it."""
    ctx = PlanContext(spec, cfg)
    cost, path = load_or_profile(ctx)
    choice = selection.choose(ctx, cost, path)
    fits = ", ".join(f"{c} {cost.component(c).fit_error:.1%}" for c in ctx.space.running)
    log.info("auto: searched the plans of %d device(s) from %s (fit error %s)", ctx.devices, path, fits)
    for line in choice.describe():
        log.info("%s", line)
    write_record(Path(cfg.run_dir), choice.record())
    return choice
