"""``m2flow plan search CONFIG --profile FILE``: rank the plans of a config by predicted iteration time.

The workflow says what may vary (``Workflow.search_space``); the planner enumerates ``PlanChoice``s,
simulates them from the profile's cost model and has the workflow build each into a Plan
(``Workflow.plan`` with the choice: the one builder); this module only loads configs, checks the profile
and prints, with each plan the config overrides that ask for it (``Workflow.overrides``), for the user. ``m2flow plan
profile-template CONFIG FILE`` writes an empty profile naming this machine and config, for
measured points to be filled in.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from m2flow.commands import CommandError, say

NO_PROFILE = ("plan search needs --profile FILE: the measured cost of each component of this config on this "
              "machine. Write an empty one with `m2flow plan profile-template CONFIG FILE`, fill in each "
              "component's [items, devices, seconds] points (format in docs/planner.md), then search again.")


def configure(sub: Any) -> None:
    """Add ``search`` and ``profile-template`` to ``m2flow plan``'s actions."""
    search = sub.add_parser("search", help="rank the plans of a config by predicted iteration time")
    _search_options(search)
    search.add_argument("config", type=Path, help="YAML file with a top-level 'workflow:' key")
    # Options may follow CONFIG among the overrides: the rest is parsed again, intermixed, in run_search.
    search.add_argument("rest", nargs=argparse.REMAINDER, metavar="[OPTION | KEY=VALUE] ...",
                        help="the options above and config overrides, in any order")
    template = sub.add_parser("profile-template", help="write an empty profile of a config for this machine")
    template.add_argument("config", type=Path, help="YAML file with a top-level 'workflow:' key")
    template.add_argument("output", type=Path, help="the profile file to write")
    template.add_argument("overrides", nargs="*", metavar="KEY=VALUE", help="config overrides")


def layout_of(cfg: Any) -> Any:
    """The device layout the config's cluster will have; attaching to a running cluster is refused."""
    from m2flow.config.errors import ConfigError
    from m2flow.autoplan.plan_context import layout_of as layout

    try:
        return layout(cfg)
    except ConfigError as e:
        raise CommandError(f"plan: {e}") from None


