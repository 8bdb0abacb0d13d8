"""Benchmark V1 (throughput): m2flow's VLA PPO against SB3 PPO ``CnnPolicy`` on MetaWorld pixels, side by side.

Both sides train PPO on MetaWorld reach-v3 from 64x64 RGB images of the same env class
(``m2flow.envs.metaworld.MetaWorldPixelEnv``: "corner" camera rotated upright, fast render settings,
dense reward, 100-step episodes) with the settings of ``examples/embodied/metaworld_vla_ppo.yaml``:
8 envs x 64 steps per update (512), 2 epochs of minibatch 128, lr 1e-4, gamma 0.99, GAE lambda
0.95, clip 0.2, rewards normalised, and ``target_kl`` off on both sides (every update does its
full two epochs, so both do the same work whatever the learning does). What each side observes:

- m2flow: the small VLA (~0.95M parameters) reads the image, the instruction's word ids and the
  proprioception (end-effector position, gripper opening), from random weights
  (``policy.init_from`` unset; ``--init-from`` names a warm start; a step costs the same);
- SB3 (``benchmarks/peers/sb3_pixels.py``, its own venv): ``CnnPolicy`` (NatureCNN) reads the image alone.

Sides: ``m2flow-local`` (``placement: local``, one process) and ``m2flow-split``
(``env,rollout: 0, actor: 1``, the policy in the env process, staleness 1, on Ray); the same policy as
SB3's on m2flow's plans, ``m2flow-cnn-*``: the CNN actor-critic shaped as ``CnnPolicy`` (603,305
parameters) on the image alone (``env.env_kwargs.observation: image``), with the same PPO settings, on
``local``, ``split`` and ``envs2`` (two env ranks of 4 envs, rendering on both cores); SB3 at its best
vector-env setting here: with ``--sb3 auto`` short probes of ``DummyVecEnv`` and ``SubprocVecEnv``
at 1 and 2 torch threads pick it (by whole-run env-steps/s). Every run is a fresh process; a run's
whole time is from starting that process to its exit (imports, Ray, workers and shut-down
included), its loop time the training loop alone. Sides alternate (A B C A B C ...); figures are
medians over rounds, ratios taken round by round. The limit: the env rendered and stepped with
random actions in one process (and in two at once), no policy (``benchmarks/v1_env_rate.py``'s loop).

    python benchmarks/v1_throughput.py --setup                          # peer venv: benchmarks/.venvs/sb3-v1
    python benchmarks/v1_throughput.py --steps 8192 --rounds 3          # probes SB3, then the rounds
    python benchmarks/v1_throughput.py --sb3 sb3-subproc-t1 --rounds 1  # a given SB3 setting, no probes
    python benchmarks/v1_throughput.py --m2flow m2flow-cnn-local,m2flow-cnn-split,m2flow-cnn-envs2  # same policy

Writes ``benchmarks/results/v1_throughput.json`` (or ``--out``) and prints one summary line.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
SB3_VENV = HERE / ".venvs" / "sb3-v1"
SB3_SCRIPT = HERE / "peers" / "sb3_pixels.py"
VLA_EXAMPLE = ROOT / "examples" / "embodied" / "metaworld_vla_ppo.yaml"
# The peer's own environment, pinned; torch is the CPU build m2flow uses. PyYAML, OmegaConf and
# PyOpenGL: the m2flow env class the peer steps imports m2flow's config layer and renders through EGL.
SB3_PACKAGES = [
    "torch==2.13.0",
    "stable-baselines3==2.9.2",
    "gymnasium==1.4.0",
    "metaworld==3.1.1",
    "mujoco==3.3.0",
    "packaging==26.4",
    "numpy==2.4.6",
    "pyyaml==6.0.4",
    "omegaconf==2.4.0",
    "pyopengl==3.1.10",
]
SB3_SETTINGS: dict[str, tuple[str, int]] = {
    "sb3-dummy-t1": ("dummy", 1),
    "sb3-dummy-t2": ("dummy", 2),
    "sb3-subproc-t1": ("subproc", 1),
    "sb3-subproc-t2": ("subproc", 2),
}
"""SB3 setting name -> (vector env class, torch threads)."""
CNN = ("policy.kind=actor_critic", "policy.encoder=cnn", "policy.shared_critic=true", "policy.hidden_sizes=[]",
       "policy.activation=relu", "env.env_kwargs.observation=image")
"""SB3's ``CnnPolicy`` in m2flow's actor-critic: NatureCNN (32-64-64 convolutions, 512 ReLU features) shared by
the action and value heads, no MLP layers after it, orthogonal init, log-std 0; the env hands it the image alone."""
M2FLOW_PLANS: dict[str, tuple[str, int, tuple[str, ...]]] = {
    "m2flow-local": ("local", 0, ()),
    "m2flow-split": ("env,rollout: 0, actor: 1", 1, ()),
    # The plan search's choice for this workload (V2): two env ranks render on both cores in two pipeline
    # stages, the rollout serves them from device 0, the actor trains over both devices.
    "m2flow-2stages": ("env,actor: 0-1, rollout: 0", 1, ("rollout.fuse_with_env=false", "pipeline_stages=2")),
    # One process, the VLA emitting chunks of 4 actions from one forward pass: a frame per decision, and
    # rollout_steps (64) counting decisions, so an update trains on 512 decisions of 2,048 env steps.
    "m2flow-local-chunk4": ("local", 0, ("policy.vla.chunk=4", "policy.vla.decoding=parallel")),
    # The split plan with the same chunks: the env process renders and decides, the actor trains on core 1.
    "m2flow-split-chunk4": ("env,rollout: 0, actor: 1", 1, ("policy.vla.chunk=4", "policy.vla.decoding=parallel")),
    # The same with a 2x2 grid of image tokens (4 instead of 16): a cheaper update and decision.
    "m2flow-split-chunk4-grid2": ("env,rollout: 0, actor: 1", 1, ("policy.vla.chunk=4", "policy.vla.decoding=parallel",
                                                                  "policy.vla.grid=2")),
    # The same with SB3's horizon in env steps: 16 decisions of 4 env steps, 8 envs x 64 env steps an iteration,
    # so 128 decisions an update (2 epochs of one minibatch of 128) and 16 updates a run, SB3's count; the
    # pipeline fills (the first collection) and drains (the last update) in a quarter of the time.
    "m2flow-split-chunk4-grid2-h16": ("env,rollout: 0, actor: 1", 1, ("policy.vla.chunk=4", "policy.vla.decoding=parallel",
                                                                      "policy.vla.grid=2", "rollout_steps=16")),
    # The same with one PPO ratio per chunk (``policy.vla.logprob: action``), with which PPO on chunks learned level with
    # one action per decision at equal env steps (docs/vla.md); a ratio per token lets a chunk of 16 tokens change
    # its probability up to 1.2^16 times in an update.
    "m2flow-split-chunk4-grid2-h16-chunkratio": ("env,rollout: 0, actor: 1", 1, (
        "policy.vla.chunk=4", "policy.vla.decoding=parallel", "policy.vla.grid=2", "rollout_steps=16",
        "policy.vla.logprob=action")),
    # The same policy on both sides: m2flow's CNN actor-critic shaped as SB3's CnnPolicy, on the image alone.
    "m2flow-cnn-local": ("local", 0, CNN),
    "m2flow-cnn-split": ("env,rollout: 0, actor: 1", 1, CNN),
    # Rendering on both cores: two env ranks of 4 envs each (8 envs, 512 samples an update, as SB3's), each
    # serving its own policy copy; the actor trains on core 1 one iteration behind.
    "m2flow-cnn-envs2": ("env,rollout: 0-1, actor: 1", 1, (*CNN, "env.num_envs=4")),
}
"""m2flow side name -> (placement, algorithm.max_staleness, further overrides)."""
CNN_SIDES = frozenset(name for name, (_, _, extra) in M2FLOW_PLANS.items() if CNN[0] in extra)
ENVS, ROLLOUT_STEPS = 8, 64


def m2flow_side(name: str, steps: int, seed: int, init_from: str | None) -> dict:
    """One m2flow training run in this process: loop and start-up seconds, the time split per component."""
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    os.environ.setdefault("MUJOCO_GL", "egl")
    t0 = time.perf_counter()
    from m2flow.config.loader import load_config
    from m2flow.runtime.logs import setup_logging
    from m2flow.workflows.embodied.config import EmbodiedConfig
    from m2flow.autoplan.entry import train
    from m2flow.workflows.embodied.workflow import WORKFLOW as EMBODIED

    setup_logging(console=False)
    placement, staleness, extra = M2FLOW_PLANS[name]
    with tempfile.TemporaryDirectory(prefix="v1tp-") as run_dir:
        cfg = load_config(EmbodiedConfig, VLA_EXAMPLE, [
            f"placement={placement}", "cluster.cpu_devices_per_node=8", f"env.num_envs={ENVS}",
            f"rollout_steps={ROLLOUT_STEPS}", f"total_env_steps={steps}", "rollout.fuse_with_env=true",
            f"algorithm.max_staleness={staleness}", "algorithm.target_kl=null", f"seed={seed}",
            f"run_dir={run_dir}", "metrics.sinks=[]", "trace=false", "checkpoint_every=0",
            f"policy.init_from={init_from or 'null'}", "env_worker.num_threads=1", "rollout.num_threads=1",
            "actor.num_threads=1", *extra])
        imported = time.perf_counter() - t0
        result = train(EMBODIED, cfg)
    hist = result.history
    total = {k: sum(h.get(f"time/{k}", 0.0) for h in hist)
             for k in ("env_busy_s", "rollout_busy_s", "actor_busy_s", "iteration_s")}
    done = int(hist[-1]["env/total_steps"]) if hist else 0
    returns = [r for _, r in result.episodes]
    return {
        "side": name, "placement": placement, "staleness": staleness, "mode": result.mode,
        "fused": result.plan.fused("rollout"), "steps": done, "seed": seed, "init_from": init_from,
        "observes": "image (64, 64, 3) uint8" if name in CNN_SIDES else
                    "image (64, 64, 3) uint8 + instruction word ids (16) + proprio (4)",
        "loop_s": round(result.loop_s, 3),
        "startup_in_process_s": round(imported + result.startup_s, 3),
        # summed over iterations; in the split plan the actor's time overlaps the env process's
        "env_s": round(total["env_busy_s"], 3),
        "policy_s": round(total["rollout_busy_s"], 3),
        "update_s": round(total["actor_busy_s"], 3),
        "iterations_s": round(total["iteration_s"], 3),
        "loop_env_steps_per_s": round(done / result.loop_s, 2) if result.loop_s else None,
        "episodes": len(returns),
        "mean_return": sum(returns) / len(returns) if returns else None,
    }


def render_rate(steps: int, sim_only: bool) -> dict:
    """Random-action env-steps/s of the benchmark's env in this process (resets included), no policy."""
    os.environ.setdefault("MUJOCO_GL", "egl")
    sys.path.insert(0, str(ROOT))
    from benchmarks.v1_env_rate import rate
    from m2flow.envs.metaworld import MetaWorldPixelEnv

    env = MetaWorldPixelEnv("reach-v3", height=64, width=64, camera="corner", max_episode_steps=100,
                            reward="dense", terminate_on_success=False)
    rate(env, 20)  # warm-up: the first frames compile shaders
    out = {"env_steps_per_s": round(rate(env, steps), 1)}
    if sim_only:
        out["sim_only_steps_per_s"] = round(rate(env, steps, render=False), 1)
    env.close()
    return out


