"""``m2flow report RUN_DIR``: where a run's time went, as tables and PNG plots."""

from __future__ import annotations

import argparse
from pathlib import Path

from m2flow.commands import CommandError, register_command


def _configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("run_dir", type=Path, help="run directory holding trace.json or trace/ and metrics.jsonl")
    parser.add_argument("--last", type=int, default=3, help="iterations drawn in the Gantt plot (default 3)")
    parser.add_argument("--skip", type=int, default=0,
                        help="leave the first N iterations (warm-up) out of the numbers (default 0)")
    parser.add_argument("--no-plots", action="store_true", help="print the tables only")


def _run(args: argparse.Namespace) -> int:
    from m2flow.report.render import render
    from m2flow.report.report import build_report

    if args.last < 1 or args.skip < 0:
        raise CommandError("--last must be >= 1 and --skip >= 0", code=2)
    try:
        report = build_report(args.run_dir, last=args.last, skip=args.skip, plots=not args.no_plots)
    except FileNotFoundError as e:
        raise CommandError(str(e)) from e
    render(report)
    return 0


register_command("report", "summarise a run: time per component, device use, bubbles, plots",
                 _configure, _run)