def _search_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--devices", type=int, default=None, help="devices to plan for (default: the cluster's)")
    parser.add_argument("--profile", type=Path, default=None, help="profile JSON of this config on this machine")
    parser.add_argument("--top", type=int, default=5, help="plans to show")
    parser.add_argument("--trace", type=Path, default=None,
                        help="write the best plan's predicted timeline here (a directory `m2flow report` reads)")


def _parse_rest(args: argparse.Namespace) -> argparse.Namespace:
    """Options and overrides after CONFIG, in any order (values given before CONFIG stay unless repeated)."""
    parser = argparse.ArgumentParser(prog="m2flow plan search CONFIG")
    _search_options(parser)
    parser.add_argument("overrides", nargs="*", metavar="KEY=VALUE")
    # Values parsed before CONFIG are the defaults here.
    parser.set_defaults(**{k: getattr(args, k) for k in ("devices", "profile", "top", "trace")})
    return parser.parse_intermixed_args(args.rest, namespace=argparse.Namespace(config=args.config))


def _override(key: str, value: Any) -> str:
    return f"{key}={json.dumps(value)}"  # JSON is YAML: placements with ':' and ',' stay one string


def _context(config: Path, overrides: list[str], devices: int | None) -> Any:
    """The loaded config (on one node of ``devices`` devices when given), its base plan and what the search
    may vary; candidates are configured from it, not read from the file again (the search builds hundreds)."""
    from m2flow.autoplan.plan_context import PlanContext
    from m2flow.config import with_overrides
    from m2flow.driver.registry import load_workflow_config
    from m2flow.runtime.placement import NodeLayout

    spec, cfg = load_workflow_config(config, list(overrides))
    if not devices:
        return PlanContext(spec, cfg, layout_of(cfg))
    cfg = with_overrides(spec.schema, cfg, {"cluster.cpu_devices_per_node": devices})
    return PlanContext(spec, cfg, NodeLayout((devices,)))


def run_template(args: argparse.Namespace) -> int:
    from m2flow.planner.profile_file import new_profile

    ctx = _context(args.config, args.overrides, None)
    comps = {c: {"points": [], "mem_fixed": 0, "mem_per_item": 0, "state_bytes": 0, "weight_bytes": 0,
                 "startup_s": 0}
             for c in ctx.space.running}
    profile = new_profile(ctx.spec.name, ctx.config_hash(), comps,
                          device={"memory_bytes": None, "cores": None}, link={"bandwidth": 1e9, "latency": 1e-4},
                          offload_bandwidth=5e9, edge_bytes={e.name: 0 for e in ctx.space.graph.edges
                                                             if e.kind != "weights"})
    args.output.write_text(json.dumps(profile, indent=1))
    say(f"wrote {args.output}: fill in each component's [items, devices, seconds] points "
        f"(items: {', '.join(ctx.space.workload.items)} per iteration)")
    return 0


def _gib(nbytes: float) -> str:
    return f"{nbytes / 2**30:.2f} GiB"


def run_search(args: argparse.Namespace) -> int:
    from m2flow.planner.profile_file import ProfileError, load_profile
    from m2flow.planner.search import rejection_summary, search
    from m2flow.planner.simulate import write_trace

    args = _parse_rest(args)
    if args.profile is None:
        raise CommandError(NO_PROFILE)
    if args.top < 1:
        raise CommandError("--top must be at least 1")
    ctx = _context(args.config, args.overrides, args.devices)
    try:
        cost = load_profile(args.profile, ctx.spec.name, ctx.config_hash())
    except ProfileError as e:
        raise CommandError(str(e)) from None
    result = search(ctx.space, cost, ctx.devices, top=args.top, build_plan=ctx.build)
    fits = ", ".join(f"{c} {cost.component(c).fit_error:.1%}" for c in ctx.space.running)
    say(f"plan search: workflow {ctx.spec.name}, {ctx.devices} device(s), profile {args.profile} (fit error {fits})")
    how = "every device split" if result.exact else "device splits on a grid refined by local search"
    say(f"  {result.considered} candidates ({how}), {result.simulated} simulated, "
        f"{sum(result.reasons.values())} rejected")
    if not result.ranked:
        for line in rejection_summary(result):
            say(f"  {line}")
        raise CommandError("no plan fits")
    ref = result.collocated.seconds_per_item if result.collocated is not None else None
    for i, cand in enumerate(result.ranked[:args.top], start=1):
        res = cand.result
        assert res is not None and cand.setup is not None
        speedup = f", {ref / cand.seconds_per_item:.2f}x collocated" if ref else ""
        say(f"{i}. {res.iteration_time:.4g} s/iteration, {cand.items / res.iteration_time:.4g} items/s{speedup}; "
            f"{cand.shape.mode}, bottleneck {res.bottleneck}")
        util = res.utilisation()
        say("   devices: " + "; ".join(f"{k.label} busy {util[k.label]:.0%}, {_gib(cand.memory.get(k.label, 0))}"
                                       for k in cand.setup.classes))
        settings = " ".join(_override(k, v) for k, v in ctx.spec.overrides(cand.choice).items())
        say(f"   use: {settings}")
        if i == 1 and cand.plan is not None:
            # What the plan's structure means for the config (staleness overlap; how partial rollouts are priced).
            for note in cand.plan.notes:
                say(f"   note: {note}")
    for line in rejection_summary(result):
        say(f"  {line}")
    if args.trace is not None:
        best = result.ranked[0]
        assert best.result is not None and best.setup is not None
        path = write_trace(best.result, best.setup, args.trace)
        say(f"predicted timeline of plan 1: {path} (m2flow report {args.trace})")
    return 0
