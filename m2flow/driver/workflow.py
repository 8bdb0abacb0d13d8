"""What a workflow is to the driver: a declared graph of components plus the short program of one iteration.

``Workflow`` is the static side, one object per workflow, registered by name: its config class, its
graph (every component declared once: worker class, config section, threads key, timing metric,
fusions and their keys), the plan settings the search may vary (``Tunable``: a setting's name in the
Plan and the config key that sets it), the constraints its config adds when the one builder
(``planner.build``) makes a ``Plan`` of it, and what the planner needs to profile and search it.
``Workflow.overrides`` writes a ``PlanChoice`` out as config keys for the user to read; nothing plans
from them.
``Flow`` is the live side of one run: what to call, in what order, on the groups and streams that
``Workflow.launch_plan`` started from the Plan alone (``driver/launch.py``), driven by the one loop in
``driver/loop.py``.

Adding a workflow is one package (or one module): a config dataclass extending ``RunConfig``, a
``WorkflowGraph``, a ``Workflow`` subclass with ``launch`` (its workers' settings to ``launch_plan``, a ``Flow``
over what that started; and the plan constraints its config adds:
``settings``, ``inactive``, ``fusion_refusal``, ``check``, ``notes``), a ``Flow``, and
``register_workflow(...)``; nothing in the driver, the planner or the CLI changes. A workflow whose
checkpoints ``m2flow eval`` can evaluate also writes ``evaluate_checkpoint`` (options: ``EvalOptions``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, Protocol

from m2flow.config.schema import get_key
from m2flow.planner import Plan, WorkflowGraph
from m2flow.planner.choice import PlanChoice
from m2flow.planner.build import PlanRules, build_plan
from m2flow.driver.launch import Launched, Settings, launch_plan
from m2flow.runtime.executors import Executor
from m2flow.runtime.placement import NodeLayout


class Flow(Protocol):
    """The launched system of one run attempt, as the driver loop drives it.

    Iteration ``it`` is started (``start``), possibly together with later ones when the plan lets
    producers run ahead (``max_staleness``), then finished (``finish``): its data consumed and the
    policy trained on it. Every call that waits on workers waits at most the run's
    ``fault_tolerance.iteration_timeout_s``.

    A flow that subclasses it gets defaults for the members most flows share: no work ahead of the
    iteration being finished, ``done`` iterations as the progress, the iteration's wall time as its rate,
    no evaluation, nothing saved, and ``launched.shutdown()`` (the groups and streams ``launch_plan`` started)
    at the end; it writes ``start``, ``finish`` and what differs.
    """

    iterations: int
    """iterations of the whole run"""
    max_staleness: int = 0
    """how many iterations producers may run ahead of the actor (0: synchronous)"""
    progress_total: int
    """the metric step the run ends at (iterations, or env steps)"""
    description: str = ""
    """what runs, in a few words (the progress line, after the workflow's name; empty: the name alone)"""
    launched: Launched | None = None
    """the groups and streams the plan started (``Workflow.launch_plan``), stopped by the default ``shutdown``"""
    done: int = 0
    """iterations trained so far (the default ``progress``)"""

    def start(self, it: int, horizon: int) -> None:
        """Queue the work of iterations ``it .. horizon`` not started yet (weights synced before it)."""
        ...

    def finish(self, it: int) -> dict[str, float]:
        """Wait for iteration ``it``'s data, train on it; its metrics."""
        ...

    def rates(self, metrics: dict[str, float], seconds: float) -> dict[str, float]:
        """Throughput and time metrics of an iteration that took ``seconds``."""
        return {"time/step": seconds}

    def in_flight(self, it: int) -> bool:
        """Whether work of an iteration past ``it`` has started."""
        return False

    def progress(self) -> int:
        """The metric step after the iterations finished so far (the x axis of every curve)."""
        return self.done

    def evaluate(self) -> dict[str, float]:
        """Held-out metrics of the current policy (``eval/...``)."""
        return {}

    def save(self, path: Path) -> dict[str, Any]:
        """Every worker's state into ``path`` (nothing is in flight); the driver-side state, as JSON values."""
        return {}

    def summary(self, history: list[dict[str, float]]) -> str:
        """The run's outcome in one line."""
        return f"{len(history)} iteration(s)"

    def shutdown(self) -> None:
        """Stop every group and release what the flow holds."""
        if self.launched is not None:
            self.launched.shutdown()


@dataclass(frozen=True)
class Launch:
    """What ``Workflow.launch`` gets besides config and plan: where the run writes, and what it resumes."""

    run_dir: Path
    trace_dir: Path | None
    prepared: Any
    """what ``Workflow.prepare`` returned (a model path, data sets)"""
    checkpoint: Path | None
    """the checkpoint the run resumes from, or None"""
    state: dict[str, Any] | None
    """the flow's state saved in that checkpoint (what ``Flow.save`` returned)"""
    start: int
    """the first iteration this attempt runs"""
    run_id: str = ""
    """a short id unique to this attempt, for names of groups and channels"""


@dataclass(frozen=True)
class EvalOptions:
    """What ``m2flow eval`` asks of a saved checkpoint, besides its path."""

    episodes: int | None = None
    """episodes to evaluate (None: the workflow's default); for workflows that play episodes"""
    overrides: tuple[str, ...] = ()
    """``KEY=VALUE`` overrides: of the run's saved config, or of the reasoning eval config"""
    config: Path | None = None
    """a training config whose settings are the defaults (reasoning only; a run's checkpoint carries its own)"""


@dataclass(frozen=True)
class CheckpointEval:
    """A checkpoint's evaluation: its metrics (the ``eval/...`` keys the run logs) and one line to print."""

    metrics: dict[str, float]
    summary: str


@dataclass(frozen=True)
class Tunable:
    """A plan setting the plan search may vary, declared by its workflow in its ``plan.py``."""

    setting: str
    """its name in the Plan's settings (``prompts_per_chunk``, ``pipeline_stages``)"""
    key: str
    """the dotted config key that sets it (``rollout.prompts_per_chunk``)"""
    values: Callable[[Any], tuple[Any, ...]]
    """``values(cfg)``: the values worth trying for a config"""


class Workflow:
    """A workflow's declaration and the functions that plan and launch it; subclass and register one instance.

    The planner's hooks (``search_space``, ``profile_*``, ``edge_bytes``, ``model_bytes``,
    ``resumable``) have defaults that make a workflow plannable with no more than its graph; the
    timings, thread keys and fusion keys come from the graph's component declarations.
    """

    name: ClassVar[str]
    schema: ClassVar[type]
    """the config dataclass (extends ``RunConfig``)"""
    graph: ClassVar[WorkflowGraph]
    help: ClassVar[str] = ""
    tunables: ClassVar[tuple[Tunable, ...]] = ()
    """the plan settings the search may vary, each with the config key that sets it"""

    # -- planning ------------------------------------------------------------------------------------
    def plan(self, cfg: Any, layout: NodeLayout, choice: PlanChoice | None = None) -> Plan:
        """The validated Plan of ``cfg`` on a cluster of ``layout``: of what the config asks for (``asked``), or
        of the search's ``choice`` (its placement, fusions and setting values in place of the config's).

        The one builder (``planner.build.build_plan``) makes it from the graph; the workflow adds only
        constraints (``rules``): the components this config does not need, the fusions it cannot take, the
        threads and offloads, and the settings (their defaults, the choice's values, their checks)."""
        choice = choice if choice is not None else self.asked(cfg)
        tunable = {t.setting for t in self.tunables}
        unknown = sorted(set(choice.values) - tunable)
        if unknown:
            raise ValueError(f"{self.name}: no tunable plan setting {unknown}; the tunables are {sorted(tunable)}")
        return build_plan(self.graph, choice, layout, self.rules(cfg, choice.values))

    def asked(self, cfg: Any) -> PlanChoice:
        """What the config asks for, as a ``PlanChoice``: its placement and the fusions whose keys it sets."""
        return PlanChoice.of(cfg.placement, [pair for pair, key in self.graph.fusion_keys().items()
                                             if bool(get_key(cfg, key))])

    def rules(self, cfg: Any, values: Mapping[str, Any]) -> PlanRules:
        """The constraints ``cfg`` adds to the graph when a Plan is built (``values``: the search's setting
        values by Plan name, in place of the config's)."""
        def settings(plan: Plan) -> tuple[dict[str, Any], tuple[str, ...]]:
            out = self.settings(cfg, plan, values)
            self.check(cfg, plan)
            return out, self.notes(cfg, plan)

        refused = {(f.component, f.host): why for f in self.graph.fusions
                   if (why := self.fusion_refusal(cfg, f.component, f.host))}
        return PlanRules(inactive=self.inactive(cfg), refused=refused, threads=self.threads(cfg),
                         offload=self.offload_settings(cfg), settings=settings)

    def settings(self, cfg: Any, plan: Plan, values: Mapping[str, Any]) -> dict[str, Any]:
        """The plan's workflow-level settings (JSON values) for the structure ``plan`` has decided: the
        config's defaults, with the search's ``values`` (by Plan name) in their place; a ValueError refuses
        a value."""
        return {}

    def inactive(self, cfg: Any) -> dict[str, str]:
        """Optional components this config does not need -> why (a note of the plan)."""
        return {}

    def fusion_refusal(self, cfg: Any, component: str, host: str) -> str:
        """Why this config cannot run ``component`` inside ``host``'s processes, besides the devices ("": it can)."""
        return ""

    def check(self, cfg: Any, plan: Plan) -> None:
        """Raise ValueError when ``plan`` cannot run this config (ranks the config's sizes do not divide)."""

    def notes(self, cfg: Any, plan: Plan) -> tuple[str, ...]:
        """What the plan's structure means for this config, one line each (after the builder's own notes)."""
        return ()

    def search_space(self, cfg: Any, plan: Plan) -> Any:
        """What ``m2flow plan search`` and ``placement: auto`` may vary for ``cfg``, in the Plan's terms: the
        tunables' values by setting name, the fusions that have a config key as (component, host) pairs."""
        from m2flow.planner.search import SearchSpace

        return SearchSpace(self.graph, self.workload(), tuple(c.name for c in plan.components if c.active),
                           dict(plan.settings), varied={t.setting: tuple(t.values(cfg)) for t in self.tunables},
                           fusions=tuple(self.graph.fusion_keys()), threads={c.name: c.threads for c in plan.components},
                           offload=self.offload_settings(cfg))

    def overrides(self, choice: PlanChoice) -> dict[str, Any]:
        """The config overrides that ask for ``choice`` (what ``m2flow plan search`` prints after ``use:`` and
        ``auto.json`` records, so that a user may read and rerun it): its placement, every fusion key (true for
        the fusions it takes), the config key of each setting. A chosen Plan runs as it is, never re-planned
        from these."""
        keys = {t.setting: t.key for t in self.tunables}
        unknown = sorted(set(choice.values) - set(keys))
        if unknown:
            raise ValueError(f"{self.name}: no tunable plan setting {unknown}; the tunables are {sorted(keys)}")
        fusions = self.graph.fusion_keys()
        foreign = sorted(set(choice.fusions) - set(fusions))
        if foreign:
            raise ValueError(f"{self.name}: no fusion with a config key for {foreign}; those are {sorted(fusions)}")
        return {"placement": choice.placement, **{key: pair in choice.fusions for pair, key in fusions.items()},
                **{keys[name]: value for name, value in choice.values.items()}}

    def offload_settings(self, cfg: Any) -> dict[str, bool]:
        """model holder -> whether it offloads when it shares devices (missing: it does), so the search
        times and memory-checks candidates as their Plans will run."""
        return {}

    def workload(self) -> Any:
        """The planner's ``Workload``: how items flow through the components in one iteration."""
        raise NotImplementedError

    def threads(self, cfg: Any) -> dict[str, int]:
        """component -> torch threads per rank, read from the config key each component declares."""
        return {c: int(get_key(cfg, key)) for c, key in self.graph.thread_keys().items()}

    def execution_keys(self) -> tuple[str, ...]:
        """Config keys that change only how a run executes, not what it computes (placement, fusions,
        threads, granularity): a checkpoint may be resumed across them, and a profile outlives them."""
        return ("placement", "cluster", *self.graph.fusion_keys().values(), *self.graph.thread_keys().values(),
                *(t.key for t in self.tunables))

    # -- running -------------------------------------------------------------------------------------
    def prepare(self, cfg: Any, run_dir: Path) -> Any:
        """Work done once in the driver before any worker starts (a model built, a warm start, data sets)."""
        return None

    def warm_start(self, cfg: Any) -> str | None:
        """The config section of the warm start ``cfg`` declares, run by ``prepare`` (None: none declared; a
        workflow with no warm start at all raises ``UserInputError`` saying so)."""
        from m2flow.errors import UserInputError

        raise UserInputError(f"workflow {self.name!r} has no warm start")

    def warm_started(self, prepared: Any) -> Path:
        """Where ``prepare``'s result keeps the warm-started model or policy."""
        return Path(prepared.model_path)

    def launch(self, cfg: Any, plan: Plan, executor: Executor, run: Launch) -> Flow:
        """Start the plan's groups and return the live flow, restored from ``run.checkpoint`` when given. The edge
        where a run's config is read: the flow gets the Plan and what it needs of ``cfg``, never ``cfg`` itself."""
        raise NotImplementedError

    def launch_plan(self, plan: Plan, executor: Executor, run: Launch, settings: Settings) -> Launched:
        """Start ``plan`` (``driver/launch.py``): its streams, a group per launched component built with its
        settings and those of the components fused into it, a view per fused one. ``settings``: one object per
        active component (None for a worker that takes none), or a function of the ``Wiring`` (group names,
        streams) that gives them."""
        return launch_plan(self.graph, plan, executor, run.run_id, run.run_dir / "logs", run.trace_dir, settings)

    # -- planner hooks -------------------------------------------------------------------------------
    def iterations(self, cfg: Any, plan: Plan) -> int:
        """Iterations of the whole run of ``cfg`` under ``plan`` (default: the config's ``steps``)."""
        if not hasattr(cfg, "steps"):
            raise NotImplementedError(f"{self.name}: its config has no 'steps'; the workflow says its iterations")
        return int(cfg.steps)

    def profile_probes(self, cfg: Any) -> list[dict[str, Any]]:
        """The config overrides of each batch size to profile (one short run each)."""
        return [{}]

    def profile_length(self, cfg: Any, iterations: int) -> dict[str, Any]:
        """The overrides that make a run ``iterations`` long and switch off what a profile does not need."""
        raise NotImplementedError

    def edge_bytes(self, cfg: Any) -> dict[str, float]:
        """Bytes per item of each data edge (from the config's shapes)."""
        return {}

    def model_bytes(self, checkpoint: Path | None) -> tuple[float, float]:
        """(bytes of the policy's weights, bytes of the trained state) read from a profiling run's checkpoint."""
        return 0.0, 0.0

    def resumable(self, old: Plan, new: Plan) -> bool:
        """Whether a checkpoint written under ``old`` can be resumed under ``new``."""
        return True

    # -- evaluation of a saved checkpoint ------------------------------------------------------------
    takes_eval_config: ClassVar[bool] = False
    """whether ``evaluate_checkpoint`` reads ``EvalOptions.config`` (a run's checkpoint carries its own config)"""

    def evaluate_checkpoint(self, checkpoint: Path, options: EvalOptions) -> CheckpointEval:
        """Evaluate the policy saved in ``checkpoint`` in this process (``m2flow eval``): the metrics the run's
        own held-out evaluation logs, and a summary line. Bad input raises a ``UserInputError`` (one ``error:``
        line from the command); a workflow that does not override this cannot evaluate a checkpoint."""
        from m2flow.errors import UserInputError

        raise UserInputError(f"workflow {self.name!r} cannot evaluate a checkpoint ({checkpoint})")
