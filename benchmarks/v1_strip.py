"""V1 picture: one held-out episode of the warm start and of the RL policy, side by side as an image strip.

    python benchmarks/v1_strip.py --eval-seeds 50 --show rl-only --out docs/images/v1_strip_reach.png

Rolls out the warm start (``policy.init_from``) and an RL checkpoint of the run greedily on the same
held-out seeds, with the protocol of ``v1_rl.py`` (greedy action tokens, episodes of up to 200 steps
that end at success, the run's image size, camera and proprio; ``--parallel`` episodes side by side in
the same chunks, so the success rates equal that script's). It counts, over those seeds, the episodes
both policies solve, only one solves, and neither solves, then draws one seed's two episodes: two rows
(before / after RL), ``--frames`` frames each at even intervals of the episode, each the policy's own
camera image (the observation's pixels) scaled up without smoothing, and a caption per row with the
instruction, the outcome and the step of success. ``--show`` picks the seed: ``rl-only`` the first
seed the RL policy solves and the warm start does not (the counts say how often that is), ``random``
a seed drawn with ``--pick-seed``, or a seed number. Writes the PNG and
``benchmarks/results/<name>.json`` (per-seed outcomes, counts, the seed shown, the command).
"""

from __future__ import annotations

import argparse
import logging
import os
import random
import sys
import time
from dataclasses import replace
from pathlib import Path

os.environ.setdefault("MUJOCO_GL", "egl")

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np  # noqa: E402
import torch  # noqa: E402

from benchmarks.common import environment, write_result  # noqa: E402
from benchmarks.v1_rl import EVAL_KWARGS, _checkpoints, load_vla_run  # noqa: E402
from m2flow.envs.instructions import instruction  # noqa: E402
from m2flow.envs.metaworld import MetaWorldPixelEnv, held_out_seeds  # noqa: E402
from m2flow.models.init_weights import read_policy_state  # noqa: E402
from m2flow.models.vla import VLAPolicy  # noqa: E402


def rollouts(policy: VLAPolicy, task: str, seeds: list[int], env_kwargs: dict, parallel: int
             ) -> tuple[list[int | None], list[np.ndarray]]:
    """Greedy episodes of ``policy`` on ``seeds``: per seed the step of first success (None: never) and its frames.

    Frames are the camera images the policy saw, (T + 1, H, W, 3) uint8 from the reset to the last step.
    """
    width = min(parallel, len(seeds))
    envs = [MetaWorldPixelEnv(task, **env_kwargs) for _ in range(width)]
    solved_at: list[int | None] = []
    frames: list[np.ndarray] = []
    try:
        for first in range(0, len(seeds), width):  # the chunks of evaluate_success: the same batches, the same actions
            chunk = seeds[first:first + width]
            live = envs[:len(chunk)]
            obs = np.stack([env.reset(seed=s)[0] for env, s in zip(live, chunk)])
            shots = [[env.render()] for env in live]
            hit: list[int | None] = [None] * len(chunk)
            running = np.ones(len(live), dtype=bool)
            step = 0
            while running.any():
                step += 1
                with torch.no_grad():
                    actions = policy.act(torch.from_numpy(obs[running]), deterministic=True).actions.numpy()
                for row, i in enumerate(np.flatnonzero(running)):
                    o, _, term, trunc, info = live[i].step(actions[row])
                    obs[i] = o
                    shots[i].append(live[i].render())
                    if info["success"] > 0 and hit[i] is None:
                        hit[i] = step
                    running[i] = not (term or trunc)
            solved_at += hit
            frames += [np.stack(s) for s in shots]
    finally:
        for env in envs:
            env.close()
    return solved_at, frames


def pick(show: str, seeds: list[int], before: list[int | None], after: list[int | None], pick_seed: int) -> int:
    """The index of the seed to draw (see ``--show``)."""
    if show == "rl-only":
        only = [i for i in range(len(seeds)) if after[i] is not None and before[i] is None]
        if not only:
            raise SystemExit("--show rl-only: no held-out seed is solved by the RL policy alone; use --show random")
        return only[0]
    if show == "random":
        return random.Random(pick_seed).randrange(len(seeds))
    if int(show) not in seeds:
        raise SystemExit(f"--show: seed {show} is not among the {len(seeds)} held-out seeds {seeds[0]}-{seeds[-1]}")
    return seeds.index(int(show))


