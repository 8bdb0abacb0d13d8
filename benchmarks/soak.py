"""Soak: hundreds of iterations of the tiny embodied and reasoning runs, traced, with the resident
memory of every process sampled through the run.

Every process is the driver and all its descendants (Ray's own daemons, every rank's process, the
reward sandbox workers), read from /proc; rank processes are named by their group and rank
(``WorkerGroup.pids()`` of the live flow). Growth is the median resident memory over the last
``--window`` iterations against the median over the ``--window`` iterations after ``--warmup``,
per process alive in both windows, and for their sum.

    python benchmarks/soak.py --workflow embodied --iterations 500 --out benchmarks/results/soak_embodied.json
    python benchmarks/soak.py --workflow reasoning --iterations 500 --out benchmarks/results/soak_reasoning.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

PLACEMENTS = {
    "embodied": "env: 0, rollout: 1, actor: 2",
    "reasoning": "rollout: 0, reward: 1, inference: 2, actor: 3",
}


def rss_kib(pid: int) -> int | None:
    """Resident memory of ``pid`` in KiB (VmRSS), None when it is gone."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
    except OSError:
        return None
    return 0  # a zombie has no VmRSS line


def descendants(root: int) -> list[int]:
    """``root`` and every process under it, from the parent ids in /proc."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        children.setdefault(ppid, []).append(int(entry))
    out, todo = [], [root]
    while todo:
        pid = todo.pop()
        out.append(pid)
        todo.extend(children.get(pid, []))
    return out


def command_name(pid: int) -> str:
    """A short name of a process that is not a rank: Ray's Python services by the package folder their
    script lives in (``ray dashboard/ service``), anything else by its first words."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            parts = [p.decode(errors="replace") for p in f.read().split(b"\0") if p]
    except OSError:
        return "?"
    for part in parts[1:3]:
        head, sep, tail = part.partition("/site-packages/ray/")
        if sep and part.endswith(".py"):
            stem = Path(tail).stem
            known = stem if stem in ("dashboard", "log_monitor", "monitor", "default_worker") else "service"
            return f"ray {Path(tail).parts[0]}/ {known}" if len(Path(tail).parts) > 1 else f"ray {known}"
    return " ".join(os.path.basename(p) for p in parts[:3])[:80] or "?"


class Sampler(threading.Thread):
    """Samples the resident memory of every process every ``interval`` seconds, with the iteration."""

    def __init__(self, metrics_file: Path, flows: list[Any], interval: float) -> None:
        super().__init__(daemon=True)
        self.metrics_file, self.flows, self.interval = metrics_file, flows, interval
        self.samples: list[dict[str, Any]] = []
        self.labels: dict[int, str] = {os.getpid(): "driver"}
        self._labelled: set[int] = set()
        self.halt = threading.Event()

    def iteration(self) -> int:
        try:
            with open(self.metrics_file, "rb") as f:
                return sum(1 for _ in f)
        except OSError:
            return 0

    def label_ranks(self) -> None:
        for flow in self.flows:
            if id(flow) in self._labelled:
                continue
            for group in vars(flow).values():
                if callable(getattr(group, "pids", None)) and hasattr(group, "name"):
                    try:
                        for rank, pid in enumerate(group.pids()):
                            self.labels[pid] = f"{group.name.rsplit('-', 1)[0]}[{rank}]"
                    except Exception:  # noqa: BLE001 - a group still starting; try again next time
                        return
            self._labelled.add(id(flow))

    def run(self) -> None:
        start = time.monotonic()
        while not self.halt.wait(self.interval):
            self.label_ranks()
            rss = {}
            for pid in descendants(os.getpid()):
                kib = rss_kib(pid)
                if kib:
                    rss[pid] = kib
                    if pid not in self.labels:
                        self.labels[pid] = command_name(pid)
            self.samples.append({"t": round(time.monotonic() - start, 2), "iteration": self.iteration(), "rss_kib": rss})