def _child_env(threads: int) -> dict[str, str]:
    env = dict(os.environ, OMP_NUM_THREADS=str(threads), MKL_NUM_THREADS=str(threads), MUJOCO_GL="egl",
               RAY_AUTH_MODE="disabled")
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    return env


def _command(side: str, args: argparse.Namespace, steps: int) -> tuple[list[str], int]:
    if side in SB3_SETTINGS:
        vec, threads = SB3_SETTINGS[side]
        return [str(SB3_VENV / "bin" / "python"), str(SB3_SCRIPT), "--steps", str(steps), "--seed", str(args.seed),
                "--threads", str(threads), "--vec", vec], threads
    cmd = [sys.executable, str(Path(__file__).resolve()), "--m2flow-side", side, "--steps", str(steps),
           "--seed", str(args.seed)]
    return cmd + (["--init-from", args.init_from] if args.init_from else []), 1


def run_side(side: str, args: argparse.Namespace, steps: int) -> dict:
    """One training run in a fresh process; its whole time is the process's, start to exit."""
    cmd, threads = _command(side, args, steps)
    load_before = os.getloadavg()[0]
    for attempt in range(args.retries + 1):  # a shared machine can time Ray's start-up out
        with tempfile.TemporaryDirectory(prefix="v1tp-cwd-") as cwd:
            t0 = time.perf_counter()
            proc = subprocess.run(cmd, cwd=cwd, env=_child_env(threads), capture_output=True, text=True,
                                  timeout=args.timeout)
            whole = time.perf_counter() - t0
        lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
        if proc.returncode == 0 and lines:
            break
        print(f"{side} failed (attempt {attempt + 1}, exit {proc.returncode}):\n{proc.stderr[-2000:]}", file=sys.stderr)
        time.sleep(20)
    else:
        raise RuntimeError(f"{side} failed {args.retries + 1} times")
    out = json.loads(lines[-1])
    out["side"] = side
    out["whole_s"] = round(whole, 3)
    out["whole_env_steps_per_s"] = round(out["steps"] / whole, 2)
    out["startup_and_exit_s"] = round(whole - out["loop_s"], 3)
    out["load_1m"] = [round(load_before, 2), round(os.getloadavg()[0], 2)]
    print(json.dumps(out), file=sys.stderr, flush=True)
    return out


