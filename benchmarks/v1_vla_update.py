"""One PPO update of the small VLA as the embodied actor runs it, in parts, and the levers against it.

The update is ``PPOUpdater.update`` itself (``m2flow/workers/embodied/ppo.py``) on a 512-sample batch
with the example's settings (``examples/embodied/metaworld_vla_ppo.yaml``: 2 epochs of minibatch 128,
clip 0.2, vf_coef 0.5, gradient norm 0.5, per-token ratios; ``target_kl`` off so every update does the
same work), plus the scoring pass that builds the batch (old log-probs and values of 512 samples, no
gradients; ``batch.score``). The observations carry reach-v3's instruction, as a reach run's do.

Per part, timed by wrapping the updater's own steps and hooking the policy's modules, in CPU time of
the process's one thread (``time.thread_time``; one torch thread runs every operation and the backward
on the calling thread): on a shared machine a wall-clock section also counts the time other processes
held the core, which here doubled some sections from one round to the next. The whole update's wall
time is recorded too (``update_wall``):

- ``image_fwd``: the conv stem; ``transformer_fwd``: the encoder layers; ``heads_fwd``: action and value
  heads; ``embed_fwd``: unpacking, embeddings, tokens from actions, the sequence;
- ``loss``: log-softmax, gather, entropy and the PPO loss; ``backward``: autograd (and zeroing gradients);
- ``optimizer``: gradient clip and Adam; ``data``: the rest of ``update`` (permutations, gathers of the
  minibatches' observations, whitening, metrics); ``score``: the batch-building forward.

Sides (``--sides``) run in interleaved rounds (A B C A B C ...), each side its own policy and updater
from the same seed: ``before`` is the VLA of ``--before`` (a git revision; the policy module is loaded
from it), ``eager`` the current one, ``compiled`` the current one with its stem and transformer under
``torch.compile`` (``fullgraph``, fixed shapes; the compile is timed apart, with the first update),
``bf16`` the current one under bfloat16 autocast, ``grid2`` the current one with ``grid: 2`` (4 image
tokens instead of 16). Sides that compile or use autocast time the ``policy`` forward as a whole
(module hooks inside compiled code would break its graph).

    python benchmarks/v1_vla_update.py --before ad26a4a --chunks 1 4 --sides before eager grid2 compiled

Writes ``benchmarks/results/v1_vla_update.json``: per chunk size and side, the median CPU milliseconds
of every part and of the whole update, its median wall milliseconds, the compile time, a torch.profiler
table of the eager side's top operations, and the 1-minute load average after every round.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np  # noqa: E402
import torch  # noqa: E402

from benchmarks.common import environment, median, write_result  # noqa: E402
from m2flow.envs.instructions import INSTRUCTIONS, WordTokenizer  # noqa: E402
from m2flow.models.policy_config import VLAConfig  # noqa: E402
from m2flow.models.vla import VLAPolicy  # noqa: E402
from m2flow.workers.embodied.batch import score  # noqa: E402
from m2flow.workers.embodied.config import PPOConfig  # noqa: E402
from m2flow.workers.embodied.ppo import PPOBatch, PPOUpdater  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
ACTION_DIM = 4
PARTS = ("image_fwd", "embed_fwd", "transformer_fwd", "heads_fwd", "loss", "backward", "optimizer", "data",
         "score")


def ppo_config() -> PPOConfig:
    """The example's PPO settings, ``target_kl`` off (every update does its two epochs)."""
    return PPOConfig(epochs=2, minibatch_size=128, lr=1e-4, gamma=0.99, gae_lambda=0.95, clip=0.2, ent_coef=0.0,
                     vf_coef=0.5, max_grad_norm=0.5, target_kl=None)


def reach_obs(config: VLAConfig, n: int, seed: int = 0) -> torch.Tensor:
    """n packed observations: random images and proprio, reach-v3's instruction."""
    rng = np.random.default_rng(seed)
    lay, ids = config.layout(), WordTokenizer.versioned().encode(INSTRUCTIONS["reach-v3"], config.text_len)
    rows = [lay.pack(rng.integers(0, 256, (lay.height, lay.width, 3), dtype=np.uint8), ids,
                     rng.normal(size=lay.proprio_dim).astype(np.float32)) for _ in range(n)]
    return torch.from_numpy(np.stack(rows))