def growth(samples: list[dict[str, Any]], labels: dict[int, str], warmup: int, window: int, last: int) -> dict[str, Any]:
    """Median RSS per process in the window after warm-up and in the final window, and the change."""
    early = [s for s in samples if warmup <= s["iteration"] < warmup + window]
    late = [s for s in samples if last - window <= s["iteration"] < last]  # the shutdown left out
    if not early or not late:
        raise RuntimeError(f"no samples in one window ({len(early)} early, {len(late)} late): lower --interval")
    per: dict[str, Any] = {}
    # Processes alive in both windows: Ray's idle workers started and gone in between would make a sum
    # over all processes move for reasons that are not growth.
    kept = sorted({p for s in early for p in s["rss_kib"]} & {p for s in late for p in s["rss_kib"]})
    for pid in kept:
        a = statistics.median(s["rss_kib"][pid] for s in early if pid in s["rss_kib"])
        b = statistics.median(s["rss_kib"][pid] for s in late if pid in s["rss_kib"])
        per[f"{labels.get(pid, '?')} (pid {pid})"] = {"after_warmup_mib": round(a / 1024, 1),
                                                      "end_mib": round(b / 1024, 1),
                                                      "growth_pct": round(100 * (b - a) / a, 2)}
    total_a = statistics.median(sum(s["rss_kib"].get(p, 0) for p in kept) for s in early)
    total_b = statistics.median(sum(s["rss_kib"].get(p, 0) for p in kept) for s in late)
    return {"processes": per,
            "total": {"after_warmup_mib": round(total_a / 1024, 1), "end_mib": round(total_b / 1024, 1),
                      "growth_pct": round(100 * (total_b - total_a) / total_a, 2)},
            "max_process_growth_pct": max(p["growth_pct"] for p in per.values()),
            "samples_in_windows": [len(early), len(late)]}


def config(workflow: str, root: Path, iterations: int, placement: str) -> Any:
    if workflow == "embodied":
        from tests.workflows.embodied.test_embodied import toy_config

        return toy_config(root, placement=placement, pipeline_stages=2, total_env_steps=iterations * 512, trace=True)
    from tests.workflows.reasoning.setup import toy_config

    return toy_config(root, placement, steps=iterations, trace=True, eval_every=0)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workflow", choices=sorted(PLACEMENTS), required=True)
    parser.add_argument("--iterations", type=int, default=500)
    parser.add_argument("--placement", default=None, help="default: a disaggregated one per workflow")
    parser.add_argument("--interval", type=float, default=1.0, help="seconds between samples")
    parser.add_argument("--warmup", type=int, default=50, help="iterations before the first window")
    parser.add_argument("--window", type=int, default=25, help="iterations per window")
    parser.add_argument("--run-root", default=None, help="where the run directory goes (default: a temporary one)")
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    root = Path(args.run_root or tempfile.mkdtemp(prefix=f"soak_{args.workflow}_"))
    placement = args.placement or PLACEMENTS[args.workflow]
    cfg = config(args.workflow, root, args.iterations, placement)
    if args.workflow == "embodied":
        from m2flow.workflows.embodied import flow as module
        from m2flow.autoplan.entry import train
        from m2flow.workflows.embodied.workflow import WORKFLOW as workflow

        flow_class = module.EmbodiedFlow
    else:
        from m2flow.workflows.reasoning import flow as module
        from m2flow.autoplan.entry import train
        from m2flow.workflows.reasoning.workflow import WORKFLOW as workflow

        flow_class = module.ReasoningFlow
    flows: list[Any] = []
    original_init = flow_class.__init__

    def recording_init(self: Any, *a: Any, **k: Any) -> None:  # the live flow, to name its ranks' pids
        original_init(self, *a, **k)
        flows.append(self)

    flow_class.__init__ = recording_init
    sampler = Sampler(Path(cfg.run_dir) / "metrics.jsonl", flows, args.interval)
    sampler.start()
    t0 = time.perf_counter()
    result = train(workflow, cfg)
    seconds = time.perf_counter() - t0
    sampler.halt.set()
    sampler.join()
    done = len(result.history)
    out = {
        "workflow": args.workflow, "placement": placement, "iterations": done, "trace": True,
        "seconds": round(seconds, 1), "interval_s": args.interval, "warmup": args.warmup, "window": args.window,
        "run_dir": str(cfg.run_dir), "trace_json_mib": round(os.path.getsize(Path(cfg.run_dir) / "trace.json") / 2**20, 1)
        if (Path(cfg.run_dir) / "trace.json").exists() else None,
        "growth": growth(sampler.samples, sampler.labels, args.warmup, args.window, done),
        "samples": [{"t": s["t"], "iteration": s["iteration"], "total_mib": round(sum(s["rss_kib"].values()) / 1024, 1),
                     "processes": len(s["rss_kib"])} for s in sampler.samples],
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(out, indent=1))
    g = out["growth"]
    print(f"{args.workflow}: {done} iterations in {seconds:.0f}s; total RSS {g['total']['after_warmup_mib']} -> "
          f"{g['total']['end_mib']} MiB ({g['total']['growth_pct']:+.2f}%), largest per-process growth "
          f"{g['max_process_growth_pct']:+.2f}%")
    for name, p in g["processes"].items():
        print(f"  {name}: {p['after_warmup_mib']} -> {p['end_mib']} MiB ({p['growth_pct']:+.2f}%)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