def render_reference(steps: int) -> dict:
    """The env alone: one process, then two processes at once (their rates summed), in fresh processes."""
    base = [sys.executable, str(Path(__file__).resolve()), "--render-rate", str(steps)]

    def launch(sim: bool) -> subprocess.Popen:
        return subprocess.Popen(base + (["--sim-only"] if sim else []), env=_child_env(1), stdout=subprocess.PIPE,
                                text=True, cwd=tempfile.gettempdir())

    def result(proc: subprocess.Popen) -> dict:
        stdout, _ = proc.communicate(timeout=600)
        if proc.returncode != 0:
            raise RuntimeError(f"render-rate child failed (exit {proc.returncode})")
        return json.loads(stdout.strip().splitlines()[-1])

    load = os.getloadavg()[0]
    one = result(launch(True))
    two = [result(p) for p in [launch(False), launch(False)]]
    return {"one_process": one, "two_processes": [t["env_steps_per_s"] for t in two],
            "two_processes_total": round(sum(t["env_steps_per_s"] for t in two), 1), "steps": steps,
            "load_1m": [round(load, 2), round(os.getloadavg()[0], 2)]}


def setup() -> None:
    """Create the SB3 peer's virtual environment and install its pinned packages."""
    py = SB3_VENV / "bin" / "python"
    if not py.exists():
        subprocess.run(["python3.11", "-m", "venv", str(SB3_VENV)], check=True)
    subprocess.run([str(py), "-m", "pip", "install", "-q", *SB3_PACKAGES], check=True)
    print(f"sb3 peer ready in {SB3_VENV}")


