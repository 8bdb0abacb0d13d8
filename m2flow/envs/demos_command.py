"""``m2flow demos TASKS --episodes N --output FILE``: scripted-expert demonstrations of MetaWorld v3 tasks.

Each task's scripted expert (``metaworld.policies``) plays ``--episodes`` episodes, seeded ``seed + k``;
the file holds what a pixel policy sees (packed image / instruction / proprio) and the expert's action
(``m2flow.envs.metaworld_demos.Demos``), ready for ``policy.warm_start.demos``. The image size and the
instruction must be those of the run that will read the file.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from m2flow.commands import CommandError, register_command, say


def _configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("tasks", help="a MetaWorld v3 task (handle-press-v3), a comma-separated list, or a family "
                                      "(mt10, mt50)")
    parser.add_argument("--episodes", type=int, default=50, help="expert episodes per task (default 50)")
    parser.add_argument("--seed", type=int, default=0, help="episode k of every task is reset with seed + k")
    parser.add_argument("--image-size", type=int, default=64,
                        help="square camera image in pixels: the run's env_kwargs height / width (default 64)")
    parser.add_argument("--action-noise", type=float, default=0.1,
                        help="std of Gaussian noise on the executed action (the recorded one stays the expert's), "
                             "so the data covers states off the expert's path (default 0.1)")
    parser.add_argument("--max-episode-steps", type=int, default=None,
                        help="cut episodes at this many steps (default: the env's 200)")
    parser.add_argument("--instruction", default=None,
                        help="the sentence the policy reads instead of the task's own (one task only)")
    parser.add_argument("--keep-failures", action="store_true", help="keep episodes the expert did not solve")
    parser.add_argument("--output", "-o", type=Path, required=True, help="the .npz file to write")


def _check(args: argparse.Namespace) -> None:
    if args.episodes < 1:
        raise CommandError(f"--episodes must be >= 1, got {args.episodes}", code=2)
    if args.image_size < 8:
        raise CommandError(f"--image-size must be >= 8, got {args.image_size}", code=2)
    if args.action_noise < 0:
        raise CommandError(f"--action-noise must be >= 0, got {args.action_noise}", code=2)
    if args.max_episode_steps is not None and args.max_episode_steps < 1:
        raise CommandError(f"--max-episode-steps must be >= 1, got {args.max_episode_steps}", code=2)
    if args.output.suffix != ".npz":
        raise CommandError(f"--output: {args.output} must end in .npz", code=2)
    if args.output.is_dir():
        raise CommandError(f"--output: {args.output} is a directory", code=2)


def _run(args: argparse.Namespace) -> int:
    _check(args)
    from m2flow.envs.metaworld import expand_tasks, metaworld_unavailable_reason

    tasks = expand_tasks(args.tasks, args.instruction)  # an unknown task: one InputError line
    reason = metaworld_unavailable_reason()
    if reason is not None:
        raise CommandError(f"MetaWorld pixels are unavailable: {reason}")
    from m2flow.envs.metaworld_demos import collect_demos
    from m2flow.metrics import ConsoleSink

    env_kwargs: dict = {"height": args.image_size, "width": args.image_size}
    if args.max_episode_steps is not None:
        env_kwargs["max_episode_steps"] = args.max_episode_steps
    if args.instruction is not None:
        env_kwargs["instruction"] = args.instruction
    total = len(tasks) * args.episodes
    bar = ConsoleSink(total, "demos", ["episodes"])
    try:
        demos = collect_demos(tasks, args.episodes, seed=args.seed, action_noise=args.action_noise,
                              keep_failures=args.keep_failures, env_kwargs=env_kwargs,
                              progress=lambda done, n: bar.write(done, {"episodes": done}))
    except RuntimeError as error:  # every episode failed and none was kept
        raise CommandError(f"{error}; try --keep-failures or more --episodes") from None
    finally:
        bar.close()
    try:
        path = demos.save(args.output)
    except OSError as error:
        raise CommandError(f"--output: cannot write {args.output}: {error.strerror or error}", code=2) from None
    kept = len(demos.tasks)
    say(f"{path}: {kept} episodes ({len(demos)} steps) of {len(tasks)} task(s), {kept}/{total} kept, "
        f"{args.image_size}x{args.image_size} images, action noise {args.action_noise}")
    return 0


register_command("demos", "write scripted-expert demonstrations of MetaWorld v3 tasks (for policy.warm_start.demos)",
                 _configure, _run)