def make_batch(policy: VLAPolicy, obs: torch.Tensor, seed: int = 0) -> PPOBatch:
    """A batch as ``build_batch`` makes it: actions the bin centres of random tokens, old log-probs and
    values from the policy, random advantages."""
    g = torch.Generator().manual_seed(seed)
    n = obs.shape[0]
    tokens = torch.randint(0, policy.config.num_bins, (n, policy.slots), generator=g)
    actions = policy.bins.to_actions(tokens)
    if policy.chunk > 1:
        actions = actions.view(n, policy.chunk, ACTION_DIM)
    logprobs, values = score(policy, obs, actions)
    advantages = torch.randn(n, generator=g)
    return PPOBatch(obs, actions, logprobs, values, advantages, advantages + values)


def load_policy_class(revision: str) -> type:
    """``VLAPolicy`` as ``m2flow/models/vla.py`` was at git ``revision`` (its imports resolve to today's package)."""
    source = subprocess.run(["git", "show", f"{revision}:m2flow/models/vla.py"], cwd=ROOT, check=True,
                            capture_output=True, text=True).stdout
    path = Path(tempfile.mkdtemp()) / "vla_before.py"
    path.write_text(source)
    spec = importlib.util.spec_from_file_location("vla_before", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.VLAPolicy


class Parts:
    """Milliseconds per named section, summed over one update."""

    def __init__(self) -> None:
        self.ms: dict[str, float] = defaultdict(float)
        self._open: dict[str, float] = {}

    def start(self, name: str) -> None:
        self._open[name] = time.thread_time()

    def stop(self, name: str) -> None:
        self.ms[name] += (time.thread_time() - self._open.pop(name)) * 1e3

    @contextlib.contextmanager
    def section(self, name: str) -> Iterator[None]:
        self.start(name)
        try:
            yield
        finally:
            self.stop(name)

    def wrap(self, name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        def timed(*args: Any, **kwargs: Any) -> Any:
            with self.section(name):
                return fn(*args, **kwargs)
        return timed

    def hook(self, module: torch.nn.Module, name: str) -> None:
        module.register_forward_pre_hook(lambda *_: self.start(name))
        module.register_forward_hook(lambda *_: self.stop(name))


class Side:
    """One policy and its updater, instrumented; ``run`` times one update and its scoring pass."""

    def __init__(self, policy: VLAPolicy, samples: int, *, compile: bool = False, autocast: bool = False,
                 fine: bool = True) -> None:
        self.policy, self.autocast = policy, autocast
        if compile:  # the stem and the transformer, each one graph of fixed shapes
            policy.stem = torch.compile(policy.stem, dynamic=False, fullgraph=True)
            policy._encode = torch.compile(policy._encode, dynamic=False, fullgraph=True)
        self.updater = PPOUpdater(policy, ppo_config())
        self.obs = reach_obs(policy.config, samples)
        self.parts = Parts()
        t0 = time.perf_counter()
        self.batch = make_batch(policy, self.obs)  # compiles the scoring shapes
        self.compile_s = time.perf_counter() - t0 if compile else 0.0
        up, p = self.updater, self.parts
        up._step_loss = p.wrap("step_loss", up._step_loss)
        up._step = p.wrap("optimizer", up._step)
        up._eager_minibatch = p.wrap("minibatch", up._eager_minibatch)
        p.hook(policy, "policy")
        if fine:
            for module, name in ((policy.stem, "image_fwd"), (policy.action_head, "heads_fwd"),
                                 (policy.value_head, "heads_fwd")):
                p.hook(module, name)
            if hasattr(policy, "_encode"):  # the layers are called one by one there
                policy._encode = p.wrap("transformer_fwd", policy._encode)
            else:
                p.hook(policy.encoder, "transformer_fwd")
        if compile:  # the minibatch shapes: a first update, timed with its compile
            t0 = time.perf_counter()
            self.run()
            self.compile_s += time.perf_counter() - t0

    def run(self) -> dict[str, float]:
        p = self.parts
        p.ms.clear()
        context = (torch.autocast("cpu", dtype=torch.bfloat16) if self.autocast else contextlib.nullcontext())
        with context:
            t0, wall = time.thread_time(), time.perf_counter()
            self.updater.update(self.batch)
            total = (time.thread_time() - t0) * 1e3
            wall = (time.perf_counter() - wall) * 1e3
        ms = dict(p.ms)
        p.ms.clear()
        with context, p.section("score"):
            score(self.policy, self.obs, self.batch.actions)
        score_ms = p.ms["score"]
        fine = "image_fwd" in ms
        inner = sum(ms.get(k, 0.0) for k in ("image_fwd", "transformer_fwd", "heads_fwd"))
        out = {
            "image_fwd": ms.get("image_fwd", float("nan")),
            "transformer_fwd": ms.get("transformer_fwd", float("nan")),
            "heads_fwd": ms.get("heads_fwd", float("nan")),
            "embed_fwd": ms["policy"] - inner if fine else float("nan"),
            "policy_fwd": ms["policy"],
            "loss": ms["step_loss"] - ms["policy"],
            "backward": ms["minibatch"] - ms["step_loss"] - ms["optimizer"],
            "optimizer": ms["optimizer"],
            "data": total - ms["minibatch"],
            "update": total,
            "update_wall": wall,
            "score": score_ms,
        }
        out["update_and_score"] = total + score_ms
        return out


def build_sides(names: list[str], chunk: int, samples: int, before: str) -> dict[str, Side]:
    sides: dict[str, Side] = {}
    for name in names:
        torch.manual_seed(0)
        config = VLAConfig(chunk=chunk, grid=2 if name == "grid2" else 4)
        cls = load_policy_class(before) if name == "before" else VLAPolicy
        policy = cls(config, ACTION_DIM)
        compiled, autocast = name == "compiled", name == "bf16"
        sides[name] = Side(policy, samples, compile=compiled, autocast=autocast, fine=not (compiled or autocast))
    return sides


def profile_table(side: Side, rows: int) -> list[dict[str, Any]]:
    """The top operations of one update by self CPU time."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        side.updater.update(side.batch)
    events = sorted(prof.key_averages(), key=lambda e: e.self_cpu_time_total, reverse=True)[:rows]
    return [{"op": e.key, "self_ms": round(e.self_cpu_time_total / 1e3, 1), "calls": e.count} for e in events]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=1, help="torch threads (the example's actor.num_threads: 1)")
    parser.add_argument("--chunks", type=int, nargs="+", default=[1, 4])
    parser.add_argument("--sides", nargs="+", default=["before", "eager", "compiled", "bf16", "grid2"],
                        choices=["before", "eager", "compiled", "bf16", "grid2"])
    parser.add_argument("--before", default="", help="git revision whose VLA is the 'before' side")
    parser.add_argument("--samples", type=int, default=512)
    parser.add_argument("--rounds", type=int, default=3, help="timed rounds, after one untimed")
    parser.add_argument("--profile-rows", type=int, default=15)
    parser.add_argument("--out", default="v1_vla_update")
    args = parser.parse_args()
    if "before" in args.sides and not args.before:
        parser.error("--before: the git revision of the 'before' side's VLA")
    torch.set_num_threads(args.threads)
    result: dict[str, Any] = {"command": " ".join(["python", *sys.argv]), "environment": environment(),
                              "threads": args.threads, "before": args.before, "chunks": {}}
    for chunk in args.chunks:
        sides = build_sides(args.sides, chunk, args.samples, args.before)
        runs: dict[str, list[dict[str, float]]] = {name: [] for name in sides}
        loads = []
        for r in range(args.rounds + 1):
            for name, side in sides.items():
                out = side.run()
                if r:
                    runs[name].append(out)
                print(f"chunk {chunk} round {r} {name}: update {out['update']:.0f} ms, score {out['score']:.0f} ms",
                      file=sys.stderr, flush=True)
            loads.append(environment()["load_avg_1m"])
        per_side = {}
        for name, side in sides.items():
            med = {k: round(median([run[k] for run in runs[name]]), 1) for k in runs[name][0]}
            med["compile_s"] = round(side.compile_s, 1)
            per_side[name] = med
        first = next(iter(sides))
        for name in sides:
            per_side[name]["vs_first"] = round(
                median([a["update_and_score"] / b["update_and_score"] for a, b in zip(runs[name], runs[first])]), 3)
        eager = sides.get("eager") or sides[first]
        result["chunks"][str(chunk)] = {"sides": per_side, "load_avg_1m": loads,
                                        "profile": profile_table(eager, args.profile_rows)}
        print(f"chunk {chunk} (ms per {args.samples}-sample update, medians of {args.rounds}; "
              f"load {min(loads):.1f}-{max(loads):.1f}):")
        keys = [*PARTS, "update", "update_and_score", "update_wall", "compile_s", "vs_first"]
        print("  " + " ".join(f"{k:>15}" for k in ["side", *keys]))
        for name, med in per_side.items():
            print("  " + f"{name:>15} " + " ".join(f"{med.get(k, float('nan')):>15.1f}" for k in keys))
    result["environment_after"] = environment()
    path = write_result(args.out, result)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