def draw(rows: list[tuple[str, np.ndarray, int | None]], title: str, frames: int, scale: int, out: Path) -> None:
    """Two rows of ``frames`` frames at even intervals of each episode, with a caption line above each row."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    h, w = rows[0][1].shape[1:3]
    dpi = 100
    cell_w, cell_h = w * scale / dpi, h * scale / dpi
    caption_h, label_h, title_h = 0.32, 0.22, 0.34
    fig_w = frames * cell_w
    fig_h = title_h + len(rows) * (caption_h + cell_h + label_h)
    fig = plt.figure(figsize=(fig_w, fig_h), dpi=dpi)
    fig.text(0.5, 1 - title_h / 2 / fig_h, title, ha="center", va="center", fontsize=11)
    top = fig_h - title_h
    for caption, episode, solved in rows:
        fig.text(0.005, (top - caption_h / 2) / fig_h, caption, ha="left", va="center", fontsize=10,
                 color="tab:green" if solved is not None else "tab:red")
        top -= caption_h
        steps = np.linspace(0, len(episode) - 1, frames).round().astype(int)
        for j, t in enumerate(steps):
            ax = fig.add_axes((j * cell_w / fig_w, (top - cell_h) / fig_h, cell_w / fig_w, cell_h / fig_h))
            ax.imshow(episode[t], interpolation="nearest")
            ax.set_axis_off()
            fig.text((j + 0.5) * cell_w / fig_w, (top - cell_h - label_h / 2) / fig_h,
                     f"step {t}" + (" (success)" if solved is not None and t == solved else ""),
                     ha="center", va="center", fontsize=8)
        top -= cell_h + label_h
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=dpi)
    plt.close(fig)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default="examples/embodied/metaworld_vla_ppo.yaml")
    parser.add_argument("overrides", nargs="*", help="the run's config overrides (run_dir=..., policy.init_from=...)")
    parser.add_argument("--step", default="last", help="the RL checkpoint: 'last' or an iteration number")
    parser.add_argument("--eval-seeds", type=int, default=50, help="held-out seeds to count over")
    parser.add_argument("--show", default="random", help="'rl-only', 'random' or a held-out seed number")
    parser.add_argument("--pick-seed", type=int, default=0, help="the draw of --show random")
    parser.add_argument("--frames", type=int, default=8, help="frames per row")
    parser.add_argument("--scale", type=int, default=3, help="pixels per camera pixel in the picture")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--parallel", type=int, default=10, help="episodes run side by side (as v1_rl.py)")
    parser.add_argument("--out", default="docs/images/v1_strip_reach.png")
    parser.add_argument("--name", default="v1_strip_reach")
    args = parser.parse_args()
    cfg, tasks = load_vla_run(args)
    if len(tasks) != 1:
        raise SystemExit(f"--config: the strip shows one task; the run has {tasks}")
    task = tasks[0]
    env_kwargs = {k: v for k, v in cfg.env.env_kwargs.items() if k in EVAL_KWARGS}
    seeds = held_out_seeds(args.eval_seeds)
    found = _checkpoints(Path(cfg.run_dir), args.step)
    if not found:
        raise SystemExit(f"--step {args.step}: no such checkpoint under {cfg.run_dir}/checkpoints")
    iteration, ckpt = found[-1]
    env_steps = iteration * cfg.rollout_steps * cfg.env.num_envs
    policy = VLAPolicy(replace(cfg.policy.vla), action_dim=4)
    policy.eval()
    outcome: dict[str, tuple[list[int | None], list[np.ndarray]]] = {}
    for side, weights in (("warm_start", read_policy_state(cfg.policy.init_from)),
                          ("rl", torch.load(ckpt / "actor.pt", map_location="cpu", weights_only=True)["policy"])):
        policy.load_state_dict(weights)
        t0 = time.perf_counter()
        outcome[side] = rollouts(policy, task, seeds, env_kwargs, args.parallel)
        logging.info("%s: solved %d / %d (%.0f s)", side, sum(s is not None for s in outcome[side][0]),
                     len(seeds), time.perf_counter() - t0)
    before, after = outcome["warm_start"][0], outcome["rl"][0]
    counts = {"both": sum(b is not None and a is not None for b, a in zip(before, after)),
              "rl_only": sum(b is None and a is not None for b, a in zip(before, after)),
              "warm_start_only": sum(b is not None and a is None for b, a in zip(before, after)),
              "neither": sum(b is None and a is None for b, a in zip(before, after))}
    i = pick(args.show, seeds, before, after, args.pick_seed)
    h, w = env_kwargs.get("height", 64), env_kwargs.get("width", 64)
    camera = env_kwargs.get("camera", "corner")

    def caption(label: str, solved: int | None, frames: np.ndarray) -> str:
        result = f"solved at step {solved}" if solved is not None else f"not solved in {len(frames) - 1} steps"
        return f"{label}: \"{instruction(task)}\": {result}"

    rows = [(caption("before RL (behaviour-cloning warm start)", before[i], outcome["warm_start"][1][i]),
             outcome["warm_start"][1][i], before[i]),
            (caption(f"after RL (PPO, {env_steps:,} env steps)", after[i], outcome["rl"][1][i]),
             outcome["rl"][1][i], after[i])]
    title = (f"{task}, held-out seed {seeds[i]}, greedy actions; the policy's own view ({camera} camera, "
             f"{h}x{w}, shown x{args.scale})")
    out = Path(args.out)
    draw(rows, title, args.frames, args.scale, out)
    result = {"command": " ".join(["python", *sys.argv]), "config": args.config, "overrides": args.overrides,
              "task": task, "warm_start": cfg.policy.init_from, "checkpoint": str(ckpt), "env_steps": env_steps,
              "eval_seeds": [seeds[0], seeds[-1]], "env_kwargs": env_kwargs, "environment": environment(),
              "success": {"warm_start": float(np.mean([b is not None for b in before])),
                          "rl": float(np.mean([a is not None for a in after]))},
              "counts": counts, "shown": {"seed": seeds[i], "show": args.show, "warm_start_solved_at": before[i],
                                          "rl_solved_at": after[i]},
              "solved_at": {"warm_start": before, "rl": after}, "image": str(out),
              "image_bytes": out.stat().st_size}
    path = write_result(args.name, result)
    print(f"v1 strip: {len(seeds)} held-out seeds, warm start {result['success']['warm_start']:.2f} -> RL "
          f"{result['success']['rl']:.2f}; {counts}; seed {seeds[i]} -> {out} ({out.stat().st_size:,} bytes), {path}")


if __name__ == "__main__":
    main()