def _med(values: list[float | None]) -> float | None:
    values = [v for v in values if v is not None]
    return round(statistics.median(values), 3) if values else None


def summarize(runs: list[dict], sides: list[str], sb3: str) -> dict:
    """Per side: medians of the rates and the time split; per m2flow side: round-by-round ratios to SB3."""
    out: dict = {}
    for side in sides:
        rs = [r for r in runs if r["side"] == side]
        if not rs:
            continue
        entry = {k: _med([r.get(k) for r in rs]) for k in (
            "whole_env_steps_per_s", "loop_env_steps_per_s", "whole_s", "loop_s", "startup_and_exit_s",
            "env_s", "policy_s", "policy_other_s", "update_s")}
        entry["env_frac_of_loop"] = _med([r["env_s"] / r["loop_s"] for r in rs])
        entry["update_frac_of_loop"] = _med([r["update_s"] / r["loop_s"] for r in rs])
        entry["runs"] = len(rs)
        entry["load_1m"] = [min(x for r in rs for x in r["load_1m"]), max(x for r in rs for x in r["load_1m"])]
        out[side] = {k: v for k, v in entry.items() if v is not None}
    base = [r for r in runs if r["side"] == sb3]
    for side in sides:
        if side == sb3 or side not in out:
            continue
        pairs = list(zip(base, [r for r in runs if r["side"] == side]))
        for unit in ("whole", "loop"):
            key = f"{unit}_env_steps_per_s"
            out[side][f"{unit}_vs_sb3"] = _med([b[key] / a[key] for a, b in pairs])
    m2 = [s for s in sides if s in M2FLOW_PLANS and s in out]
    if m2 and sb3 in out:
        best = max(m2, key=lambda s: out[s]["whole_env_steps_per_s"])
        out["best_m2flow"] = best
        out["best_vs_sb3_whole"] = out[best]["whole_vs_sb3"]
        out["best_vs_sb3_loop"] = out[best]["loop_vs_sb3"]
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--setup", action="store_true", help="create the peer venv and exit")
    p.add_argument("--steps", type=int, default=8192, help="env steps per run, on every side (whole updates of 512)")
    p.add_argument("--rounds", type=int, default=3, help="A B C rounds over the sides")
    p.add_argument("--sb3", default="auto", help=f"SB3 setting, one of {list(SB3_SETTINGS)}, or 'auto' (probe them)")
    p.add_argument("--probe-steps", type=int, default=4096, help="env steps per SB3 probe run")
    p.add_argument("--m2flow", default=",".join(s for s in M2FLOW_PLANS if s not in CNN_SIDES),
                   help=f"m2flow sides, from {list(M2FLOW_PLANS)} (default: the VLA's)")
    p.add_argument("--render-steps", type=int, default=1000, help="steps of the render-only reference (0 skips)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--init-from", default=None, help="m2flow: policy.init_from (default: random weights)")
    p.add_argument("--timeout", type=float, default=1200, help="seconds allowed per run")
    p.add_argument("--retries", type=int, default=1, help="reruns of a failed run")
    p.add_argument("--out", default=str(HERE / "results" / "v1_throughput.json"), help="result JSON path")
    p.add_argument("--m2flow-side", default=None, help=argparse.SUPPRESS)  # one m2flow run here, JSON out
    p.add_argument("--render-rate", type=int, default=0, help=argparse.SUPPRESS)  # the env alone here, JSON out
    p.add_argument("--sim-only", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args()

    if args.m2flow_side:
        print(json.dumps(m2flow_side(args.m2flow_side, args.steps, args.seed, args.init_from)))
        return
    if args.render_rate:
        print(json.dumps(render_rate(args.render_rate, args.sim_only)))
        return
    if args.setup:
        setup()
        return
    if args.steps % (ENVS * ROLLOUT_STEPS) or args.probe_steps % (ENVS * ROLLOUT_STEPS):
        raise SystemExit(f"--steps and --probe-steps must be multiples of {ENVS * ROLLOUT_STEPS}")
    if args.sb3 != "auto" and args.sb3 not in SB3_SETTINGS:
        raise SystemExit(f"--sb3: unknown setting {args.sb3!r}; valid: auto, {', '.join(SB3_SETTINGS)}")
    m2 = [s for s in args.m2flow.split(",") if s]
    unknown = [s for s in m2 if s not in M2FLOW_PLANS]
    if unknown:
        raise SystemExit(f"--m2flow: unknown sides {unknown}; valid: {list(M2FLOW_PLANS)}")
    if not (SB3_VENV / "bin" / "python").exists():
        raise SystemExit(f"no {SB3_VENV}; run with --setup first")

    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    record: dict = {"benchmark": "V1-throughput", "command": " ".join([Path(sys.argv[0]).name, *sys.argv[1:]]),
                    "cpus": os.cpu_count(), "steps": args.steps, "task": "reach-v3", "probes": [], "runs": [],
                    "started": time.strftime("%Y-%m-%dT%H:%M:%S")}

    def write() -> None:  # after every run: a benchmark stopped early still leaves what it measured
        out.write_text(json.dumps(record, indent=2) + "\n")

    if args.render_steps:
        record["render_before"] = render_reference(args.render_steps)
        write()
    sb3 = args.sb3
    if sb3 == "auto":
        for name in SB3_SETTINGS:
            record["probes"].append(run_side(name, args, args.probe_steps))
            write()
        sb3 = max(record["probes"], key=lambda r: r["whole_env_steps_per_s"])["side"]
    record["sb3_side"] = sb3
    sides = [sb3, *m2]
    for _ in range(args.rounds):
        for side in sides:
            record["runs"].append(run_side(side, args, args.steps))
            record["summary"] = summarize(record["runs"], sides, sb3)
            write()
    if args.render_steps:
        record["render_after"] = render_reference(args.render_steps)
    record["finished"] = time.strftime("%Y-%m-%dT%H:%M:%S")
    write()
    print(summary_line(record))


def summary_line(record: dict) -> str:
    s = record.get("summary", {})
    parts = []
    for side, e in s.items():
        if isinstance(e, dict):
            ratio = f" ({e['whole_vs_sb3']}x / {e['loop_vs_sb3']}x SB3)" if "whole_vs_sb3" in e else ""
            parts.append(f"{side} {e['whole_env_steps_per_s']:.1f} whole / {e['loop_env_steps_per_s']:.1f} loop "
                         f"env-steps/s{ratio}")
    ref = record.get("render_before")
    if ref:
        parts.append(f"env alone {ref['one_process']['env_steps_per_s']:.0f} steps/s in one process, "
                     f"{ref['two_processes_total']:.0f} in two")
    loads = [x for r in record["runs"] for x in r["load_1m"]]
    load = f"load {min(loads)}-{max(loads)}" if loads else "no runs"
    return f"V1 throughput ({load}, {record['steps']} steps/run) | " + " | ".join(parts)


if __name__ == "__main__":
    main()
