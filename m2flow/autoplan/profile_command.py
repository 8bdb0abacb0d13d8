"""``m2flow profile CONFIG [KEY=VALUE ...] [--out FILE]``: measure a config's components, write its profile.

The probes run the workflow's own workers (``probes.py``); the result is the profile file that
``m2flow plan search --profile`` and ``placement: auto`` read. Progress goes to the console.
"""

from __future__ import annotations

import argparse
import os
import tempfile
from pathlib import Path

from m2flow.commands import CommandError, register_command, say


def _options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--out", type=Path, default=None,
                        help="the profile file to write (default: RUN_DIR/profile.json, where placement: auto looks)")
    parser.add_argument("--iterations", type=int, default=None,
                        help="iterations of each profiling run, the first a warm-up (default: auto.profile_iterations)")
    parser.add_argument("--max-devices", type=int, default=None,
                        help="largest rank count to profile (default: auto.profile_devices, else the cluster's)")
    parser.add_argument("--repeats", type=int, default=1,
                        help="run every probe this many times, in rotation, and keep each one's fastest run "
                             "(a noisy machine's slow spells then miss some of them; default 1)")


def configure(parser: argparse.ArgumentParser) -> None:
    _options(parser)
    parser.add_argument("config", type=Path, help="YAML file with a top-level 'workflow:' key")
    # Options may follow CONFIG among the overrides: the rest is parsed again, intermixed, in run.
    parser.add_argument("rest", nargs=argparse.REMAINDER, metavar="[OPTION | KEY=VALUE] ...",
                        help="the options above and config overrides, in any order")


def _parse_rest(args: argparse.Namespace) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="m2flow profile CONFIG")
    _options(parser)
    parser.add_argument("overrides", nargs="*", metavar="KEY=VALUE")
    parser.set_defaults(**{k: getattr(args, k) for k in ("out", "iterations", "max_devices", "repeats")})
    return parser.parse_intermixed_args(args.rest, namespace=argparse.Namespace(config=args.config))


def default_profile_path(cfg: object) -> Path:
    """Where ``placement: auto`` looks for a profile of ``cfg``: ``auto.profile``, else RUN_DIR/profile.json."""
    auto = getattr(cfg, "auto")
    return Path(auto.profile) if auto.profile else Path(getattr(cfg, "run_dir")) / "profile.json"


def run(args: argparse.Namespace) -> int:
    from m2flow.autoplan.plan_context import PlanContext
    from m2flow.autoplan.probes import Profiler, ProfileWriteError, fit_errors, check_writable
    from m2flow.driver.registry import load_workflow_config

    args = _parse_rest(args)
    spec, cfg = load_workflow_config(args.config, args.overrides)
    iterations = args.iterations if args.iterations is not None else cfg.auto.profile_iterations
    if iterations < 2:
        raise CommandError(f"--iterations must be at least 2 (one warm-up, one measured), got {iterations}")
    if args.repeats < 1:
        raise CommandError(f"--repeats must be at least 1, got {args.repeats}")
    if args.max_devices is not None and args.max_devices < 1:
        raise CommandError(f"--max-devices must be at least 1, got {args.max_devices}")
    out = args.out if args.out is not None else default_profile_path(cfg)
    try:
        check_writable(out)
    except ProfileWriteError as e:
        raise CommandError(str(e)) from None
    ctx = PlanContext(spec, cfg)
    # transformers' notices and weight-loading bars would bury the progress lines.
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    with tempfile.TemporaryDirectory(prefix="m2flow-profile-") as work:
        profiler = Profiler(ctx, iterations=iterations, max_devices=args.max_devices or cfg.auto.profile_devices,
                            work_dir=Path(work), say=say, repeats=args.repeats)
        try:
            profile = profiler.run(out)
        except ProfileWriteError as e:
            raise CommandError(str(e)) from None
    errors = ", ".join(f"{c} {e:.1%}" for c, e in fit_errors(profile).items())
    say(f"wrote {out} (fit error per component: {errors})")
    say(f"next: m2flow plan search {args.config} --profile {out}, or train it with placement=auto")
    return 0


register_command("profile", "measure each component of a config through its workers and write a profile",
                 configure, run)
