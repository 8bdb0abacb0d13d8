"""What the planner knows of partial rollouts (``rollout.partial``), in plan terms, for every workflow that has them.

Partial rollouts change two things a plan's price depends on:

* **how far the producer runs ahead**: a carried response (or episode) is trained an iteration after its first
  tokens were sampled, so under a staleness bound ``s`` the rollout generates ``s - 1`` iterations ahead of the
  actor, not ``s`` (``run_ahead``; the flows run exactly this many, the simulator plays it);
* **how long an iteration's generation takes**: it stops once the groups it owes have finished, so it no longer
  waits for its slowest response. This is measured, not modelled: ``m2flow profile`` runs the config itself,
  partial rollouts included (``rollout.partial`` is part of the hash a profile carries, so a profile of a
  config without them is refused), and each point of the rollout's curve is the busy time of iterations that
  stopped at the groups that finished first, carrying the rest, on this machine. How much that saves depends on
  what a decoding step costs here: on an accelerator, where a step costs about the same for few rows as for
  many, the steps are the time; on a CPU a step costs about in proportion to its rows, so a whole batch's tail
  of stragglers is cheap and the saving small (docs/benchmarks/g3.md: decoding steps 0.57x, seconds 0.82x).
  A length model would have to guess that split; the measurement holds it.

``partial_notes`` are the lines ``m2flow plan`` and ``m2flow plan search`` print about them.
"""

from __future__ import annotations


def run_ahead(max_staleness: int, partial: bool) -> int:
    """Iterations the rollout generates ahead of the actor (0: synchronous): ``max_staleness`` s, or s - 1 with
    partial rollouts, whose carried tokens are trained an iteration after they were sampled."""
    return max(0, max_staleness - 1) if partial else max(0, max_staleness)


def partial_notes(partial: bool, max_staleness: int, what: str = "responses") -> tuple[str, ...]:
    """What partial rollouts mean for a plan, one line each (none without them): how far the rollout runs ahead,
    and how its generation is priced. ``what``: the unit that can outlive an iteration (responses, episodes)."""
    if not partial:
        return ()
    ahead = run_ahead(max_staleness, partial)
    return (f"rollout.partial: {what} unfinished at an iteration's end continue in the next, so with max_staleness "
            f"{max_staleness} the rollout generates {ahead} iteration(s) ahead, not {max_staleness}",
            "rollout.partial: generation priced as the profile measured it: its probes run partial rollouts, so the "
            "measured curves hold iterations that stop at the groups that finish first instead of waiting for the "
            "slowest (no length model: what that saves depends on this machine's cost of a decoding step)")
